"""A job's health: the stall scan's view of its current attempt.

The one home of the record the API shows as a job's ``health`` (API.md, the
``JobHealth`` schema of docs/openapi.yaml): its members (:class:`Health`),
how a job's first one is made, what the scan's verdict makes of it, and how
an incident is cleared (a new attempt, a false alarm) or frozen (the job
ended). It stays a plain JSON object: it is stored and shown as it is.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from .clock import iso
from .stall import Verdict
from .threshold import threshold_s
from .verdict import MAX_LISTED, by_exit

if TYPE_CHECKING:
    from .spec import JobSpec

#: the most co_first entries a record keeps (``co_first_count`` says how many)
MAX_CO_FIRST = 8


class Health(TypedDict):
    """The members of a job's health, every one always present."""
    #: OK (judged, heard from), STALLED (an incident open, or what ended the
    #: job), UNKNOWN (not judged yet, not instrumented, or ended otherwise)
    status: str
    threshold_s: float
    #: the open incident: the rank that stopped first, its last receive time,
    #: when the scan convicted it and how long after that time
    first_stalled_rank: int | None
    last_heard_at: str | None
    detected_at: str | None
    detection_s: float | None
    #: ranks the first cannot be told apart from by silence ({rank,
    #: last_heard_at, step, beat_at}; the first MAX_CO_FIRST of
    #: ``co_first_count``), and a node all of whose ranks went quiet together
    #: (only when nothing but silence names a rank)
    co_first: list[dict]
    co_first_count: int
    suspect_node: str | None
    #: the one answer to "which rank stopped", what every surface shows
    #: first (domain/verdict.py): the rank or a tie, its node, by what
    #: evidence, how sure, and the sentence people read; kept once the job ends
    verdict: dict | None
    #: as of the last scan: its stalled ranks, every rank not live by status
    #: (each list the first MAX_LISTED ranks, the counts whole), whether mode
    #: auto has heard any beat, why it convicted nobody
    stalled_ranks: list[int]
    stalled_count: int
    ranks_by_status: dict[str, list[int]]
    status_counts: dict[str, int]
    instrumented: bool | None
    suppressed: str | None
    #: incidents whose culprit beat again
    false_alarms: int
    #: when the job ended and its health stopped changing
    frozen_at: str | None
    #: the ranks called slow now (domain/straggler.py), and the straggler
    #: rule's state from one scan to the next
    slow_ranks: list[int]
    slow: dict | None


#: every member of a job's health
FIELDS = tuple(Health.__annotations__)

#: an incident's members and what they are when none is open
_NO_INCIDENT: dict[str, Any] = {
    "first_stalled_rank": None, "last_heard_at": None, "detected_at": None,
    "stalled_ranks": [], "stalled_count": 0, "co_first": [], "co_first_count": 0,
    "suspect_node": None, "detection_s": None, "verdict": None, "ranks_by_status": {},
    "status_counts": {}, "instrumented": None}


def initial_health(spec: JobSpec, scans_per_hour: float) -> dict:
    """A new job's health (``spec`` with its defaults filled): not judged yet,
    its threshold fixed (domain/threshold.py) for every attempt."""
    hb = spec.heartbeat
    return dict(Health(
        status="UNKNOWN",
        threshold_s=float(threshold_s(spec.ranks, scans_per_hour, hb.interval_s,
                                      hb.miss_probability,
                                      hb.false_positive_budget_per_hour)),
        first_stalled_rank=None, last_heard_at=None, detected_at=None, stalled_ranks=[],
        stalled_count=0, co_first=[], co_first_count=0, suspect_node=None, detection_s=None,
        false_alarms=0, suppressed=None, verdict=None, ranks_by_status={}, status_counts={},
        instrumented=None, frozen_at=None, slow_ranks=[], slow=None))


def clear_incident(health: dict) -> dict:
    """Health with no incident open (a new attempt, or a false alarm over);
    the threshold and the false-alarm count stay."""
    return {**health, **_NO_INCIDENT, "status": "UNKNOWN", "suppressed": None}


def frozen_health(health: dict, at: str, to_terminal: bool, exit_: dict | None,
                  node_id: str | None = None) -> dict:
    """Health once the attempt ended. A new attempt to come: cleared. The job
    finished: frozen as the last scan left it, stamped ``frozen_at``: a job
    that stalled stays STALLED with its verdict (the incident is history, not
    UNKNOWN), unless every rank went on to succeed; a healthy one stays OK. A rank's failure that ended it is the
    verdict when no stall named one (``node_id``: the failed rank's node)."""
    if not to_terminal:  # no rank of the next attempt is slow yet
        return {**clear_incident(health), "slow_ranks": []}
    exit_ = exit_ or {}
    reason = exit_.get("reason")
    # a job whose every rank finished its work was not hung, whatever a scan said
    stalled = reason == "stalled" or (health.get("status") == "STALLED" and reason != "succeeded")
    named = health.get("verdict")
    if named is None and exit_.get("reason") == "rank_failed" and exit_.get("rank") is not None:
        named = by_exit(exit_["rank"], exit_.get("exit_code"), node_id)
    status = "STALLED" if stalled else "OK" if reason == "succeeded" else health.get("status")
    return {**health, "status": status or "UNKNOWN",
            "suppressed": None, "frozen_at": at, "verdict": named}


