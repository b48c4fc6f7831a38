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

Only live ranks are judged: a rank recorded as exited or stopped is never
stalled. What a rank *is* comes out as a status (:data:`STATUSES`), decided by
the job's ``heartbeat.mode`` (:data:`MODES`) from three kinds of evidence:
beats (silence), the host's samples of the rank's process tree (CPU and I/O:
a silent rank writing at a real rate is ``busy``, a checkpoint, for at most
``max_busy_s`` past the threshold), and collective-arrival markers, which name
the culprit of a hang (:func:`culprit`): the rank that never arrived at the
collective the others are waiting in.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import stacks, verdict
from .clock import plus

#: the least uncertainty of an estimated last beat(): a post's transit time
MIN_BEAT_BAND_S = 0.25

#: ``heartbeat.mode``: ``auto`` judges by beats once any rank of the attempt
#: has beaten (until then nobody is convicted by silence: within
#: ``startup_grace_s`` of the attempt's start its ranks are still
#: ``awaiting_first_beat``, as an instrumented job's are before its first
#: beat; past it, with no beat ever, the job is not instrumented),
#: ``beats`` from the attempt's start, ``process`` by process evidence alone,
#: ``off`` not at all
MODES = ("auto", "beats", "process", "off")
#: what a rank is, as health and the ranks view show it
STATUSES = ("live", "silent", "stalled", "paused", "busy", "waiting", "not_instrumented",
            "exited", "stopped", "awaiting_first_beat")
#: I/O of a rank's process tree at this rate or more is real work (a checkpoint
#: writes hundreds of MB/s; a log line or a heartbeat file is bytes)
BUSY_IO_BPS = 1 << 20
#: a process sample with less CPU (cores) and less I/O than these is idle
IDLE_CPU = 0.02
IDLE_IO_BPS = 4096


def sample_is_busy(proc: dict) -> bool:
    """Whether a process sample shows I/O at a real rate."""
    return (proc.get("io_bps") or 0) >= BUSY_IO_BPS


def sample_is_writing(proc: dict) -> bool:
    """Whether a process sample shows *writes* at a real rate. A sample that
    does not split reads from writes (an older agent) counts all its I/O."""
    w = proc.get("write_bps")
    rate = proc.get("io_bps") if w is None else w
    return (rate or 0) >= BUSY_IO_BPS


#: a rank's process group using at least this much CPU (cores) is spinning
SPIN_CPU = 0.5
#: a rank whose process the host sees stopped (state T: SIGSTOP, a debugger)
#: and that did no work for this long is stalled, whatever its silence, its
#: mode's threshold or ``idle_s`` (issue 44: a rank stopped before its first
#: step read "not instrumented" for minutes, until gloo's timeout made its
#: healthy peers exit and they were blamed); nothing else reads T
STOPPED_S = 30.0


def signature(proc: dict | None) -> str | None:
    """What a silent rank's processes look like: ``spinning`` (running, a core
    or more: a CUDA or NCCL wait, a busy loop), ``sleeping`` (blocked in the
    kernel without CPU: a gloo receive, a lock, a queue), ``io_wait`` (state
    D: a hung filesystem), or None when the sample says neither clearly."""
    if not proc:
        return None
    state, cpu = proc.get("state"), proc.get("cpu") or 0
    if state == "D" and cpu < SPIN_CPU:
        return "io_wait"
    if cpu >= SPIN_CPU:
        return "spinning"
    if state in ("S", "I") and cpu < IDLE_CPU * 5:
        return "sleeping"
    return None


def sample_is_active(proc: dict) -> bool:
    """Whether a process sample shows any work at all (CPU or I/O)."""
    return (proc.get("cpu") or 0) >= IDLE_CPU or (proc.get("io_bps") or 0) >= IDLE_IO_BPS


