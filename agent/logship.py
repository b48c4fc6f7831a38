"""Ships every rank's stdout and stderr to CloudWatch Logs.

Ranks write to files (``rank-<r>.log`` stdout, ``rank-<r>.err`` stderr, under
the agent's log directory); the shipper reads them from the agent's side, so a
rank running as another user needs no AWS access, and a rank that writes while
no agent runs loses nothing: the file is the buffer.

One log stream per job, attempt and rank (``<job>/<attempt>/rank-<r>``) in the
stage's log group (declared in infra/template.yaml, its name handed to the agent
by ``PUT /v1/nodes``). Each event is one line as JSON,
``{"stream": "stdout"|"stderr", "line": "..."}``; the API parses it back.

Exactly once, across restarts: for each file the offset shipped so far is kept
in ``<state-dir>/logship.json`` (atomic, fsynced). Before a batch is sent, the
batch (file, byte range, last event's time and text) is recorded as in flight;
after PutLogEvents answers, the offset moves past it. An agent that stopped
between the two finds the batch still in flight at start-up and asks the stream
for its last event (GetLogEvents): if it is the batch's last line, the batch
arrived and only the offset moves; otherwise it is sent again. PutLogEvents
takes a batch whole or not at all, so nothing is lost or sent twice.

Bounds, as PutLogEvents counts them (each event's message in UTF-8 plus 26
bytes): one batch per stream at a time, read straight from the file, at most
``MAX_BATCH_BYTES`` and ``MAX_BATCH_EVENTS`` (under the call's 1,048,576 bytes
and 10,000 events). One event's message is at most ``MAX_MESSAGE_BYTES`` once
encoded (262,144 bytes, 256 KB, with its 26) and holds at most
``MAX_LINE_BYTES`` of the file: a line is cut into as many events as that
takes, measured as encoded (a control byte is six, ``\\u0001``; a character
outside ASCII its UTF-8), each cut on a UTF-8 character boundary. A partial
last line waits for its newline until the file has been quiet for
``PARTIAL_AFTER_S``. A failed call is retried with capped, jittered backoff per
stream; the data stays in the file meanwhile, so memory does not grow with an
outage. Files are read through rankfiles.py: what is not a regular file (a
FIFO, a link) is skipped, logged once.

A quota per stream, so per rank and attempt (``quota_bytes``, default
``LOG_QUOTA_BYTES``, 1 GiB; the agent's ``--log-quota-bytes``), on what is
shipped, counted as above (stdout and stderr together). The event that would
pass it is cut to what fits, and the batch ends with one line of the agent's,
``[truncated: over this rank's log quota of 1 GiB; ...]``; from then on that
rank's output in this attempt is not read, let alone sent: its offsets move to
the files' ends at once and what they pass is counted as dropped. Once the
rank has been quiet for ``QUOTA_SETTLE_S`` (it ended, or paused), one more
line says how much: ``[truncated: 171.7 MiB (180,000,000 bytes) over this
rank's log quota of 1 GiB]``, again after each later quiet spell that dropped
more, at most ``MAX_COUNT_LINES`` times. These lines go as any batch does (in
flight first, then committed): the quota's state (shipped, over, dropped,
reported) is in ``logship.json`` beside the offsets, changed in the same
atomic write that moves them, so a restart neither ships past the quota nor
says it twice.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .backoff import retry_delay
from .rankfiles import read_rank_file

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
STREAMS = {".log": "stdout", ".err": "stderr"}
_FILE_RE = re.compile(r"^rank-(\d+)\.(log|err)$")


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


def encode(stream: str, line: str) -> str:
    return json.dumps({"stream": stream, "line": line}, ensure_ascii=False)


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


def _piece(line: bytes, start: int, stream: str, budget: int) -> tuple[int, str, int]:
    """``(end, message, size)``: ``line[start:end]``, its newline dropped, as
    the event message ``encode`` makes of it, ``size`` bytes of UTF-8, at most
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
        message = encode(stream, line[start:end].rstrip(b"\n").decode("utf-8", "replace"))
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
        self._failures: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._last_ts: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
        was reached), ``dropped`` (bytes of its files not shipped since),
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
                try:
                    self.tick()
                except Exception:  # noqa: BLE001 - keep shipping; the files keep the data
                    log.exception("shipping logs failed; going on")
                self._stop.wait(period_s)
        self._thread = threading.Thread(target=loop, name="logship", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def tick(self) -> int:
        """Ship what is new in every file; returns how many events were sent."""
        return self._tick()[0]

    def _tick(self) -> tuple[int, bool]:
        """(events sent, whether any offset moved without sending: over a quota)."""
        sent, dropped = 0, False
        for key in list(self._state["inflight"]):
            sent += self._resolve(key)
        over: dict[str, list[tuple[str, os.stat_result | None]]] = {}
        for path in sorted(self._files()):
            key = str(path.relative_to(self._dir))
            stream = self._stream_of(key)
            if self._busy(stream):
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

    def _busy(self, stream: str) -> bool:
        return any(self._stream_of(k) == stream for k in self._state["inflight"])

    def _files(self):
        """``<job>/<attempt>/rank-<r>.(log|err)`` under the log directory; a
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
        job, attempt, name = Path(key).parts[-3:]
        m = _FILE_RE.match(name)
        if m is None:  # never: only matching files are read (_files)
            raise ValueError(f"not a rank's log file: {key}")
        return stream_name(job, attempt, m.group(1))

    def _now_ms(self, stream: str) -> int:
        return max(int(self._clock() * 1000), self._last_ts.get(stream, 0))

    def _over_line(self, timestamp: int) -> dict:
        text = (f"[truncated: over this rank's log quota of {size_text(self.quota)}; the rest "
                "of its output in this attempt is not shipped]")
        return {"timestamp": timestamp, "message": encode("stderr", text)}

    def _count_line(self, timestamp: int, dropped: int) -> dict:
        text = (f"[truncated: {size_text(dropped)} ({dropped:,} bytes) over this rank's log "
                f"quota of {size_text(self.quota)}]")
        return {"timestamp": timestamp, "message": encode("stderr", text)}

    def _read(self, path: Path, key: str) -> _Batch | None:
        start = self.offset(key)
        # never blocking, never through a link, bounded (rankfiles.py): a rank
        # run without rank isolation may put anything at its log's path
        got = read_rank_file(path, MAX_BATCH_BYTES, offset=start, whole=False)
        if got is None:
            return None
        data, st = got
        if st.st_size <= start:
            return None
        quiet = self._clock() - st.st_mtime >= PARTIAL_AFTER_S
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < MAX_LINE_BYTES and not quiet:
                return None  # a partial line: wait for its end
            cut = _char_boundary(data, MAX_LINE_BYTES)
        elif cut < len(data) and quiet and start + len(data) == st.st_size:
            cut = len(data)  # the tail has been quiet: ship it without its newline
        data = data[:cut]
        label = STREAMS[path.suffix]
        stream = self._stream_of(key)
        now = self._now_ms(stream)
        left = self.quota - self.usage(stream)["shipped"]  # of the quota, before this batch
        events: list[dict] = []
        size = pos = 0

        def full(cost: int) -> bool:
            return bool(events) and (size + cost > MAX_BATCH_BYTES
                                     or len(events) >= MAX_BATCH_EVENTS)

        for raw in data.splitlines(keepends=True):
            at = 0
            while at < len(raw):
                budget = min(MAX_MESSAGE_BYTES, left - size - EVENT_OVERHEAD)
                end, msg, nbytes = _piece(raw, at, label, budget)
                if end == at:  # the quota is reached: a line says so, and ends the batch
                    line = self._over_line(now)
                    if full(len(line["message"].encode()) + EVENT_OVERHEAD):
                        return _Batch(key, start, start + pos, events, size)
                    return _Batch(key, start, start + pos, events + [line], size, over=True)
                cost = nbytes + EVENT_OVERHEAD
                if full(cost):
                    return _Batch(key, start, start + pos, events, size)
                events.append({"timestamp": now, "message": msg})
                size += cost
                pos += end - at
                at = end
        return _Batch(key, start, start + pos, events, size) if events else None

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
        """Say how much a rank over its quota lost, once its files have been
        quiet for QUOTA_SETTLE_S and it lost more than was last said."""
        use = self.usage(stream)
        now = self._clock()
        if use["dropped"] <= use["reported"] or use["lines"] >= MAX_COUNT_LINES \
                or now < self._not_before.get(stream, 0):
            return 0
        if any(st is not None and now - st.st_mtime < QUOTA_SETTLE_S for _, st in files):
            return 0
        key = files[0][0]
        line = self._count_line(self._now_ms(stream), use["dropped"])
        return self._send(_Batch(key, self.offset(key), self.offset(key), [line],
                                 reported=use["dropped"]))

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

    def _resolve(self, key: str) -> int:
        """A batch recorded in flight: did it arrive? Move on, or send it again."""
        stream = self._stream_of(key)
        if self._clock() < self._not_before.get(stream, 0):
            return 0
        rec = self._state["inflight"][key]
        try:
            got = self.client.get_log_events(logGroupName=self.group, logStreamName=stream,
                                             startFromHead=False, limit=1)["events"]
        except Exception as e:  # noqa: BLE001
            if _code(e) == "ResourceNotFoundException":
                got = []
            else:
                self._failed(stream, e)
                return 0
        if got and got[-1]["message"] == rec["message"] \
                and int(got[-1]["timestamp"]) == int(rec["timestamp"]):
            self._commit(key, rec)
            return 0
        # it never arrived: forget the record; the next read sends the same bytes
        self._state["inflight"].pop(key)
        self._save()
        return 0

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
