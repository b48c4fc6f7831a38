"""A rank's Python stack, taken from outside with ``py-spy dump``.

A rank blocked in a gloo collective and one hung in ``time.sleep`` look alike in
``/proc`` (state S, no CPU); their stacks tell them apart
(chalicelib/domain/stacks.py reads them). The agent takes the stack of the
rank's own command process (the shim's child, procs.py) with
``py-spy dump --pid P --json --nonblocking`` (it does not stop the rank; how
long a dump takes is in docs/benchmarks.md), bounded by a timeout, never more
often than ``GPUJOBS_STACK_EVERY_S`` per rank, and only for ranks that went
silent or never beat (beats.py), so a healthy instrumented job pays nothing.
Before a CANCEL's first SIGTERM it takes every live rank's stack (core.py), to
say where each one was.

py-spy is the host's (agent/README.md): ``GPUJOBS_PY_SPY`` names it, else the
one next to ``sys.executable``, else the one on PATH; without it there are no
stacks (logged once), never an error. It needs ptrace rights over the rank
(root, or the rank's user with ptrace allowed).

``/proc/<pid>/wchan`` is the cheap evidence that needs no py-spy: the kernel
function the process sleeps in (``futex_do_wait`` for a gloo wait,
``hrtimer_nanosleep`` for a sleep); procs.py posts it with the sample.

Wire shape (api/schemas.py HEARTBEATS ``proc.stack``): ``{"frames": [...],
"code": str, "age_s": float}``, frames ``func (short_filename:line)``
innermost first, at most :data:`MAX_FRAMES`, each at most :data:`MAX_CHARS`.
"""
from __future__ import annotations

import functools
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import tokenize
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, TypeVar

from chalicelib.domain.stacks import focus, where

from .rankfiles import open_rank_file
from .uidpool import process_uids

#: the key a caller names its stacks by (a rank, or (attempt, rank))
K = TypeVar("K", bound=Hashable)

log = logging.getLogger("gpujobs.agent.stacks")

MAX_FRAMES = 16
MAX_CHARS = 200
MAX_WCHAN = 64
#: seconds one ``py-spy dump`` may take before it is given up
TIMEOUT_S = 3.0
#: the least time between two stacks of one rank (``GPUJOBS_STACK_EVERY_S``)
EVERY_S = 10.0
#: how many dumps run at once (a host has a handful of ranks)
WORKERS = 8
#: the bound on a STOPPED report's ``stacks`` (the API takes bodies up to 64 KiB)
REPORT_BUDGET_B = 40 * 1024
MAX_REPORT_STACKS = 64
MAX_AGE_S = 3600.0

Dump = Callable[[int], "dict | None"]


def find_py_spy(env: Mapping[str, str] | None = None) -> str | None:
    """The py-spy to run: ``GPUJOBS_PY_SPY`` (empty: none), the one next to
    ``sys.executable``, or the one on PATH; None when there is none."""
    env = os.environ if env is None else env
    named = env.get("GPUJOBS_PY_SPY")
    if named is not None:
        return named or None
    beside = Path(sys.executable).parent / "py-spy"
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def every_s(env: Mapping[str, str] | None = None) -> float:
    """``GPUJOBS_STACK_EVERY_S`` (default :data:`EVERY_S`); a bad value is the default."""
    raw = (os.environ if env is None else env).get("GPUJOBS_STACK_EVERY_S")
    try:
        value = float(raw) if raw else EVERY_S
    except ValueError:
        return EVERY_S
    return value if value >= 0 else EVERY_S


def _cut(text: str, n: int = MAX_CHARS) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _main_thread(threads: list, pid: int | None) -> dict | None:
    threads = [t for t in threads if isinstance(t, dict)]
    for t in threads:
        if t.get("thread_name") == "MainThread":
            return t
    for t in threads:  # --nonblocking names no thread: the main one has the pid as its tid
        if pid is not None and t.get("os_thread_id") == pid:
            return t
    return threads[0] if threads else None


#: how much of a source file is read for its line (a stack names any file)
MAX_SOURCE_BYTES = 1 << 20


def source_line(filename: str | None, line: int | None, uid: int | None = None) -> str | None:
    """Line ``line`` of ``filename``, stripped and cut, or None (never raises).

    The rank names the file (its code objects' ``co_filename``), so it is read
    as a rank's file (rankfiles.py): never blocking (a FIFO), never through a
    symbolic link, at most :data:`MAX_SOURCE_BYTES`; and with ranks run as
    ``uid`` only a file of that user or one every user may read, so the
    agent (root) never quotes a line of a file the rank could not read
    itself (``/etc/shadow``) into its stack."""
    if not filename or not isinstance(line, int) or line < 1:
        return None
    raw = open_rank_file(filename, MAX_SOURCE_BYTES, whole=False, uid=uid,
                         world_readable_ok=True)
    if raw is None:
        return None
    lines = raw.split(b"\n", line)
    if len(lines) < line:
        return None
    # a line far longer than any shown (a file of NULs) is not tokenised whole
    text = _code_only(lines[line - 1][:4 * MAX_CHARS].decode("utf-8", "replace"))
    return _cut(text) if text else None