@dataclass(frozen=True)
class Beat:
    """The collector's record of one rank of one attempt: the one shape of a
    heartbeat from ingest (:func:`received`) through the heartbeat store
    (service/ports.py HeartbeatStore takes and returns it) to the verdict."""
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
    #: "exited" or "stopped" once the attempt recorded it: never judged again
    ended: str | None = None
    #: collector receive time of the latest sample of the rank's process tree
    sampled_at: datetime | None = None
    #: ... of the latest sample showing I/O at a real rate, and showing any work
    io_at: datetime | None = None
    active_at: datetime | None = None
    #: the latest sample itself, for display ({"cpu", "io_bps", "state", ...})
    proc: dict | None = None
    #: the last collective the rank arrived at: its sequence number and name
    arrived_seq: int | None = None
    arrived_name: str | None = None
    #: ... of the latest sample showing *writes* at a real rate (a checkpoint)
    wrote_at: datetime | None = None
    #: when the rank's last long silence (its agent saw no beat() for more than
    #: two intervals) ended, and how long it lasted (host clock)
    resumed_at: datetime | None = None
    resumed_gap_s: float | None = None
    #: the sender's clock when it posted, and why a declared pause was taken:
    #: stored for diagnosis, never judged, so not read back
    sent_at: datetime | None = None
    pause_reason: str | None = None
    #: the median of the rank's recent steps' time outside collectives (s, on
    #: its own monotonic clock), as its last beat reported it (straggler.py)
    step_time_s: float | None = None


def received(entry: dict, *, node_id: str, now: datetime,
             sent_at: datetime | None = None) -> Beat:
    """One entry of a heartbeat post (``ranks[i]`` of api/schemas.py
    HEARTBEATS, validated) as the collector records it: every time on the
    collector's clock ``now``, the receive time. The agent's durations (the
    beat's age, a pause's remaining time, a silence's end) are counted back
    or forward from ``now``; its ``sent_at`` is kept beside them for
    diagnosis only.

    An entry with only a declared pause or a process sample is not a beat:
    its ``heard_at`` is None, and storing it leaves the rank's last beat as
    it was. A beat is work done (``active_at``)."""
    proc, pause = entry.get("proc"), entry.get("pause")
    if proc is not None and "stack" in proc:
        proc = {**proc, "stack": stacks.bounded(proc["stack"])}
    resumed, collective = entry.get("resumed"), entry.get("collective")
    is_beat = "step" in entry or (pause is None and proc is None)
    return Beat(
        entry["rank"], node_id,
        heard_at=now if is_beat else None,
        step=entry.get("step"),
        beat_at=plus(now, -entry["age_s"]) if "age_s" in entry else None,
        paused_until=None if pause is None else plus(now, pause["remaining_s"]),
        pause_reason=None if pause is None else pause.get("reason", "paused"),
        proc=proc,
        sampled_at=None if proc is None else now,
        io_at=now if proc is not None and sample_is_busy(proc) else None,
        wrote_at=now if proc is not None and sample_is_writing(proc) else None,
        active_at=now if is_beat or (proc is not None and sample_is_active(proc)) else None,
        resumed_at=None if resumed is None else plus(now, -resumed["age_s"]),
        resumed_gap_s=None if resumed is None else resumed["gap_s"],
        arrived_seq=None if collective is None else collective["seq"],
        arrived_name=None if collective is None else collective.get("name"),
        step_time_s=entry.get("step_time_s") if is_beat else None,
        sent_at=sent_at)


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
    status: str = "live"
    #: the beat this view was made from (evidence, markers)
    beat: Beat | None = None


@dataclass(frozen=True)
class Verdict:
    ranks: list[RankView]
    first: RankView | None
    co_first: list[RankView]
    suspect_node: str | None
    jitter_s: float
    #: the one name for the rank that stopped first, with its evidence
    culprit: dict | None = None
    #: False once mode ``auto`` has heard no beat from any rank of the attempt
    #: for its whole startup grace; None while the grace lasts (not known
    #: yet: an instrumented job's first beat may still come)
    instrumented: bool | None = True

    @property
    def stalled(self) -> list[RankView]:
        return [r for r in self.ranks if r.stalled]

    def by_status(self) -> dict[str, list[int]]:
        """Ranks by status, every status but ``live`` (compact for health)."""
        out: dict[str, list[int]] = {}
        for r in sorted(self.ranks, key=lambda r: r.rank):
            if r.status != "live":
                out.setdefault(r.status, []).append(r.rank)
        return out


def _wrote_at(b: Beat) -> datetime | None:
    """The latest real-rate writes of a rank; an agent whose samples do not
    split reads from writes (no ``write_bps``) has all its I/O counted."""
    if b.wrote_at is not None or (b.proc is not None and "write_bps" in b.proc):
        return b.wrote_at
    return b.io_at


