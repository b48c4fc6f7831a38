"""Keeping ranks from becoming the agent (docs/security.md).

- The agent's token comes from a file of mode 0600 (or stdin), or from
  GPUJOBS_AGENT_TOKEN, which is removed from the environment at once (no child
  inherits it) but stays in ``/proc/<pid>/environ``, the kernel's copy of the
  starting environment, which root can read whatever the process does; never
  from argv, which every local user reads in ``/proc/<pid>/cmdline``.
- The agent marks itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``): its
  ``/proc/<pid>/environ``, ``mem`` and ptrace are then closed to every
  unprivileged process, also to one of its own uid.
- Running as root, it starts each attempt's ranks as a uid of its own pool
  (uidpool.py: a user per job on the host; the shim stays root and drops
  privileges for the command alone), each in its own session and process
  group. The state directory is 0711 (traversable, not readable), every file
  in it 0600; only a rank's own heartbeat directory and its attempt's HOME
  belong to the attempt's uid (and, outside it, the job's checkpoint
  directory: ``give_checkpoint_dir``).
- Not running as root (or told not to: ``--rank-uids ''``), it cannot drop
  privileges: it says so loudly at start and reports ``isolation: "none"`` to
  the API (``GET /v1/nodes/{id}`` shows it); otherwise ``isolation: "user"``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpujobs.agent")
PR_SET_DUMPABLE = 4
TOKEN_ENV = "GPUJOBS_AGENT_TOKEN"


class IsolationError(RuntimeError):
    pass


@dataclass(frozen=True)
class RankIdentity:
    """Who one attempt's ranks run as: a uid of the agent's pool (uidpool.py),
    never root; ``name`` is only what USER and LOGNAME say."""
    name: str
    uid: int
    gid: int
    home: str


def isolation_name(isolated: bool) -> str:
    return "user" if isolated else "none"


def make_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/environ, mem and ptrace closed to
    unprivileged processes. False where it is not available (not Linux)."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def take_token_from_env(environ=os.environ) -> str | None:
    """GPUJOBS_AGENT_TOKEN, removed from the environment (children never get it)."""
    return environ.pop(TOKEN_ENV, None)


def read_token_file(path: str, stdin=None) -> str:
    """The token from ``path`` (``-``: the first line of stdin). A file that other
    users may read, or that is not a regular file, is refused."""
    if path == "-":
        token = (stdin or sys.stdin).readline().strip()
    else:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            raise IsolationError(f"cannot open the token file {path}: {e.strerror}") from None
        with os.fdopen(fd, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise IsolationError(f"the token file {path} is not a regular file")
            if st.st_mode & 0o077:
                raise IsolationError(f"the token file {path} has mode "
                                     f"{stat.S_IMODE(st.st_mode):04o}; other users could read "
                                     f"it: chmod 600 {path}")
            token = f.readline().strip()
    if not token:
        raise IsolationError(f"the token file {path} is empty")
    return token


def lock_down_state_dir(state_dir: Path) -> None:
    """0711: ranks may pass through to their heartbeat directory, never list or read."""
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o711)


def give_rank_dir(directory: Path, state_dir: Path, identity: RankIdentity | None) -> None:
    """Create ``directory`` (under ``state_dir``) for a rank to write in: the
    directories above it traversable only, itself 0700 and the rank's uid's.

    Walked down from ``state_dir`` one component at a time, each made and
    opened ``O_NOFOLLOW`` and changed through its descriptor: a link a rank
    put anywhere on the way (in a folder it was given earlier) is an OSError,
    never followed as root (issue 41)."""
    parts = directory.relative_to(state_dir).parts
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n, name in enumerate(parts):
            parent, fd = fd, -1
            fd = _enter(parent, name, 0o700)
            if identity is not None:
                if n == len(parts) - 1:
                    os.fchown(fd, identity.uid, identity.gid)
                    os.fchmod(fd, 0o700)
                else:
                    os.fchmod(fd, 0o711)
    finally:
        if fd >= 0:
            os.close(fd)


#: a directory walked into as root: never through a link, never a device's
#: node or a FIFO that would block the open
WALKED = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _enter(parent: int, name: str, mode: int) -> int:
    """The descriptor of directory ``name`` in ``parent`` (made with ``mode``,
    whatever the umask, if it is not there), opened without following a link;
    ``parent`` is closed."""
    try:
        if name in (".", ".."):
            raise OSError(errno.EINVAL, "a path with . or .. is not walked", name)
        try:
            os.mkdir(name, mode, dir_fd=parent)
            made = True
        except FileExistsError:
            made = False
        fd = os.open(name, WALKED, dir_fd=parent)
        if made:
            os.fchmod(fd, mode)  # the agent's umask is 077
        return fd
    finally:
        os.close(parent)


def parse_job_roots(text: str) -> tuple[str, ...]:
    """``GPUJOBS_AGENT_JOB_ROOTS``: absolute folders, ``:``-separated."""
    roots = tuple(os.path.normpath(r) for r in text.split(":") if r)
    for root in roots:
        if not os.path.isabs(root):
            raise ValueError(f"{root!r} is not an absolute path")
    return roots


def job_root(directory: str, roots: tuple[str, ...]) -> str | None:
    """The operator's root (``--job-roots``) ``directory`` lies under, as written
    (a ``..`` in it never climbs out: it is refused when walked); None: none."""
    for root in roots:
        if directory.startswith(root.rstrip("/") + "/"):
            return root
    return None


def give_checkpoint_dir(directory: str, job_id: str, identity: RankIdentity | None,
                        pool=None, *, root: str, state_dir: Path) -> None:
    """Create the job's checkpoint directory (the LAUNCH's checkpoint_dir,
    ``<shared storage>/<job_id>``), parents too, unless it is there already (an
    earlier attempt's, maybe another node's); with an identity, make it that
    uid's and writable by it, and what is in it too: a retry may run as
    another uid of the pool than the attempt that wrote its files. Raises
    OSError when it cannot.

    Only under ``root``, a folder the operator allows for it (``--job-roots``,
    docs/security.md): a path outside every root is made by the rank's own
    shim, as the rank's uid (shim.py ``--mkdir``), never by root. The path
    comes from a job's spec and any folder below the root may be one a rank
    can write in (shared storage), so it is walked down from the root one
    component at a time, each opened ``O_NOFOLLOW`` and changed through its
    descriptor: a link a rank put anywhere on the way (to ``/etc``) is an
    OSError, nothing is changed through it. A walk that passes through the
    agent's own state directory (``state_dir``) is refused: the heartbeat
    folders there are never a job's to own. Any real directory whose last
    component is the job's id is the job's (ids are unique), so a directory
    whose last component is not ``job_id`` is not given to the rank's uid.

    Inside it (:func:`_give_contents`) only what an earlier attempt's uid owns
    changes hands (``pool``: the uids that may be; default none), walked
    without following links, each entry opened ``O_NOFOLLOW`` and changed
    through its descriptor; a file with more than one link (a hard link a
    rank made to a file elsewhere) is never given."""
    path = Path(directory)
    if identity is not None and path.name != job_id:
        raise OSError(errno.EINVAL, f"not the job's own directory (<...>/{job_id}): not "
                      "given to the rank's uid", directory)
    state = os.stat(state_dir)
    if Path(os.path.realpath(root)).is_relative_to(os.path.realpath(state_dir)):
        raise OSError(errno.EPERM, "the job root is in the agent's state directory", root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        parts = path.relative_to(root).parts
        for n, name in enumerate(parts):
            parent, fd = fd, -1
            # folders on the way: a rank passes through; the job's own: its alone
            fd = _enter(parent, name, 0o700 if n == len(parts) - 1 else 0o755)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (state.st_dev, state.st_ino):
                raise OSError(errno.EPERM, "in the agent's state directory: never a job's",
                              directory)
        if identity is not None:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid) != (identity.uid, identity.gid):
                os.fchown(fd, identity.uid, identity.gid)
            if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
            if pool is not None:
                _give_contents(fd, identity, pool)
    finally:
        if fd >= 0:
            os.close(fd)


NOT_FOLLOWED = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(
    os, "O_NOCTTY", 0)


def _give_contents(top: int, identity: RankIdentity, pool) -> int:
    """Give ``identity`` what is under directory ``top`` and owned by another
    uid of ``pool`` (an earlier attempt's); how many entries changed hands."""
    given = 0
    for _root, dirs, files, rootfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.stat(name, dir_fd=rootfd, follow_symlinks=False)
                if st.st_uid == identity.uid or st.st_uid not in pool or not (
                        stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                    continue  # ours already, not a pool uid's, a link, FIFO, socket
                fd = os.open(name, NOT_FOLLOWED, dir_fd=rootfd)
            except OSError:
                continue  # gone meanwhile, or replaced by a link
            try:
                st = os.fstat(fd)  # what was opened is what is changed
                if st.st_uid in pool and st.st_uid != identity.uid and (
                        stat.S_ISDIR(st.st_mode)
                        or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1)):
                    os.fchown(fd, identity.uid, identity.gid)
                    given += 1
            except OSError as e:
                log.warning("cannot give %s in a checkpoint directory to uid %s: %s",
                            name, identity.uid, e)
            finally:
                os.close(fd)
    return given
