"""The supervisor shim: one per rank, between the agent and the rank's command.

    python -I agent/shim.py --exit-file F [--uid U --gid G] [--cwd DIR] [--mkdir DIR]
                            [--cgroup DIR[:DIR...]] [--env-stdin] -- command...

Why it exists: the agent must learn every rank's exit code, also of ranks that a
previous agent process started (after a restart they are no longer its children,
so ``waitpid`` cannot reach them). The shim is the command's parent for the
command's whole life and writes its exit code to F atomically (temporary file,
fsync, ``os.replace``); the agent reads F.

Process layout: the agent starts the shim as the leader of a new session and
process group, and the command runs in that same group (pgid = the shim's pid),
so ``killpg(pgid)`` reaches the command and every descendant that stayed in it.

Signals: SIGTERM (or SIGINT) to the shim is forwarded once to the whole group,
the shim swallowing its own copy, and the shim goes on waiting, so the exit code of
a gracefully stopped rank is still recorded. Every process of the group thus gets
exactly one SIGTERM. A SIGKILL of the group kills the shim too; no exit file is
written then, and the agent, which sent it, knows why. The other signals a time
limit's warning may be (:data:`WARNINGS`) the agent sends to the whole group
itself; the shim catches them only to survive them, doing nothing (a handler,
not SIG_IGN: exec resets a handled signal to its default, so the command gets
the default disposition or installs its own).

Containment: with ``--cgroup`` the shim joins the job's cgroup before it
starts the command (agent/cgroups.py); one it cannot join is a rank that
cannot start.

Privilege: the shim runs as the agent (root, on a host with isolation) and
nothing a tenant controls reaches that part. The agent starts it with a fixed
environment of its own; the rank's environment (the job's ``env``: loader
variables such as ``LD_PRELOAD`` included) comes as JSON on stdin
(``--env-stdin``) and is given only to the command's ``execve``. In the
child, privileges drop first (groups, gid, uid, then no new privileges),
then it makes the job's checkpoint directory (``--mkdir``, when no root the
operator allows holds it) and enters the working directory (``--cwd``), both
as the rank's uid, and only then the command runs: a folder the rank's uid
cannot enter is a rank that cannot start, whatever root could enter.

Exit codes written: the command's own; ``128 + N`` when it was killed by signal
N (the shell's convention); 127 when it could not be started at all, with the
reason in the rank's log.

Output: the shim's own stdout is the rank's log file, opened by the agent in
append mode and never given to the command (a rank user cannot write it). The
command's stdout and stderr are two pipes the shim reads itself, non-blocking,
whichever is ready (``selectors``), and writes to the log file as records in
the CRI log format kubelet and containerd write, one a line::

    2026-12-02T03:04:05.123456789Z stdout F the line, without its newline

- the time: the shim's wall clock (UTC, nanoseconds) when it read the bytes
  that complete the record, never earlier than the record before it in the
  file (:func:`record_time`);
- ``stdout`` or ``stderr``: the pipe. Two pipes give an order only to the
  resolution of the shim's reads, as containerd's do: what the command wrote
  to both between two reads may come out either way round; a command that
  flushes and pauses (even a few ms) between them keeps its order;
- ``F``: a full line; ``P``: a piece of one. A line longer than
  :data:`PIECE_BYTES` (64 KiB: the size of one pipe read and of the pipe's
  buffer, so a piece never needs more than one read's memory; well under the
  shipper's event size, so a piece of text is one event) is written as ``P``
  pieces then an ``F``, each cut between UTF-8 characters where the bytes are
  UTF-8; a partial line (no newline yet) is written as ``P`` once its first
  byte has waited :data:`PARTIAL_AFTER_S` (a quiet command, or a progress bar
  redrawing its line with ``\r``), and at EOF.

Content is kept as bytes, undecoded; a newline in it is impossible by
construction, so a rank cannot forge a record: whatever it prints is content
of a record of its own pipe. The shim's own messages (the command could not
start) are stderr records. The pipes are read continuously, so the command
never waits on the shim for long, whatever it writes. Once the command
exited, both pipes are read to their EOF, but for at most :data:`DRAIN_S` (a
descendant may hold them open), the log file is fsynced, and only then is the
exit file written: a rank's log file is complete once its exit is known.

Standard library only, and run by path with ``-I``, so it neither depends on nor
is disturbed by the rank's PYTHONPATH or working directory (nor can it import
the agent's modules: agent/records.py parses what it writes).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

CANNOT_START = 127
#: what the shim forwards once to its whole group (a stop, or a warning named so)
FORWARDED = (signal.SIGTERM, signal.SIGINT)
#: the other signals a LAUNCH's warn_signal may name (chalicelib/domain/wire.py,
#: WARN_SIGNALS): sent to the whole group by the agent, survived by the shim
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGALRM, signal.SIGWINCH,
            signal.SIGURG)


def write_exit_file(path: str, exit_code: int) -> None:
    """Atomically record ``exit_code`` at ``path``: a reader sees all of it or nothing."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"exit_code": exit_code}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: an exit file is ``{"exit_code": N}``: anything longer is not one
