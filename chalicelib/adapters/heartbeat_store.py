"""Heartbeats on DynamoDB: one item per host of an attempt (per 32 of its
ranks), sharded by rank.

A host's post writes one item (1 WRU for 8 ranks' beats, the floor of
docs/deploy.md): each rank's record is one map in the item's ``ranks`` map,
under the rank's number, its fields under short codes (FIELDS). A post that
beats every rank of an item, as a healthy host's every post does, sets the
whole map in one clause; otherwise a beat sets its rank's whole record, one
clause a rank. (A clause per field made an UpdateItem of 8 ranks 120
clauses, far slower on moto; a clause a rank kept a 65,536-rank job from
beating on time on the local stack: docs/benchmarks.md, "A host's heartbeat
post on moto".)

The item is keyed by its lowest rank, ``<job>#<attempt>#<rank // 512>`` and
that rank: placement never changes within an attempt, so a host always
writes the same items; a shard holds at most 512 ranks' items (64 hosts of
8 ranks, 6 writes/s at a 10 s interval). A scan reads O(ranks), one
strongly consistent Query per shard, whatever the history in the table.

Every request is built by adapters/dynamo.py from the models' schema and sent
through its :class:`~.dynamo.Dynamo`; what goes in and comes out is the
domain's :class:`~..domain.stall.Beat`.
"""
from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any, Collection, Iterator, Mapping, Sequence

from pynamodb.connection import Connection

from ..domain.clock import iso, parse_iso
from ..domain.stall import Beat
from .dynamo import Changes, ConditionFailed, Dynamo, Table
from .models import CollectorModel, HeartbeatModel

SHARD_RANKS = 512
#: heartbeat items outlive their attempt by this much, then TTL removes them
KEEP = timedelta(days=7)
INGEST_SHARDS = 8
#: ranks of one item: a host's 8 ranks are one item of under 1 KB; a bigger
#: host's are items of 32, each far under DynamoDB's 400 KB with every rank's
#: stack (domain/stacks.MAX_STACK_BYTES: a record stays under 6 KB)
RANKS_PER_ITEM = 32
#: clauses of one UpdateItem: an entry that is not a beat sets a clause per
#: field, under 30 characters each, and an expression must stay under
#: DynamoDB's 4 KB; an item's write of more is several UpdateItems
MAX_CLAUSES = 96
#: attempts whose item layout a process keeps worked out
_ATTEMPTS_KEPT = 1024

_HEARTBEATS = Table(HeartbeatModel)
_COLLECTOR = Table(CollectorModel)
#: a rank's record, ``ranks[<rank>]`` of its host's item: each Beat field
#: under a short code (item size is the bill); times as API text
FIELDS = {"heard_at": "h", "beat_at": "b", "step": "s", "paused_until": "p",
          "pause_reason": "pr", "proc": "c", "sampled_at": "sa", "io_at": "i",
          "active_at": "a", "wrote_at": "w", "resumed_at": "ra", "resumed_gap_s": "rg",
          "arrived_seq": "q", "arrived_name": "qn", "offset_s": "o", "step_time_s": "st"}
_FIELD_OF = {code: name for name, code in FIELDS.items()}
#: what an entry that is not a beat sets in its rank's record when it has them:
#: its declared pause and its process sample (earlier sample times stand
#: unless this sample has its own)
_NOTED = ("paused_until", "pause_reason", "proc", "sampled_at", "io_at", "active_at",
          "wrote_at", "arrived_seq", "arrived_name")


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def _stored(b: Beat, name: str) -> Any:
    """A rank record's field as the map holds it (times as API text; the
    sender's clock only as its offset from the receive time)."""
    if name == "offset_s":
        return None if b.sent_at is None or b.heard_at is None else \
            round((b.sent_at - b.heard_at).total_seconds(), 3)
    value = getattr(b, name)
    return iso(value) if isinstance(value, datetime) else value


def shard_key(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}#{attempt}#{rank // SHARD_RANKS}"


