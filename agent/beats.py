"""Posting the ranks' beats: what ``gpujobs_heartbeat.beat`` wrote, once an interval.

Each RUNNING attempt is visited every ``heartbeat_interval_s`` (from its LAUNCH).
A rank is posted only if it beat since the last successful post: a rank that
stopped calling ``beat`` is left out, so the server's receive time for it stops
advancing and its silence grows (posting it anyway would fake liveness). A rank
inside a declared pause is posted with the pause's remaining time, a duration on
this host's monotonic clock, so the server can bound it on its own clock.

Every visit also samples each live rank's process group (procs.py) and posts the
summary: with the beat of a rank that beat, and alone (``{"rank", "proc"}``, which
the server does not take for a beat) for a rank that did not, or never beats at
all. A rank's last collective mark rides with its beats.

A rank that has not beaten for two intervals or more, or never beat, also has
its Python stack taken (stacks.py, in the background, at most once every
``GPUJOBS_STACK_EVERY_S`` per rank): the latest one rides in each of its
process samples as ``proc.stack`` (``{"frames", "code", "age_s"}``) until the
rank beats again, which drops it. A healthy instrumented rank costs nothing.
``sent_at`` (this host's wall clock) is sent for diagnosis only.

A rank's record is read through rankfiles.py: the rank owns the file and may
put a FIFO, a symbolic link or a huge file in its place, which is then no record
(logged once), never a read that blocks the agent or fills its memory. When
its attempt runs as a uid of the pool (``AttemptRecord.uid``, uidpool.py) a
record must also be a file of that uid: another job's rank, which could not
write it, cannot hard-link one of its own there either.

The node's call-in rides on one of these posts when one goes out as it is due
(``tick``'s ``call_in``: one request an interval, not two, on a busy node).

A failed post is retried at the next visit (beats are idempotent: the newest
overwrites); 409 stale_attempt / already_finished ends posting for the attempt
and tells ``on_gone`` (the agent stops its ranks: nobody waits for them).

A rank's last beats are posted before its end is reported (``final``, which
core.Agent calls before it sends EXITED or STOPPED): a rank that beat step 60
and exited between two visits would otherwise end with the server holding
step 15, since nothing is posted for an ended rank and a finished job takes
no beat (issue 47).
"""
from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Protocol

from .api import ApiError, AttemptGone
from .procs import ProcSampler
from .rankfiles import open_rank_file
from .stacks import StackSampler
from .state import RUNNING, AttemptRecord

sys.path.insert(0, str(Path(__file__).resolve().parent / "rankside"))
import gpujobs_heartbeat  # noqa: E402  (the same module the ranks write with)

log = logging.getLogger("gpujobs.agent.beats")
MAX_RANKS_PER_POST = 1024
#: a post's body stays under the API's 256 KiB (stacks make entries of ~3 KiB)
MAX_POST_BYTES = 200 * 1024
MAX_AGE_S = 3600.0  # the server takes ages up to an hour