# -- what a scan's verdict makes of it -----------------------------------------
def judged(health: dict, verdict: Verdict, suppressed: str | None) -> dict:
    """``health`` with this scan's view of the ranks (its status not decided
    yet: :func:`watched`, :func:`convicted` or :func:`followed`)."""
    by_status = verdict.by_status()
    stalled = [r.rank for r in verdict.stalled]
    return {**health, "suppressed": suppressed,
            "stalled_ranks": stalled[:MAX_LISTED], "stalled_count": len(stalled),
            "ranks_by_status": {s: ranks[:MAX_LISTED] for s, ranks in by_status.items()},
            "status_counts": {s: len(ranks) for s, ranks in by_status.items()},
            "instrumented": verdict.instrumented}


def watched(health: dict, verdict: Verdict) -> dict:
    """No incident: OK once any rank was heard and the job is instrumented."""
    heard = any(r.last_heard_at for r in verdict.ranks)
    return {**health, "status": "OK" if heard and verdict.instrumented else "UNKNOWN"}


def convicted(health: dict, verdict: Verdict, now: datetime) -> dict:
    """A new incident: ``verdict.first`` stopped first (it must be set)."""
    first = verdict.first
    if first is None:
        raise ValueError("a verdict without a stalled rank convicts nobody")
    since = first.last_heard_at
    return {
        **health,
        "status": "STALLED", "first_stalled_rank": first.rank,
        "last_heard_at": since and iso(since), "detected_at": iso(now),
        "detection_s": None if since is None else round((now - since).total_seconds(), 3),
        "co_first": [{"rank": r.rank, "last_heard_at": r.last_heard_at and iso(r.last_heard_at),
                      "step": r.step, "beat_at": r.beat_at and iso(r.beat_at)}
                     for r in verdict.co_first[:MAX_CO_FIRST]],
        "co_first_count": len(verdict.co_first),
        "suspect_node": verdict.suspect_node,
        "verdict": verdict.culprit,
    }


def culprit_beat_again(health: dict, verdict: Verdict) -> bool:
    """Whether the open incident's culprit (the rank its verdict names, else
    the first stalled) was heard after it was convicted."""
    named = (health.get("verdict") or {}).get("rank")
    culprit = named if named is not None else health.get("first_stalled_rank")
    detected = health.get("detected_at")
    return any(r.rank == culprit and r.last_heard_at and detected
               and iso(r.last_heard_at) > detected for r in verdict.ranks)


def followed(health: dict, verdict: Verdict) -> dict:
    """An open incident, one scan later. Its culprit beat again: a false
    alarm, counted, and the job is healthy again. Else the incident stays,
    its culprit's name sharpened by the posts that landed since."""
    if culprit_beat_again(health, verdict):
        return {**clear_incident(health), "status": "OK",
                "false_alarms": int(health.get("false_alarms") or 0) + 1}
    if verdict.culprit is not None:
        return {**health, "verdict": verdict.culprit}
    return health


def compacted(health: dict) -> dict:
    """``health`` cut to what must survive when the whole record does not fit
    its store: the status, the incident's rank and times, the counts, and the
    verdict's rank, node, kind of evidence and sentence; no rank lists, no
    stacks (GET /ranks still shows every rank)."""
    named = health.get("verdict")
    slim = None if not named else {
        **{k: named.get(k) for k in ("rank", "ranks_count", "node_id", "by", "confidence",
                                     "text")},
        "ranks": [] if named.get("rank") is None else [named["rank"]],
        "stack": None, "stacks": [],
        # the band its later scans keep (incident_band)
        "evidence": {k: v for k, v in (named.get("evidence") or {}).items() if k == "band_s"}}
    return {**health, "stalled_ranks": [], "ranks_by_status": {}, "co_first": [],
            "verdict": slim}


def incident_band(health: dict) -> float | None:
    """The band (s) the open incident's verdict by silence was reached with,
    which later scans of it keep as their least (stall.judge's band_floor_s);
    None without one."""
    named = health.get("verdict") or {}
    if health.get("status") != "STALLED" or health.get("frozen_at") or named.get("by") != "silence":
        return None
    band = (named.get("evidence") or {}).get("band_s")
    return None if band is None else float(band)


def incident(health: dict) -> dict:
    """What the job's ``stalled`` event records of the incident ``health``
    opens: the verdict's words, its rank (None on a tie) and ranks, and the
    first stalled rank's last beat, where its stalled time starts
    (domain/usage.py)."""
    named = health.get("verdict") or {}
    rank = named.get("rank") if named else health.get("first_stalled_rank")
    return {"reason": named.get("text") or f"rank {rank} stalled first", "rank": rank,
            "node_id": named.get("node_id"), "ranks": named.get("ranks"), "by": named.get("by"),
            "stacks": named.get("stacks") or None,
            "co_first": [c.get("rank") for c in health.get("co_first") or []] or None,
            "suspect_node": health.get("suspect_node"),
            "last_heard_at": health.get("last_heard_at")}