MAX_EXIT_FILE_BYTES = 4096


def read_exit_file(path: str, read_bytes: Callable[[str, int], bytes | None] | None = None
                   ) -> int | None:
    """The exit code recorded at ``path``, or None when nothing is recorded (yet).
    ``read_bytes(path, max_bytes)``: how the file is read, the whole file or
    None; the agent passes agent/rankfiles.py's, as a rank run without rank
    isolation could put anything there. Default: a plain read."""
    try:
        if read_bytes is None:
            with open(path, "rb") as f:
                raw: bytes | None = f.read(MAX_EXIT_FILE_BYTES + 1)
        else:
            raw = read_bytes(path, MAX_EXIT_FILE_BYTES)
        if raw is None or len(raw) > MAX_EXIT_FILE_BYTES:
            return None
        value = json.loads(raw).get("exit_code")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status_to_exit_code(returncode: int) -> int:
    """``subprocess`` returncode to a shell-style exit code (killed by N is 128 + N)."""
    return returncode if returncode >= 0 else 128 - returncode


USAGE = ("usage: shim.py --exit-file FILE [--uid UID --gid GID] [--cwd DIR] [--mkdir DIR] "
         "[--cgroup DIR[:DIR...]] [--env-stdin] -- command [args...]")


@dataclass(frozen=True)
class Options:
    exit_file: str
    command: list[str]
    #: (uid, gid) the command runs as; None: as the shim
    run_as: tuple[int, int] | None = None
    #: the directory the command runs in; None: the shim's own
    cwd: str | None = None
    #: a directory made (parents too) as the command's user before it starts:
    #: the job's checkpoint directory when no root the operator allows holds it
    make_dir: str | None = None
    #: the cgroup directories the shim joins before it starts the command
    #: (agent/cgroups.py): the command and all it forks are born inside
    cgroup: tuple[str, ...] = ()
    #: the command's environment comes on stdin; else it is the shim's own
    env_stdin: bool = False


def _parse(argv: list[str]) -> Options:
    if len(argv) < 4 or argv[0] != "--exit-file":
        raise SystemExit(USAGE)
    exit_file, rest = argv[1], argv[2:]
    run_as = None
    if rest[:1] == ["--uid"]:
        if len(rest) < 5 or rest[2] != "--gid":
            raise SystemExit(USAGE)
        try:
            run_as = (int(rest[1]), int(rest[3]))
        except ValueError:
            raise SystemExit(USAGE) from None
        rest = rest[4:]
    paths: dict[str, str] = {}
    for flag in ("--cwd", "--mkdir", "--cgroup"):
        if rest[:1] == [flag]:
            if len(rest) < 2:
                raise SystemExit(USAGE)
            paths[flag], rest = rest[1], rest[2:]
    env_stdin = rest[:1] == ["--env-stdin"]
    if env_stdin:
        rest = rest[1:]
    if len(rest) < 2 or rest[0] != "--":
        raise SystemExit(USAGE)
    cgroup = tuple(paths["--cgroup"].split(":")) if "--cgroup" in paths else ()
    return Options(exit_file, rest[1:], run_as, paths.get("--cwd"), paths.get("--mkdir"),
                   cgroup, env_stdin)