def _code_only(line: str) -> str:
    """A source line without its indentation and its trailing comment
    (``loss.backward()  # DDP's all-reduce`` → ``loss.backward()``); a ``#``
    inside a string literal is kept."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return line.strip()
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    return (line.strip()[:comment.start[1]] if comment else line.strip()).rstrip()


def _file(frame: dict) -> str:
    """A frame's file as a frame string names it: py-spy's short name (the
    package part: ``torch/autograd/graph.py``, or a script's own name), but
    the standard library's from ``lib/pythonX.Y/``, which py-spy shortens to
    a bare name (``weakref.py``) that would pass for the rank's own code."""
    full = frame.get("filename") or ""
    i = full.find("lib/python")
    if i >= 0 and "-packages/" not in full:
        return full[i:]
    return frame.get("short_filename") or full or "?"


def parse_dump(text: str, pid: int | None = None, uid: int | None = None) -> dict | None:
    """``{"frames": [...], "code": str?}`` of the main thread of a
    ``py-spy dump --json`` output, or None when it holds no stack. ``uid``:
    the uid of the dumped rank (None: any), for :func:`source_line`."""
    try:
        threads = json.loads(text)
    except ValueError:
        return None
    thread = _main_thread(threads if isinstance(threads, list) else [], pid)
    if thread is None:
        return None
    raw = [f for f in thread.get("frames") or [] if isinstance(f, dict)][:MAX_FRAMES]
    frames = [_cut(f"{f.get('name') or '?'} ({_file(f)}:{f.get('line') or 0})") for f in raw]
    if not frames:
        return None
    out: dict = {"frames": frames}
    i = focus(frames)
    if i is not None:
        code = source_line(raw[i].get("filename"), raw[i].get("line"), uid)
        if code:
            out["code"] = code
    return out


class PySpy:
    """``dump(pid)``: the process's stack (:func:`parse_dump`), or None when
    py-spy is absent, fails or takes longer than ``timeout_s``."""

    def __init__(self, path: str | None = None, *, timeout_s: float = TIMEOUT_S,
                 env: Mapping[str, str] | None = None, isolated: bool = False) -> None:
        self.path = path if path is not None else find_py_spy(env)
        self.timeout_s = timeout_s
        #: ranks run as uids of their own (uidpool.py): a stack quotes only
        #: source files of the dumped process's uid, or that every user reads
        self.isolated = isolated
        self._warned = False

    @property
    def available(self) -> bool:
        return bool(self.path)

    def _absent(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("no Python stacks of ranks: %s (install py-spy on the host, "
                        "agent/README.md; wchan and state are still posted)", why)

    def __call__(self, pid: int) -> dict | None:
        if not self.path:
            self._absent("py-spy not found")
            return None
        try:
            done = subprocess.run([self.path, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                                  capture_output=True, timeout=self.timeout_s, text=True,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            self._absent(f"{self.path} does not exist")
            self.path = None
            return None
        except (OSError, subprocess.SubprocessError) as e:
            log.info("py-spy dump of pid %s failed: %s", pid, e)
            return None
        if done.returncode != 0:
            log.info("py-spy dump of pid %s failed (%s): %s", pid, done.returncode,
                     done.stderr.strip()[-300:])
            return None
        return parse_dump(done.stdout, pid, self.uid_of(pid))

    def uid_of(self, pid: int) -> int | None:
        """Whose files a stack of ``pid`` may quote: None (any: ranks run as
        the agent), else the process's real uid when it is no root process,
        else -1 (only files every user may read)."""
        if not self.isolated:
            return None
        uids = process_uids(pid)
        return uids.pop() if len(uids) == 1 and 0 not in uids else -1


def read_wchan(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The kernel function ``pid`` sleeps in (``/proc/<pid>/wchan``), or None
    when it runs, is gone or is not ours to read."""
    try:
        text = (proc / str(pid) / "wchan").read_text().strip()
    except (OSError, ValueError):
        return None
    return text[:MAX_WCHAN] if text and text != "0" else None


class StackSampler:
    """The latest stack of each rank (any hashable key), taken in a small pool
    of threads so that no caller waits on py-spy: :meth:`request` starts a dump
    when one is due, :meth:`latest` answers what the last finished one found.
    :meth:`capture` (before a kill) waits, at most the dumper's timeout."""

    def __init__(self, dump: Dump | None = None, *, every_s_: float | None = None,
                 timeout_s: float = TIMEOUT_S, workers: int = WORKERS,
                 monotonic_ns: Callable[[], int] = time.monotonic_ns,
                 isolated: bool = False) -> None:
        self._dump = dump if dump is not None else PySpy(timeout_s=timeout_s, isolated=isolated)
        self.every_ns = int((every_s() if every_s_ is None else every_s_) * 1e9)
        self.timeout_s = timeout_s
        self._mono = monotonic_ns
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._tried: dict[Hashable, int] = {}             # key -> ns of the last request
        self._running: dict[Hashable, Future] = {}
        self._latest: dict[Hashable, tuple[int, dict]] = {}  # key -> (ns taken, stack)

    @property
    def available(self) -> bool:
        return getattr(self._dump, "available", True)

    def _submit(self, pid: int) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="py-spy")
        return self._pool.submit(self._safe_dump, pid)

    def _safe_dump(self, pid: int) -> dict | None:
        try:
            return self._dump(pid)
        except Exception:  # noqa: BLE001 - a stack is evidence, never a failure
            log.exception("taking the stack of pid %s failed", pid)
            return None

    def request(self, key: Hashable, pid: int) -> bool:
        """Start a dump of ``pid`` for ``key`` unless one runs or the last one
        started less than ``every_s`` ago; True if one was started."""
        if not self.available:
            return False
        now = self._mono()
        last = self._tried.get(key)
        if key in self._running or (last is not None and now - last < self.every_ns):
            return False
        self._tried[key] = now
        future = self._submit(pid)
        self._running[key] = future
        future.add_done_callback(functools.partial(self._done, key, now))
        return True

    def _done(self, key: Hashable, taken_ns: int, future: Future) -> None:
        with self._lock:
            if self._running.get(key) is future:
                del self._running[key]
                stack = None if future.cancelled() else future.result()
                if stack:
                    self._latest[key] = (taken_ns, stack)

    def latest(self, key: Hashable) -> dict | None:
        """``{"frames", "code"?, "age_s"}`` of the last stack taken for ``key``."""
        with self._lock:
            got = self._latest.get(key)
        if got is None:
            return None
        taken, stack = got
        age = min(MAX_AGE_S, max(0.0, (self._mono() - taken) / 1e9))
        return {**stack, "age_s": round(age, 3)}

    def taken_ns(self, key: Hashable) -> int | None:
        with self._lock:
            got = self._latest.get(key)
        return None if got is None else got[0]

    def drop(self, key: Hashable) -> None:
        """Forget ``key``'s stack (the rank beat again: it moved on)."""
        with self._lock:
            self._latest.pop(key, None)

    def forget(self, keys) -> None:
        with self._lock:
            for key in list(keys):
                self._latest.pop(key, None)
                self._tried.pop(key, None)
                self._running.pop(key, None)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(set(self._latest) | set(self._tried))

    def capture(self, pids: Mapping[K, int]) -> dict[K, dict]:
        """Every ``pid``'s stack now, concurrently, waiting at most the timeout:
        ``{key: {"frames", "code"?}}`` for those that answered in time."""
        if not pids or not self.available:
            return {}
        # a pool of its own: dumps of silent ranks still running in the
        # shared one must not queue these behind them
        pool = ThreadPoolExecutor(min(len(pids), MAX_REPORT_STACKS),
                                  thread_name_prefix="py-spy-capture")
        try:
            futures = {key: pool.submit(self._safe_dump, pid) for key, pid in pids.items()}
            wait(list(futures.values()), timeout=self.timeout_s)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        out: dict[K, dict] = {}
        for key, f in futures.items():
            stack = f.result() if f.done() and not f.cancelled() else None
            if stack:
                out[key] = stack
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def report_stacks(by_rank: Mapping[int, dict], budget_b: int = REPORT_BUDGET_B) -> list[dict]:
    """The STOPPED report's ``stacks``: ``[{"rank", "where", "frames"}]`` by
    rank, at most :data:`MAX_REPORT_STACKS`, cut (outer frames first, then the
    frames altogether, then ranks) to fit ``budget_b`` bytes of JSON."""
    entries: list[dict[str, Any]] = [
               {"rank": r, "where": _cut(where(s) or "?", 2 * MAX_CHARS + 64),
                "frames": list(s.get("frames") or [])[:MAX_FRAMES]}
               for r, s in sorted(by_rank.items())][:MAX_REPORT_STACKS]

    def size() -> int:
        return len(json.dumps(entries))

    keep = MAX_FRAMES
    while entries and size() > budget_b:
        if keep > 0:
            keep //= 2
            for e in entries:
                e["frames"] = e["frames"][:keep]
        else:
            entries.pop()
    return entries
