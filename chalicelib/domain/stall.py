"""Stall detection, as pure functions of what the collector received.

Silence is the collector's clock minus the collector's receive time: a
sender's clock never decides liveness. A rank is stalled when its silence is
strictly greater than the threshold; a rank never heard from counts from its
attempt's start and is not stalled before ``startup_grace_s`` has passed; a
declared pause (``with pause(...)`` in the training script) does not count as
silence until its bound passes. The first stalled rank is the one silent
longest, ties by rank; ranks whose last beat lies within one measured jitter
band of it are reported beside it as ``co_first``, because the order inside
that band is noise.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime

#: the least uncertainty of an estimated last beat(): a post's transit time
MIN_BEAT_BAND_S = 0.25


@dataclass(frozen=True)
class Beat:
    """The collector's record of one rank of one attempt."""
    rank: int
    node_id: str
    heard_at: datetime | None = None       # collector receive time of the last beat
    prev_heard_at: datetime | None = None  # and of the one before (for jitter)
    step: int | None = None
    paused_until: datetime | None = None   # collector time a declared pause ends
    #: when the rank last called beat(), estimated as the receive time minus the
    #: age the agent measured on its host's monotonic clock (never a wall clock);
    #: never later than heard_at, so it cannot make a rank look alive
    beat_at: datetime | None = None


@dataclass(frozen=True)
class RankView:
    rank: int
    node_id: str
    last_heard_at: datetime | None
    silence_s: float
    step: int | None
    stalled: bool
    paused: bool
    beat_at: datetime | None = None


@dataclass(frozen=True)
class Verdict:
    ranks: list[RankView]
    first: RankView | None
    co_first: list[RankView]
    suspect_node: str | None
    jitter_s: float

    @property
    def stalled(self) -> list[RankView]:
        return [r for r in self.ranks if r.stalled]


def view(beats: list[Beat], *, now: datetime, started_at: datetime, threshold_s: float,
         startup_grace_s: float) -> list[RankView]:
    """Every rank, silent longest first, ties by rank ascending."""
    out = []
    for b in beats:
        since = b.heard_at or started_at
        silence = (now - since).total_seconds()
        paused = b.paused_until is not None and now <= b.paused_until
        if paused:
            stalled = False
        elif b.heard_at is None:
            stalled = silence > threshold_s and silence > startup_grace_s
        else:
            stalled = silence > threshold_s  # strictly: at the threshold is not stalled
        out.append(RankView(b.rank, b.node_id, b.heard_at, silence, b.step, stalled, paused,
                            b.beat_at))
    return sorted(out, key=lambda r: (-r.silence_s, r.rank))


def jitter_band(beats: list[Beat], interval_s: float,
                healthy: list[RankView] | None = None) -> float:
    """How far apart beats of healthy ranks land. Within this band, which rank
    went quiet first cannot be told.

    With two receive times per rank: the 90th percentile of how far each
    rank's last gap strayed from the interval. With one (what the collector
    stores): how far the most silent healthy rank is past one interval, since
    a healthy rank is heard at least once an interval but for jitter.
    """
    deviations = sorted(abs((b.heard_at - b.prev_heard_at).total_seconds() - interval_s)
                        for b in beats if b.heard_at and b.prev_heard_at)
    if not deviations:
        silences = [r.silence_s for r in healthy or () if r.last_heard_at is not None]
        return max(0.0, max(silences) - interval_s) if silences else 0.0
    if len(deviations) == 1:
        return deviations[0]
    return statistics.quantiles(deviations, n=10, method="inclusive")[-1]


def judge(beats: list[Beat], *, now: datetime, started_at: datetime, threshold_s: float,
          startup_grace_s: float, interval_s: float) -> Verdict:
    ranks = view(beats, now=now, started_at=started_at, threshold_s=threshold_s,
                 startup_grace_s=startup_grace_s)
    stalled = [r for r in ranks if r.stalled]
    jitter = jitter_band(beats, interval_s, [r for r in ranks if not r.stalled])
    if not stalled:
        return Verdict(ranks, None, [], None, jitter)
    first = stalled[0]
    co = []
    if first.last_heard_at is not None:
        # receive times only say when a rank's beat was *posted*: within one
        # posting interval (plus jitter) the order of stops is not known
        co = [r for r in stalled[1:] if r.last_heard_at is not None
              and (r.last_heard_at - first.last_heard_at).total_seconds() <= jitter]
        if first.beat_at is not None:
            # with the agents' measured ages, any rank whose last beat() came no
            # later than the first's (within the estimate's own band) is a rival,
            # stalled or not yet: the culprit's last post may simply have arrived
            # later than the beats of ranks that stopped after it
            band = max(jitter, MIN_BEAT_BAND_S)
            co += [r for r in ranks if r is not first and r not in co
                   and r.beat_at is not None
                   and (r.beat_at - first.beat_at).total_seconds() <= band]
        # best guess first: the earliest last beat(), then the lowest step
        co.sort(key=lambda r: (r.beat_at or r.last_heard_at,
                               r.step if r.step is not None else -1, r.rank))
    return Verdict(ranks, first, co, suspect_node(ranks, interval_s), jitter)


def suspect_node(ranks: list[RankView], interval_s: float) -> str | None:
    """A node all of whose ranks went silent within one interval of each other:
    more likely the host (or its agent) than one rank."""
    by_node: dict[str, list[RankView]] = {}
    for r in ranks:
        by_node.setdefault(r.node_id, []).append(r)
    suspects = []
    for node, rs in by_node.items():
        heard = [r.last_heard_at for r in rs if r.stalled and r.last_heard_at is not None]
        if len(rs) < 2 or len(heard) < len(rs):
            continue
        if (max(heard) - min(heard)).total_seconds() <= interval_s:
            suspects.append((min(heard), node))
    return min(suspects)[1] if suspects else None


def suppression(*, now: datetime, previous_scan_at: datetime | None, period_s: float,
                latest_ingest_at: datetime | None, window_s: float) -> str | None:
    """Why this scan must convict nobody, or None.

    Common-mode silence is more often the collector than the ranks: if the scan
    itself ran late (the collector paused), or nothing at all reached the
    collector in the window (no heartbeat of any job and no node calling in:
    the ingest path is down), silence says nothing about ranks. Node calls
    count, so one job hanging whole on a quiet cluster is still convicted.
    """
    if previous_scan_at is not None:
        lag = (now - previous_scan_at).total_seconds()
        if lag > 2 * period_s:
            return f"collector paused: {lag:.1f}s since the previous scan (period {period_s:g}s)"
    if latest_ingest_at is None or (now - latest_ingest_at).total_seconds() > window_s:
        return (f"nothing reached the collector in the last {window_s:g}s "
                "(no heartbeat, no node call): ingest looks down")
    return None
