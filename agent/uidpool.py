"""A user per job on a host: the pool of uids the agent owns (issue 24, item 2).

Running as root, the agent runs every attempt's ranks on this node as a uid
of its own, taken from ``--rank-uids FIRST-LAST`` (default
:data:`DEFAULT_RANK_UIDS`), its gid the same number, no supplementary groups
(the shim drops them). All ranks of one attempt on this node share it (they
talk through shared memory, gloo and NCCL); ranks of two jobs never do, so a
rank cannot signal, ptrace or read ``/proc/<pid>/environ`` of another job's
rank, nor open its heartbeat directory (0700, its uid's).

- The numbers need no passwd entries (``setuid`` to a bare number works). At
  start (:func:`check_range`) a range that holds uid 0, a uid of a passwd
  entry, a gid of a group entry (the rank's gid is its uid's number: it would
  be in that group), a range of ``/etc/subuid`` or ``/etc/subgid`` (someone's
  user namespaces), or a uid this process cannot map (a container's
  ``uid_map``) is refused: the agent exits 2 saying which.
- Why 70000-70999 by default: above login.defs' UID_MAX (60000), systemd's
  homed, container-bind and DynamicUser ranges (60001-65519) and the 16-bit
  range (65534 ``nobody``, 65535), inside what systemd's UIDS-GIDS.md leaves
  unused (65536-524287), and below shadow's SUB_UID_MIN (100000: where
  ``useradd`` puts users' subuid ranges) and sssd's default id-mapping floor
  (200000). 524288 and up (600000, say) is where systemd-nspawn and machined
  pick container ranges.
- The allocation is recorded in the agent's state (state.py's
  ``AttemptRecord.uid``) before any rank starts, so a restarted agent that
  adopts running ranks knows each attempt's uid and never hands it out twice.
  A uid is never handed out while any process on the host has it (a scan of
  ``/proc/<pid>/status``), whoever started it, unless it is the same
  attempt's (below).
- **The same uid on every node**: a job's uid is chosen from its id (the
  range's ``crc32(job_id) % size``-th, then the next free ones in turn), so
  every node running the job, and every attempt of it, picks the same one
  unless that host has it taken by another job. The ranks of one job on
  several nodes then write its shared checkpoint directory as one user (a
  Hugging Face Trainer writes a file a rank there; a uid per host made the
  directory the first node's, and the other nodes' ranks failed).
- Several agents on one host (the local stack runs one per simulated node)
  may share a range: each uid handed out is also claimed host-wide, a file
  ``/run/gpujobs-agent/uids/<uid>.<agent>`` naming the claiming agent's state
  directory and the attempt, made and removed under one ``flock``
  (:class:`Claims`). Agents share a uid for one attempt (its ranks on two
  simulated nodes) and never for two. A claim of another state directory is
  respected while that directory's state file holds the uid or it is less
  than a minute old; otherwise it is stale (an agent that died between
  claiming and recording) and taken over.
- Files an earlier attempt left in the job's checkpoint directory under
  another uid (its uid was taken on that host) are given to the new uid
  (isolation.give_checkpoint_dir).
- A uid returns to the pool only when every rank of its attempt ended AND no
  process of that uid is left. What is left once the ranks' process groups
  are gone (a daemon that left the group with ``setsid``) is the job's and
  nobody else's: it is SIGKILLed (through a pidfd, after checking its uid
  again), as Slurm's cgroup process tracking kills all of a job's processes
  at its end, until none is left. Then the uid's files in ``/dev/shm`` (POSIX
  shared memory: NCCL's and gloo's segments) and its HOME are removed (by the
  last of the host's agents that shared it for the attempt), so the
  next job of that uid finds nothing of this one there. Elsewhere (``/tmp``
  when a job sets its own TMPDIR, SysV IPC) what a job left stays.
- Each attempt's HOME (and TMPDIR, unless its env names one) is
  ``<state-dir>/homes/<uid>``, made fresh for it, 0700 and its uid's;
  USER and LOGNAME are ``gpujobs-<uid>``.
- Exhausted (every uid held, by running attempts or lingering processes): a
  LAUNCH's ranks are not started, exit code 127, and each rank's log says
  why; two jobs never share a uid.
"""
from __future__ import annotations

import errno
import fcntl
import grp
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .isolation import RankIdentity

log = logging.getLogger("gpujobs.agent.uids")

