"""Heartbeats on DynamoDB: one item per rank per attempt, sharded by rank.

``<job>#<attempt>#<rank // 512>`` keeps any one partition far below its
~1,000 writes/s (a 16,384-rank job beating every 5 s writes ~100/s into each
of 32 shards), and a scan reads O(ranks) items, one strongly consistent Query
per shard, whatever the history in the table.

Every request is built by adapters/dynamo.py from the models' schema and sent
through its :class:`~.dynamo.Dynamo`; what goes in and comes out is the
domain's :class:`~..domain.stall.Beat`.
"""
from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta
from typing import Any, Iterator, Mapping, Sequence

from pynamodb.connection import Connection

from ..domain.clock import iso, parse_iso
from ..domain.stall import Beat
from .dynamo import Dynamo, Table
from .items import Codec
from .models import CollectorModel, HeartbeatModel

SHARD_RANKS = 512
#: heartbeat items outlive their attempt by this much, then TTL removes them
KEEP = timedelta(days=7)
INGEST_SHARDS = 8

_HEARTBEATS = Table(HeartbeatModel)
_COLLECTOR = Table(CollectorModel)
#: what the scan reads of a rank's item
_BEAT = Codec(HeartbeatModel, (
    "rank", "heard_at", "beat_at", "step", "paused_until", "proc", "sampled_at", "io_at",
    "active_at", "wrote_at", "resumed_at", "resumed_gap_s", "arrived_seq", "arrived_name"))
#: what an entry that is not a beat sets in its rank's item when it has them:
#: its declared pause and its process sample (earlier sample times stand
#: unless this sample has its own)
_NOTED = ("paused_until", "pause_reason", "proc", "sampled_at", "io_at", "active_at",
          "wrote_at", "arrived_seq", "arrived_name")
#: the Beat fields stored as they are in the item's attribute of the same name
_AS_IS = ("step", "pause_reason", "proc", "resumed_gap_s", "arrived_seq", "arrived_name")
_TIMES = ("heard_at", "beat_at", "sent_at", "paused_until", "resumed_at", "sampled_at",
          "io_at", "active_at", "wrote_at")


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def _stored(value: Any) -> Any:
    """A Beat field's value as its attribute holds it (times as API text)."""
    return iso(value) if isinstance(value, datetime) else value


def shard_key(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}#{attempt}#{rank // SHARD_RANKS}"


class DynamoHeartbeatStore:
    def __init__(self, connection: Connection) -> None:
        self._dynamo = Dynamo(connection)

    def record(self, job_id: str, attempt: int, entries: Sequence[Beat],
               now: datetime) -> None:
        """Each beat overwrites its rank's item (batches of 25; unwritten items
        raise, 503 upstream); each other entry updates its rank's item with
        what it has, the last beat's time untouched. Items expire KEEP after
        ``now``."""
        ttl = int((now + KEEP).timestamp())
        beats = [b for b in entries if b.heard_at is not None]
        if beats:
            self._dynamo.put_all(_HEARTBEATS,
                      [self._item(job_id, attempt, b, ttl) for b in beats])
        for entry in entries:
            if entry.heard_at is None:
                self._note(job_id, attempt, entry, ttl)

    @staticmethod
    def _item(job_id: str, attempt: int, b: Beat, ttl: int) -> dict:
        values: dict[str, Any] = {name: getattr(b, name) for name in _AS_IS}
        values.update((name, _stored(getattr(b, name))) for name in _TIMES)
        heard = b.heard_at
        offset = None if b.sent_at is None or heard is None else \
            round((b.sent_at - heard).total_seconds(), 3)
        values.update(shard_key=shard_key(job_id, attempt, b.rank), rank=b.rank,
                      node_id=b.node_id, offset_s=offset, ttl_epoch=ttl)
        return _HEARTBEATS.item(values)

    def _note(self, job_id: str, attempt: int, entry: Beat, ttl: int) -> None:
        values: dict[str, Any] = {"node_id": entry.node_id, "ttl_epoch": ttl}
        for name in _NOTED:
            value = getattr(entry, name)
            if value is not None:
                values[name] = _stored(value)
        expression = "SET " + ", ".join(f"#{name} = :{name}" for name in values)
        self._dynamo.update(_HEARTBEATS.update(
            _HEARTBEATS.key(shard_key(job_id, attempt, entry.rank), entry.rank), expression,
            values={f":{name}": _HEARTBEATS.value(name, v) for name, v in values.items()}))

    def read(self, job_id: str, attempt: int, node_of: Mapping[int, str]) -> list[Beat]:
        """Every rank of the attempt (never-heard ranks too), strongly consistent:
        a stale read could fake a stall. Raw items through the codec, not a
        model instance per rank (the scan reads every running rank, every
        period: docs/benchmarks.md)."""
        world = len(node_of)
        heard: dict[int, dict] = {}
        for shard in range(-(-world // SHARD_RANKS)):
            for item in self._shard_items(f"{job_id}#{attempt}#{shard}"):
                v = _BEAT.values(item)
                heard[int(v["rank"])] = v
        out = []
        for rank in range(world):
            h = heard.get(rank)
            if h is None:
                out.append(Beat(rank, node_of[rank]))
                continue
            out.append(Beat(rank, node_of[rank],
                            heard_at=_t(h["heard_at"]),
                            beat_at=_t(h["beat_at"]),
                            step=None if h["step"] is None else int(h["step"]),
                            paused_until=_t(h["paused_until"]),
                            proc=h["proc"], sampled_at=_t(h["sampled_at"]),
                            io_at=_t(h["io_at"]),
                            active_at=_t(h["active_at"]),
                            wrote_at=_t(h["wrote_at"]),
                            resumed_at=_t(h["resumed_at"]),
                            resumed_gap_s=None if h["resumed_gap_s"] is None
                            else float(h["resumed_gap_s"]),
                            arrived_seq=None if h["arrived_seq"] is None
                            else int(h["arrived_seq"]),
                            arrived_name=h["arrived_name"]))
        return out

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