def _fresh(t: datetime | None, now: datetime, window_s: float) -> bool:
    return t is not None and (now - t).total_seconds() <= window_s


def _spinning(b: Beat, now: datetime, window_s: float) -> bool:
    return (_fresh(b.sampled_at, now, window_s) and b.proc is not None
            and (b.proc.get("cpu") or 0) >= SPIN_CPU)


def _stack(b: Beat) -> dict | None:
    return b.proc.get("stack") if b.proc else None


def _stopped(b: Beat) -> bool:
    return b.proc is not None and b.proc.get("state") in ("T", "t")


def _stopped_for(b: Beat, now: datetime, started_at: datetime, fresh_s: float) -> float:
    """How long ``b``'s rank has been stopped: its latest sample (within
    ``fresh_s``) reads T, since its last sign of work; 0 when it is not."""
    if not _stopped(b) or not _fresh(b.sampled_at, now, fresh_s):
        return 0.0
    return (now - (b.active_at or b.heard_at or started_at)).total_seconds()


def _waits_in_collective(b: Beat) -> bool:
    return stacks.waiting_in(_stack(b)) is not None


def _waits_for(b: Beat, holder: Beat) -> bool:
    """Whether silent ``b`` may be waiting on ``holder`` (a peer in a pause, or
    busy): it arrived at a collective the holder has not reached, or its
    stack is inside one; with neither marks nor a stack nothing says it is
    not, and the holder's own bound (its pause's, or max_busy_s) limits it."""
    if b.arrived_seq is not None and holder.arrived_seq is not None:
        return b.arrived_seq > holder.arrived_seq
    if _stack(b) is not None:
        return _waits_in_collective(b)
    return True


def _idle(b: Beat, now: datetime, started_at: datetime, idle_s: float,
          startup_grace_s: float) -> bool:
    """Whether the host's samples show a rank doing no work for ``idle_s``."""
    if b.sampled_at is None:
        return False
    quiet = (now - (b.active_at or started_at)).total_seconds()
    return quiet > idle_s and (b.active_at is not None or quiet > startup_grace_s)


