"""Invariant (issue 24, item 1): the Makefile makes its virtualenvs from a
python3 that a rank's own uid can run; an interpreter in or under a folder
others cannot search (pyenv's under a 0700 /root), or not readable by them,
is passed over for one that is."""
from __future__ import annotations

import os
import stat
import sys

from devstack.interpreter import reachable_by_others, why_not


def test_a_file_under_a_private_folder_is_out_of_others_reach(tmp_path):
    open_dir, private = tmp_path / "open", tmp_path / "private"
    for d in (open_dir, private):
        d.mkdir()
    for f in (open_dir / "python3", private / "python3"):
        f.write_text("")
        os.chmod(f, 0o755)
    os.chmod(tmp_path, 0o755)
    os.chmod(open_dir, 0o755)
    os.chmod(private, 0o700)
    parents_open = all(os.stat(p).st_mode & stat.S_IXOTH for p in tmp_path.parents)
    assert reachable_by_others(str(open_dir / "python3"), want=stat.S_IXOTH) == parents_open
    assert not reachable_by_others(str(private / "python3"), want=stat.S_IXOTH)
    os.chmod(open_dir / "python3", 0o750)
    assert not reachable_by_others(str(open_dir / "python3"), want=stat.S_IXOTH)


def test_a_link_is_judged_by_the_file_it_names(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    real = private / "python3"
    real.write_text("")
    os.chmod(real, 0o755)
    link = tmp_path / "python3"
    link.symlink_to(real)
    assert not reachable_by_others(str(link), want=stat.S_IXOTH)


def test_an_interpreter_others_cannot_run_is_passed_over(tmp_path):
    """A working python3 (a wrapper of this one) in a 0700 folder will not do;
    the same in a folder anyone may search will, if its parents allow."""
    def wrapper(folder, mode):
        folder.mkdir(mode=mode)
        os.chmod(folder, mode)
        path = folder / "python3"
        path.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
        os.chmod(path, 0o755)
        return str(path)

    os.chmod(tmp_path, 0o755)
    assert why_not(wrapper(tmp_path / "private", 0o700)).startswith("other users cannot run")
    public = wrapper(tmp_path / "public", 0o755)
    if reachable_by_others(public, want=stat.S_IXOTH):
        assert why_not(public) in (None, f"other users cannot read its standard library ("
                                         f"{__import__('sysconfig').get_paths()['stdlib']})")
