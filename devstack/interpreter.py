"""Which python3 the Makefile makes its virtualenvs from: one every user can run.

As root, ``make up``'s agents run each job's ranks as a uid of its own
(agent/uidpool.py), and a job's ``python`` (a rank's PATH is its agent's) is
the virtualenv's. A virtualenv's interpreter is a link to the one it was made
from, with that one's standard library: made from pyenv's python under a
``/root`` of mode 0700, no rank could start it ("Permission denied", exit
126). So this picks the first candidate (``/usr/bin/python3``,
``/usr/local/bin/python3``, the PATH's ``python3``) that is at least 3.11, can
make a virtualenv (``venv`` and ``ensurepip``), and that a user who is
neither its owner nor in its group can run: its real file and standard
library readable and every folder above them searchable by others. None
qualifying, it prints the PATH's ``python3`` and says why on stderr.

Standard library only, for the Makefile to run before any virtualenv exists:
``python3 devstack/interpreter.py``.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
PROBE = ("import sys, sysconfig, venv, ensurepip; "
         "print(sys.version_info >= (3, 11)); print(sysconfig.get_paths()['stdlib'])")


def blocking_folder(folder: str) -> str | None:
    """The first of ``folder`` and the folders above it that others may not
    search (no o+x, or not there), or None when they all may."""
    while True:
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
        except OSError:
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def reachable_by_others(path: str, *, want: int = stat.S_IROTH) -> bool:
    """``path`` (its real file) has ``want`` for others, and every folder
    above it lets others search it: above the path as given (a virtualenv's
    ``bin/python`` is a link, reached through the virtualenv's folders) and
    above the real file it names."""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & want:
            return False
    except OSError:
        return False
    return all(blocking_folder(os.path.dirname(p)) is None
               for p in (os.path.abspath(path), real))


def why_not(python: str) -> str | None:
    """Why ``python`` will not do, or None when it will."""
    try:
        out = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"it does not run ({e})"
    if out.returncode != 0:
        return "it cannot make a virtualenv (no venv or ensurepip module)"
    new_enough, stdlib = out.stdout.split("\n")[:2]
    if new_enough != "True":
        return "it is older than 3.11"
    if not reachable_by_others(python, want=stat.S_IXOTH):
        return f"other users cannot run {os.path.realpath(python)}"
    if not reachable_by_others(os.path.join(stdlib, "os.py")):
        return f"other users cannot read its standard library ({stdlib})"
    return None


def main() -> int:
    on_path = shutil.which("python3") or "python3"
    reasons = []
    for python in dict.fromkeys((*CANDIDATES, on_path)):
        if not os.path.exists(python):
            continue
        why = why_not(python)
        if why is None:
            print(python)
            return 0
        reasons.append(f"{python}: {why}")
    print(f"devstack/interpreter.py: no python3 that every user can run ({'; '.join(reasons)});"
          f" the virtualenvs use {on_path}, and as root make up's ranks cannot start them",
          file=sys.stderr)
    print(on_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