def view(beats: list[Beat], *, now: datetime, started_at: datetime, threshold_s: float,
         startup_grace_s: float, mode: str = "beats", interval_s: float | None = None,
         max_busy_s: float = 0.0, idle_s: float | None = None,
         finishing: bool = False) -> list[RankView]:
    """Every rank, silent longest first, ties by rank ascending, each with its
    status under ``mode`` (see :data:`MODES`).

    Evidence of work comes from the host's samples: a rank is doing I/O "now"
    when its latest busy sample (reads or writes) is within two intervals. A
    rank that would be stalled by silence but does I/O now is ``busy``.
    Beyond that, only *writes* count as a sign of life: a silent rank is
    excused (shown ``silent``) until its own last write, or the last write of
    any silent rank of its job (ranks wait in a checkpoint's barrier for the
    slowest writer), is ``threshold_s`` old (at least two intervals). Reads
    do not extend it: a data loader keeps prefetching for seconds after its
    rank hung. Every excuse ends ``max_busy_s`` past the threshold.

    A job some rank of which exited 0 (``finishing``) is shutting down: its
    other ranks go quiet in their last collective, the process group's
    teardown and the interpreter's exit, which a loaded host stretches past
    a short threshold. A silent rank is excused then (``silent``) until its
    silence is ``startup_grace_s`` past the threshold, the grace a rank has
    to start, given to it to end.

        A whole job going quiet and coming back is a pause, not a hang: a silent
    rank is also excused while another rank of the job resumed within the
    last two intervals from a silence (more than two intervals without a
    beat) that began no later than this rank's own last beat (within one
    interval): ranks resume one agent visit apart, and a lost post delays one
    by another interval. A hang inside a pause is convicted two intervals
    after the last of its peers came back.
    """
    interval = interval_s if interval_s is not None else threshold_s
    fresh_s = 2 * interval
    # real writes are a sign of life as good as a beat: silence since the last
    # of them must pass the threshold too (a rank that wrote its shard early
    # waits in the checkpoint's barrier for the others, without I/O)
    io_s = max(fresh_s, threshold_s)
    instrumented = mode != "auto" or any(b.heard_at is not None for b in beats)
    rows = []
    for b in beats:
        since = b.heard_at or started_at
        silence = (now - since).total_seconds()
        paused = b.paused_until is not None and now <= b.paused_until
        if b.ended:
            would = False
        elif paused:
            would = False
        elif b.heard_at is None:
            would = silence > threshold_s and silence > startup_grace_s
        else:
            would = silence > threshold_s  # strictly: at the threshold is not stalled
        rows.append((b, silence, paused, would))
    within_busy = threshold_s + max_busy_s
    job_writing = any(would and _fresh(_wrote_at(b), now, io_s) and silence <= within_busy
                      for b, silence, paused, would in rows)
    # whole-job silences that just ended: (when the silence began, when it ended)
    resumed = [(b.resumed_at - timedelta(seconds=b.resumed_gap_s), b.resumed_at)
               for b, silence, paused, would in rows
               if not b.ended and not would and b.resumed_at is not None
               and b.resumed_gap_s is not None and b.resumed_gap_s > fresh_s
               and _fresh(b.resumed_at, now, fresh_s)]

    def resuming(b: Beat) -> bool:
        last = b.beat_at or b.heard_at
        return last is not None and any(
            (last - began).total_seconds() >= -interval for began, _ in resumed)

    # peers a silent rank may be waiting on: in a declared pause, or silent
    # themselves and visibly busy, until their excuse for being busy would
    # end: I/O at a real rate, or a core of CPU where most silent ranks sleep
    # (gloo waits sleep; where most spin, spinning is how NCCL waits)
    silent = [b for b, silence, paused, would in rows if not b.ended and silence > fresh_s]
    spinning = [b for b in silent if _spinning(b, now, fresh_s)]
    cpu_tells = 2 * len(spinning) < sum(1 for b in silent if _fresh(b.sampled_at, now, fresh_s))
    holders = [b for b, silence, paused, would in rows if not b.ended and (
        paused or (fresh_s < silence <= within_busy and (
            _fresh(b.io_at, now, fresh_s) or (cpu_tells and any(b is x for x in spinning)))))]
    # an uninstrumented job (mode auto, no beat yet): hung when its ranks have
    # done no work for idle_s and the host shows why (a stopped rank, or
    # peers waiting inside a collective)
    idle = idle_s if idle_s is not None else threshold_s
    hung = set() if instrumented else {
        b.rank for b, silence, paused, would in rows
        if not b.ended and not paused and _idle(b, now, started_at, idle, startup_grace_s)}
    in_collective = {b.rank for b, *_ in rows if b.rank in hung and _waits_in_collective(b)}
    loose = hung - in_collective
    out = []
    for b, silence, paused, would in rows:
        stalled = False
        if b.ended:
            status = b.ended
        elif paused:
            status = "paused"
        elif mode == "off":
            status = "live" if silence <= fresh_s else "silent"
        elif _stopped_for(b, now, started_at, fresh_s) > max(STOPPED_S, fresh_s):
            stalled, status = True, "stalled"
        elif mode == "process":
            idle = idle_s if idle_s is not None else threshold_s
            active = b.active_at or b.heard_at
            quiet = (now - (active or started_at)).total_seconds()
            stalled = quiet > idle and (active is not None or quiet > startup_grace_s)
            status = ("stalled" if stalled else "busy" if _fresh(b.io_at, now, fresh_s)
                      else "live" if quiet <= fresh_s else "silent")
        elif not instrumented:
            # the loose ranks hang while their peers wait; every one hangs
            # when all wait (the one they wait for lies out of sight)
            stalled = b.rank in hung and (_stopped(b) or (bool(in_collective) and (
                b.rank in loose or not loose)))
            status = ("stalled" if stalled else "waiting" if b.rank in in_collective
                      else "awaiting_first_beat" if silence <= startup_grace_s
                      else "not_instrumented")
        elif would and silence <= within_busy and _fresh(b.io_at, now, fresh_s):
            status = "busy"
        elif would and silence <= within_busy and (_fresh(_wrote_at(b), now, io_s) or job_writing):
            status = "silent"
        elif would and any(h is not b and _waits_for(b, h) for h in holders):
            status = "waiting"
        elif would and finishing and silence <= threshold_s + startup_grace_s:
            status = "silent"
        elif would and resumed and resuming(b):
            status = "silent"
        elif would:
            stalled, status = True, "stalled"
        else:
            status = "live" if b.heard_at is not None and silence <= fresh_s else "silent"
        out.append(RankView(b.rank, b.node_id, b.heard_at, silence, b.step, stalled, paused,
                            b.beat_at, status, b))
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
          startup_grace_s: float, interval_s: float, mode: str = "beats",
          max_busy_s: float = 0.0, idle_s: float | None = None,
          finishing: bool = False, band_floor_s: float | None = None) -> Verdict:
    """The ranks' view and the verdict on them. ``band_floor_s``: the band an
    open incident's verdict was reached with (health.incident_band): the
    band never narrows while it is open. Jitter is measured on ranks still
    beating; once a whole job is silent there are none, and a band of 0
    made the rank whose last post happened to land first "the one that
    went quiet first" of ranks the scan had found indistinguishable."""
    ranks = view(beats, now=now, started_at=started_at, threshold_s=threshold_s,
                 startup_grace_s=startup_grace_s, mode=mode, interval_s=interval_s,
                 max_busy_s=max_busy_s, idle_s=idle_s, finishing=finishing)
    instrumented = known_instrumented(beats, now=now, started_at=started_at,
                                      startup_grace_s=startup_grace_s, mode=mode)
    stalled = [r for r in ranks if r.stalled]
    live = [r for r in ranks if not r.stalled and r.beat and not r.beat.ended]
    jitter = jitter_band([b for b in beats if not b.ended], interval_s, live)
    if band_floor_s is not None:
        jitter = max(jitter, band_floor_s)
    if not stalled:
        return Verdict(ranks, None, [], None, jitter, None, instrumented)
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
                   and r.beat_at is not None and r.status not in verdict.OUT
                   and (r.beat_at - first.beat_at).total_seconds() <= band]
        # best guess first: the earliest last beat(), then the lowest step
        co.sort(key=lambda r: (r.beat_at or r.last_heard_at,
                               r.step if r.step is not None else -1, r.rank))
    band = max(jitter, MIN_BEAT_BAND_S) if first.beat_at is not None else jitter
    named = verdict.decide(ranks, first, co, band_s=band, signature=signature)
    # a node whose ranks all went quiet together is a suspect only when
    # nothing better than silence named the rank
    suspect = suspect_node(ranks, interval_s) if named["by"] == "silence" else None
    return Verdict(ranks, first, co, suspect, jitter, named, instrumented)


