"""Reading a file a rank can reach, without letting the rank stall the agent.

A rank owns its heartbeat directory (isolation.py) and, without rank
isolation, every file of the agent's; its stack names source files by
whatever ``co_filename`` it gave them. What sits at such a path is the rank's
choice: a FIFO, whose plain ``open`` blocks until a writer comes (it never
does: the agent's one loop would wait for ever, the node stop calling in and
go DOWN); a symbolic link to ``/dev/zero`` or to a file only root may read; a
10 GiB sparse file. Every such read goes through :func:`read_rank_file`:

- ``O_NONBLOCK``, so opening a FIFO (or a device) returns at once;
  ``O_NOFOLLOW``, so a symbolic link in the last component is refused
  (``ELOOP``); ``O_NOCTTY``, ``O_CLOEXEC``;
- ``fstat`` of what was opened: anything but a regular file is refused;
  optionally, a file not owned by the rank's user (a hard link to someone
  else's file) too;
- at most ``max_bytes`` are read, and never past the size ``fstat`` saw; with
  ``whole`` a file larger than ``max_bytes`` is refused outright (a record is
  never that large).

A refusal is "no file" to the caller, and logged once per path at WARNING
(again only after the path was read fine in between), never once per tick.
A missing file is just missing: not logged.
"""
from __future__ import annotations

import errno
import logging
import os
import stat
import threading

log = logging.getLogger("gpujobs.agent.rankfiles")

#: how a rank-reachable path is opened: never blocks, never follows a link
FLAGS = (os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
         | getattr(os, "O_NOCTTY", 0))
#: the paths refused so far, with why (each logged once); bounded
_refused: dict[str, str] = {}
_lock = threading.Lock()  # the agent's loop, the log shipper and py-spy's pool read
MAX_REMEMBERED = 4096
#: thread id -> the path it is reading (for watchdog.py)
_opening: dict[int, str] = {}


def read_rank_file(path: str | os.PathLike, max_bytes: int, *, offset: int = 0,
                   uid: int | None = None, world_readable_ok: bool = False,
                   whole: bool = True) -> tuple[bytes, os.stat_result] | None:
    """``(data, fstat)`` of the regular file at ``path``: at most ``max_bytes``
    from ``offset``, never past the size fstat saw; None when it is missing or
    refused (module docstring). ``uid``: the owner it must have (a rank's own
    file), else it is refused, unless ``world_readable_ok`` and every user may
    read it. ``whole``: refuse a file larger than ``max_bytes`` (a record)."""
    path = os.fspath(path)
    me = threading.get_ident()
    _opening[me] = path
    try:
        return _read(path, max_bytes, offset, uid, world_readable_ok, whole)
    finally:
        _opening.pop(me, None)


def opening(thread_id: int) -> str | None:
    """The rank file thread ``thread_id`` is reading now, if any (watchdog.py)."""
    return _opening.get(thread_id)


def _read(path: str, max_bytes: int, offset: int, uid: int | None, world_readable_ok: bool,
          whole: bool) -> tuple[bytes, os.stat_result] | None:
    try:
        fd = os.open(path, FLAGS)
    except FileNotFoundError:
        return None
    except OSError as e:
        _refuse(path, "a symbolic link" if e.errno == errno.ELOOP else
                f"cannot be opened ({e.strerror})")
        return None
    try:
        st = os.fstat(fd)
        why = _why_not(st, max_bytes, uid, world_readable_ok, whole)
        if why is not None:
            _refuse(path, why)
            return None
        want = max(0, min(max_bytes, st.st_size - offset))
        chunks, got = [], 0
        while got < want:
            chunk = os.pread(fd, want - got, offset + got)
            if not chunk:
                break  # it shrank meanwhile
            chunks.append(chunk)
            got += len(chunk)
    except OSError as e:
        _refuse(path, f"cannot be read ({e.strerror})")
        return None
    finally:
        os.close(fd)
    if _refused:
        with _lock:
            _refused.pop(path, None)  # fine again: a new refusal is logged again
    return b"".join(chunks), st


def open_rank_file(path: str | os.PathLike, max_bytes: int, **kw) -> bytes | None:
    """The bytes :func:`read_rank_file` reads, or None (missing or refused)."""
    got = read_rank_file(path, max_bytes, **kw)
    return None if got is None else got[0]


def _why_not(st: os.stat_result, max_bytes: int, uid: int | None, world_readable_ok: bool,
             whole: bool) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({_kind(st.st_mode)})"
    if uid is not None and st.st_uid != uid and not (
            world_readable_ok and st.st_mode & stat.S_IROTH):
        return (f"owned by uid {st.st_uid}, not the rank's {uid}"
                + (", and not readable by every user" if world_readable_ok else ""))
    if whole and st.st_size > max_bytes:
        return f"{st.st_size} bytes, larger than the {max_bytes} expected"
    return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"mode {mode:o}"


def _refuse(path: str, why: str) -> None:
    with _lock:
        if _refused.get(path) == why:
            return
        if len(_refused) >= MAX_REMEMBERED:
            _refused.clear()
        _refused[path] = why
    log.warning("not reading %s, which a rank can replace: %s; taken as no file", path, why)


def forget_refusals() -> None:
    """Forget which paths were refused (tests)."""
    with _lock:
        _refused.clear()