DEFAULT_RANK_UIDS = "70000-70999"
PROC = Path("/proc")
SHM = Path("/dev/shm")
CLAIMS = Path("/run/gpujobs-agent/uids")
#: a claim this young is taken, whatever its agent's state file says yet
FRESH_CLAIM_S = 60.0


class UidRangeError(ValueError):
    pass


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __iter__(self):
        return iter(range(self.first, self.last + 1))

    def __len__(self) -> int:
        return self.last - self.first + 1


def parse_range(text: str) -> UidRange | None:
    """``FIRST-LAST`` (or one number); None for ``''``: no pool, no isolation."""
    text = text.strip()
    if not text:
        return None
    first_s, sep, last_s = text.partition("-")
    try:
        first = int(first_s)
        last = int(last_s) if sep else first
    except ValueError:
        raise UidRangeError(f"not a uid range FIRST-LAST: {text!r}") from None
    if not 0 <= first <= last < 2 ** 31 - 1:
        raise UidRangeError(f"not a uid range FIRST-LAST with FIRST <= LAST < 2^31-1: {text!r}")
    return UidRange(first, last)


def _id_ranges(path: str) -> list[tuple[str, int, int]]:
    """(owner, first, last) of each line of /etc/subuid-like ``path``."""
    out: list[tuple[str, int, int]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[2]):
            out.append((parts[0], int(parts[1]), int(parts[1]) + int(parts[2]) - 1))
    return out


def _mapped(uid_map: str, pool: UidRange) -> bool:
    """Whether every uid of ``pool`` maps into this user namespace (``uid_map``)."""
    try:
        lines = Path(uid_map).read_text().splitlines()
    except OSError:
        return True  # no user namespaces here: every uid is there
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            inside, count = int(parts[0]), int(parts[2])
            if inside <= pool.first and pool.last < inside + count:
                return True
    return False


def check_range(pool: UidRange, *, subuid: str = "/etc/subuid", subgid: str = "/etc/subgid",
                uid_map: str = "/proc/self/uid_map") -> None:
    """Raise UidRangeError, saying why, for a range that is not the agent's
    alone to hand out (module docstring)."""
    if pool.first == 0:
        raise UidRangeError(f"--rank-uids {pool} holds uid 0 (root)")
    for uid in pool:
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            pass
        else:
            raise UidRangeError(f"--rank-uids {pool} holds uid {uid}, user {pw.pw_name!r}: "
                                "the pool's uids must belong to no user")
        try:
            gr = grp.getgrgid(uid)
        except KeyError:
            pass
        else:
            raise UidRangeError(f"--rank-uids {pool} holds gid {uid}, group {gr.gr_name!r}: "
                                "a rank's gid is its uid's number, and must be no group's")
    for path in (subuid, subgid):
        for owner, first, last in _id_ranges(path):
            if first <= pool.last and pool.first <= last:
                raise UidRangeError(f"--rank-uids {pool} overlaps {owner}'s range "
                                    f"{first}-{last} in {path}")
    if not _mapped(uid_map, pool):
        raise UidRangeError(f"--rank-uids {pool}: not every uid of it exists in this "
                            f"user namespace ({uid_map})")


def process_uids(pid: int | str, proc: Path = PROC) -> set[int]:
    """The real, effective, saved and filesystem uids of process ``pid``;
    empty when it is gone or a zombie (it runs nothing any more, and only its
    parent, or init, can make it go).

    A process whose main thread ended (``SYS_exit``, not ``exit_group``)
    while other threads run on reads ``State: Z`` in its own status, yet it
    runs: its live threads' uids are its uids then (issue 41: a daemon that
    did this kept running after its uid went back to the pool)."""
    state, uids = _task_status(proc / str(pid) / "status")
    if state not in (b"Z", b"X"):
        return uids
    try:
        tasks = [t.name for t in os.scandir(proc / str(pid) / "task")]
    except OSError:
        return set()
    live: set[int] = set()
    for task in tasks:
        state, uids = _task_status(proc / str(pid) / "task" / task / "status")
        if state not in (b"Z", b"X"):
            live |= uids
    return live


def _task_status(path: Path) -> tuple[bytes | None, set[int]]:
    """(the state letter, the uids) from a ``/proc`` status file; (None,
    empty) when it cannot be read."""
    state = None
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"State:"):
                    state = line.split()[1]
                elif line.startswith(b"Uid:"):
                    return state, {int(u) for u in line.split()[1:5]}
    except (OSError, ValueError, IndexError):
        pass
    return None, set()