def known_instrumented(beats: list[Beat], *, now: datetime, started_at: datetime,
                       startup_grace_s: float, mode: str) -> bool | None:
    """Whether the attempt is instrumented, as far as the server can know:
    True once any rank beat (or the mode judges without beats); in mode
    ``auto`` with no beat yet, None while the attempt is within its
    ``startup_grace_s`` (an instrumented job's ranks are still starting:
    "waiting for the first beat"), False after it (no beat ever: "not
    instrumented"). The judgement itself (who may be convicted by silence)
    does not wait on this: no beat, nobody convicted by silence."""
    if mode != "auto" or any(b.heard_at is not None for b in beats):
        return True
    return None if (now - started_at).total_seconds() <= startup_grace_s else False


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

    Common-mode silence is more often the collector than the ranks: if no scan
    ran for over two periods (``previous_scan_at`` is when the last one ended:
    the collector paused, not merely busy with a long scan), or nothing at all
    reached the collector in the window (no heartbeat of any job and no node calling in:
    the ingest path is down), silence says nothing about ranks. Node calls
    count, so one job hanging whole on a quiet cluster is still convicted.
    """
    if previous_scan_at is not None:
        lag = (now - previous_scan_at).total_seconds()
        if lag > 2 * period_s:
            return (f"collector paused: {lag:.1f}s since the previous scan ended "
                    f"(period {period_s:g}s)")
    if latest_ingest_at is None or (now - latest_ingest_at).total_seconds() > window_s:
        return (f"nothing reached the collector in the last {window_s:g}s "
                "(no heartbeat, no node call): ingest looks down")
    return None
