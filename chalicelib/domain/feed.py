"""The tenant's event feed (``GET /v1/events``, API.md "Events, webhooks and
EventBridge"): what a job's story (domain/events.py) tells the people who
follow a tenant's jobs, in the one order the feed gives it.

How an event gets there, and why nothing is skipped or repeated:

1. A transition writes its story event on the job's item, in its own
   conditional write (as it always has), and marks the key *unfed* in that
   same write (adapters/jobs_table: ``unfed_keys``, and the job in the
   sparse ``by_unfed`` index under its tenant). No event without its
   transition, none lost: the mark is the event's place in a queue.
2. A *sequencer* (the feed timer, and every read of the feed) takes the
   tenant's unfed events and gives each the next number of the tenant's
   sequence, in one transaction conditioned on the sequence's head it read:
   two sequencers never hand out the same number, and an event is fed once
   (a marker per job and key, put if absent, in the same transaction).
3. A read returns the events numbered after the cursor's and up to the head
   it read first: a number below the head is committed with it, so a page
   never shows a later number before an earlier one can be read.

The id of an event is made from its number and the time it was numbered, so
ids sort as the feed does. An event becomes visible when it is numbered, a
moment after its transition: never out of order. Pure: no AWS.
"""
from __future__ import annotations

from datetime import datetime

from .clock import parse_iso

#: the types of the feed (API.md), each ``data`` documented in the OpenAPI document
TYPES = ("job.created", "job.state_changed", "job.retried", "job.stalled", "job.rank_slow",
         "webhook.disabled")

#: the kinds of story event (domain/events.py keys, before ``#``) the feed tells
TOLD = frozenset({"created", "placed", "started", "retried", "finished", "stalled",
                  "rank_slow"})

#: events are kept at least 7 days (API.md); the table's TTL deletes them after
KEEP_S = 8 * 86400

#: at most this many events numbered in one transaction (DynamoDB: 100 items,
#: two each, and the head)
BATCH = 40

PAGE_MAX, WAIT_MAX_S = 500, 20

#: a placement's nodes an event names (an EventBridge event is at most 256 KB)
NODES_SHOWN = 100

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def told(key: str) -> bool:
    """Whether the story event under ``key`` is told on the feed."""
    return key.split("#", 1)[0] in TOLD


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 32)
        out.append(_CROCKFORD[r])
    return "".join(reversed(out))


def event_id(tenant_tag: int, ms: int, seq: int) -> str:
    """``evt_`` + the time it was numbered (ms, 10 chars, as a ULID's) + its
    number (8) + the tenant's tag (4): ids of one tenant sort as its feed
    does (both grow), and no two tenants' ids are the same."""
    return f"evt_{_b32(ms, 10)}{_b32(seq, 8)}{_b32(tenant_tag, 4)}"


def tell(job_id: str, key: str, stored: dict) -> list[dict]:
    """The feed events (without ids: numbering gives them) that the story
    event ``stored`` of job ``job_id``, under ``key``, tells: a retry tells
    two (``job.retried`` and the move back to PENDING)."""
    kind = key.split("#", 1)[0]
    at, attempt, reason = stored["time"], stored.get("attempt"), stored.get("reason")

    def one(type_: str, **data) -> dict:
        return {"type": type_, "time": at, "job_id": job_id,
                "data": {k: v for k, v in data.items() if v is not None}}

    def moved(from_: str | None, to: str, **more) -> dict:
        return one("job.state_changed", **{"from": from_, "to": to, "attempt": attempt,
                                           "reason": reason, **more})

    if kind == "created":
        return [one("job.created", reason=reason)]
    if kind == "placed":
        nodes = sorted(stored.get("nodes") or {})
        return [moved(stored.get("from", "PENDING"), "SCHEDULED", nodes=nodes[:NODES_SHOWN],
                      nodes_count=len(nodes) if len(nodes) > NODES_SHOWN else None)]
    if kind == "started":
        return [moved(stored.get("from", "SCHEDULED"), "RUNNING")]
    if kind == "retried":
        return [one("job.retried", attempt=attempt, next_attempt=stored.get("next_attempt"),
                    reason=reason, decision=stored.get("decision")),
                moved(stored.get("from"), "PENDING", next_attempt=stored.get("next_attempt"))]
    if kind == "finished":
        exit_ = {k: stored.get(k) for k in ("exit_code", "rank", "node_id", "detail")
                 if stored.get(k) is not None}
        return [moved(stored.get("from"), stored["state"], exit=exit_ or None,
                      decision=stored.get("decision"))]
    if kind == "stalled":
        return [one("job.stalled", attempt=attempt, rank=stored.get("rank"),
                    node_id=stored.get("node_id"), text=reason, by=stored.get("by"))]
    if kind == "rank_slow":
        return [one("job.rank_slow", attempt=attempt, rank=stored.get("rank"),
                    node_id=stored.get("node_id"), score=stored.get("score"), text=reason)]
    raise ValueError(f"the feed does not tell {key!r}")


def in_order(events: list[dict]) -> list[dict]:
    """Unnumbered events in the order they are numbered: by time, then job;
    those of one job and time keep the order they were told in (a job's
    story order, domain/events.timeline)."""
    return sorted(events, key=lambda e: (e["time"], e["job_id"] or ""))


def numbered(events: list[dict], *, tenant_tag: int, head_seq: int, head_ms: int,
             now: datetime) -> tuple[list[tuple[int, dict]], int]:
    """``events`` (in order) numbered after ``head_seq``: [(seq, event with
    its id)], and the ms their ids carry: never below the head's, so ids grow
    even when clocks of two sequencers differ."""
    ms = max(head_ms, int(now.timestamp() * 1000))
    out = []
    for i, e in enumerate(events, start=1):
        seq = head_seq + i
        out.append((seq, {"id": event_id(tenant_tag, ms, seq), **e}))
    return out, ms


def matches(event: dict, *, type_: str | None, job_id: str | None) -> bool:
    """Whether a feed event passes a reader's filter."""
    return (type_ is None or event["type"] == type_) and \
        (job_id is None or event.get("job_id") == job_id)


def filter_key(type_: str | None, job_id: str | None) -> str:
    """What a cursor is bound to besides its tenant."""
    return f"events|{type_ or ''}|{job_id or ''}"


def expires_epoch(at: str) -> int:
    """When an event recorded at ``at`` may be deleted (the table's TTL)."""
    return int(parse_iso(at).timestamp()) + KEEP_S


def kept(event_time: str, now: datetime) -> bool:
    """An event past its keeping (the TTL deletes it some time later) is not served."""
    return expires_epoch(event_time) > now.timestamp()


__all__ = ["TYPES", "TOLD", "KEEP_S", "BATCH", "told", "tell", "in_order", "numbered",
           "event_id", "matches", "filter_key", "expires_epoch", "kept"]
