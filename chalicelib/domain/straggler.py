"""Stragglers: ranks that make progress, but slower than their peers (API.md
"Stragglers"), as a pure function of what the scans saw. No AWS.

In synchronous training every rank's step takes the same wall time: the slow
rank is the one its peers wait for, so what tells it apart is the time its
steps spend *outside* collectives. Each rank's helper measures that on its
own monotonic clock (a duration: no clock skew between hosts) and reports
the median of its recent steps as ``step_time_s``, steps that held a
declared pause (a checkpoint, an evaluation) left out.

``slow_score`` = the fastest rank's ``step_time_s`` / this rank's (1.0: as
fast as the fastest; 0.5: twice as slow; None: unknown). A rank is *called*
slow (an episode opens, told once as a ``rank_slow`` event) only when, on
each of at least :data:`MIN_SCANS` consecutive scans spanning at least
:data:`MIN_SUSTAIN_S`, its score was below the job's ``heartbeat.slow_score``
*and* its steps took at least :data:`MIN_EXCESS_S` longer than the
fastest's (and no more than half the scored ranks were: then the fastest is
the outlier, or the work is uneven by design). A scan on which the rank was not live and un-paused (a declared
pause, a checkpoint, silence, exit) or reported no step time does not count
as below: the streak starts again. The episode ends after
:data:`RECOVER_SCANS` consecutive scans at or above the threshold; a later
slowdown is a new episode, a new event. docs/stall-detection.md gives the
reasoning ("Stragglers").

The rule's state is a small JSON object kept in the job's health
(``health.slow``) from one scan to the next::

    {"attempt": 1, "ranks": {"3": {"below": 0, "since": None, "above": 0,
                                    "open": 1, "score": 0.417, "text": "rank 3 ..."}},
     "episodes": {"3": 1}}

``episodes`` counts each rank's episodes over the job's life (so the event
keys ``rank_slow#<rank>#<episode>`` never repeat across attempts); the
per-rank streaks start afresh with each attempt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from .clock import iso, parse_iso

#: the default of ``heartbeat.slow_score``
SLOW_SCORE = 0.7
#: consecutive scans below the threshold before a rank is called slow ...
MIN_SCANS = 3
#: ... spanning at least this long (s) from the first of them
MIN_SUSTAIN_S = 60.0
#: a rank is below only when its steps take at least this much longer (s)
#: than the fastest's: a millisecond-scale difference is noise however large
#: its ratio
MIN_EXCESS_S = 0.02
#: consecutive scans at or above the threshold that end an episode
RECOVER_SCANS = 2
#: the least step time a score divides by (s): a rank that reports 0 (all its
#: time inside collectives) is as fast as the fastest, not infinitely so
FLOOR_S = 0.001
#: the most slow ranks health lists
MAX_LISTED = 64
#: the most ranks one scan may count as below (the slowest first): the rule's
#: state lives in the job's health, an item of at most 400 KB
MAX_BELOW = 256


@dataclass(frozen=True)
class Sample:
    """What one scan knows of one rank: its reported step time and whether
    it counts (live, not paused, not ended)."""
    rank: int
    node_id: str
    step_time_s: float | None
    counts: bool = True


@dataclass(frozen=True)
class Episode:
    """A slow episode that this scan opens: one ``rank_slow`` event."""
    rank: int
    node_id: str
    episode: int
    score: float
    step_time_s: float
    fastest_s: float
    text: str

    @property
    def key(self) -> str:
        return f"rank_slow#{self.rank}#{self.episode}"


@dataclass(frozen=True)
class Judgement:
    state: dict
    slow_ranks: list[int]
    opened: list[Episode] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)


def scores(step_times: dict[int, float | None]) -> dict[int, float | None]:
    """rank -> slow_score: the fastest known step time over the rank's (None
    where the rank's is unknown)."""
    known = [t for t in step_times.values() if t is not None]
    if not known:
        return {r: None for r in step_times}
    fastest = max(min(known), FLOOR_S)
    return {r: None if t is None else round(min(1.0, fastest / max(t, FLOOR_S)), 3)
            for r, t in step_times.items()}


def sentence(rank: int, node_id: str, score: float) -> str:
    """The line every surface shows for a slow rank."""
    ratio = 1.0 / score if score > 0 else float("inf")
    return f"rank {rank} on {node_id} is slow: its steps take {ratio:.1f}× the fastest rank's"


def empty(attempt: int, episodes: dict[str, int] | None = None) -> dict:
    return {"attempt": attempt, "ranks": {}, "episodes": dict(episodes or {})}


