"""Usage rolled up by hour (API.md, "Usage and goodput": ``GET /v1/usage``).

Pure: no AWS, no clock (``now`` is an argument). A job's ``usage``
(domain/usage.py) cut into hour cells: ``cells(spans, now)`` gives, for each
(hour, part) the job held GPUs in, whole GPU-seconds (``part`` is
``productive`` or a cause of loss), such that for each part the cells sum
exactly to that part of the job's ``usage``: each part's whole seconds (as
``usage`` rounds them) are apportioned over its hours by largest remainder of
the GPU-milliseconds held in each hour (ties to the earlier hour).

What an attempt adds to the rollup when it ends (``added``) is the job's
cells with that attempt minus its cells without it (attempts end in order),
so whatever attempts have ended, their additions sum to the cells of those
attempts exactly: the rows of ``GET /v1/usage`` sum to the jobs' ``usage``
to the GPU-second. An addition may take a second from one cell of an
earlier hour and give it to another (a later attempt can change the job's
rounding, or the share of an earlier attempt's time it resumed from): the
rollup ADDs signed numbers. A running attempt's part (``running``) is the
same difference with the running attempt counted up to ``now``.

A job counts in the ``jobs`` of an hour (and of a day) it held GPUs in for
any positive time; an attempt adds 1 to the hours (days) the job held
nothing in before it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable, Mapping, Sequence

from .usage import (
    CAUSES,
    Span,
    _clipped,
    _length,
    _ms,
    _whole_seconds,
    resumed_share,
)

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

Cells = dict[tuple[int, str], int]


def _minus(intervals: list[tuple[int, int]], taken: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``intervals`` without ``taken`` (both merged and sorted)."""
    out = []
    for a, b in intervals:
        cur = a
        for c, d in taken:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


