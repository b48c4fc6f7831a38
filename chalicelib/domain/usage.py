"""What a job's GPU time bought: its ``usage`` (API.md, "Usage and goodput").

A pure function of what the control plane records (no clock is read here:
``now`` is an argument). Each attempt of the job is one :class:`Span`: its
GPUs, its placement and its end, when its first ranks started, its stalls
and, when the ranks' steps are recorded, its first and last step. All but
the steps are in the job's own story (:func:`spans_of`: the events on the
job's item, which reading the job already reads); the steps are not
recorded per attempt yet (the collector keeps each rank's latest beat). Each attempt's
time held, ``GPUs x (placement -> end)`` (a running attempt's up to ``now``),
is cut into parts, in this order, each part of the attempt's time once:

- ``startup``: from placement to the attempt's first step (to its first
  ranks' start when no step is recorded: an uninstrumented job). An attempt
  that ended before any rank started has no startup: all of it is lost to
  what ended it.
- ``stalled``: from a stall's last progress (the stalled rank's last beat
  as the incident recorded it; the detection when none was) to the stall's
  end (its ``recovered`` event, else the attempt's end).
- ``checkpoint``: the declared checkpoint pauses, when recorded.
- the rest: ``productive`` for an attempt that succeeded or still runs; for
  an attempt ended otherwise, lost under what ended it (:data:`CAUSES`:
  ``failed_attempt`` for a rank's failure, ``preempted``, ``node_lost``,
  ``cancelled``, ``stalled``, ``timeout``, ...), except the share a later
  attempt resumed from, which is productive. That share is shown only by the
  ranks' steps: the later attempt's first step ``r`` against this attempt's
  first and last steps ``s0 < s1``, ``(r - s0) / (s1 - s0)`` of the rest
  (clamped to 0..1). Without steps, none of it.

A job with an attempt that has no recorded step is ``estimated``: its
startup is counted to its ranks' start and the rest of a successful attempt
as productive. Everything is counted in GPU-milliseconds (integers) and shown
in whole GPU-seconds, the parts rounded by largest remainder so that
``productive + sum(lost) == gpu_seconds`` exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Sequence

from .clock import parse_iso

#: an attempt's end reason -> the cause its lost time is counted under
#: (an unknown reason counts as a failed attempt)
CAUSES = {"rank_failed": "failed_attempt", "port_in_use": "failed_attempt",
          "node_lost": "node_lost", "agent_lost": "node_lost", "preempted": "preempted",
          "cancelled": "cancelled", "stalled": "stalled", "timeout": "timeout"}
#: the causes that are not an attempt's end
PHASES = ("startup", "stalled", "checkpoint")

Interval = tuple[datetime, datetime | None]


@dataclass(frozen=True)
class Span:
    """One attempt, as usage reads it."""
    attempt: int
    gpus: int
    placed_at: datetime
    #: None while the attempt runs
    ended_at: datetime | None
    #: its end's reason (``succeeded``, ``rank_failed``, ...); read once it ended
    reason: str | None = None
    #: when its first ranks started (None: none did)
    started_at: datetime | None = None
    #: its ranks' first step and when it was made, and its last (None: none recorded)
    first_step: int | None = None
    first_step_at: datetime | None = None
    last_step: int | None = None
    #: (from last progress, to the stall's end or None: the attempt's end)
    stalls: tuple[Interval, ...] = field(default_factory=tuple)
    #: declared checkpoint pauses, (from, to or None: the attempt's end)
    checkpoints: tuple[Interval, ...] = field(default_factory=tuple)


def _ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def _clipped(intervals: Iterable[Interval], lo: int, hi: int) -> list[tuple[int, int]]:
    """The intervals within [lo, hi), in ms, merged and sorted."""
    cut = sorted((max(lo, _ms(a)), min(hi, hi if b is None else _ms(b))) for a, b in intervals)
    out: list[tuple[int, int]] = []
    for a, b in cut:
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _minus(intervals: list[tuple[int, int]], taken: list[tuple[int, int]]) -> int:
    """Length of ``intervals`` outside ``taken`` (both merged and sorted)."""
    total = _length(intervals)
    for a, b in intervals:
        for c, d in taken:
            total -= max(0, min(b, d) - max(a, c))
    return total


def resumed_share(span: Span, later: Sequence[Span]) -> float:
    """The share (0..1) of ``span``'s progress that a later attempt resumed
    from: by the first later attempt with a recorded first step."""
    if span.first_step is None or span.last_step is None or span.last_step <= span.first_step:
        return 0.0
    for s in later:
        if s.first_step is not None:
            share = (s.first_step - span.first_step) / (span.last_step - span.first_step)
            return min(1.0, max(0.0, share))
    return 0.0


def span_parts(span: Span, later: Sequence[Span], now: datetime) -> dict[str, int]:
    """The attempt's GPU-milliseconds by part (``productive`` or a cause),
    summing to its GPUs x its held time exactly."""
    placed = _ms(span.placed_at)
    end = max(placed, _ms(span.ended_at if span.ended_at is not None else now))
    begun = span.first_step_at or span.started_at
    if begun is not None:
        first = min(end, max(placed, _ms(begun)))
    else:  # no rank started: a running attempt is still starting; an ended one lost it all
        first = end if span.ended_at is None else placed
    stalls = _clipped(span.stalls, first, end)
    checkpoints = _clipped(span.checkpoints, first, end)
    stalled, paused = _length(stalls), _minus(checkpoints, stalls)
    rest = end - first - stalled - paused
    parts = {"startup": first - placed, "stalled": stalled, "checkpoint": paused}
    if span.ended_at is None or span.reason == "succeeded":
        parts["productive"] = rest
    else:
        kept = int(rest * resumed_share(span, later))
        cause = CAUSES.get(span.reason or "", "failed_attempt")
        parts["productive"] = kept
        parts[cause] = parts.get(cause, 0) + rest - kept
    return {k: v * span.gpus for k, v in parts.items()}


def _whole_seconds(parts: dict[str, int]) -> dict[str, int]:
    """GPU-ms parts to whole GPU-seconds summing to the rounded total
    (largest remainder; ties by name)."""
    total = round(sum(parts.values()) / 1000)
    floors = {k: v // 1000 for k, v in parts.items()}
    left = total - sum(floors.values())
    for k in sorted(parts, key=lambda k: (-(parts[k] % 1000), k))[:max(0, left)]:
        floors[k] += 1
    return floors


def usage(spans: Sequence[Span], now: datetime) -> dict:
    """The job's ``usage``: ``gpu_seconds``, ``productive_gpu_seconds``,
    ``lost_gpu_seconds`` by cause (only causes with time), ``goodput``
    (productive / held; None when nothing was held) and ``estimated``."""
    ordered = sorted(spans, key=lambda s: s.attempt)
    parts: dict[str, int] = {"productive": 0}
    for i, span in enumerate(ordered):
        for k, v in span_parts(span, ordered[i + 1:], now).items():
            parts[k] = parts.get(k, 0) + v
    whole = _whole_seconds(parts)
    held = sum(whole.values())
    productive = whole.pop("productive")
    return {"gpu_seconds": held, "productive_gpu_seconds": productive,
            "lost_gpu_seconds": {k: v for k, v in sorted(whole.items()) if v > 0},
            "goodput": None if held == 0 else round(productive / held, 4),
            "estimated": any(s.first_step_at is None and s.started_at is not None
                             for s in ordered)}


def spans_of(events: Iterable[dict], gpus: int) -> list[Span]:
    """The spans of a job's attempts, from its own story (domain/events.py:
    the job item's events, served, in any order), each attempt ``gpus`` GPUs
    (its ranks x GPUs per rank: a gang is placed whole). An attempt is its
    ``placed`` event (written with the attempt, at its ``created_at``) to
    its first ``retried`` or ``finished`` event (written with its end, at
    its ``finished_at``, with the end's reason); it started at its
    ``started`` event (its first ranks' start); each ``stalled`` event opens
    a stall at its ``last_heard_at`` (else its time), ended by the attempt's
    next ``recovered`` event (else by the attempt's end)."""
    placed: dict[int, datetime] = {}
    started: dict[int, datetime] = {}
    ended: dict[int, tuple[datetime, str | None]] = {}
    stalls: dict[int, list[list]] = {}
    story = sorted(((parse_iso(e["time"]), e) for e in events
                    if isinstance(e.get("attempt"), int) and e.get("time")),
                   key=lambda te: te[0])
    for at, e in story:
        n, kind = e["attempt"], e.get("type")
        if kind == "placed":
            placed.setdefault(n, at)
        elif kind == "started":
            started.setdefault(n, at)
        elif kind in ("retried", "finished") and n in placed:
            ended.setdefault(n, (at, e.get("reason")))
        elif kind == "stalled":
            since = e.get("last_heard_at")
            stalls.setdefault(n, []).append([parse_iso(since) if since else at, None])
        elif kind == "recovered":
            open_ = [s for s in stalls.get(n, []) if s[1] is None]
            if open_:
                open_[0][1] = at
    return [Span(attempt=n, gpus=gpus, placed_at=at,
                 ended_at=ended[n][0] if n in ended else None,
                 reason=ended[n][1] if n in ended else None,
                 started_at=started.get(n),
                 stalls=tuple((s[0], s[1]) for s in stalls.get(n, [])))
            for n, at in sorted(placed.items())]
