"""Heartbeats on DynamoDB: one item per rank per attempt, sharded by rank.

``<job>#<attempt>#<rank // 512>`` keeps any one partition far below its
~1,000 writes/s (a 16,384-rank job beating every 5 s writes ~100/s into each
of 32 shards), and a scan reads O(ranks) items, one strongly consistent Query
per shard, whatever the history in the table.
"""
from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta
from typing import Iterator

from pynamodb.connection import Connection

from ..domain.clock import iso, parse_iso
from ..domain.stall import Beat
from . import written
from .items import Codec
from .models import CollectorModel, HeartbeatModel

SHARD_RANKS = 512
#: heartbeat items outlive their attempt by this much, then TTL removes them
KEEP = timedelta(days=7)
INGEST_SHARDS = 8
#: what the scan reads of a rank's item
_BEAT = Codec(HeartbeatModel, (
    "rank", "heard_at", "beat_at", "step", "paused_until", "proc", "sampled_at", "io_at",
    "active_at", "wrote_at", "resumed_at", "resumed_gap_s", "arrived_seq", "arrived_name"))


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def shard_key(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}#{attempt}#{rank // SHARD_RANKS}"


class DynamoHeartbeatStore:
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def write(self, job_id: str, attempt: int, beats: list[dict], node_of: dict[int, str],
              now: datetime) -> None:
        """Overwrite each rank's item with this beat, stamped ``now`` (collector
        time), in batches of 25. Unwritten items raise (503 upstream)."""
        ttl = int((now + KEEP).timestamp())
        with HeartbeatModel.batch_write() as batch:
            for b in beats:
                sent = b.get("sent_at")
                paused_until, reason = b.get("paused_until"), b.get("pause_reason")
                batch.save(HeartbeatModel(
                    shard_key(job_id, attempt, b["rank"]), b["rank"],
                    node_id=node_of.get(b["rank"], ""), heard_at=iso(now), step=b.get("step"),
                    beat_at=b.get("beat_at") and iso(b["beat_at"]),
                    sent_at=sent and iso(sent),
                    offset_s=sent and round((sent - now).total_seconds(), 3),
                    paused_until=paused_until and iso(paused_until), pause_reason=reason,
                    resumed_at=b.get("resumed_at") and iso(b["resumed_at"]),
                    resumed_gap_s=b.get("resumed_gap_s"),
                    ttl_epoch=ttl, **_evidence(b)))

    def sample(self, job_id: str, attempt: int, rank: int, node_id: str, sample: dict,
               now: datetime) -> None:
        """Record a process sample of a silent rank without touching its last
        beat's time; the receive times of earlier busy or active samples stand
        unless this one is busy or active too."""
        ev = _evidence(sample)
        actions = [getattr(HeartbeatModel, k).set(v) for k, v in ev.items() if v is not None]
        HeartbeatModel(shard_key(job_id, attempt, rank), rank).update(actions=[
            *actions, HeartbeatModel.node_id.set(node_id),
            HeartbeatModel.ttl_epoch.set(int((now + KEEP).timestamp()))])

    def pause(self, job_id: str, attempt: int, rank: int, node_id: str,
              until: datetime, reason: str, now: datetime) -> None:
        """Record a declared pause without touching the last beat's time."""
        HeartbeatModel(shard_key(job_id, attempt, rank), rank).update(actions=[
            HeartbeatModel.paused_until.set(iso(until)),
            HeartbeatModel.pause_reason.set(reason),
            HeartbeatModel.node_id.set(node_id),
            HeartbeatModel.ttl_epoch.set(int((now + KEEP).timestamp())),
        ])

    def read(self, job_id: str, attempt: int, node_of: dict[int, str]) -> list[Beat]:
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
        start = None
        while True:
            page = self._conn.dispatch("Query", written.query(
                HeartbeatModel, None, "#shard_key = :key", {":key": {"S": key}},
                consistent=True, start=start))
            yield from page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return


def _evidence(b: dict) -> dict:
    """The process sample and collective marker of an ingested entry, as stored."""
    out = {"proc": b.get("proc"), "arrived_seq": b.get("arrived_seq"),
           "arrived_name": b.get("arrived_name")}
    for k in ("sampled_at", "io_at", "active_at", "wrote_at"):
        out[k] = b.get(k) and iso(b[k])
    return out


class DynamoCollectorStore:
    """When the scan last ran; when anything last reached the ingest path."""

    def __init__(self) -> None:
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
        CollectorModel(f"ingest#{random.randrange(INGEST_SHARDS)}", at=iso(now)).save()

    def latest_ingest(self) -> datetime | None:
        marks = [m.at for m in CollectorModel.batch_get(
            [f"ingest#{i}" for i in range(INGEST_SHARDS)]) if m.at]
        return parse_iso(max(marks)) if marks else None

    def previous_scan(self) -> tuple[datetime | None, datetime | None, str | None]:
        """(when the last scan ran, until when convictions are held, why)."""
        try:
            m = CollectorModel.get("scanner", consistent_read=True)
        except CollectorModel.DoesNotExist:
            return None, None, None
        return _t(m.at), _t(m.hold_until), m.hold_reason

    def record_scan(self, now: datetime, hold_until: datetime | None = None,
                    hold_reason: str | None = None) -> None:
        CollectorModel("scanner", at=iso(now), hold_until=hold_until and iso(hold_until),
                       hold_reason=hold_reason).save()
