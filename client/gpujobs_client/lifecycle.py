"""A job's lifecycle in the spec and in words: retry rules, time limits, what is left.

The parsers turn what a person types (``4h``, ``exit:42=fail``) into the
members of ``POST /v1/jobs`` (``max_runtime_s``, ``retry.rules``); the
``*_text`` functions say a job's policy and limits back in words, as
``gpujobs describe`` shows them. Pure functions: no I/O, no clock of their
own (``now`` is passed in).

The names are the API's (docs/api.md, "Retries and time limits"): a test
checks they are the server's.
"""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Mapping

from .models import parse_time

#: what an attempt can end with that a retry rule may name
REASONS = ("rank_failed", "node_lost", "stalled", "timeout", "preempted", "agent_lost",
           "port_in_use")
#: the causes outside the job, retried without counting by default
INFRA_REASONS = ("node_lost", "preempted", "agent_lost", "port_in_use")
#: the rule actions, and what ``--retry-on WHAT=ACTION`` calls them
ACTIONS = ("retry", "retry_uncounted", "fail")
ACTION_WORDS = {"retry": "retry", "uncounted": "retry_uncounted",
                "retry_uncounted": "retry_uncounted", "fail": "fail"}
DEFAULT_MAX_UNCOUNTED = 10
#: the signals a rule may name, Linux numbering: SIGNALS[n - 1] is signal n
SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
           "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
           "SIGSTKFLT", "SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU",
           "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",
           "SIGPWR", "SIGSYS")
#: the signals ``warn_signal`` may be
WARN_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGALRM", "SIGTERM", "SIGWINCH",
                "SIGURG")
#: the longest time limit a spec may set (max_runtime_s, warn_before_s, max_pending_s)
MAX_LIMIT_S = 365 * 86400
#: a rank killed by signal N exits 128 + N (as the agent's shim records it)
SIGNAL_EXIT_BASE = 128

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:([0-9]{1,9})d)?(?:([0-9]{1,9})h)?(?:([0-9]{1,9})m)?(?:([0-9]{1,9})s)?")
_NUMBER = re.compile(r"[0-9]{1,9}")


class LifecycleError(ValueError):
    """A duration or a retry rule that cannot be read; the message says why."""


# -- durations ----------------------------------------------------------------
def parse_duration(text: str) -> int:
    """Whole seconds from ``90``, ``90s``, ``15m``, ``4h``, ``2d`` or a
    combination, largest unit first (``1h30m``, ``1d12h``); at least 1 s."""
    t = text.strip().lower()
    if _NUMBER.fullmatch(t):
        seconds = int(t)
    else:
        m = _DURATION.fullmatch(t)
        if not t or m is None:
            raise LifecycleError(f"{text!r} is not a duration: use seconds (90) or units d, "
                                 "h, m, s, largest first (90s, 15m, 4h, 2d, 1h30m)")
        seconds = sum(int(v) * _UNITS[u] for v, u in zip(m.groups(), "dhms") if v)
    if seconds < 1:
        raise LifecycleError(f"{text!r} is not a duration of at least 1 s")
    return seconds