def read_env(stream) -> dict[str, str]:
    """The command's environment, a JSON object of strings read to EOF."""
    env = json.loads(stream.read() or b"{}")
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the environment on stdin is no JSON object of strings")
    return env


def join_cgroup(dirs: tuple[str, ...]) -> str | None:
    """The shim into the job's cgroup (each of its directories), before it
    starts the command, which is then born inside with all it forks; why
    not, or None."""
    try:
        for d in dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
    except OSError as e:
        return str(e)
    return None


#: prctl(2)'s PR_SET_NO_NEW_PRIVS: no exec after it gains privileges (setuid
#: binaries, file capabilities)
PR_SET_NO_NEW_PRIVS = 38


def entering(cwd: str | None, make_dir: str | None = None) -> Callable[[], None]:
    """What the child does after it dropped privileges (subprocess runs it
    after setgroups, setregid and setreuid, before exec): no new privileges,
    then ``make_dir`` made, then the working directory entered, both as the
    rank's uid. A directory it cannot make is said on its stderr (the rank's
    log) and the command starts anyway (it may not need it); a failure of the
    rest is said there too and exits 127. The shim has one thread, so running
    Python between fork and exec is safe here."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def enter() -> None:
        try:
            if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
            if make_dir is not None:
                try:
                    os.makedirs(make_dir, 0o700, exist_ok=True)  # the job's alone
                except OSError as e:
                    os.write(2, f"gpujobs-shim: cannot make {make_dir}: {e}; starting "
                                "anyway\n".encode())
            if cwd is not None:
                os.chdir(cwd)
        except OSError as e:
            os.write(2, f"gpujobs-shim: cannot start: {e}\n".encode())
            os._exit(CANNOT_START)
    return enter


#: the longest content of one record: a longer line is cut into P pieces (docstring)
PIECE_BYTES = 64 * 1024
#: how long a partial line's first byte waits for its newline before it is written as P
PARTIAL_AFTER_S = 1.0
#: how long the pipes are still read once the command exited (a descendant may hold them)
DRAIN_S = 2.0
#: the pipes' buffer, where the kernel allows it (F_SETPIPE_SZ): a burst of output
#: waits there while the shim writes, not in the command
PIPE_BYTES = 1 << 20


def format_time(time_ns: int) -> bytes:
    """RFC 3339 in UTC with nanoseconds: ``2026-12-02T03:04:05.123456789Z``."""
    seconds, ns = divmod(time_ns, 1_000_000_000)
    return b"%s.%09dZ" % (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)).encode(), ns)


def record(time_ns: int, stream: str, full: bool, content: bytes) -> bytes:
    """One record of a rank's log file (module docstring); ``content`` has no newline."""
    return b"%s %s %s %s\n" % (format_time(time_ns), stream.encode(), b"F" if full else b"P",
                               content)


def char_boundary(data: bytes, at: int) -> int:
    """``at`` (below ``len(data)``) moved back to the start of the UTF-8
    character it falls in, at most 3 bytes and never to 0; where it is when
    the bytes there are no UTF-8."""
    back = at
    while back > 1 and at - back < 3 and data[back] & 0xC0 == 0x80:
        back -= 1
    return back if data[back] & 0xC0 != 0x80 else at


def whole_characters(data: bytes) -> int:
    """How much of ``data`` to write now without splitting a UTF-8 character
    that its next bytes may complete: all of it, or all but an incomplete
    trailing sequence (never nothing: a lone lead byte is written as it is)."""
    for i in range(len(data) - 1, max(len(data) - 4, 0) - 1, -1):
        byte = data[i]
        if byte & 0xC0 == 0x80:
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else \
            4 if byte & 0xF8 == 0xF0 else 1
        return i if i + need > len(data) and i > 0 else len(data)
    return len(data)


