"""A job's story: the events written with its transitions.

Every event is stored in the same conditional write (or transaction) as the
transition it tells of, as one entry of a map on the job's or the attempt's
item, under a key that names the occurrence. A repeated report or a retried
write therefore sets the same key again (``if_not_exists``: the first time
stays), and a transition that loses its condition writes no event at all.

Job item keys: ``created``, ``waiting#<attempt>#<reason hash>``,
``placed#<attempt>``, ``started#<attempt>``, ``cancel_requested``,
``stalled#<incident>``, ``recovered#<incident>``, ``retried#<attempt>``,
``finished``.
Attempt item keys: ``<kind>#<exit code>#<ranks hash>`` for each report of
ranks that started, exited or stopped (one per node report, so an attempt holds
about as many as it has nodes). They are the attempt's progress
(domain/attempts.reported): their ``ranks`` are stored as runs
(``[[0, 1023]]``) and served as the ranks themselves. A ``rank_stopped``
event may carry ``stacks``, ``[{"rank", "where", "frames"}]``: where each rank
was when its agent took its stack, just before SIGTERM (a cancel or a stall
restart).
"""
from __future__ import annotations

import hashlib
from datetime import datetime

from .attempts import LOST, PORT_TAKEN, RANK_EVENTS, from_runs, rank_runs
from .clock import iso, parse_iso
from .stacks import where
from .verdict import span

#: order of events that carry the same time (one transaction writes several)
_ORDER = {"created": 0, "waiting": 1, "preempting": 1, "placed": 2, "rank_started": 3, "started": 4,
          "cancel_requested": 5, "stalled": 6, "recovered": 6, "rank_slow": 6, "rank_exited": 7, "rank_stopped": 7,
          "retried": 8, "finished": 9}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def event(kind: str, at: datetime, *, attempt: int | None = None,
          reason: str | None = None, from_: str | None = None, **details) -> dict:
    """An event as stored and served: type, time, attempt, reason, details,
    and the state a move left (``from``, which the tenant's feed tells)."""
    out = {"type": kind, "time": iso(at), "attempt": attempt, "reason": reason,
           "from": from_, **details}
    return {k: v for k, v in out.items() if v is not None}


def placed(at: datetime, attempt: int, ranks_by_node: dict[str, list[int]]) -> dict:
    """The event of a placement: its nodes, each with its ranks as a span
    (``{"node-1": "0-1023"}``, a few KB at 65,536 ranks)."""
    n = len(ranks_by_node)
    return event("placed", at, attempt=attempt,
                 reason=f"placed on {n} node{'s' if n != 1 else ''}",
                 nodes={node: span(ranks, max_runs=len(ranks))
                        for node, ranks in ranks_by_node.items()})


def attempt_end(at: datetime, attempt: int, state: str, exit_: dict | None,
                from_: str | None = None) -> tuple[str, dict]:
    """(key, event) of an attempt's end: ``finished`` when the job ends with it
    (``state`` terminal), else ``retried#<attempt>``; either carries the end's
    reason, its first failed rank and node, the retry rules' ``decision``
    (domain/retry.py: why the next attempt is made, or why none is), and the
    state it left (``from``)."""
    exit_ = exit_ or {}
    details = {"reason": exit_.get("reason"), "rank": exit_.get("rank"),
               "node_id": exit_.get("node_id"), "decision": exit_.get("decision"),
               "from_": from_}
    if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return "finished", event("finished", at, attempt=attempt, state=state,
                                 exit_code=exit_.get("exit_code"), **details)
    return f"retried#{attempt}", event("retried", at, attempt=attempt,
                                       next_attempt=attempt + 1, **details)


