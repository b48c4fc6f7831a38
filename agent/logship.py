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

Bounds: one batch per stream at a time, read straight from the file, at most
``MAX_BATCH_BYTES`` and ``MAX_BATCH_EVENTS`` (under PutLogEvents' 1,048,576
bytes, counting 26 bytes an event, and 10,000 events); a line longer than
``MAX_LINE_BYTES`` is cut into several events. A partial last line waits for its
newline until the file has been quiet for ``PARTIAL_AFTER_S``. A failed call is
retried with capped, jittered backoff per stream; the data stays in the file
meanwhile, so memory does not grow with an outage. Files are read through
rankfiles.py: what is not a regular file (a FIFO, a link) is skipped, logged once.
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
EVENT_OVERHEAD = 26
MAX_LINE_BYTES = 200_000
PARTIAL_AFTER_S = 2.0
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


class Shipper:
    """Call ``tick()`` every second or so (its own thread: ``start``/``stop``)."""

    def __init__(self, log_dir: str | os.PathLike, state_dir: str | os.PathLike,
                 log_group: str, *, client_factory: Callable[[], object] = logs_client,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 backoff_base: float = 0.5, backoff_cap: float = 30.0) -> None:
        self._dir = Path(log_dir)
        self._state_path = Path(state_dir) / "logship.json"
        self.group = log_group
        self._factory = client_factory
        self._client: Any = None  # a boto3 CloudWatch Logs client, made on first use
        self._clock, self._rng = clock, rng or random.Random()
        self._base, self._cap = backoff_base, backoff_cap
        self._state = self._load()  # {"offsets": {key: int}, "inflight": {key: {...}}}
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
            return {"offsets": {}, "inflight": {}}
        return {"offsets": dict(data.get("offsets", {})),
                "inflight": dict(data.get("inflight", {}))}

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
        sent = 0
        for key in list(self._state["inflight"]):
            sent += self._resolve(key)
        for path in sorted(self._files()):
            key = str(path.relative_to(self._dir))
            for _ in range(20):  # at most 20 batches a file a tick: others get a turn
                if self._clock() < self._not_before.get(self._stream_of(key), 0):
                    break
                batch = self._read(path, key)
                if batch is None:
                    break
                n = self._send(batch)
                sent += n
                if n == 0:
                    break
        return sent

    def flush(self, timeout_s: float = 10.0) -> None:
        """Ship until nothing is left (partial lines included); for shutdown and tests."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.tick() == 0 and not self._state["inflight"]:
                return
            time.sleep(0.05)

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

    @staticmethod
    def _pieces(line: bytes):
        """``line`` in pieces of at most MAX_LINE_BYTES, each cut on a UTF-8
        character boundary (a character is never split into two U+FFFD)."""
        start = 0
        while True:
            end = _char_boundary(line, start + MAX_LINE_BYTES, floor=start)
            yield line[start:end]
            if end >= len(line):
                return
            start = end

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
        stream = STREAMS[path.suffix]
        now = max(int(self._clock() * 1000), self._last_ts.get(self._stream_of(key), 0))
        events: list[dict] = []
        size = pos = 0
        for raw in data.splitlines(keepends=True):
            for piece in self._pieces(raw):
                msg = encode(stream, piece.rstrip(b"\n").decode("utf-8", "replace"))
                cost = len(msg.encode()) + EVENT_OVERHEAD
                if events and (size + cost > MAX_BATCH_BYTES or len(events) >= MAX_BATCH_EVENTS):
                    return _Batch(key, start, start + pos, events)
                events.append({"timestamp": now, "message": msg})
                size += cost
                pos += len(piece)
        return _Batch(key, start, start + pos, events) if events else None

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
        self._state["inflight"][batch.key] = {
            "start": batch.start, "end": batch.end, "timestamp": last["timestamp"],
            "message": last["message"]}
        self._save()
        try:
            self._ensure_stream(stream)
            self.client.put_log_events(logGroupName=self.group, logStreamName=stream,
                                       logEvents=batch.events)
        except Exception as e:  # noqa: BLE001 - retried; the batch stays in flight
            self._failed(stream, e)
            return 0
        self._commit(batch.key, batch.end, last["timestamp"])
        return len(batch.events)

    def _commit(self, key: str, end: int, timestamp: int) -> None:
        self._state["offsets"][key] = end
        self._state["inflight"].pop(key, None)
        self._save()
        stream = self._stream_of(key)
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
            self._commit(key, int(rec["end"]), rec["timestamp"])
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