class RecordWriter:
    """Turns what the shim reads from the command's pipes into records on ``fd``."""

    STREAMS = ("stdout", "stderr")

    def __init__(self, fd: int, clock_ns: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.fd, self._clock_ns, self._monotonic = fd, clock_ns, monotonic
        self._last_ns = 0
        self._pending = {s: b"" for s in self.STREAMS}  # a partial line, < PIECE_BYTES
        self._since: dict[str, float] = {}  # when a pending partial's first byte was read
        self._failed = False

    def _now_ns(self) -> int:
        self._last_ns = max(self._last_ns, self._clock_ns())
        return self._last_ns

    def feed(self, stream: str, data: bytes) -> None:
        """``data``, just read from ``stream``'s pipe."""
        prefix = b"%s %s " % (format_time(self._now_ns()), stream.encode())
        buf = self._pending[stream] + data
        lines = buf.split(b"\n")
        rest = lines.pop()  # after the last newline: a partial line, or nothing
        full = prefix + b"F "
        out: list[bytes] = []
        if lines and len(buf) - len(rest) <= PIECE_BYTES:  # no line to cut: one join
            out.append(full + (b"\n" + full).join(lines) + b"\n")
        else:
            for line in lines:
                while len(line) > PIECE_BYTES:
                    cut = char_boundary(line, PIECE_BYTES)
                    out += (prefix, b"P ", line[:cut], b"\n")
                    line = line[cut:]
                out += (full, line, b"\n")
        while len(rest) > PIECE_BYTES:
            cut = char_boundary(rest, PIECE_BYTES)
            out += (prefix, b"P ", rest[:cut], b"\n")
            rest = rest[cut:]
        consumed = len(buf) - len(rest) > 0
        self._pending[stream] = rest
        if not rest:
            self._since.pop(stream, None)
        elif consumed or stream not in self._since:
            self._since[stream] = self._monotonic()
        self._write(b"".join(out))

    def due(self) -> float | None:
        """When the oldest partial line is to be written (monotonic), if any."""
        return min(self._since.values()) + PARTIAL_AFTER_S if self._since else None

    def flush_partials(self, eof: tuple[str, ...] = ()) -> None:
        """Write as P each partial line that waited PARTIAL_AFTER_S, and every
        one of the ``eof`` streams whatever its age."""
        now = self._monotonic()
        for stream in self.STREAMS:
            pending = self._pending[stream]
            if not pending or (stream not in eof
                               and now < self._since.get(stream, now) + PARTIAL_AFTER_S):
                continue
            n = len(pending) if stream in eof else whole_characters(pending)
            self._pending[stream] = pending[n:]
            if pending[n:]:
                self._since[stream] = now
            else:
                self._since.pop(stream, None)
            self._write(record(self._now_ns(), stream, False, pending[:n]))

    def message(self, text: str) -> None:
        """One of the shim's own lines, as a stderr record."""
        self._write(record(self._now_ns(), "stderr", True,
                           text.replace("\n", " ").encode("utf-8", "replace")))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except InterruptedError:
                continue
            except OSError as e:  # a full disk: the output is lost, the pipes still drained
                if not self._failed:
                    self._failed = True
                    print(f"gpujobs-shim: cannot write the rank's log: {e}", file=sys.stderr)
                return

    def sync(self) -> None:
        try:
            os.fsync(self.fd)
        except OSError:
            pass  # not a file (a test's pipe): nothing to make durable


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    try:
        import fcntl
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # the default buffer (64 KiB on Linux)
    return r, w


def pump(child: subprocess.Popen, pipes: dict[int, str], writer: RecordWriter,
         wake: int) -> int:
    """Read the command's pipes into records until it exited and they reached
    EOF (at most DRAIN_S after the exit); its exit code. ``wake``: the read
    end of the signals' wakeup pipe (a SIGCHLD ends the wait at once)."""
    sel = selectors.DefaultSelector()
    for fd, stream in pipes.items():
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ, stream)
    sel.register(wake, selectors.EVENT_READ, None)
    code: int | None = None
    drain_until = 0.0
    while True:
        if code is None:
            returncode = child.poll()
            if returncode is not None:
                code = status_to_exit_code(returncode)
                drain_until = time.monotonic() + DRAIN_S
        now = time.monotonic()
        if code is not None and (not pipes or now >= drain_until):
            break
        timeouts = [1.0]  # a SIGCHLD wakes it first; this in case one is missed
        due = writer.due()
        if due is not None:
            timeouts.append(due - now)
        if code is not None:
            timeouts.append(drain_until - now)
        for key, _ in sel.select(max(0.0, min(timeouts))):
            if key.data is None:
                try:
                    while os.read(wake, 4096):
                        pass
                except OSError:
                    pass
                continue
            try:
                data = os.read(key.fd, PIECE_BYTES)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if data:
                writer.feed(key.data, data)
            else:  # EOF: every writer of this pipe is gone
                sel.unregister(key.fd)
                os.close(key.fd)
                writer.flush_partials(eof=(pipes.pop(key.fd),))
        writer.flush_partials()
    for fd in list(pipes):  # held open by a descendant past DRAIN_S: what came is written
        sel.unregister(fd)
        os.close(fd)
    writer.flush_partials(eof=tuple(pipes.values()))
    sel.close()
    return code