def _now_iso() -> str:
    t = datetime.now(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class BeatPoster:
    def __init__(self, api, *, monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 wall: Callable[[], str] = _now_iso,
                 sampler: ProcSampler | None = None,
                 stacks: StackSampler | None = None,
                 on_gone: Callable[[str, int], None] = lambda job_id, attempt: None) -> None:
        self._api, self._mono, self._wall = api, monotonic_ns, wall
        self._sampler = sampler if sampler is not None else ProcSampler()
        self._stacks = stacks  # None: no stacks
        self._on_gone = on_gone
        self._posted: dict[tuple[str, int], int] = {}  # (attempt key, rank) -> seq posted
        # (attempt key, rank) -> beat_ns of the last beat() posted, and the end
        # (beat_ns) and length (ns) of the rank's last long silence
        self._beat_ns: dict[tuple[str, int], int] = {}
        self._resumed: dict[tuple[str, int], tuple[int, int]] = {}
        self._pending_beat_ns: dict[int, int] = {}  # rank -> beat_ns of this visit's entries
        self._next: dict[str, int] = {}                 # attempt key -> next visit (ns)
        self._gone: set[str] = set()
        self._posted_ns: int | None = None              # the last post answered 2xx
        #: ``tick`` runs on the beat loop, ``final`` on the main loop (runner.py)
        self._lock = threading.Lock()

    def posted_within(self, seconds: float) -> bool:
        """Whether a post was answered 2xx in the last ``seconds``: the node's
        agent is alive for the server (reconciler), whatever its call-ins."""
        return self._posted_ns is not None and self._mono() - self._posted_ns <= seconds * 1e9

    def posting(self) -> bool:
        """Whether an attempt was being posted for at the last tick (running
        here, not cancelled, not gone): the server counts a node's posts
        as signs of life only for attempts it holds there."""
        return bool(self._next)

    def tick(self, attempts: Iterable[AttemptRecord], call_in: CallIn | None = None
             ) -> dict | None:
        """Post what is due. ``call_in``: the node's call-in rides on the
        first post that goes out (an attempt not yet due is visited early for
        it, and keeps that phase); returns its answer, None if none carried it."""
        with self._lock:
            return self._tick(attempts, call_in)

    def _tick(self, attempts: Iterable[AttemptRecord], call_in: CallIn | None) -> dict | None:
        now = self._mono()
        live = [rec for rec in attempts if rec.phase == RUNNING and not rec.quiet
                and not rec.cancelled and rec.key not in self._gone]
        due = [rec for rec in live if now >= self._next.get(rec.key, 0)]
        if call_in is not None and not due and live:
            due = [min(live, key=lambda rec: self._next.get(rec.key, 0))]
        node = None
        for rec in due:
            self._next[rec.key] = now + int(rec.heartbeat_interval_s * 1e9)
            carry = call_in if node is None else None
            answer = self._post(rec, now, carry)
            if carry is not None and answer is not None:
                node = answer
        self._forget({rec.key for rec in live})
        return node

    def _forget(self, live: set[str]) -> None:
        """Drops what is kept of attempts no longer ``live``."""
        for key in set(self._next) - live:
            self._next.pop(key, None)
        self._sampler.forget(k for k in self._sampler.keys()
                             if isinstance(k, tuple) and k[0] not in live)
        if self._stacks is not None:
            self._stacks.forget(k for k in self._stacks.keys()
                                if isinstance(k, tuple) and k[0] not in live)
        for known in (self._beat_ns, self._resumed):
            for k in [k for k in known if k[0] not in live]:
                del known[k]

    def _entries(self, rec: AttemptRecord, now: int) -> tuple[list[dict], dict[int, int]]:
        entries, seqs = [], {}
        beats_ns = self._pending_beat_ns = {}
        # how a record is read: never blocking, bounded, a regular file of the
        # attempt's uid (None: its ranks run as the agent)
        read_bytes = functools.partial(open_rank_file, uid=rec.uid)
        procs = dict(rec.procs)  # one copy: the main loop may add to it meanwhile
        samples = self._sampler.sample({(rec.key, r): p.pid for r, p in procs.items()
                                        if not p.ended and p.pid})
        for r, p in sorted(procs.items()):
            if p.ended:
                continue
            proc = samples.get((rec.key, r))
            record = (gpujobs_heartbeat.read(p.heartbeat_file, read_bytes)
                      if p.heartbeat_file else None)
            proc = self._with_stack(rec, r, record, proc, now)
            if record is None:
                if proc is not None:  # never beat: the host's evidence only
                    entries.append({"rank": r, "proc": proc})
                continue
            fresh = record.seq != self._posted.get((rec.key, r))
            paused = record.pause_deadline_ns > now
            entry: dict = {"rank": r}
            if fresh:
                # how long ago the rank last called beat(), on this host's
                # monotonic clock: the server orders stopped ranks by it
                entry.update(step=record.step, sent_at=self._wall())
                if record.beat_ns:  # 0: it marked a collective or a pause, never beat()
                    age = max(0.0, (now - record.beat_ns) / 1e9)
                    entry["age_s"] = min(MAX_AGE_S, round(age, 3))
                    # a long silence just ended (more than two intervals between
                    # the beats posted): the server excuses peers still quiet
                    prev = self._beat_ns.get((rec.key, r))
                    gap = record.beat_ns - prev if prev else 0
                    if gap > 2 * rec.heartbeat_interval_s * 1e9:
                        self._resumed[(rec.key, r)] = (record.beat_ns, gap)
                    beats_ns[r] = record.beat_ns
                resumed = self._resumed.get((rec.key, r))
                if resumed is not None and now - resumed[0] <= MAX_AGE_S * 1e9:
                    entry["resumed"] = {"age_s": round(max(0, now - resumed[0]) / 1e9, 3),
                                        "gap_s": round(min(86400e9, resumed[1]) / 1e9, 3)}
                if record.collective_seq is not None:
                    entry["collective"] = {"seq": record.collective_seq,
                                           "name": record.collective_name or "collective"}
                if record.step_time_ns is not None:  # its steps' time outside collectives
                    entry["step_time_s"] = round(min(86400.0, record.step_time_ns / 1e9), 6)
                seqs[r] = record.seq
            if paused:
                entry["pause"] = {"reason": record.pause_reason or "paused",
                                  "remaining_s": round((record.pause_deadline_ns - now) / 1e9, 3)}
            if proc is not None:
                entry["proc"] = proc
            if len(entry) > 1:  # a silent rank with no sample is not posted at all
                entries.append(entry)
        return entries, seqs

    def final(self, rec: AttemptRecord, ranks: Iterable[int]) -> bool:
        """Posts what ``ranks`` of ``rec`` (ended, or being reported ended)
        beat since their last post, before their end is reported: their last
        step reaches the server while it still takes beats for the attempt.
        True once done (or nothing to post, or the server no longer takes
        them); False when the post failed and may be tried again (the
        caller holds the report back, for a bounded time), or when the beat
        loop is posting just now (the caller, the main loop, never waits for
        it: its posts may wait out a slow server)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return self._final(rec, ranks)
        finally:
            self._lock.release()

    def _final(self, rec: AttemptRecord, ranks: Iterable[int]) -> bool:
        if rec.key in self._gone:
            return True
        now = self._mono()
        read_bytes = functools.partial(open_rank_file, uid=rec.uid)
        entries, seqs, beats_ns = [], {}, {}
        for r in sorted(set(ranks)):
            p = rec.procs.get(r)
            if p is None or not p.heartbeat_file:
                continue
            record = gpujobs_heartbeat.read(p.heartbeat_file, read_bytes)
            if record is None or record.seq == self._posted.get((rec.key, r)):
                continue
            entry: dict = {"rank": r, "step": record.step, "sent_at": self._wall()}
            if record.beat_ns:
                entry["age_s"] = min(MAX_AGE_S, round(max(0.0, (now - record.beat_ns) / 1e9), 3))
                beats_ns[r] = record.beat_ns
            if record.collective_seq is not None:
                entry["collective"] = {"seq": record.collective_seq,
                                       "name": record.collective_name or "collective"}
            entries.append(entry)
            seqs[r] = record.seq
        for chunk in _chunks(entries):
            try:
                self._api.post_heartbeats(rec.job_id, rec.attempt, chunk)
            except AttemptGone as e:
                # the attempt is over for the server: the end's own report
                # hears so too; nothing more to post
                log.info("%s: last beats answered %s", rec.key, e.code)
                self._gone.add(rec.key)
                return True
            except ApiError as e:
                log.warning("%s: posting the last beats of ranks %s failed (%s)", rec.key,
                            sorted(seqs), e)
                return False
            self._posted_ns = self._mono()
            for entry in chunk:
                self._posted[(rec.key, entry["rank"])] = seqs[entry["rank"]]
                if entry["rank"] in beats_ns:
                    self._beat_ns[(rec.key, entry["rank"])] = beats_ns[entry["rank"]]
        if entries:
            log.info("%s: last beats of ranks %s posted before their end", rec.key, sorted(seqs))
        return True

    def _with_stack(self, rec: AttemptRecord, r: int, record, proc: dict | None,
                    now: int) -> dict | None:
        """``proc`` with the rank's latest stack, when it has one; asks for a
        new one when the rank is silent (two intervals or more without a beat,
        or never a beat); drops the one taken before the rank's latest beat."""
        if self._stacks is None:
            return proc
        key = (rec.key, r)
        beat_ns = record.beat_ns if record is not None else 0
        taken = self._stacks.taken_ns(key)
        if taken is not None and beat_ns and beat_ns > taken:
            self._stacks.drop(key)  # it beat since: it moved on
        silent = not beat_ns or now - beat_ns >= 2 * rec.heartbeat_interval_s * 1e9
        pid = getattr(self._sampler, "own_pids", {}).get(key)
        if silent and pid:
            self._stacks.request(key, pid)
        stack = self._stacks.latest(key) if proc is not None else None
        return {**proc, "stack": stack} if proc is not None and stack else proc

    def _post(self, rec: AttemptRecord, now: int, call_in: CallIn | None = None
              ) -> dict | None:
        """Posts the attempt's entries, the first post carrying ``call_in``;
        returns the answer to the call-in (None: none went out, or it failed)."""
        entries, seqs = self._entries(rec, now)
        node, carry = None, call_in
        for chunk in _chunks(entries):
            body = carry.body() if carry is not None else None
            try:
                answer = self._api.post_heartbeats(rec.job_id, rec.attempt, chunk, call_in=body)
            except AttemptGone as e:
                log.info("%s: heartbeats answered %s: the attempt is over", rec.key, e.code)
                self._gone.add(rec.key)
                self._on_gone(rec.job_id, rec.attempt)
                return node
            except ApiError as e:
                # the next visit posts the newest beats; nothing is lost but time
                log.warning("%s: posting heartbeats failed (%s); retrying next interval",
                            rec.key, e)
                self._next[rec.key] = now
                return node
            self._posted_ns = self._mono()
            if carry is not None and body is not None and isinstance(answer.get("node"), dict):
                node = carry.answered(answer["node"], body)
            carry = None  # the first post carries it
            for entry in chunk:
                if entry["rank"] in seqs:
                    self._posted[(rec.key, entry["rank"])] = seqs[entry["rank"]]
                if entry["rank"] in self._pending_beat_ns:
                    self._beat_ns[(rec.key, entry["rank"])] = self._pending_beat_ns[entry["rank"]]
        return node


class CallIn(Protocol):
    """The node's call-in (runner.CallIn): its body, made as it goes out, and
    what the agent does with the answer to it."""

    def body(self) -> dict: ...

    def answered(self, node: dict, body: dict) -> dict: ...


def _chunks(entries: list[dict]) -> Iterable[list[dict]]:
    """The entries in posts of at most MAX_RANKS_PER_POST and about MAX_POST_BYTES."""
    chunk: list[dict] = []
    size = 0
    for entry in entries:
        n = len(json.dumps(entry)) + 2  # as agent/api.py sends it
        if chunk and (len(chunk) >= MAX_RANKS_PER_POST or size + n > MAX_POST_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += n
    if chunk:
        yield chunk
