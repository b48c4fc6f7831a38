"""Where the ranks' side of a checkout lives: in it, or, when other users
cannot reach it, in a folder of its own that they can pass through.

As root, ``make up``'s agents run each job's ranks as uids of their own
(agent/uidpool.py), and a rank must pass through every folder above what it
runs and writes: the virtualenvs (a job's ``python`` is ``.venv``'s, the
real-torch tests' ranks run ``.venv-torch``'s), the agents' folders (its
heartbeat folder and HOME are there), the examples it is given. A checkout
under a folder others cannot search (``/root`` is 0700, so is ``mktemp -d``)
keeps those, as root, in ``/var/tmp/gpujobs-<the first 8 hex digits of the
sha256 of the checkout's real path>/`` under the names they have in the
checkout (``.venv``, ``.venv-torch``, ``.gpujobs-local-agents``,
``examples``), one folder a checkout so two clones never share one. It is
root's, mode 0711 (pass through, never list); one found there that is not
root's own folder, not writable by others (a link or a folder someone else
planted) is refused, never used. Anywhere else (a checkout others can reach,
or not root: the ranks are the user's own processes) every name stays in the
checkout.

Standard library only, for the Makefile to ask before any virtualenv exists:
``python3 -m devstack.reach .venv`` prints where ``.venv`` goes (as given when
in the checkout, else the full path) and links the checkout's ``.venv`` to it,
so ``. .venv/bin/activate`` works in any clone.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import stat
import sys

from devstack.interpreter import blocking_folder

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: where the folders of out-of-reach checkouts are: kept across reboots, as the
#: virtualenvs must be, and every user may pass through it
BASE = pathlib.Path("/var/tmp")
#: a checkout's folder there: its ranks pass through it, nobody lists it
MODE = 0o711


class Refused(Exception):
    """A folder was found where this checkout's must be, and is not one to trust."""


def out_of_reach(checkout: pathlib.Path = ROOT) -> str | None:
    """The folder at or above ``checkout`` (as given, or its real path) that
    other users cannot search, or None when they can reach it."""
    for path in (os.path.abspath(checkout), os.path.realpath(checkout)):
        folder = blocking_folder(path)
        if folder is not None:
            return folder
    return None


def needed(checkout: pathlib.Path = ROOT) -> bool:
    """Whether ``checkout``'s ranks' side lives elsewhere: as root (ranks may
    run as uids of their own), in a checkout others cannot reach."""
    return os.geteuid() == 0 and out_of_reach(checkout) is not None


def folder(checkout: pathlib.Path = ROOT, base: pathlib.Path = BASE) -> pathlib.Path:
    """``checkout``'s folder under ``base``, made if missing (mode
    :data:`MODE`, this user's); :class:`Refused` when what is there is not
    this user's own folder (a link, another owner, writable by others), or
    ``base`` lets others replace it (writable by them without the sticky
    bit) or reach nothing (others cannot pass through it)."""
    digest = hashlib.sha256(os.path.realpath(checkout).encode()).hexdigest()[:8]
    path = base / f"gpujobs-{digest}"
    try:
        st = os.stat(base)
    except OSError as e:
        raise Refused(f"{base}: {e.strerror}") from None
    if st.st_uid not in (0, os.geteuid()) or (
            st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise Refused(f"{base} is not a folder only its owner or root may replace "
                      f"entries of (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    if out_of_reach(base) is not None:
        raise Refused(f"other users cannot pass through {out_of_reach(base)}, above {base}")
    try:
        os.mkdir(path, MODE)
    except FileExistsError:
        pass
    try:  # what is there now, never through a link
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise Refused(f"{path} is a link or not a folder ({e.strerror}): someone else "
                      f"made it; remove it") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise Refused(f"{path} is not this user's own folder (owner uid {st.st_uid}, "
                          f"mode {stat.S_IMODE(st.st_mode):o}): someone else made it; "
                          f"remove it")
        if stat.S_IMODE(st.st_mode) != MODE:
            os.fchmod(fd, MODE)
    finally:
        os.close(fd)
    note = path / "checkout"  # which checkout it serves, for a person looking at /var/tmp
    if not note.exists():
        note.write_text(os.path.realpath(checkout) + "\n")
    return path


def place(name: str, checkout: pathlib.Path = ROOT, base: pathlib.Path = BASE) -> pathlib.Path:
    """Where ``name`` (a path relative to the checkout: ``.venv``,
    ``.gpujobs-local-agents``) lives: in ``checkout``, or in its
    :func:`folder` when :func:`needed`."""
    return folder(checkout, base) / name if needed(checkout) else checkout / name


def examples(checkout: pathlib.Path = ROOT, base: pathlib.Path = BASE) -> pathlib.Path:
    """The ``examples/`` folder the ranks can read: the checkout's, or its
    copy in :func:`folder`, brought up to date file by file (each replaced
    whole, so a rank reading one while another stack copies never sees half
    of it; files no longer in the checkout stay)."""
    source, target = checkout / "examples", place("examples", checkout, base)
    if target == source:
        return source
    for here, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        there = target / os.path.relpath(here, source)
        there.mkdir(mode=0o755, exist_ok=True)
        os.chmod(there, 0o755)
        for name in files:
            data = (pathlib.Path(here) / name).read_bytes()
            dest = there / name
            if dest.is_file() and not dest.is_symlink() and dest.read_bytes() == data:
                continue
            tmp = there / f".{name}.{os.getpid()}"
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                              0o644), "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
    return target


def linked(name: str, checkout: pathlib.Path = ROOT, base: pathlib.Path = BASE) -> str:
    """:func:`place` for the Makefile: ``name`` as given when it is in the
    checkout; else the full path, the checkout's ``name`` made a link to it
    (left alone, with a word on stderr, when something else is there)."""
    where = place(name, checkout, base)
    if where == checkout / name:
        return name
    here = checkout / name
    if here.is_symlink() and os.readlink(here) != str(where):
        here.unlink()
    if not here.exists() and not here.is_symlink():
        here.symlink_to(where)
        print(f"devstack/reach.py: {checkout} is out of other users' reach "
              f"({out_of_reach(checkout)} lacks o+x), and as root the ranks run as uids of "
              f"their own: {name} is {where} ({name} in the checkout links to it)",
              file=sys.stderr)
    elif not here.is_symlink():
        print(f"devstack/reach.py: {here} is no longer used (ranks could not reach it): "
              f"{where} is; rm -rf {here} to have {name} link to it", file=sys.stderr)
    return str(where)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith(("/", "-")):
        print("usage: python3 -m devstack.reach NAME  (a path in the checkout: .venv)",
              file=sys.stderr)
        return 2
    try:
        print(linked(argv[0]))
    except (Refused, OSError) as e:
        print(f"devstack/reach.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