def processes_by_uid(uids: Iterable[int], proc: Path = PROC) -> dict[int, list[int]]:
    """Live processes (not zombies, but those with a live thread) having one
    of ``uids`` as any of their uids, by uid."""
    want = set(uids)
    out: dict[int, list[int]] = {}
    if not want:
        return out
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        for uid in process_uids(name, proc) & want:
            out.setdefault(uid, []).append(int(name))
    return out


def kill_uid_processes(uid: int, pids: Iterable[int]) -> int:
    """SIGKILL each of ``pids`` that still has ``uid`` (checked again through
    a pidfd, so a pid reused meanwhile is never hit); how many were signalled."""
    killed = 0
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:
            if uid in process_uids(pid):  # the pidfd pins the process: still the one
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                killed += 1
        except OSError as e:
            if e.errno != errno.ESRCH:
                log.error("cannot kill pid %s of uid %s: %s", pid, uid, e)
        finally:
            os.close(pidfd)
    return killed


def remove_shm_of(uid: int, shm: Path = SHM) -> int:
    """Remove what ``uid`` owns at the top of ``/dev/shm`` (POSIX shared
    memory and semaphores); how many entries went. Never through a link."""
    removed = 0
    try:
        fd = os.open(shm, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if st.st_uid != uid:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    _rmtree_at(fd, name)
                else:
                    os.unlink(name, dir_fd=fd)
                removed += 1
            except OSError as e:
                log.warning("cannot remove %s/%s of uid %s: %s", shm, name, uid, e)
    finally:
        os.close(fd)
    return removed


def _rmtree_at(dir_fd: int, name: str) -> None:
    """``shutil.rmtree`` of ``name`` under ``dir_fd``, never following a link."""
    for _root, dirs, files, rootfd in os.fwalk(name, dir_fd=dir_fd, topdown=False,
                                               follow_symlinks=False):
        for f in files:
            os.unlink(f, dir_fd=rootfd)
        for d in dirs:
            try:
                os.rmdir(d, dir_fd=rootfd)
            except NotADirectoryError:  # a link to a directory is listed among dirs
                os.unlink(d, dir_fd=rootfd)
    os.rmdir(name, dir_fd=dir_fd)


class Claims:
    """Host-wide claims of uids (module docstring), in ``directory``: one file
    a claiming agent and uid, ``<uid>.<agent>``, holding its state directory
    and the attempt it runs as the uid."""

    def __init__(self, directory: Path, state_dir: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.me = str(Path(state_dir).resolve())
        self._tag = f"{zlib.crc32(self.me.encode()):08x}"

    def locked(self):
        """A context holding the claims' lock."""
        claims = self

        class _Lock:
            def __enter__(self) -> None:
                claims.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                self.fd = os.open(claims.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                  0o600)
                fcntl.flock(self.fd, fcntl.LOCK_EX)

            def __exit__(self, *exc) -> None:
                os.close(self.fd)
        return _Lock()

    def _mine(self, uid: int) -> Path:
        return self.dir / f"{uid}.{self._tag}"

    def others(self, uid: int) -> list[str | None]:
        """The attempts other agents hold ``uid`` for (None: a claim that names
        none), stale claims left out."""
        held = []
        for path in self.dir.glob(f"{uid}.*"):
            if path.name.startswith(".") or path == self._mine(uid):
                continue
            try:
                owner, _, key = path.read_text().partition("\n")
                young = time.time() - path.stat().st_mtime < FRESH_CLAIM_S
            except OSError:
                continue
            if owner.strip() != self.me and (young or self._holds(owner.strip(), uid)):
                held.append(key.strip() or None)
        return held

    @staticmethod
    def _holds(owner: str, uid: int) -> bool:
        """Whether the agent of state directory ``owner`` records ``uid`` as held."""
        try:
            state = json.loads((Path(owner) / "state.json").read_text())
            return any(a.get("uid") == uid and not a.get("uid_freed")
                       for a in state.get("attempts", {}).values())
        except (OSError, ValueError, AttributeError):
            return False  # no such agent any more: stale

    def claim(self, uid: int, key: str) -> None:
        tmp = self.dir / f".{uid}.{os.getpid()}"
        tmp.write_text(f"{self.me}\n{key}\n")
        os.replace(tmp, self._mine(uid))

    def unclaim(self, uid: int) -> None:
        self._mine(uid).unlink(missing_ok=True)


class PoolExhausted(RuntimeError):
    pass


class UidPool:
    """Hands out the range's uids, one an attempt (module docstring). Which
    are held is the state's business: the caller passes them in."""

    def __init__(self, uids: UidRange, state_dir: str | os.PathLike, *,
                 proc: Path = PROC, shm: Path = SHM, claims: Path = CLAIMS) -> None:
        self.range = uids
        self.homes = Path(state_dir) / "homes"
        self._proc, self._shm = proc, shm
        self.claims = Claims(claims, state_dir)

    def busy(self) -> dict[int, list[int]]:
        """Processes of the range's uids, by uid."""
        return processes_by_uid(self.range, self._proc)

    def preferred(self, job_id: str) -> int:
        """The uid every node picks first for ``job_id``."""
        return self.range.first + zlib.crc32(job_id.encode()) % len(self.range)

    def allocate(self, job_id: str, attempt: int, held: Iterable[int]) -> int:
        """The attempt's uid: :meth:`preferred`, else the next after it that is
        neither held here nor claimed by another agent of the host for another
        attempt, nor used by a process other than this attempt's; raises
        PoolExhausted."""
        held, key = set(held), f"{job_id}#{attempt}"
        size = len(self.range)
        start = self.preferred(job_id) - self.range.first
        with self.claims.locked():
            running = processes_by_uid(set(self.range) - held, self._proc)
            others = 0
            for i in range(size):
                uid = self.range.first + (start + i) % size
                if uid in held:
                    continue
                claimed = self.claims.others(uid)
                if any(k != key for k in claimed):
                    others += 1
                    continue
                if uid in running and not claimed:  # a process of no attempt sharing it
                    continue
                self.claims.claim(uid, key)
                return uid
        lingering = sorted(running)
        raise PoolExhausted(
            f"no free rank uid in --rank-uids {self.range}: {len(held)} held by attempts "
            f"on this node" + (f", {others} by other agents on this host" if others else "")
            + (f", {len(lingering)} by processes still running "
               f"(uids {lingering[:5]}{'...' if len(lingering) > 5 else ''})"
               if lingering else ""))

    def home(self, uid: int) -> Path:
        return self.homes / str(uid)

    def identity(self, uid: int) -> RankIdentity:
        return RankIdentity(f"gpujobs-{uid}", uid, uid, str(self.home(uid)))

    def make_home(self, uid: int) -> Path:
        """``uid``'s HOME, 0700 and its own: kept when it is that already (a
        restart finishing a launch whose first ranks run), else made afresh
        (whatever was at its path is removed)."""
        self.homes.mkdir(parents=True, exist_ok=True)
        os.chmod(self.homes, 0o711)
        home = self.home(uid)
        try:
            st = os.lstat(home)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return home
        self.remove_home(uid)
        os.mkdir(home, 0o700)
        os.chown(home, uid, uid)
        return home

    def remove_home(self, uid: int) -> None:
        home = self.home(uid)
        if os.path.lexists(home):
            if os.path.islink(home) or not home.is_dir():
                home.unlink()
            else:
                shutil.rmtree(home)  # fd-based on Linux: never follows a link inside

    def release(self, uid: int, busy: dict[int, list[int]]) -> bool:
        """Whether ``uid`` is free again: no process of it is left (those in
        ``busy`` are killed: they are its job's); then its /dev/shm files and
        HOME are removed. While another agent of the host holds it for the
        same attempt (its ranks there run on), this agent lets go of it alone."""
        with self.claims.locked():
            if self.claims.others(uid):
                self.claims.unclaim(uid)
                self.remove_home(uid)
                return True
        pids = busy.get(uid)
        if pids:
            n = kill_uid_processes(uid, pids)
            log.warning("uid %s: its attempt's ranks ended, %s process(es) of it were left "
                        "(pids %s): SIGKILLed; the uid returns to the pool once none is left",
                        uid, n, sorted(pids)[:10])
            return False
        try:
            remove_shm_of(uid, self._shm)
            self.remove_home(uid)
        except OSError as e:
            log.warning("uid %s: cleaning up its files failed: %s", uid, e)
        with self.claims.locked():
            self.claims.unclaim(uid)
        return True
