"""Ships every rank's output to CloudWatch Logs, each line with its own time.

A rank's output is one file, ``rank-<r>.log`` under the agent's log directory
(``<job>/<attempt>/``), written by agent/shim.py one record a line in the CRI
log format (``<RFC 3339 time> <stdout|stderr> <F|P> <content>``; records.py
parses it): stdout and stderr in the order the shim read them, each line
stamped with the host's time when the shim read it. The shipper reads the
files from the agent's side, so a rank running as another user needs no AWS
access, and a rank that writes while no agent runs loses nothing: the file is
the buffer.

One log stream per job, attempt and rank (``<job>/<attempt>/rank-<r>``) in the
stage's log group (declared in infra/template.yaml, its name handed to the agent
by ``PUT /v1/nodes``). Each record is one event (or several, below): its
``timestamp`` the record's time in ms (never earlier than the event before it,
so a batch is in chronological order, as PutLogEvents requires; a batch spans
at most ``MAX_BATCH_SPAN_MS``), its message
``{"stream": "stdout"|"stderr", "line": "...", "seq": N, "next": M}``, where
``seq`` is the byte offset in the file where the event's bytes start (the
record's own offset for its first event): unique and increasing within the
stream; ``next`` is the offset just past them, so the stream's next event
starts there (the lines saying a quota dropped bytes carry no ``next``). A
reader that holds an event and then sees a later one of the stream whose
``seq`` is not the first's ``next`` knows it has not read what lies between
(``gpujobs logs -f`` reads that rank again). The API parses both back. The shim cuts a line over 64 KiB, and a partial line written
after a quiet spell, into P records; each record is shipped on its own, so such
a line arrives as several events, as a line over the event limit (below) does.
A line that is no record (something else than the shim wrote the file) is
shipped whole as stdout, at the time it is shipped.

Exactly once, across restarts: for each file the offset shipped so far is kept
in ``<state-dir>/logship.json`` (atomic, fsynced). Before a batch is sent, the
batch (file, byte range, last event's time and message) is recorded as in
flight; after PutLogEvents answers, the offset moves past it. PutLogEvents
takes a batch whole or not at all. The store is the authority, though (the
local stack's moto may be killed and restored from an older snapshot): before
a process ships to a stream the first time, and again after the stream turned
out missing, it asks the stream for its last event (GetLogEvents). A batch
still in flight arrived if that event is the batch's last one (its message
holds its ``seq``, so it is unique): only the offset (and the quota's
state) then moves; otherwise it is sent again. Then the offset is taken from
that event's ``seq``, not from the file: the next record after it, or the rest
of a record it is the first part of (the cut is made again, as it was made: see
``_resume``); an empty or missing stream starts at 0 (and its quota count
with it). The in-flight record stays for what the store cannot say: the quota
state a batch changes, committed in the same write as its offset. Files not
written for ``RESYNC_WITHIN_S`` and shipped to their end are not checked
(one call per old file at every start would not scale). A rank over its
quota is not checked either (nothing more of it is shipped); after a store
rolled back, what its quota counted stays counted.

Bounds, as PutLogEvents counts them (each event's message in UTF-8 plus 26
bytes): one batch per stream at a time, read straight from the file, at most
``MAX_BATCH_BYTES`` and ``MAX_BATCH_EVENTS`` (under the call's 1,048,576 bytes
and 10,000 events), a record never split between two batches. One event's
message is at most ``MAX_MESSAGE_BYTES`` once encoded (262,144 bytes, 256 KB,
with its 26) and holds at most ``MAX_LINE_BYTES`` of the file: a record is cut
into as many events as that takes, measured as encoded (a control byte is six,
``\\u0001``; a character outside ASCII its UTF-8), each cut on a UTF-8
character boundary. A last line without its newline (a shim killed while
writing) waits for it until the file has been quiet for ``PARTIAL_AFTER_S``.
A failed call is retried with capped, jittered backoff per stream; the data
stays in the file meanwhile, so memory does not grow with an outage. Files are
read through rankfiles.py: what is not a regular file (a FIFO, a link) is
skipped, logged once.

A quota per stream, so per rank and attempt (``quota_bytes``, default
``LOG_QUOTA_BYTES``, 1 GiB; the agent's ``--log-quota-bytes``), on what is
shipped, counted as above. The event that would pass it is cut to what fits,
and the batch ends with one line of the agent's, ``[truncated: over this
rank's log quota of 1 GiB; ...]`` (its ``seq`` where the rank's shipped bytes
end); from then on that rank's output in this attempt is not read, let alone
sent: its offset moves to the file's end at once and what it passes is
counted as dropped. Once the rank has been quiet for ``QUOTA_SETTLE_S`` (it
ended, or paused), one more line says how much: ``[truncated: 171.7 MiB
(180,000,000 bytes) over this rank's log quota of 1 GiB]`` (its ``seq`` the
file's end), again after each later quiet spell that dropped more, at most
``MAX_COUNT_LINES`` times. These lines go as any batch does (in flight first,
then committed): the quota's state (shipped, over, dropped, reported) is in
``logship.json`` beside the offsets, changed in the same atomic write that
moves them, so a restart neither ships past the quota nor says it twice.

The agent asks (:meth:`Shipper.settled`, :meth:`Shipper.wake`) whether a
rank's file is shipped to its end before it reports the rank's exit, so a
rank's lines are in the store when its end is known.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import stat
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import records
from .backoff import retry_delay
from .rankfiles import read_rank_file
from .shim import PIECE_BYTES

log = logging.getLogger("gpujobs.agent.logs")

MAX_BATCH_BYTES = 900_000
MAX_BATCH_EVENTS = 5_000
#: what PutLogEvents counts for an event beside its message's UTF-8
EVENT_OVERHEAD = 26
#: the longest message of one event, in UTF-8 (PutLogEvents: 256 KB with the 26)
MAX_MESSAGE_BYTES = 262_144 - EVENT_OVERHEAD
#: the most bytes of a rank's file one event holds
MAX_LINE_BYTES = 200_000
PARTIAL_AFTER_S = 2.0
#: what a rank may ship in one attempt, counted as PutLogEvents counts it
LOG_QUOTA_BYTES = 1 << 30
#: how long a rank over its quota is quiet before the count of what it lost is said
QUOTA_SETTLE_S = 30.0
#: the most lines saying that count, per rank and attempt
MAX_COUNT_LINES = 20
#: a batch's events span at most this (PutLogEvents: 24 hours)
MAX_BATCH_SPAN_MS = 23 * 3600 * 1000
#: a file shipped to its end and not written for this long is taken as shipped
#: at start-up, without asking its stream (docstring)
RESYNC_WITHIN_S = 24 * 3600.0
_FILE_RE = re.compile(r"^rank-(\d+)\.log$")


def logs_client(region: str | None = None, endpoint_url: str | None = None):
    """The CloudWatch Logs client, made on first use (one place to point it at
    a shared botocore session later). ``AWS_ENDPOINT_URL_CLOUDWATCH_LOGS``
    (botocore's per-service endpoint variable) points it at a local emulator."""
    import boto3

    return boto3.client("logs", region_name=region or os.environ.get("AWS_DEFAULT_REGION")
                        or os.environ.get("AWS_REGION") or "us-east-1",
                        endpoint_url=endpoint_url)


def emulator_endpoint(inbox_endpoint: str, environ=os.environ) -> str | None:
    """Where to send logs when the inbox is not on AWS: an emulator (the local
    stack's moto server) serves every service at the inbox's address. None on
    AWS, or when botocore's endpoint variables already say where logs go."""
    host = urllib.parse.urlsplit(inbox_endpoint).hostname or ""
    if host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        return None
    if environ.get("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS") or environ.get("AWS_ENDPOINT_URL"):
        return None
    return inbox_endpoint


def stream_name(job_id: str, attempt: int | str, rank: int | str) -> str:
    return f"{job_id}/{attempt}/rank-{rank}"


def encode(stream: str, line: str, seq: int, next_seq: int | None = None) -> str:
    body: dict = {"stream": stream, "line": line, "seq": seq}
    if next_seq is not None:
        body["next"] = next_seq
    return json.dumps(body, ensure_ascii=False)


@dataclass
class _Batch:
    key: str          # the file, relative to the log directory
    start: int
    end: int
    events: list[dict]
    cost: int = 0     # what the rank's own events take of its quota
    over: bool = False  # it ends with the line saying the quota is reached
    reported: int | None = None  # a line saying this many bytes were dropped


def _char_boundary(data: bytes, at: int, floor: int = 0) -> int:
    """``at`` (at most ``len(data)``), moved back to the start of the UTF-8
    character it falls in; never to ``floor`` or before (a run of bytes that
    is no UTF-8 is cut where it is)."""
    if at >= len(data):
        return len(data)
    back = at
    while back > floor + 1 and at - back < 3 and data[back] & 0xC0 == 0x80:
        back -= 1
    return back if data[back] & 0xC0 != 0x80 else at


def _piece(line: bytes, start: int, stream: str, budget: int, seq: int, base: int
           ) -> tuple[int, str, int]:
    """``(end, message, size)``: ``line[start:end]``, its newline dropped, as
    the event message ``encode`` makes of it (``line`` starts at byte ``base``
    of the file, so the event's ``next`` is ``base + end``), ``size`` bytes of UTF-8, at most
    ``budget`` of them and at most MAX_LINE_BYTES of the line; cut on a UTF-8
    character boundary (``_char_boundary``). A cut that does not fit is moved
    back in proportion to what it takes over, so a piece is at least a sixth
    of what would fit. ``end == start`` when not even one character fits."""
    body = len(line) - line.endswith(b"\n")
    end = len(line) if body - start <= MAX_LINE_BYTES else \
        _char_boundary(line, start + MAX_LINE_BYTES, floor=start)
    while end > start:
        if end < len(line) and end - start < 4 and line[end] & 0xC0 == 0x80:
            break  # only part of one character would fit
        message = encode(stream, line[start:end].rstrip(b"\n").decode("utf-8", "replace"), seq,
                         base + end)
        size = len(message.encode())
        if size <= budget:
            return end, message, size
        shorter = start + (min(end, body) - start) * max(budget, 0) // size
        end = _char_boundary(line, shorter, floor=start) if shorter > start else start
    return start, "", 0


def size_text(n: float) -> str:
    """``n`` bytes in binary units, one decimal at most: 512 B, 1.5 KiB, 1 GiB."""
    if n < 1024:
        return f"{int(n)} B"
    units = ["KiB", "MiB", "GiB", "TiB"]
    n /= 1024
    while n >= 1024 and len(units) > 1:
        n /= 1024
        units.pop(0)
    return f"{f'{n:.1f}'.removesuffix('.0')} {units[0]}"


class Shipper:
    """Call ``tick()`` every second or so (its own thread: ``start``/``stop``)."""

    def __init__(self, log_dir: str | os.PathLike, state_dir: str | os.PathLike,
                 log_group: str, *, client_factory: Callable[[], object] = logs_client,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 backoff_base: float = 0.5, backoff_cap: float = 30.0,
                 quota_bytes: int = LOG_QUOTA_BYTES) -> None:
        if quota_bytes <= 0:
            raise ValueError(f"a log quota is a positive number of bytes, not {quota_bytes}")
        self._dir = Path(log_dir)
        self._state_path = Path(state_dir) / "logship.json"
        self.group = log_group
        self.quota = quota_bytes
        self._factory = client_factory
        self._client: Any = None  # a boto3 CloudWatch Logs client, made on first use
        self._clock, self._rng = clock, rng or random.Random()
        self._base, self._cap = backoff_base, backoff_cap
        # {"offsets": {key: int}, "inflight": {key: {...}}, "quota": {stream: {...}}}
        self._state = self._load()
        self._streams: set[str] = set()
        #: files whose offset this process checked against their stream (_sync)
        self._synced: set[str] = set()
        self._failures: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._last_ts: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()

    # -- state ------------------------------------------------------------
    def _load(self) -> dict:
        try:
            data = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return {"offsets": {}, "inflight": {}, "quota": {}}
        return {"offsets": dict(data.get("offsets", {})),
                "inflight": dict(data.get("inflight", {})),
                "quota": dict(data.get("quota", {}))}

    def _save(self) -> None:
        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._state_path.parent, prefix=".logship-")
        with os.fdopen(fd, "w") as f:
            json.dump(self._state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._state_path)

    def offset(self, key: str) -> int:
        return int(self._state["offsets"].get(key, 0))

    def usage(self, stream: str) -> dict:
        """What ``stream`` (a rank's, of one attempt) did with its quota:
        ``shipped`` (bytes, as PutLogEvents counts them), ``over`` (the quota
        was reached), ``dropped`` (bytes of its file not shipped since),
        ``reported`` (the count the last line about it said), ``lines``
        (how many said one)."""
        got = self._state["quota"].get(stream, {})
        return {"shipped": int(got.get("shipped", 0)), "over": bool(got.get("over", False)),
                "dropped": int(got.get("dropped", 0)), "reported": int(got.get("reported", 0)),
                "lines": int(got.get("lines", 0))}

    def _use(self, stream: str, **changes) -> None:
        self._state["quota"][stream] = {**self.usage(stream), **changes}

    # -- the loop -----------------------------------------------------------
    def start(self, period_s: float = 1.0) -> None:
        def loop():
            while not self._stop.is_set():
                self._wake.clear()
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - keep shipping; the files keep the data
                    log.exception("shipping logs failed; going on")
                self._wake.wait(period_s)
        self._thread = threading.Thread(target=loop, name="logship", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Ship now rather than at the next period (a rank just exited)."""
        self._wake.set()

    def settled(self, log_file: str | os.PathLike) -> bool:
        """Whether there is nothing to wait for before a rank whose log is
        ``log_file`` is reported ended: the file is shipped to its end, or the
        shipper cannot ship it now (its stream failing, over its quota, not a
        regular file, not under the log directory). Safe from another thread:
        it only reads."""
        path = Path(log_file)
        try:
            key = str(path.relative_to(self._dir))
            stream = self._stream_of(key)
        except ValueError:
            return True
        if self._failures.get(stream) or self.usage(stream)["over"]:
            return True
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return True
        if not stat.S_ISREG(st.st_mode):
            return True
        return key not in self._state["inflight"] and self.offset(key) >= st.st_size

    def tick(self) -> int:
        """Ship what is new in every file; returns how many events were sent."""
        return self._tick()[0]

    def _tick(self) -> tuple[int, bool]:
        """(events sent, whether any offset moved without sending: over a quota)."""
        sent, dropped = 0, False
        for key in list(self._state["inflight"]):
            self._sync(key)  # did it arrive? (a failed call may have reached the service)
        over: dict[str, list[tuple[str, os.stat_result | None]]] = {}
        for path in sorted(self._files()):
            key = str(path.relative_to(self._dir))
            stream = self._stream_of(key)
            if key not in self._synced and not self._check(path, key):
                continue  # its stream could not be asked yet: retried with backoff
            if key in self._state["inflight"]:
                continue  # one batch in flight per stream, until it is resolved
            if self.usage(stream)["over"]:
                start = self.offset(key)
                over.setdefault(stream, []).append((key, self._drop(path, key)))
                dropped = dropped or self.offset(key) != start
                continue
            for _ in range(20):  # at most 20 batches a file a tick: others get a turn
                if self._clock() < self._not_before.get(stream, 0):
                    break
                batch = self._read(path, key)
                if batch is None:
                    break
                n = self._send(batch)
                sent += n
                if n == 0 or batch.over:
                    break
        for stream, files in over.items():
            sent += self._count_dropped(stream, files)
        return sent, dropped

    def flush(self, timeout_s: float = 10.0) -> None:
        """Ship until nothing is left (partial lines included); for shutdown and tests."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sent, dropped = self._tick()
            if sent == 0 and not dropped and not self._state["inflight"]:
                return
            time.sleep(0.05)

    def _files(self):
        """``<job>/<attempt>/rank-<r>.log`` under the log directory; a
        directory that is a symbolic link is not followed."""
        for job in _subdirs(self._dir):
            for attempt in _subdirs(job):
                try:
                    names = [e.name for e in os.scandir(attempt)]
                except OSError:
                    continue
                for name in names:
                    if _FILE_RE.match(name):
                        yield attempt / name

    @staticmethod
    def _stream_of(key: str) -> str:
        parts = Path(key).parts
        m = _FILE_RE.match(parts[-1]) if len(parts) >= 3 else None
        if m is None:  # never for what _files yields
            raise ValueError(f"not a rank's log file: {key}")
        job, attempt = parts[-3:-1]
        return stream_name(job, attempt, m.group(1))

    def _now_ms(self, stream: str) -> int:
        return max(int(self._clock() * 1000), self._last_ts.get(stream, 0))

    def _over_line(self, timestamp: int, seq: int) -> dict:
        text = (f"[truncated: over this rank's log quota of {size_text(self.quota)}; the rest "
                "of its output in this attempt is not shipped]")
        return {"timestamp": timestamp, "message": encode("stderr", text, seq)}

    def _count_line(self, timestamp: int, dropped: int, seq: int) -> dict:
        text = (f"[truncated: {size_text(dropped)} ({dropped:,} bytes) over this rank's log "
                f"quota of {size_text(self.quota)}]")
        return {"timestamp": timestamp, "message": encode("stderr", text, seq)}

    def _read(self, path: Path, key: str) -> _Batch | None:
        start = self.offset(key)
        before = 1 if start > 0 else 0  # the byte before: is ``start`` a line's start?
        # never blocking, never through a link, bounded (rankfiles.py): a rank
        # run without rank isolation may put anything at its log's path
        got = read_rank_file(path, MAX_BATCH_BYTES + before, offset=start - before,
                             whole=False)
        if got is None:
            return None
        data, st = got
        if st.st_size <= start:
            return None
        line_start = before == 0 or data[:1] == b"\n"
        data = data[before:]
        quiet = self._clock() - st.st_mtime >= PARTIAL_AFTER_S
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < MAX_LINE_BYTES and not quiet:
                return None  # a partial line: wait for its end
            cut = _char_boundary(data, MAX_LINE_BYTES)
        elif cut < len(data) and quiet and start + len(data) == st.st_size:
            cut = len(data)  # the tail has been quiet: ship it without its newline
        units = data[:cut].split(b"\n")
        last = units.pop()
        units = [u + b"\n" for u in units] + ([last] if last else [])
        stream = self._stream_of(key)
        now = self._now_ms(stream)
        prev_ts = self._last_ts.get(stream, 0)
        left = self.quota - self.usage(stream)["shipped"]  # of the quota, before this batch
        events: list[dict] = []
        size = pos = 0

        def full(cost: int) -> bool:
            return bool(events) and (size + cost > MAX_BATCH_BYTES
                                     or len(events) >= MAX_BATCH_EVENTS)

        # the rest of a record (cut into events, a batch ended inside it: only
        # after a store lost events, _resume): the record's own stream and time
        rest_of = None if line_start else self._record_before(path, start)
        for unit in units:
            rec = records.parse(unit) if line_start else rest_of
            if rest_of is not None and not line_start:
                rec = records.Record(rest_of.time_ns, rest_of.stream, rest_of.full,
                                     unit, 0)
            line_start = True  # every unit after the first follows a newline
            if rec is not None:
                label, ts, at = rec.stream, max(rec.time_ms, prev_ts), rec.content_start
            else:  # no record: shipped as stdout, now
                label, ts, at = "stdout", max(now, prev_ts), 0
            if events and ts - events[0]["timestamp"] > MAX_BATCH_SPAN_MS:
                break
            prev_ts = ts
            # where this unit starts: the batch ends here rather than inside it
            mark, unit_at = (len(events), size), pos
            while at < len(unit):
                seq = start + unit_at + (0 if pos == unit_at else at)
                budget = min(MAX_MESSAGE_BYTES, left - size - EVENT_OVERHEAD)
                end, msg, nbytes = _piece(unit, at, label, budget, seq, start + unit_at)
                if end == at:  # the quota is reached: a line says so, and ends the batch
                    line = self._over_line(ts, start + pos)
                    if full(len(line["message"].encode()) + EVENT_OVERHEAD):
                        if mark[0]:  # no room for it: the batch ends before this unit
                            del events[mark[0]:]
                            return _Batch(key, start, start + unit_at, events, mark[1])
                        return _Batch(key, start, start + pos, events, size)
                    return _Batch(key, start, start + pos, events + [line], size, over=True)
                cost = nbytes + EVENT_OVERHEAD
                if full(cost):
                    if mark[0]:  # a record is never split between two batches
                        del events[mark[0]:]
                        return _Batch(key, start, start + unit_at, events, mark[1])
                    return _Batch(key, start, start + pos, events, size)  # one huge line
                events.append({"timestamp": ts, "message": msg})
                size += cost
                pos, at = unit_at + end, end
            pos = unit_at + len(unit)
        return _Batch(key, start, start + pos, events, size) if events else None

    @staticmethod
    def _record_before(path: Path, offset: int) -> records.Record | None:
        """The record byte ``offset`` of ``path`` is inside (not at its start),
        read back to the newline before it; None when none is near enough (a
        line that is no record) or it is no record."""
        back = min(offset, PIECE_BYTES + 1024)
        got = read_rank_file(path, back, offset=offset - back, whole=False)
        if got is None:
            return None
        data = got[0]
        nl = data.rfind(b"\n")
        if nl < 0 and back < offset:
            return None
        return records.parse(data[nl + 1:])

    def _drop(self, path: Path, key: str) -> os.stat_result | None:
        """A file of a rank over its quota: its offset moves to its end, what it
        passes counted as dropped; nothing of it is read. Its fstat (None:
        missing or refused)."""
        got = read_rank_file(path, 0, whole=False)
        if got is None:
            return None
        st, start = got[1], self.offset(key)
        if st.st_size > start:
            stream = self._stream_of(key)
            self._state["offsets"][key] = st.st_size
            self._use(stream, dropped=self.usage(stream)["dropped"] + st.st_size - start)
            self._save()
        return st

    def _count_dropped(self, stream: str, files: list[tuple[str, os.stat_result | None]]) -> int:
        """Say how much a rank over its quota lost, once its file has been
        quiet for QUOTA_SETTLE_S and it lost more than was last said."""
        use = self.usage(stream)
        now = self._clock()
        if use["dropped"] <= use["reported"] or use["lines"] >= MAX_COUNT_LINES \
                or now < self._not_before.get(stream, 0):
            return 0
        if any(st is not None and now - st.st_mtime < QUOTA_SETTLE_S for _, st in files):
            return 0
        key = files[0][0]
        if key in self._state["inflight"]:
            return 0
        line = self._count_line(self._now_ms(stream), use["dropped"], self.offset(key))
        return self._send(_Batch(key, self.offset(key), self.offset(key), [line],
                                 reported=use["dropped"]))

    # -- the store's word ---------------------------------------------------------
    def _check(self, path: Path, key: str) -> bool:
        """Before a file is shipped by this process the first time: its offset
        checked against its stream (:meth:`_sync`), unless it is over its
        quota, or shipped to its end and not written for RESYNC_WITHIN_S.
        Whether it may be shipped now."""
        if self.usage(self._stream_of(key))["over"]:
            self._synced.add(key)
            return True
        got = read_rank_file(path, 0, whole=False)
        if got is None:
            return False
        st = got[1]
        if st.st_size <= self.offset(key) and self._clock() - st.st_mtime > RESYNC_WITHIN_S:
            self._synced.add(key)
            return True
        return self._sync(key, path)

    def _sync(self, key: str, path: Path | None = None) -> bool:
        """Ask ``key``'s stream for its last event: resolve the batch in flight
        (it arrived if that event is its last), then take the offset from
        that event's ``seq`` (:meth:`_resume`). False when the stream could
        not be asked (retried after backoff)."""
        stream = self._stream_of(key)
        if self._clock() < self._not_before.get(stream, 0):
            return False
        try:
            got = self.client.get_log_events(logGroupName=self.group, logStreamName=stream,
                                             startFromHead=False, limit=1)["events"]
        except Exception as e:  # noqa: BLE001
            if _code(e) != "ResourceNotFoundException":
                self._failed(stream, e)
                return False
            got = []
            self._streams.discard(stream)
        last = got[-1] if got else None
        rec = self._state["inflight"].get(key)
        if rec is not None:
            if last is not None and last["message"] == rec["message"] \
                    and int(last["timestamp"]) == int(rec["timestamp"]):
                self._commit(key, rec)
            else:  # it never arrived: forget it; the next read sends the same bytes
                self._state["inflight"].pop(key)
        if not self.usage(stream)["over"]:
            resume = self._resume(path or self._dir / key, last)
            if resume is not None and resume != self.offset(key):
                log.warning("%s: its stream ends at byte %s of %s, not %s as logship.json "
                            "says: shipping from there", stream, resume, key, self.offset(key))
                self._state["offsets"][key] = resume
                if resume == 0:  # nothing of it is stored: nothing counts toward its quota
                    self._state["quota"].pop(stream, None)
        self._save()
        self._synced.add(key)
        self._failures.pop(stream, None)
        return True

    def _resume(self, path: Path, last: dict | None) -> int | None:
        """Where shipping resumes, given the stream's last event: 0 for none;
        else past that event's bytes, found from its ``seq`` (where its bytes
        start) by cutting the record there again as :meth:`_read` did (the cut
        depends only on the bytes, the stream and the seq). None: the event
        has no ``seq`` (an older agent's), or the file cannot be read; the
        offset in logship.json stands."""
        if last is None:
            return 0
        try:
            body = json.loads(last["message"])
            seq = body["seq"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            return None
        before = 1 if seq > 0 else 0
        got = read_rank_file(path, MAX_LINE_BYTES + 1024 + before, offset=seq - before,
                             whole=False)
        if got is None:
            return None
        data, st = got
        if seq >= st.st_size:
            return st.st_size
        line_start = before == 0 or data[:1] == b"\n"
        data = data[before:]
        nl = data.find(b"\n")
        unit = data[:nl + 1] if nl >= 0 else data
        rec = records.parse(unit) if line_start else None
        label, at = (rec.stream, rec.content_start) if rec is not None else ("stdout", 0)
        if at >= len(unit):
            return seq + len(unit)
        end, message, _ = _piece(unit, at, label, MAX_MESSAGE_BYTES, seq, seq)
        if message != last["message"]:
            log.warning("the last event of %s is not what byte %s of %s makes (%.80s); "
                        "resuming past it anyway", path, seq, path, last["message"])
        return seq + (end if end > at else len(unit))

    # -- sending ----------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _ensure_stream(self, stream: str) -> None:
        if stream in self._streams:
            return
        try:
            self.client.create_log_stream(logGroupName=self.group, logStreamName=stream)
        except Exception as e:  # noqa: BLE001 - only "already exists" is fine
            if _code(e) != "ResourceAlreadyExistsException":
                raise
        self._streams.add(stream)

    def _send(self, batch: _Batch) -> int:
        stream = self._stream_of(batch.key)
        last = batch.events[-1]
        record = {"start": batch.start, "end": batch.end, "timestamp": last["timestamp"],
                  "message": last["message"], "cost": batch.cost, "over": batch.over,
                  "reported": batch.reported}
        self._state["inflight"][batch.key] = record
        self._save()
        try:
            self._ensure_stream(stream)
            self.client.put_log_events(logGroupName=self.group, logStreamName=stream,
                                       logEvents=batch.events)
        except Exception as e:  # noqa: BLE001 - retried; the batch stays in flight
            if _code(e) == "ResourceNotFoundException":
                # the stream is gone (deleted, or a store restored from an older
                # snapshot): ask it again before shipping more
                self._streams.discard(stream)
                self._synced.discard(batch.key)
            self._failed(stream, e)
            return 0
        self._commit(batch.key, record)
        return len(batch.events)

    def _commit(self, key: str, record: dict) -> None:
        """The batch ``record`` (in flight) arrived: its offset, and what it
        used of the quota, in one write."""
        stream = self._stream_of(key)
        use = self.usage(stream)
        changes: dict[str, Any] = {"shipped": use["shipped"] + int(record.get("cost") or 0)}
        if record.get("over"):
            changes["over"] = True
        if record.get("reported") is not None:
            changes.update(reported=int(record["reported"]), lines=use["lines"] + 1)
        self._state["offsets"][key] = int(record["end"])
        self._state["inflight"].pop(key, None)
        self._use(stream, **changes)
        self._save()
        timestamp = record["timestamp"]
        self._last_ts[stream] = max(self._last_ts.get(stream, 0), int(timestamp))
        self._failures.pop(stream, None)
        self._not_before.pop(stream, None)

    def _failed(self, stream: str, e: Exception) -> None:
        n = self._failures.get(stream, 0) + 1
        self._failures[stream] = n
        delay = retry_delay(n, self._base, self._cap, self._rng)
        self._not_before[stream] = self._clock() + delay
        log.warning("shipping %s failed (%s); retry %d in %.1fs", stream, e, n, delay)


def _subdirs(directory: Path) -> list[Path]:
    """The directories in ``directory``, not following symbolic links."""
    try:
        return [Path(e.path) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _code(e: Exception) -> str | None:
    return getattr(e, "response", {}).get("Error", {}).get("Code")