def judge(state: dict | None, samples: Iterable[Sample], *, now: datetime, attempt: int,
          threshold: float = SLOW_SCORE, suppressed: bool = False) -> Judgement:
    """One scan of the rule: ``state`` as the last scan left it (None: none
    yet), this scan's ``samples``. ``suppressed``: the collector was blind
    (domain/stall.suppression): nothing advances, nothing opens."""
    prev = state if isinstance(state, dict) else None
    if prev is None or prev.get("attempt") != attempt:
        prev = empty(attempt, (prev or {}).get("episodes"))
    ranks: dict[str, dict[str, Any]] = {k: dict(v) for k, v in prev.get("ranks", {}).items()}
    episodes: dict[str, int] = dict(prev.get("episodes", {}))
    if suppressed:
        new = {"attempt": attempt, "ranks": ranks, "episodes": episodes}
        return Judgement(new, _slow(ranks))
    samples = list(samples)
    counted = {s.rank: s.step_time_s for s in samples if s.counts}
    score = scores(counted)
    known = [t for t in counted.values() if t is not None]
    fastest = min(known) if known else None
    below = _below(counted, score, fastest, threshold)
    opened: list[Episode] = []
    closed: list[int] = []
    seen = {str(s.rank) for s in samples}
    for key in [k for k in ranks if k not in seen]:  # not heard of at all: no streak
        ranks[key].update(below=0, since=None, above=0)
        if ranks[key].get("open") is None:
            del ranks[key]
    for s in samples:
        key = str(s.rank)
        r = ranks.get(key, {"below": 0, "since": None, "above": 0, "open": None})
        sc = score.get(s.rank) if s.counts else None
        t = s.step_time_s
        if sc is None or t is None or fastest is None:
            # not judged this scan (paused, silent, no step time): no streak
            r.update(below=0, since=None, above=0)
        elif s.rank in below:
            r["above"] = 0
            if r["below"] == 0 or r.get("since") is None:
                r["since"] = iso(now)
            r["below"] += 1
            sustained = (now - parse_iso(r["since"])).total_seconds() >= MIN_SUSTAIN_S
            if r.get("open") is None and r["below"] >= MIN_SCANS and sustained:
                n = episodes.get(key, 0) + 1
                episodes[key] = n
                r.update(open=n, score=sc, text=sentence(s.rank, s.node_id, sc))
                opened.append(Episode(s.rank, s.node_id, n, sc, t, fastest,
                                      sentence(s.rank, s.node_id, sc)))
        else:
            r.update(below=0, since=None)
            if r.get("open") is not None:
                r["above"] += 1
                if r["above"] >= RECOVER_SCANS:
                    closed.append(s.rank)
                    r.update(open=None, above=0)
                    r.pop("score", None)
                    r.pop("text", None)
        if r["below"] or r.get("open") is not None or r["above"]:
            ranks[key] = r
        else:
            ranks.pop(key, None)
    new = {"attempt": attempt, "ranks": ranks, "episodes": episodes}
    return Judgement(new, _slow(ranks), opened, closed)


def _below(counted: dict[int, float | None], score: dict[int, float | None],
           fastest: float | None, threshold: float) -> set[int]:
    """The ranks below the threshold this scan, by score and by excess over
    the fastest. More than half the scored ranks below is no straggler: the
    fastest is the outlier (a rank with less work), or the work is uneven by
    design; nobody counts then. At most MAX_BELOW, the slowest."""
    if fastest is None:
        return set()
    out = sorted((sc, r) for r, sc in score.items()
                 if sc is not None and sc < threshold
                 and (counted.get(r) or 0.0) - fastest >= MIN_EXCESS_S)
    scored = sum(1 for sc in score.values() if sc is not None)
    if len(out) * 2 > scored:
        return set()
    return {r for _, r in out[:MAX_BELOW]}


def _slow(ranks: dict[str, dict[str, Any]]) -> list[int]:
    return sorted(int(k) for k, v in ranks.items() if v.get("open") is not None)[:MAX_LISTED]


def open_episode(state: dict | None, rank: int) -> int | None:
    """The episode open for ``rank`` (None: it is not called slow)."""
    return ((state or {}).get("ranks", {}).get(str(rank)) or {}).get("open")


def slow_text(state: dict | None, rank: int) -> str | None:
    """The sentence of the episode open for ``rank`` (None: not called slow)."""
    r = (state or {}).get("ranks", {}).get(str(rank)) or {}
    return r.get("text") if r.get("open") is not None else None


def counts(status: str, paused: bool) -> bool:
    """Whether a rank's step time counts this scan: live and not paused."""
    return status == "live" and not paused
