"""The supervisor shim: one per rank, between the agent and the rank's command.

    python -I agent/shim.py --exit-file F [--uid U --gid G] -- command [args...]

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

Exit codes written: the command's own; ``128 + N`` when it was killed by signal
N (the shell's convention); 127 when it could not be started at all, with the
reason in the rank's log.

Standard library only, and run by path with ``-I``, so it neither depends on nor
is disturbed by the rank's PYTHONPATH or working directory.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


USAGE = "usage: shim.py --exit-file FILE [--uid UID --gid GID] [--cwd DIR] -- command [args...]"


def _parse(argv: list[str]) -> tuple[str, list[str], tuple[int, int] | None, str | None]:
    """(exit file, command, (uid, gid) the command runs as or None, the
    directory it runs in or None: the shim's own)."""
    if len(argv) < 4 or argv[0] != "--exit-file":
        raise SystemExit(USAGE)
    run_as = None
    rest = argv[2:]
    if rest[:1] == ["--uid"]:
        if len(rest) < 5 or rest[2] != "--gid":
            raise SystemExit(USAGE)
        try:
            run_as = (int(rest[1]), int(rest[3]))
        except ValueError:
            raise SystemExit(USAGE) from None
        rest = rest[4:]
    cwd = None
    if rest[:1] == ["--cwd"]:
        if len(rest) < 2:
            raise SystemExit(USAGE)
        cwd, rest = rest[1], rest[2:]
    if len(rest) < 2 or rest[0] != "--":
        raise SystemExit(USAGE)
    return argv[1], rest[1:], run_as, cwd


def main(argv: list[str] | None = None) -> int:
    exit_file, command, run_as, cwd = _parse(sys.argv[1:] if argv is None else argv)
    received: list[int] = []
    own_copies: dict[int, int] = {}  # by signal: our own forwarded copies still to arrive

    def forward(signum: int, _frame) -> None:
        # Send one copy to the whole group, so the command and whatever it spawned
        # get exactly one, and swallow the copy that comes back to us. (Not
        # SIG_IGN: a command started right after would inherit it through exec.)
        if own_copies.get(signum):
            own_copies[signum] -= 1
            return
        received.append(signum)
        own_copies[signum] = own_copies.get(signum, 0) + 1
        try:
            os.killpg(os.getpgrp(), signum)
        except OSError:
            own_copies[signum] -= 1

    def survive(_signum: int, _frame) -> None:
        pass  # a warning meant for the command, which the agent sent it too

    for sig in WARNINGS:
        signal.signal(sig, survive)
    for sig in FORWARDED:
        signal.signal(sig, forward)

    if received:  # stopped before the command even started: do not start it
        code = 128 + received[0]
    else:
        try:
            # as the rank user when asked: the shim (root) keeps writing the exit
            # file; the command gets no supplementary groups and a usual umask
            drop: dict[str, Any] = {} if run_as is None else {
                "user": run_as[0], "group": run_as[1], "extra_groups": [], "umask": 0o022}
            # in the job's working_dir when it has one: a relative path in the
            # command is the job's, not the agent's
            child = subprocess.Popen(command, cwd=cwd, **drop)
        except (OSError, ValueError) as e:
            print(f"gpujobs-shim: cannot start {command[0]!r}: {e}", file=sys.stderr, flush=True)
            code = CANNOT_START
        else:
            code = status_to_exit_code(child.wait())
    write_exit_file(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
