"""Pipelines and sweeps in the spec and in words: dependencies and job arrays.

The parsers turn what a person types (``--array 0-99%8``,
``--array-env LR=0.1,0.01``, ``--after-ok job_x``) into the members of
``POST /v1/jobs`` (``array``, ``depends_on``); the ``*_text`` functions say
a job's dependencies and an array's progress back in words, as ``gpujobs
describe`` shows them. Pure functions: no I/O.

The names and limits are the API's (docs/api.md): ``depends_on`` lists up
to 100 jobs, each with a condition ``succeeded`` (the default), ``failed``
(ended FAILED or CANCELLED) or ``ended`` (any end); an array has 1 to
10,000 indexes, numbered from 0.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .models import ARRAY_COUNT_STATES, CONDITIONS, DEFAULT_CONDITION

if TYPE_CHECKING:  # pragma: no cover
    from .models import ArrayProgress, Job

#: how many jobs one job may depend on (the API's limit)
MAX_DEPENDENCIES = 100
#: the most indexes an array may have (the API's limit)
MAX_ARRAY_SIZE = 10_000
#: what each condition waits for, as a waiting job's pending_reason says it
CONDITION_WORDS = {"succeeded": "to succeed", "failed": "to fail", "ended": "to end"}
#: the name an ``array.env`` member may have (the API's pattern)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
#: the exit reasons of pipelines and sweeps, whose ``detail`` says why
PIPELINE_REASONS = ("dependency_failed", "array_failed", "max_failed_indexes")

_ARRAY = re.compile(r"(?:([0-9]{1,9})-([0-9]{1,9})|([0-9]{1,9}))(?:%([0-9]{1,9}))?")


class PipelineError(ValueError):
    """An array range, an ``--array-env`` or a dependency that cannot be
    read; the message says why."""


# -- arrays ---------------------------------------------------------------------
def parse_array(text: str) -> dict[str, int]:
    """``array``'s ``size`` and ``max_parallel`` from Slurm's notation:
    ``0-99%8`` (indexes 0 to 99, at most 8 at once), ``100%8`` (the same),
    ``0-99`` or ``100`` (no limit). Indexes always start at 0."""
    t = text.strip()
    m = _ARRAY.fullmatch(t)
    if m is None:
        raise PipelineError(f"{text!r} is not an array range: use 0-N (indexes 0 to N) or a "
                            "size, and %P to run at most P at once (0-99%8, 100%8, 0-99)")
    first, last, size_text, parallel = m.groups()
    if size_text is not None:
        size = int(size_text)
    else:
        start, end = int(first), int(last)
        if end < start:
            raise PipelineError(f"{text!r} ends before it starts")
        if start != 0:
            width = end - start + 1
            raise PipelineError(
                f"{text!r} starts at {start}, but an array's indexes always start at 0: "
                f"write 0-{end} for {end + 1} indexes, or 0-{width - 1} (or {width}) for "
                f"{width}, and offset GPUJOBS_ARRAY_INDEX in the command if it needs to")
        size = end + 1
    if not 1 <= size <= MAX_ARRAY_SIZE:
        raise PipelineError(f"{text!r} has {size} indexes; an array has 1 to "
                            f"{MAX_ARRAY_SIZE:,}")
    out = {"size": size}
    if parallel is not None:
        p = int(parallel)
        if not 1 <= p <= MAX_ARRAY_SIZE:
            raise PipelineError(f"{text!r}: %{p} is not 1 to {MAX_ARRAY_SIZE:,} at once")
        out["max_parallel"] = p
    return out


def parse_array_env(text: str) -> tuple[str, list[str]]:
    """``NAME=v0,v1,...`` as ``(NAME, [v0, v1, ...])``: index i gets the
    i-th value (``array.env``). Values are split on commas."""
    name, sep, values = text.partition("=")
    if not sep or not name:
        raise PipelineError(f"{text!r} is not NAME=V0,V1,... (one value per index)")
    if not ENV_NAME.fullmatch(name):
        raise PipelineError(f"{name!r} is not an environment variable name (letters, digits "
                            "and _, not starting with a digit)")
    return name, values.split(",")


def check_array_env(array: Mapping[str, Any], names: Iterable[str]) -> None:
    """Each of ``names``' ``array.env`` lists holds one value per index, as
    the server requires; :class:`PipelineError` otherwise."""
    size = array.get("size")
    if not isinstance(size, int):
        return
    env = array.get("env") or {}
    for name in names:
        n = len(env.get(name) or [])
        if n != size:
            raise PipelineError(f"{name} has {n} value{'s' if n != 1 else ''}; the array has "
                                f"{size} indexes ({index_range(size)}), one value each")


def check_max_failed(array: Mapping[str, Any]) -> None:
    """``max_failed_indexes`` is below the array's size, as the server
    requires; :class:`PipelineError` otherwise."""
    size, failed = array.get("size"), array.get("max_failed_indexes")
    if isinstance(size, int) and isinstance(failed, int) and failed >= size:
        raise PipelineError(f"{failed} is not less than the array's {size} indexes")


def index_range(size: int) -> str:
    """``0-99`` for 100 indexes, ``0`` for one."""
    return "0" if size <= 1 else f"0-{size - 1}"


def array_spec_text(array: Mapping[str, Any]) -> str:
    """``100 indexes (0-99), at most 8 at once, fails after 2 failed indexes;
    env LR, BATCH``: what ``spec.array`` asks for, in words."""
    size = int(array.get("size") or 0)
    parts = [f"{size} index{'es' if size != 1 else ''} ({index_range(size)})"]
    if array.get("max_parallel"):
        parts.append(f"at most {array['max_parallel']} at once")
    failed = array.get("max_failed_indexes")
    if failed is not None:
        parts.append(f"fails once more than {failed} failed")
    text = ", ".join(parts)
    env = array.get("env") or {}
    if env:
        text += "; env " + ", ".join(env)
    return text


def counts_text(progress: "ArrayProgress", *, ended: bool = False) -> str:
    """``100: 88 pending, 4 running, 7 succeeded, 1 failed``: the indexes by
    state (the states with none left out). Once the array has ``ended``
    early (failed fast or cancelled), the indexes never made are among its
    cancelled ones, and said so: ``8 cancelled (6 never started)``."""
    counts = progress.counts
    never = progress.size - progress.materialized if ended else 0
    states = [*ARRAY_COUNT_STATES, *(s for s in counts if s not in ARRAY_COUNT_STATES)]
    parts = [f"{counts[s]} {s.lower()}"
             + (f" ({never} never started)" if s == "CANCELLED" and never else "")
             for s in states if counts.get(s)]
    return f"{progress.size}: " + ", ".join(parts) if parts else str(progress.size)


def index_text(job: "Job") -> str | None:
    """``3 of 0-5``: a child's index among its array's, or None for a job
    that is not a child."""
    if job.array_index is None:
        return None
    size = str((job.spec.get("env") or {}).get("GPUJOBS_ARRAY_SIZE") or "")
    if not size.isdigit():
        return str(job.array_index)
    return f"{job.array_index} of {index_range(int(size))}"


# -- dependencies -------------------------------------------------------------------
def depends_on(pairs: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """``depends_on`` from ``(condition, job_id)`` pairs, in their order: a
    job named twice, an unknown condition or more than 100 are errors."""
    out: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for condition, job_id in pairs:
        if condition not in CONDITIONS:
            raise PipelineError(f"{condition!r} is not one of {', '.join(CONDITIONS)}")
        job_id = job_id.strip()
        if not job_id:
            raise PipelineError("a dependency needs a job id")
        if job_id in seen:
            raise PipelineError(f"{job_id} is named twice ({seen[job_id]} and {condition}): a "
                                "job depends on another once, with one condition")
        seen[job_id] = condition
        out.append({"job_id": job_id, "condition": condition})
    if len(out) > MAX_DEPENDENCIES:
        raise PipelineError(f"{len(out)} dependencies; a job may depend on at most "
                            f"{MAX_DEPENDENCIES}")
    return out


def dependencies_summary(spec: Mapping[str, Any]) -> str:
    """``job_a to succeed, job_b to end``: what ``spec.depends_on`` waits for."""
    return ", ".join(f"{d.get('job_id')} "
                     f"{CONDITION_WORDS.get(d.get('condition') or DEFAULT_CONDITION, '?')}"
                     for d in spec.get("depends_on") or [] if isinstance(d, Mapping))


def dependency_lines(job: "Job") -> list[str]:
    """Each of the job's dependencies (its job and condition) and where it
    stands: ``job_a to succeed: waiting``, ``job_b to end: met``, ``job_c to
    succeed: can no longer be met`` (the one a ``dependency_failed`` exit
    names)."""
    waiting = set(job.waiting_for)
    exit_ = job.exit
    failed = exit_.dependency if exit_ is not None and exit_.reason == "dependency_failed" \
        else None
    lines = []
    for d in job.depends_on:
        if d.job_id == failed:
            status = "can no longer be met"
        elif d.job_id in waiting and not job.is_terminal:
            status = "waiting"
        elif d.job_id in waiting or failed is not None:
            status = "-"  # the job ended before this one mattered
        else:
            status = "met"
        lines.append(f"{d.job_id} {CONDITION_WORDS.get(d.condition, d.condition)}: {status}")
    return lines


def shown_ids(ids: Sequence[str], most: int = 10) -> str:
    """``job_a, job_b`` (at most ``most``, then ``and N more``)."""
    head = ", ".join(ids[:most])
    return head + (f" and {len(ids) - most} more" if len(ids) > most else "")