class DynamoHeartbeatStore:
    def __init__(self, connection: Connection) -> None:
        self._dynamo = Dynamo(connection)
        self._items: dict[tuple[str, int], tuple[dict[int, int], dict[int, list[int]]]] = {}
        self._lock = threading.Lock()

    def record(self, job_id: str, attempt: int, entries: Sequence[Beat], now: datetime,
               node_of: Mapping[int, str]) -> None:
        """One UpdateItem per item the post touches (a host of up to
        RANKS_PER_ITEM ranks: one; more only for more than MAX_CLAUSES
        clauses): a beat replaces its rank's record (the
        last of a rank's beats in the post counts); each other entry then
        sets what it has, the last beat's time untouched. A first write makes
        its item, with an empty record for each of its ranks. Items expire
        KEEP after ``now``."""
        ttl = int((now + KEEP).timestamp())
        #: rank -> (the beat replaces the record, the fields to set)
        records: dict[int, tuple[bool, dict[str, Any]]] = {}
        nodes: dict[int, str] = {}
        for b in sorted(entries, key=lambda e: e.heard_at is None):  # beats first
            nodes[b.rank] = b.node_id
            if b.heard_at is not None:
                records[b.rank] = (True, {n: _stored(b, n) for n in FIELDS})
            else:
                replaced, fields = records.setdefault(b.rank, (False, {}))
                fields.update((n, v) for n, v in ((n, _stored(b, n)) for n in _NOTED)
                              if v is not None)
        item_of, held = self._items_of(job_id, attempt, node_of)
        for first, group in groupby(sorted(records, key=lambda r: (item_of.get(r, r), r)),
                                    key=lambda r: item_of.get(r, r)):
            ranks = list(group)
            self._write(job_id, attempt, first, nodes[ranks[0]],
                        {r: records[r] for r in ranks}, held.get(first, ranks), ttl, iso(now))

    def _items_of(self, job_id: str, attempt: int, node_of: Mapping[int, str]
                  ) -> tuple[dict[int, int], dict[int, list[int]]]:
        """rank -> the lowest rank of its item, and each item's ranks by its
        lowest: each host's ranks in order, in items of at most
        RANKS_PER_ITEM (fixed for an attempt; worked out once an attempt per
        process)."""
        key = (job_id, attempt)
        layout = self._items.get(key)
        if layout is None or len(layout[0]) != len(node_of):
            by_node: dict[str, list[int]] = {}
            for rank, node in node_of.items():
                by_node.setdefault(node, []).append(rank)
            items: dict[int, int] = {}
            held: dict[int, list[int]] = {}
            for ranks in by_node.values():
                ranks.sort()
                for i in range(0, len(ranks), RANKS_PER_ITEM):
                    held[ranks[i]] = ranks[i:i + RANKS_PER_ITEM]
                    items.update(dict.fromkeys(held[ranks[i]], ranks[i]))
            layout = (items, held)
            with self._lock:
                self._items[key] = layout
                while len(self._items) > _ATTEMPTS_KEPT:
                    self._items.pop(next(iter(self._items)))
        return layout

    def _write(self, job_id: str, attempt: int, first: int, node_id: str,
               records: Mapping[int, tuple[bool, dict[str, Any]]],
               held: Sequence[int], ttl: int, posted_at: str) -> None:
        """The item whose lowest rank is ``first`` (holding the ranks
        ``held``): a beat of each of them sets the whole map, one clause;
        otherwise a beat's record is one clause, an entry that is not a beat
        a clause per field it has."""
        def changes() -> Changes:
            return Changes(_HEARTBEATS).set("node_id", node_id).set("ttl_epoch", ttl) \
                .set("posted_at", posted_at)
        present = {rank: {FIELDS[n]: v for n, v in fields.items() if v is not None}
                   for rank, (_, fields) in records.items()}
        key = _HEARTBEATS.key(shard_key(job_id, attempt, first), first)
        if len(records) == len(held) and all(replaces for replaces, _ in records.values()):
            self._dynamo.update(changes().set("ranks", {str(r): present[r] for r in held})
                                .update(key))
            return
        #: (rank, field code, value): the whole record where the code is None
        clauses = [c for rank, (replaces, _) in records.items()
                   for c in ([(rank, None, present[rank])] if replaces else
                             [(rank, code, v) for code, v in present[rank].items()])]
        for i in range(0, len(clauses), MAX_CLAUSES):
            part = changes()
            for rank, code, value in clauses[i:i + MAX_CLAUSES]:
                if code is None:
                    part.entry("ranks", str(rank), value)
                else:
                    part.entry_field("ranks", str(rank), code, value)
            request = part.update(key, condition="attribute_exists(#ranks)")
            try:
                self._dynamo.update(request)
            except ConditionFailed:
                # the host's first write: make the item, a record for each of
                # its ranks (a field's path needs its record), then write
                self._dynamo.update(_HEARTBEATS.update(
                    key, "SET #ranks = if_not_exists(#ranks, :empty)",
                    values={":empty": _HEARTBEATS.value("ranks", {str(r): {} for r in held})}))
                self._dynamo.update(request)

    def read(self, job_id: str, attempt: int, node_of: Mapping[int, str]) -> list[Beat]:
        """Every rank of the attempt (never-heard ranks too), strongly consistent:
        a stale read could fake a stall. Raw items, no model instance (the
        scan reads every running rank, every period: docs/benchmarks.md).
        A rank held by two items (an attempt that began under items of 8
        ranks and beat on under items of 32) is as its later beat says."""
        world = len(node_of)
        heard: dict[int, dict[str, Any]] = {}
        for shard in range(-(-world // SHARD_RANKS)):
            for item in self._shard_items(f"{job_id}#{attempt}#{shard}"):
                for key, record in (_HEARTBEATS.values(item)["ranks"] or {}).items():
                    if not (key.isdigit() and isinstance(record, dict)):
                        continue
                    seen = heard.get(int(key))
                    # receive times are API text of one width: they sort as times
                    if seen is None or record.get("h", "") >= seen.get("heard_at", ""):
                        heard[int(key)] = {_FIELD_OF[c]: v for c, v in record.items()
                                           if c in _FIELD_OF}
        return [self._beat(rank, node_of[rank], heard.get(rank)) for rank in range(world)]

    def last_posts(self, attempts: Mapping[tuple[str, int], Mapping[int, str]],
                   nodes: Collection[str]) -> dict[str, datetime]:
        """When each of ``nodes`` last posted beats for any of ``attempts``
        (``(job_id, attempt)`` -> where its ranks run), by the collector's
        clock; a node that never did is left out. BatchGetItem, 100 host
        items a request, eventually consistent (a second late at most: far
        inside the minute a node has before DOWN), ``posted_at`` alone."""
        keys = []
        for (job_id, attempt), node_of in attempts.items():
            firsts = {first for rank, first in self._items_of(job_id, attempt, node_of)[0].items()
                      if node_of[rank] in nodes}
            keys += [_HEARTBEATS.key(shard_key(job_id, attempt, f), f) for f in sorted(firsts)]
        out: dict[str, datetime] = {}
        for i in range(0, len(keys), 100):
            for item in self._dynamo.get_all(_HEARTBEATS, keys[i:i + 100],
                                             attributes=("node_id", "posted_at")):
                v = _HEARTBEATS.values(item)
                at = _t(v["posted_at"])
                if at is not None and (v["node_id"] not in out or at > out[v["node_id"]]):
                    out[v["node_id"]] = at
        return out

    @staticmethod
    def _beat(rank: int, node_id: str, h: dict[str, Any] | None) -> Beat:
        if not h:
            return Beat(rank, node_id)
        step, gap, seq = h.get("step"), h.get("resumed_gap_s"), h.get("arrived_seq")
        step_time = h.get("step_time_s")
        return Beat(rank, node_id,
                    heard_at=_t(h.get("heard_at")), beat_at=_t(h.get("beat_at")),
                    paused_until=_t(h.get("paused_until")), resumed_at=_t(h.get("resumed_at")),
                    sampled_at=_t(h.get("sampled_at")), io_at=_t(h.get("io_at")),
                    active_at=_t(h.get("active_at")), wrote_at=_t(h.get("wrote_at")),
                    step=None if step is None else int(step),
                    proc=h.get("proc"),
                    resumed_gap_s=None if gap is None else float(gap),
                    arrived_seq=None if seq is None else int(seq),
                    arrived_name=h.get("arrived_name"),
                    step_time_s=None if step_time is None else float(step_time))

    def _shard_items(self, key: str) -> Iterator[dict]:
        """Every item of one shard, page after page (a Query stops at 1 MB)."""
        request = _HEARTBEATS.query(None, "#shard_key = :key",
                                    {":key": _HEARTBEATS.value("shard_key", key)},
                                    consistent=True)
        for page in self._dynamo.pages(request):
            yield from page


class DynamoCollectorStore:
    """When the scan last ran; when anything last reached the ingest path.
    Reads no clock: every time is the caller's (the injected one)."""

    def __init__(self, connection: Connection) -> None:
        self._dynamo = Dynamo(connection)
        self._lock = threading.Lock()
        self._last_mark: datetime | None = None

    def mark_ingest(self, now: datetime) -> None:
        # at most one write a second per process, spread over shards: the
        # mark must never become the hot item it is meant to watch
        with self._lock:
            if self._last_mark is not None and \
                    abs((now - self._last_mark).total_seconds()) < 1.0:
                return
            self._last_mark = now
        self._dynamo.put(_COLLECTOR.put(_COLLECTOR.item(
            {"name": f"ingest#{random.randrange(INGEST_SHARDS)}", "at": iso(now)})))

    def latest_ingest(self) -> datetime | None:
        items = self._dynamo.get_all(_COLLECTOR,
                          [_COLLECTOR.key(f"ingest#{i}") for i in range(INGEST_SHARDS)])
        marks = [at for item in items if (at := _COLLECTOR.values(item)["at"])]
        return parse_iso(max(marks)) if marks else None

    def previous_scan(self) -> tuple[datetime | None, datetime | None, str | None]:
        """(when the last scan ran, until when convictions are held, why)."""
        item = self._dynamo.get(_COLLECTOR.get(_COLLECTOR.key("scanner")))
        if item is None:
            return None, None, None
        v = _COLLECTOR.values(item)
        return _t(v["at"]), _t(v["hold_until"]), v["hold_reason"]

    def record_scan(self, now: datetime, hold_until: datetime | None = None,
                    hold_reason: str | None = None) -> None:
        self._dynamo.put(_COLLECTOR.put(_COLLECTOR.item(
            {"name": "scanner", "at": iso(now), "hold_until": hold_until and iso(hold_until),
             "hold_reason": hold_reason})))