def recovered(at: datetime, attempt: int, incident_key: str, stalled: dict) -> tuple[str, dict]:
    """(key, event) of an open stall incident that ended because its culprit
    beat again (``stalled``: the job's health while the incident was open,
    as the scan read it): the incident it ends, its culprit (the rank its
    verdict names, else the rank silent longest, as
    domain/health.culprit_beat_again takes it), when it was detected and
    how long it lasted from there. One per incident: the key names it."""
    named = stalled.get("verdict") or {}
    rank = named.get("rank") if named.get("rank") is not None \
        else stalled.get("first_stalled_rank")
    detected = stalled.get("detected_at")
    lasted = None if not detected else round(max(0.0, (at - parse_iso(detected))
                                                 .total_seconds()), 3)
    who = f"rank {rank}" if rank is not None else "the stalled ranks"
    after = "" if lasted is None else f" {lasted:.0f} s after the stall was detected"
    count = int(stalled.get("false_alarms") or 0) + 1
    return f"recovered#{incident_key}", event(
        "recovered", at, attempt=attempt,
        reason=f"{who} beat again{after}: the job recovered (false alarm {count})",
        incident=incident_key, rank=rank, detected_at=detected, stalled_s=lasted,
        stalled_reason=named.get("text"))


def waiting_key(attempt: int, reason: str) -> str:
    return f"waiting#{attempt}#{_digest(reason)}"


def ranks_key(kind: str, ranks: list[int], exit_code: int | None) -> str:
    return f"{kind}#{exit_code}#{_digest(','.join(map(str, sorted(ranks))))}"


def rank_event(kind: str, at: datetime, attempt: int, ranks: list[int],
               exit_code: int | None, node_id: str | None = None,
               stacks: list[dict] | None = None) -> dict:
    """Ranks of one node report that started, exited (with a code) or stopped;
    ranks lost with their node "exited" with the code :data:`~.attempts.LOST`,
    which the reason tells as such ("ranks 2-3 lost with node local-2");
    a stop may carry the ranks' ``stacks`` (``[{"rank", "where", "frames"}]``,
    by rank; ``where`` is domain/stacks.where's line, worked out from the
    frames when the report has none)."""
    verb = {"started": "started", "exited": "exited", "stopped": "stopped"}[kind]
    ranks = sorted(ranks)
    who = f"rank{'s' if len(ranks) > 1 else ''} {span(ranks)}"
    if kind == "exited" and exit_code == LOST:  # no process exited: its node was lost
        reason = f"{who} lost with node {node_id}" if node_id else f"{who} lost with their node"
    elif kind == "exited" and exit_code == PORT_TAKEN:  # none started: the port was held
        reason = (f"{who} not started on node {node_id}: the attempt's rendezvous port "
                  "(MASTER_PORT) was in use there")
    elif kind == "exited":
        reason = f"{who} exited with code {exit_code}"
    else:
        reason = f"{who} {verb}"
    return event(f"rank_{verb}", at, attempt=attempt, reason=reason, ranks=rank_runs(ranks),
                 exit_code=exit_code if kind == "exited" else None, node_id=node_id,
                 stacks=_stacks(stacks) if kind == "stopped" and stacks else None)


def _stacks(stacks: list[dict]) -> list[dict] | None:
    out = [{"rank": int(s["rank"]),
            "where": s.get("where") or where({"frames": s.get("frames")}) or "?",
            "frames": list(s.get("frames") or [])}
           for s in sorted(stacks, key=lambda s: int(s["rank"]))]
    return out or None


def served(e: dict) -> dict:
    """An event as the API serves it: a rank event's runs as its ranks."""
    out = {"attempt": None, "reason": None, **e}
    if out["type"] in RANK_EVENTS and "ranks" in out:
        out["ranks"] = from_runs(out["ranks"])
    return out


def timeline(*maps: dict | None) -> list[dict]:
    """Events of the job's and its attempts' maps, oldest first, as served."""
    events = [served(e) for m in maps for e in (m or {}).values()]
    events.sort(key=lambda e: (e["time"], e.get("attempt") or 0, _ORDER.get(e["type"], 5)))
    return events
