"""Rank processes: start them under the shim, find them again, stop them.

Every rank runs as ``python -I agent/shim.py --exit-file F -- command...``, the
shim leading a new session and process group that the command shares
(shim.py says why), its stdout and stderr the rank's log file, where it writes
the command's output as records. What is recorded per rank is the shim's pid (= the pgid)
and its start time from ``/proc/<pid>/stat``.

Pids are reused, so nothing is signalled on the strength of a recorded pid
alone. The group is ours when its leader still has the recorded start time, or
when no process has that pid at all: Linux keeps a pid number allocated for as
long as any process still uses it as its process group id, so while one member
of our group lives, no other process can get that number. A leader pid in use
by a process that started at another time therefore means our group is empty
and the number went to someone else: it is left alone.

Exit files are read through rankfiles.py (never blocking, a regular file, a
few KiB at most): a rank run without rank isolation can reach them.

Liveness is read from ``/proc`` and zombies count as dead: a rank's processes
are reparented to init when the shim dies, and init may reap late.
This module is Linux-specific where it reads ``/proc``; elsewhere it falls back
to ``kill(pid, 0)`` and does without the start-time check.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .rankfiles import open_rank_file
from .records import agent_record
from .shim import CANNOT_START, FORWARDED, read_exit_file, status_to_exit_code, write_exit_file

log = logging.getLogger("gpujobs.agent.ranks")

SHIM = Path(__file__).resolve().with_name("shim.py")
#: the whole environment of the shim itself: nothing of the job's (its env
#: goes to the command alone, through the shim's stdin)
SHIM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
PROC = Path("/proc")
# the shim vanished without recording an exit code: it was SIGKILLed (the OOM
# killer, or a person); reported as 128 + SIGKILL, the likeliest cause
LOST_EXIT_CODE = 128 + signal.SIGKILL


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    pgrp: int
    start_time: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat``, or None when there is no such process (or no /proc)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name is in parentheses and may itself contain ') ': split at the last
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return ProcStat(pid=pid, state=fields[0], pgrp=int(fields[2]),
                        start_time=int(fields[19]))
    except (IndexError, ValueError):
        return None


class ProcTable:
    """One read of every process's group, taken at most once per agent tick."""

    def __init__(self, stats: dict[int, ProcStat] | None) -> None:
        self._stats = stats  # None: no /proc, fall back to kill(0)

    @classmethod
    def read(cls) -> "ProcTable":
        if not PROC.is_dir():
            return cls(None)
        stats = {}
        for entry in os.scandir(PROC):
            if entry.name.isdigit():
                stat = read_stat(int(entry.name))
                if stat is not None:
                    stats[stat.pid] = stat
        return cls(stats)

    def group(self, pgid: int) -> list[int]:
        """Live (not zombie) processes whose process group is ``pgid``."""
        if self._stats is None:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return []
            except PermissionError:
                pass
            return [pgid]
        return sorted(s.pid for s in self._stats.values() if s.pgrp == pgid and s.alive)


def catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in
    ``/proc/<pid>/status``); None when that cannot be read (no such process,
    no /proc)."""
    try:
        lines = (PROC / str(pid) / "status").read_text().splitlines()
    except (OSError, ValueError):
        return None
    for line in lines:
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
            except (IndexError, ValueError):
                return None
    return None


def group_is_ours(pgid: int, start_time: int | None) -> bool:
    """Whether signalling group ``pgid`` can only reach our rank's processes (see above)."""
    leader = read_stat(pgid)
    return leader is None or start_time is None or leader.start_time == start_time