def duration_text(seconds: float, *, exact: bool = True) -> str:
    """``14400`` -> ``4 h``, ``5400`` -> ``1 h 30 min``, ``45`` -> ``45 s``.
    ``exact`` says every unit (a limit as it was set); otherwise the two
    largest, rounded down (what is left: ``3 h 12 min``)."""
    t = max(0, int(seconds))
    values = []
    for name, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        values.append((t // size, name))
        t %= size
    if not exact:
        first = next((i for i, (v, _) in enumerate(values) if v), len(values) - 1)
        values = values[first:first + 2]
    return " ".join(f"{v} {name}" for v, name in values if v) or "0 s"


# -- retry rules --------------------------------------------------------------
def _signal_name(raw: str) -> str:
    name = raw.strip().upper()
    if _NUMBER.fullmatch(name) and 1 <= int(name) <= len(SIGNALS):
        return SIGNALS[int(name) - 1]
    if not name.startswith("SIG"):
        name = "SIG" + name
    if name not in SIGNALS:
        raise LifecycleError(f"{raw.strip()!r} is not a signal a rank can die of "
                             "(SIGKILL, SIGSEGV, SIGTERM, ...)")
    return name


def _unique(items: list[Any]) -> list[Any]:
    return list(dict.fromkeys(items))


def parse_retry_on(text: str) -> dict[str, Any]:
    """One retry rule from ``WHAT[=ACTION]``.

    WHAT is a reason (``node_lost``; several: ``node_lost,preempted``),
    ``exit:CODE[,CODE...]`` (1 to 255) or ``signal:NAME[,NAME...]``
    (``SIGKILL``, ``KILL`` or ``9``). ACTION is ``retry`` (the default: a
    retry counted against max_attempts), ``uncounted`` (a retry that does not
    count) or ``fail``."""
    what, sep, action_word = text.strip().partition("=")
    what = what.strip()
    action = ACTION_WORDS.get(action_word.strip().lower() if sep else "retry")
    if action is None:
        raise LifecycleError(f"{action_word.strip()!r} is not an action: use retry, "
                             "uncounted or fail")
    kind, colon, values = what.partition(":")
    kind = kind.strip().lower()
    items = [v.strip() for v in values.split(",")] if colon else []
    if colon and (not items or "" in items):
        raise LifecycleError(f"{what!r} names nothing after '{kind}:'")
    if colon and kind == "exit":
        codes = []
        for v in items:
            if not _NUMBER.fullmatch(v) or not 1 <= int(v) <= 255:
                raise LifecycleError(f"{v!r} is not an exit code from 1 to 255")
            codes.append(int(v))
        return {"exit_codes": _unique(codes), "action": action}
    if colon and kind in ("signal", "sig"):
        return {"signals": _unique([_signal_name(v) for v in items]), "action": action}
    if colon:
        raise LifecycleError(f"{what!r}: use a reason, exit:CODE or signal:NAME")
    reasons = [r.strip().lower() for r in what.split(",")]
    bad = [r for r in reasons if r not in REASONS]
    if not what or bad:
        raise LifecycleError(f"{(bad or [''])[0]!r} is not a reason: use one of "
                             f"{', '.join(REASONS)}, exit:CODE or signal:NAME")
    return {"reasons": _unique(reasons), "action": action}


def signal_of(exit_code: int | None) -> str | None:
    """The signal an exit code says the rank died of (137: SIGKILL), or None."""
    if exit_code is None or not SIGNAL_EXIT_BASE < exit_code <= SIGNAL_EXIT_BASE + len(SIGNALS):
        return None
    return SIGNALS[exit_code - SIGNAL_EXIT_BASE - 1]


_SAID = {"retry": "retry", "retry_uncounted": "retry, not counted", "fail": "fail"}


def rule_text(rule: Mapping[str, Any]) -> str:
    """``{"exit_codes": [42], "action": "fail"}`` -> ``exit 42 → fail``."""
    what = []
    if rule.get("reasons"):
        what.append(" or ".join(str(r) for r in rule["reasons"]))
    if rule.get("exit_codes"):
        what.append("exit " + ", ".join(str(c) for c in rule["exit_codes"]))
    if rule.get("signals"):
        what.append(" or ".join(str(s) for s in rule["signals"]))
    action = str(rule.get("action", "?"))
    return f"{' and '.join(what) or 'anything'} → {_SAID.get(action, action)}"


def retry_policy_text(spec: Mapping[str, Any]) -> str:
    """The spec's retry policy in words: its rules in order, then the defaults.

    ``exit 42 → fail; node_lost → retry, not counted; then defaults (infra
    causes not counted, up to 10)``."""
    given = spec.get("retry")
    policy: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    cap = policy.get("max_uncounted_retries", DEFAULT_MAX_UNCOUNTED)
    defaults = f"defaults (infra causes not counted, up to {cap})"
    rules = [rule_text(r) for r in policy.get("rules") or [] if isinstance(r, Mapping)]
    return "; ".join([*rules, f"then {defaults}"]) if rules else defaults


def attempt_text(attempt: int, max_attempts: int, uncounted: int) -> str:
    """``3 of max 3``, or with retries that did not count
    ``3 (2 counted of max 3, 1 not counted)``."""
    if uncounted <= 0:
        return f"{attempt} of max {max_attempts}"
    return (f"{attempt} ({attempt - uncounted} counted of max {max_attempts}, "
            f"{uncounted} not counted)")


def limits_lines(spec: Mapping[str, Any]) -> list[str]:
    """``max runtime 4 h (warning SIGUSR1 5 min before)``, ``max pending 30 min``."""
    lines = []
    runtime = spec.get("max_runtime_s")
    if runtime is not None:
        line = f"max runtime {duration_text(runtime)} per attempt"
        warn = spec.get("warn_before_s")
        if warn is not None:
            line += (f" (warning {spec.get('warn_signal') or 'SIGUSR1'} "
                     f"{duration_text(warn)} before)")
        lines.append(line)
    pending = spec.get("max_pending_s")
    if pending is not None:
        lines.append(f"max pending {duration_text(pending)}")
    return lines


def time_left_text(state: str, spec: Mapping[str, Any], *, started_at: str | None,
                   pending_since: str | None, now: datetime) -> str | None:
    """What is left of the limit that applies now: a RUNNING attempt's
    (``times out in 3 h 12 min``, from ``started_at``), a PENDING job's wait
    (``gives up waiting in 12 min``, from ``pending_since``); None when no
    limit applies."""
    if state == "RUNNING" and spec.get("max_runtime_s") is not None:
        start = parse_time(started_at)
        if start is None:
            return None
        left = start.timestamp() + float(spec["max_runtime_s"]) - now.timestamp()
        if left >= 0:
            return f"times out in {duration_text(left, exact=False)}"
        return (f"over its max runtime by {duration_text(-left, exact=False)}: "
                "being stopped")
    if state == "PENDING" and spec.get("max_pending_s") is not None:
        since = parse_time(pending_since)
        if since is None:
            return None
        left = since.timestamp() + float(spec["max_pending_s"]) - now.timestamp()
        if left >= 0:
            return f"gives up waiting in {duration_text(left, exact=False)}"
        return (f"waited past its max pending by {duration_text(-left, exact=False)}: "
                "ends FAILED when the placer next looks")
    return None


def decision_rest(exit_: Mapping[str, Any]) -> str | None:
    """The exit's ``decision`` without the cause it starts with (the exit's
    own reason, code, rank and detail, said beside it): ``not retried (rule 1
    says fail)``; the whole sentence when it does not start with the reason.

    The cause is ``reason`` or ``reason (bits)``, and a bit may hold ``: ``
    itself ("preempted (node n1 drained: bad ECC): retried, ..."): the rest
    starts after the cause's closing parenthesis, not at the first ``: ``."""
    decision = exit_.get("decision")
    if not decision:
        return None
    text = str(decision)
    reason = str(exit_.get("reason") or "")
    if not reason or not text.startswith(reason):
        return text
    after = text[len(reason):]
    if after.startswith(" ("):
        # the detail is the cause's last bit, free text: the cause ends after it
        detail = exit_.get("detail")
        at = after.find(f"{detail}): ") if detail else -1
        end = at + len(f"{detail})") if at >= 0 else _closing(after, 1)
        if end > 0 and after[end:end + 2] == ": " and after[end + 2:]:
            return after[end + 2:]
    elif after.startswith(": ") and after[2:]:
        return after[2:]
    return text


def _closing(text: str, start: int) -> int:
    """The index just past the parenthesis closing the one at ``start``; -1
    when it is not closed."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def exit_text(exit_: Mapping[str, Any]) -> str:
    """``rank_failed, exit code 1, rank 3 on node-2 — not retried (...)``;
    ``preempted, on n1, node n1 drained: bad ECC — retried, not counted (...)``."""
    parts = [str(exit_.get("reason") or "ended")]
    code = exit_.get("exit_code")
    if code is not None:
        sig = signal_of(int(code))
        parts.append(f"exit code {code}" + (f" ({sig})" if sig else ""))
    rank, node = exit_.get("rank"), exit_.get("node_id")
    if rank is not None:
        parts.append(f"rank {rank}" + (f" on {node}" if node else ""))
    elif node:
        parts.append(f"on {node}")
    if exit_.get("detail"):
        parts.append(str(exit_["detail"]))
    text = ", ".join(parts)
    rest = decision_rest(exit_)
    return f"{text} — {rest}" if rest else text


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _jobs_named(items: list[Mapping[str, Any]]) -> str:
    """``job_a (8 GPUs), job_b (4 GPUs) and 2 jobs of other tenants``."""
    named = [f"{i['job_id']} ({i['gpus']} GPU{'s' if i['gpus'] != 1 else ''})"
             for i in items if i.get("job_id")]
    others = sum(1 for i in items if not i.get("job_id"))
    if others:
        named.append(f"{others} job{'s' if others != 1 else ''} of other tenants"
                     if others != 1 else "1 job of another tenant")
    return ", ".join(named[:-1]) + f" and {named[-1]}" if len(named) > 1 else "".join(named)


def queue_lines(queue: Any) -> list[tuple[str, str]]:
    """A PENDING job's place in line (``job.queue``, a :class:`QueueStanding`)
    as (label, text) rows: where it stands and behind whom, whose GPUs it
    waits for, and when it may start and why."""
    if queue is None:
        return []
    kind = f"{queue.gpu_type} GPUs" if queue.gpu_type else "GPUs of any type"
    where = f"{_ordinal(queue.position)} of {queue.of} for {kind}"
    if queue.ahead:
        where += f", behind {_jobs_named(queue.ahead)}"
    rows = [("in line", where)]
    if queue.waiting_for:
        rows.append(("waiting for", _jobs_named(queue.waiting_for)))
    start = queue.estimated_start
    when = (start.replace("T", " ").split(".")[0].rstrip("Z") + " UTC (" + queue.basis + ")"
            if start else queue.basis)
    rows.append(("estimated start", when))
    return rows