def main(argv: list[str] | None = None) -> int:
    options = _parse(sys.argv[1:] if argv is None else argv)
    exit_file, command, run_as = options.exit_file, options.command, options.run_as
    received: list[int] = []
    own_copies: dict[int, int] = {}  # by signal: our own forwarded copies still to arrive
    #: signals that came before the command was started: held, and sent to it
    #: once it is (a SIGTERM while it was being started is not lost)
    held: list[int] = []
    started = [False]
    writer = RecordWriter(sys.stdout.fileno())

    def to_group(signum: int) -> None:
        own_copies[signum] = own_copies.get(signum, 0) + 1
        try:
            os.killpg(os.getpgrp(), signum)
        except OSError:
            own_copies[signum] -= 1

    def forward(signum: int, _frame) -> None:
        # Send one copy to the whole group, so the command and whatever it spawned
        # get exactly one, and swallow the copy that comes back to us. (Not
        # SIG_IGN: a command started right after would inherit it through exec.)
        if own_copies.get(signum):
            own_copies[signum] -= 1
            return
        received.append(signum)
        if not started[0]:
            held.append(signum)  # nothing to send it to yet: sent once started
            return
        to_group(signum)

    def survive(_signum: int, _frame) -> None:
        pass  # a warning meant for the command, which the agent sent it too

    for sig in WARNINGS:
        signal.signal(sig, survive)
    for sig in FORWARDED:
        signal.signal(sig, forward)
    # any signal (SIGCHLD: the command exited) wakes the pump's select at once
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, survive)

    env, bad_env = None, None
    if options.env_stdin:
        try:
            env = read_env(sys.stdin.buffer)
        except ValueError as e:  # (json's errors are ValueErrors too)
            bad_env = str(e)
    if received:  # stopped before the command even started: do not start it
        code = 128 + received[0]
    elif bad_env is not None:
        writer.message(f"gpujobs-shim: cannot start {command[0]!r}: {bad_env}")
        code = CANNOT_START
    elif (cgroup_error := join_cgroup(options.cgroup)) is not None:
        writer.message(f"gpujobs-shim: cannot start {command[0]!r}: cannot join its "
                       f"cgroup: {cgroup_error}")
        code = CANNOT_START
    else:
        out_r, out_w = _pipe()
        err_r, err_w = _pipe()
        try:
            # as the rank user when asked: the shim (root) keeps writing the exit
            # file and the log; the command gets no supplementary groups, a usual
            # umask, and of its output only the two pipes
            drop: dict[str, Any] = {} if run_as is None else {
                "user": run_as[0], "group": run_as[1], "extra_groups": [], "umask": 0o022}
            # the job's working_dir (a relative path in the command is the
            # job's, not the agent's) is entered after the drop, not by
            # Popen's cwd, which chdirs before it; the environment is only
            # the command's
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=out_w,
                                     stderr=err_w,
                                     preexec_fn=entering(options.cwd, options.make_dir), **drop)
        except (OSError, ValueError) as e:
            for fd in (out_r, err_r, out_w, err_w):
                os.close(fd)
            writer.message(f"gpujobs-shim: cannot start {command[0]!r}: {e}")
            code = CANNOT_START
        else:
            started[0] = True
            for signum in dict.fromkeys(held):  # came while it was being started
                to_group(signum)
            for fd in (out_w, err_w):  # the command's now: EOF once it and its own are gone
                os.close(fd)
            code = pump(child, {out_r: "stdout", err_r: "stderr"}, writer, wake_r)
    writer.sync()  # the log is complete and durable before the exit is known
    write_exit_file(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