def find_shims() -> dict[str, int]:
    """Running shims by exit file: finds ranks launched just before a crash, before
    their pids could be recorded (so a restart adopts them instead of launching twice)."""
    found: dict[str, int] = {}
    if not PROC.is_dir():
        return found
    shim = str(SHIM)
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            argv = (PROC / entry.name / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if shim in args and "--exit-file" in args:
            i = args.index("--exit-file")
            stat = read_stat(int(entry.name))
            # the shim leads its group; a child it just forked has the same
            # command line until it execs, but not pid == pgrp
            if i + 1 < len(args) and stat is not None and stat.alive and stat.pgrp == stat.pid:
                found[args[i + 1]] = stat.pid
    return found


class Rank:
    """A handle on one rank's shim and process group, launched or adopted."""

    def __init__(self, *, pid: int | None, pgid: int | None, start_time: int | None,
                 exit_file: str, popen: subprocess.Popen | None = None) -> None:
        self.pid, self.pgid, self.start_time = pid, pgid, start_time
        self.exit_file = exit_file
        self._popen = popen  # set when this agent process is the shim's parent

    def shim_alive(self) -> bool:
        if self.pid is None:
            return False
        if self._popen is not None:
            return self._popen.poll() is None  # also reaps it
        stat = read_stat(self.pid)
        if stat is None or (self.start_time is not None and stat.start_time != self.start_time):
            return False
        if not stat.alive:
            self._reap(self.pid)
            return False
        return True

    @staticmethod
    def _reap(pid: int) -> None:
        # an adopted shim is normally init's child; it is ours only when this
        # process outlived an earlier agent in it (tests) or is a subreaper
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass

    def exit_code(self) -> int | None:
        """The rank's exit code once it exited, else None."""
        code = read_exit_file(self.exit_file, open_rank_file)
        if code is not None or self.shim_alive():
            return code
        # written just before the shim exited
        code = read_exit_file(self.exit_file, open_rank_file)
        if code is not None:
            return code
        if self.pid is None:
            return CANNOT_START
        if self._popen is not None and self._popen.returncode is not None:
            return status_to_exit_code(self._popen.returncode)
        return LOST_EXIT_CODE

    def members(self, table: ProcTable) -> list[int]:
        """Live processes of the rank's group (the shim included while it runs)."""
        self.shim_alive()  # reaps the shim if it is our child and exited
        if self.pgid is None or not group_is_ours(self.pgid, self.start_time):
            return []
        return table.group(self.pgid)

    def terminate(self) -> None:
        """SIGTERM, once to every process of the group: through the shim, which forwards
        it to the group, or straight to the group when the shim is gone."""
        pid = self.pid
        if pid is not None and self.shim_alive():
            _signal(lambda: os.kill(pid, signal.SIGTERM), self)
        else:
            self._signal_group(signal.SIGTERM)

    def ready_for(self, sig: int) -> bool:
        """Whether :meth:`signal` can send ``sig`` now: False only while the shim
        runs but does not catch ``sig`` yet (it is still starting, and would die
        of it, the command not even started); try again a moment later."""
        return self.pid is None or not self.shim_alive() or catches(self.pid, sig) is not False

    def signal(self, sig: int) -> None:
        """``sig`` once to every process of the group, the shim surviving it (a
        time limit's warning, shim.WARNINGS): SIGTERM and SIGINT through the
        shim, which forwards them (as :meth:`terminate`), any other straight to
        the group, after the same ownership check as :meth:`kill`."""
        pid = self.pid
        if sig in FORWARDED and pid is not None and self.shim_alive():
            _signal(lambda: os.kill(pid, sig), self)
        else:
            self._signal_group(sig)

    def kill(self) -> None:
        """SIGKILL to the whole group, the shim included."""
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        if self.pgid is not None and group_is_ours(self.pgid, self.start_time):
            _signal(lambda: os.killpg(self.pgid, sig), self)


def _signal(send, rank: Rank) -> None:
    try:
        send()
    except ProcessLookupError:
        pass
    except PermissionError as e:  # not ours after all; never escalate
        log.error("cannot signal rank group %s: %s", rank.pgid, e)


def open_log_file(log_file: str) -> int:
    """A rank's log file, opened for appending (created mode 0600, the agent's;
    never through a symbolic link): the shim's stdout and stderr. The command
    gets only the shim's pipes, so a rank user cannot write it."""
    return os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                   | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0), 0o600)


class Launcher:
    """Starts ranks under the shim and re-creates handles for recorded ones."""

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python

    def launch(self, command: list[str], env: dict[str, str], log_file: str,
               exit_file: str, cwd: str | None = None, identity=None,
               make_dir: str | None = None, cgroup: Sequence[str] = ()) -> Rank:
        """Start one rank, in ``cwd`` when given; its stdout and stderr become
        records in ``log_file`` (appended; shim.py writes them, records.py
        reads them, agent/logship.py ships them). A ``cwd`` that is not there
        is a rank that cannot start. ``identity`` (isolation.RankIdentity):
        the uid and gid the command runs as; None: as the agent itself.
        ``make_dir``: a directory made (parents too) as that uid before the
        command starts (the job's checkpoint directory outside the operator's
        roots: isolation.give_checkpoint_dir). ``cgroup``: the directories of
        the job's cgroup (agent/cgroups.py), joined before the command starts.

        Never raises for a rank that cannot start: the rank then has exit code 127
        (recorded in its exit file, the reason in its log), as for a command not found."""
        drop = [] if identity is None else [
            "--uid", str(identity.uid), "--gid", str(identity.gid)]
        where = ([] if cwd is None else ["--cwd", cwd]) + (
            [] if make_dir is None else ["--mkdir", make_dir]) + (
            ["--cgroup", ":".join(cgroup)] if cgroup else [])
        argv = [self._python, "-I", str(SHIM), "--exit-file", exit_file, *drop, *where,
                "--env-stdin", "--", *command]
        try:
            for path in (log_file, exit_file):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            out = open_log_file(log_file)
            try:
                # the shim (root, with isolation) starts with SHIM_ENV: the
                # rank's environment reaches only the command (shim.py)
                popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out,
                                         stderr=out, env=SHIM_ENV,
                                         start_new_session=True, close_fds=True)
            except (OSError, ValueError) as e:
                os.write(out, agent_record("stderr", f"gpujobs-agent: cannot start the rank: {e}"))
                raise
            finally:
                os.close(out)
        except (OSError, ValueError) as e:
            log.error("cannot start rank (%s): %s", exit_file, e)
            try:
                write_exit_file(exit_file, CANNOT_START)
            except OSError:
                pass  # exit_code() still says CANNOT_START for a rank without a pid
            return Rank(pid=None, pgid=None, start_time=None, exit_file=exit_file)
        stdin = popen.stdin
        assert stdin is not None  # stdin=PIPE
        try:
            with stdin:
                stdin.write(json.dumps(env).encode())
        except OSError as e:  # the shim is gone already: its exit says the rest
            log.error("cannot give the rank its environment (%s): %s", exit_file, e)
        stat = read_stat(popen.pid)
        return Rank(pid=popen.pid, pgid=popen.pid,
                    start_time=stat.start_time if stat is not None else None,
                    exit_file=exit_file, popen=popen)

    def adopt(self, *, pid: int | None, pgid: int | None, start_time: int | None,
              exit_file: str) -> Rank:
        """A handle on a rank started earlier, possibly by another agent process."""
        return Rank(pid=pid, pgid=pgid, start_time=start_time, exit_file=exit_file)

    def find_shims(self) -> dict[str, int]:
        return find_shims()

    def proc_table(self) -> ProcTable:
        return ProcTable.read()