def by_hour(intervals: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Milliseconds of ``intervals`` in each hour (keyed by the hour's start, ms)."""
    out: dict[int, int] = defaultdict(int)
    for a, b in intervals:
        h = a - a % HOUR_MS
        while h < b:
            n = min(b, h + HOUR_MS) - max(a, h)
            if n > 0:
                out[h] += n
            h += HOUR_MS
    return dict(out)


def apportion(total: int, weights: Mapping[int, int]) -> dict[int, int]:
    """``total`` split in proportion to ``weights`` (non-negative integers)
    by largest remainder, ties to the smaller key: sums to ``total`` exactly."""
    whole = sum(weights.values())
    if whole <= 0:
        return {}
    share = {k: total * w // whole for k, w in weights.items()}
    left = total - sum(share.values())
    for k in sorted(weights, key=lambda k: (-(total * weights[k] % whole), k))[:left]:
        share[k] += 1
    return share


def span_hours(span: Span, later: Sequence[Span], now: datetime) -> Cells:
    """The attempt's GPU-milliseconds by (hour, part): the hours of each part
    of domain/usage.py ``span_parts``, summing part by part to it exactly."""
    placed = _ms(span.placed_at)
    end = max(placed, _ms(span.ended_at if span.ended_at is not None else now))
    begun = span.first_step_at or span.started_at
    if begun is not None:
        first = min(end, max(placed, _ms(begun)))
    else:
        first = end if span.ended_at is None else placed
    stalls = _clipped(span.stalls, first, end)
    paused = _minus(_clipped(span.checkpoints, first, end), stalls)
    rest = _minus(_minus([(first, end)] if end > first else [], stalls), paused)
    parts: dict[str, dict[int, int]] = {
        "startup": by_hour([(placed, first)] if first > placed else []),
        "stalled": by_hour(stalls), "checkpoint": by_hour(paused)}
    rest_hours = by_hour(rest)
    if span.ended_at is None or span.reason == "succeeded":
        parts["productive"] = rest_hours
    else:
        kept = int(_length(rest) * resumed_share(span, later))
        kept_hours = apportion(kept, rest_hours)
        cause = CAUSES.get(span.reason or "", "failed_attempt")
        lost = {h: ms - kept_hours.get(h, 0) for h, ms in rest_hours.items()}
        parts["productive"] = kept_hours
        merged = dict(parts.get(cause, {}))
        for h, ms in lost.items():
            merged[h] = merged.get(h, 0) + ms
        parts[cause] = merged
    return {(h, part): ms * span.gpus for part, hours in parts.items()
            for h, ms in hours.items() if ms > 0 and span.gpus > 0}


def cells(spans: Sequence[Span], now: datetime) -> Cells:
    """The job's whole GPU-seconds by (hour, part), each part summing to the
    job's ``usage`` of that part exactly (zero cells left out)."""
    ordered = sorted(spans, key=lambda s: s.attempt)
    ms: Cells = defaultdict(int)
    for i, span in enumerate(ordered):
        for k, v in span_hours(span, ordered[i + 1:], now).items():
            ms[k] += v
    totals: dict[str, int] = {"productive": 0}
    for (_, part), v in ms.items():
        totals[part] = totals.get(part, 0) + v
    whole = _whole_seconds(totals)
    out: Cells = {}
    for part, seconds in whole.items():
        weights = {h: v for (h, p), v in ms.items() if p == part}
        for h, s in apportion(seconds, weights).items():
            if s:
                out[(h, part)] = s
    return out


def held_hours(spans: Sequence[Span], now: datetime) -> set[int]:
    """The hours (their start, ms) in which the job held GPUs for any time."""
    out: set[int] = set()
    for s in spans:
        placed = _ms(s.placed_at)
        end = _ms(s.ended_at if s.ended_at is not None else now)
        if s.gpus > 0 and end > placed:
            out.update(by_hour([(placed, end)]))
    return out


@dataclass(frozen=True)
class Addition:
    """What some attempts add to the rollup: signed GPU-seconds by (hour,
    part), and the hours and days (their start, ms) the job newly counts in."""
    cells: Cells
    hours: frozenset[int]
    days: frozenset[int]

    def empty(self) -> bool:
        return not self.cells and not self.hours and not self.days


def _diff(after: Cells, before: Cells) -> Cells:
    out = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in out.items() if v}


def _days(hours: Iterable[int]) -> set[int]:
    return {h - h % DAY_MS for h in hours}


def difference(with_: Sequence[Span], without: Sequence[Span], now: datetime) -> Addition:
    """What the job's spans ``with_`` add over its spans ``without``."""
    h1, h0 = held_hours(with_, now), held_hours(without, now)
    return Addition(_diff(cells(with_, now), cells(without, now)),
                    frozenset(h1 - h0), frozenset(_days(h1) - _days(h0)))


def added(spans: Sequence[Span], attempt: int) -> Addition:
    """What attempt ``attempt`` (ended, as all before it) adds when it ends."""
    ordered = sorted(spans, key=lambda s: s.attempt)
    upto = [s for s in ordered if s.attempt <= attempt]
    if not upto or upto[-1].attempt != attempt or any(s.ended_at is None for s in upto):
        raise ValueError(f"attempt {attempt} has not ended")
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)  # ended spans do not read now
    return difference(upto, upto[:-1], epoch)


def running(spans: Sequence[Span], now: datetime) -> Addition:
    """What the job's running attempt (if any) adds up to ``now`` over its
    ended attempts (which the rollup holds)."""
    ordered = sorted(spans, key=lambda s: s.attempt)
    closed = [s for s in ordered if s.ended_at is not None]
    if len(closed) == len(ordered):
        return Addition({}, frozenset(), frozenset())
    return difference(ordered, closed, now)


def ended_attempts(spans: Sequence[Span]) -> list[int]:
    """The attempts that ended, in order (each one's ``added`` is defined)."""
    out = []
    for s in sorted(spans, key=lambda s: s.attempt):
        if s.ended_at is None:
            break
        out.append(s.attempt)
    return out


#: a job's value when its spec names no GPU type
ANY_GPU_TYPE = "any"


def escape(text: str) -> str:
    """``text`` with no ``#`` (the separator of stored keys): reversible."""
    return text.replace("%", "%25").replace("#", "%23")


def unescape(text: str) -> str:
    return text.replace("%23", "#").replace("%25", "%")


def groups(job_id: str, gpu_type: str | None, labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (dimension, value) groups a job's usage is rolled up under: its
    GPU type, itself, and each of its labels (``label:<key>``). A job's or
    a label's value is stored with the job's GPU type (``pack``), so that a
    price per GPU type prices any group."""
    gpu = gpu_type or ANY_GPU_TYPE
    return [("gpu_type", gpu), ("job", pack(gpu, job_id))] + \
        [(f"label:{k}", pack(gpu, str(v))) for k, v in sorted(labels.items())]


def pack(gpu_type: str, value: str) -> str:
    return f"{escape(gpu_type)}#{value}"


def unpack(dim: str, stored: str) -> tuple[str, str]:
    """(GPU type, value) of a stored group value of dimension ``dim``."""
    if dim == "gpu_type":
        return stored, stored
    gpu, _, value = stored.partition("#")
    return unescape(gpu), value


#: a rollup cell: (granularity "hour"|"day", period start ms, dimension, value)
Key = tuple[str, int, str, str]


def increments(addition: Addition, groups_: Sequence[tuple[str, str]]) -> dict[Key, dict[str, int]]:
    """What ``addition`` adds to each rollup cell of each group: by part
    (``productive`` or a cause, signed GPU-seconds) and ``jobs``. A day's
    cell is the sum of its hours' cells."""
    per: dict[tuple[str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (h, part), s in addition.cells.items():
        per[("hour", h)][part] += s
        per[("day", h - h % DAY_MS)][part] += s
    for h in addition.hours:
        per[("hour", h)]["jobs"] += 1
    for d in addition.days:
        per[("day", d)]["jobs"] += 1
    return {(gran, at, dim, value): dict(counts)
            for (gran, at), counts in sorted(per.items())
            for dim, value in groups_ if any(counts.values())}
