"""Posting the ranks' beats: what ``gpujobs_heartbeat.beat`` wrote, once an interval.

Each RUNNING attempt is visited every ``heartbeat_interval_s`` (from its LAUNCH).
A rank is posted only if it beat since the last successful post: a rank that
stopped calling ``beat`` is left out, so the server's receive time for it stops
advancing and its silence grows (posting it anyway would fake liveness). A rank
inside a declared pause is posted with the pause's remaining time, a duration on
this host's monotonic clock, so the server can bound it on its own clock.
``sent_at`` (this host's wall clock) is sent for diagnosis only.

A failed post is retried at the next visit (beats are idempotent: the newest
overwrites); 409 stale_attempt / already_finished ends posting for the attempt
and tells ``on_gone`` (the agent stops its ranks: nobody waits for them).
"""
from __future__ import annotations

import logging
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from .api import ApiError, AttemptGone
from .state import RUNNING, AttemptRecord

sys.path.insert(0, str(Path(__file__).resolve().parent / "rankside"))
import gpujobs_heartbeat  # noqa: E402  (the same module the ranks write with)

log = logging.getLogger("gpujobs.agent.beats")
MAX_RANKS_PER_POST = 1024


def _now_iso() -> str:
    t = datetime.now(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class BeatPoster:
    def __init__(self, api, *, monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 wall: Callable[[], str] = _now_iso,
                 on_gone: Callable[[str, int], None] = lambda job_id, attempt: None) -> None:
        self._api, self._mono, self._wall = api, monotonic_ns, wall
        self._on_gone = on_gone
        self._posted: dict[tuple[str, int], int] = {}  # (attempt key, rank) -> seq posted
        self._next: dict[str, int] = {}                 # attempt key -> next visit (ns)
        self._gone: set[str] = set()

    def tick(self, attempts: Iterable[AttemptRecord]) -> int:
        """Post what is due; returns how many rank entries went out."""
        now = self._mono()
        sent = 0
        live = set()
        for rec in attempts:
            if rec.phase != RUNNING or rec.quiet or rec.cancelled or rec.key in self._gone:
                continue
            live.add(rec.key)
            if now < self._next.get(rec.key, 0):
                continue
            self._next[rec.key] = now + int(rec.heartbeat_interval_s * 1e9)
            sent += self._post(rec, now)
        for key in set(self._next) - live:  # forget ended attempts
            self._next.pop(key, None)
        return sent

    def _entries(self, rec: AttemptRecord, now: int) -> tuple[list[dict], dict[int, int]]:
        entries, seqs = [], {}
        for r, p in sorted(rec.procs.items()):
            if p.ended or not p.heartbeat_file:
                continue
            record = gpujobs_heartbeat.read(p.heartbeat_file)
            if record is None:
                continue
            fresh = record.seq != self._posted.get((rec.key, r))
            paused = record.pause_deadline_ns > now
            if not fresh and not paused:
                continue  # silent: not posted, so the server sees the silence
            entry: dict = {"rank": r}
            if fresh:
                # how long ago the rank last called beat(), on this host's
                # monotonic clock: the server orders stopped ranks by it
                age = max(0.0, (now - record.beat_ns) / 1e9)
                entry.update(step=record.step, sent_at=self._wall(), age_s=round(age, 3))
                seqs[r] = record.seq
            if paused:
                entry["pause"] = {"reason": record.pause_reason or "paused",
                                  "remaining_s": round((record.pause_deadline_ns - now) / 1e9, 3)}
            entries.append(entry)
        return entries, seqs

    def _post(self, rec: AttemptRecord, now: int) -> int:
        entries, seqs = self._entries(rec, now)
        for i in range(0, len(entries), MAX_RANKS_PER_POST):
            chunk = entries[i:i + MAX_RANKS_PER_POST]
            try:
                self._api.post_heartbeats(rec.job_id, rec.attempt, chunk)
            except AttemptGone as e:
                log.info("%s: heartbeats answered %s: the attempt is over", rec.key, e.code)
                self._gone.add(rec.key)
                self._on_gone(rec.job_id, rec.attempt)
                return i
            except ApiError as e:
                # the next visit posts the newest beats; nothing is lost but time
                log.warning("%s: posting heartbeats failed (%s); retrying next interval",
                            rec.key, e)
                self._next[rec.key] = now
                return i
            for e in chunk:
                if e["rank"] in seqs:
                    self._posted[(rec.key, e["rank"])] = seqs[e["rank"]]
        return len(entries)
