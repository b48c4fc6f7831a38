"""Invariant (issue 42, item 6): any clone location works. As root, ranks run
as uids of their own, which cannot pass through a 0700 folder: a checkout
under one keeps what ranks need (virtualenvs, agents' folders, examples) in
a folder of its own that they can pass through, named after the checkout,
root's own, never one someone else planted (devstack/reach.py); a checkout
others can reach keeps all of it."""
from __future__ import annotations

import os
import pathlib
import shutil
import stat
import sys

import pytest

from devstack import reach
from devstack.interpreter import reachable_by_others

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="ranks run as uids of their own as root")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_tmp(shared_dir):
    """A folder under /tmp every user may pass through (pytest's are under a
    0700 one): tests/conftest.py's shared_dir, removed after the test."""
    return shared_dir


@pytest.fixture
def private_main(open_tmp):
    """A checkout under a 0700 folder, as a clone in root's home or mktemp -d is."""
    private = open_tmp / "private"
    private.mkdir(mode=0o700)
    return checkout(private / "main")


def checkout(at: pathlib.Path) -> pathlib.Path:
    """A checkout's bones: examples/ with a script and a __pycache__."""
    (at / "examples" / "__pycache__").mkdir(parents=True)
    (at / "examples" / "ring.py").write_text("print('ring')\n")
    (at / "examples" / "__pycache__" / "ring.pyc").write_bytes(b"\0")
    for folder in (at, at / "examples"):
        os.chmod(folder, 0o755)
    return at


@pytest.fixture
def base(open_tmp):
    """/var/tmp's stand-in: anyone may make entries, only their owner remove them."""
    path = open_tmp / "vartmp"
    path.mkdir()
    os.chmod(path, 0o1777)
    return path


def test_a_checkout_others_can_reach_keeps_everything_in_itself(open_tmp, base):
    main = checkout(open_tmp / "main")
    assert reach.out_of_reach(main) is None and not reach.needed(main)
    assert reach.place(".venv", main, base) == main / ".venv"
    assert reach.examples(main, base) == main / "examples"
    assert reach.linked(".venv", main, base) == ".venv", "as the Makefile had it"
    assert not os.path.lexists(main / ".venv") and list(base.iterdir()) == []


@as_root
def test_under_a_0700_folder_the_ranks_side_is_in_a_folder_of_its_own(open_tmp, private_main, base):
    main = private_main
    private = main.parent
    assert reach.out_of_reach(main) == str(private) and reach.needed(main)
    where = reach.place(".venv", main, base)
    own = where.parent
    assert where.name == ".venv" and own.parent == base
    assert own.name.startswith("gpujobs-") and len(own.name) == len("gpujobs-") + 8
    st = os.lstat(own)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and mode(own) == reach.MODE
    assert reach.out_of_reach(own) is None, "every user passes through it"
    assert (own / "checkout").read_text() == f"{main}\n", "it says whose it is"
    assert reach.place(".gpujobs-local-agents", main, base) == own / ".gpujobs-local-agents"
    # another clone has another; the same one through a link the same
    other = checkout(private / "other")
    assert reach.place(".venv", other, base).parent != own
    (open_tmp / "link").symlink_to(private)
    assert reach.place(".venv", open_tmp / "link" / "main", base) == where


def test_not_as_root_the_ranks_are_the_user_s_own_processes(open_tmp, private_main, base, monkeypatch):
    main = private_main
    monkeypatch.setattr(reach.os, "geteuid", lambda: 1000)
    assert not reach.needed(main) and reach.place(".venv", main, base) == main / ".venv"


@as_root
def test_the_examples_are_copied_whole_and_kept_current(open_tmp, private_main, base):
    main = private_main
    copy = reach.examples(main, base)
    assert copy == reach.folder(main, base) / "examples"
    assert (copy / "ring.py").read_text() == "print('ring')\n"
    assert (mode(copy), mode(copy / "ring.py")) == (0o755, 0o644)
    assert not (copy / "__pycache__").exists()
    (main / "examples" / "ring.py").write_text("print('ring 2')\n")
    assert (reach.examples(main, base) / "ring.py").read_text() == "print('ring 2')\n"
    assert sorted(p.name for p in copy.iterdir()) == ["ring.py"], "no temporary file left"


@as_root
def test_the_checkout_s_name_links_to_where_it_went(open_tmp, private_main, base):
    main = private_main
    where = reach.linked(".venv", main, base)
    assert where == str(reach.place(".venv", main, base))
    assert os.readlink(main / ".venv") == where
    (main / ".venv-torch").mkdir()  # an older virtualenv in the checkout is left alone
    reach.linked(".venv-torch", main, base)
    assert not (main / ".venv-torch").is_symlink()


@as_root
def test_a_link_planted_where_the_folder_goes_is_refused(open_tmp, private_main, base):
    main = private_main
    own = reach.folder(main, base)
    shutil.rmtree(own)
    target = open_tmp / "theirs"
    target.mkdir()
    own.symlink_to(target)
    with pytest.raises(reach.Refused, match="not a folder"):
        reach.place(".venv", main, base)
    assert list(target.iterdir()) == [], "nothing written through it"


@as_root
@pytest.mark.parametrize("owner, folder_mode", [(65534, 0o711), (0, 0o777), (0, 0o731)])
def test_a_folder_someone_else_made_or_may_write_is_refused(open_tmp, private_main, base, owner, folder_mode):
    main = private_main
    own = reach.folder(main, base)
    shutil.rmtree(own)
    own.mkdir()
    os.chown(own, owner, owner)
    os.chmod(own, folder_mode)
    with pytest.raises(reach.Refused, match="not this user's own folder"):
        reach.examples(main, base)
    assert list(own.iterdir()) == []


@as_root
def test_a_base_others_may_replace_entries_of_or_cannot_pass_is_refused(open_tmp, private_main):
    main = private_main
    private = main.parent
    loose = open_tmp / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)  # no sticky bit: anyone may rename root's folder away
    with pytest.raises(reach.Refused, match="may replace"):
        reach.folder(main, loose)
    with pytest.raises(reach.Refused, match="cannot pass through"):
        reach.folder(main, private)


def test_a_virtualenv_s_python_is_judged_by_its_own_folders_too(open_tmp):
    """A virtualenv's ``bin/python`` links to an interpreter anyone may run;
    in a 0700 folder, no rank can start it all the same."""
    for folder, folder_mode in (("open", 0o755), ("private", 0o700)):
        bin_ = open_tmp / folder / "venv" / "bin"
        bin_.mkdir(parents=True)
        os.chmod(open_tmp / folder, folder_mode)
        (bin_ / "python").symlink_to(os.path.realpath(sys.executable))
    runnable = reachable_by_others(sys.executable, want=stat.S_IXOTH)
    assert reachable_by_others(str(open_tmp / "open/venv/bin/python"),
                               want=stat.S_IXOTH) == runnable
    assert not reachable_by_others(str(open_tmp / "private/venv/bin/python"), want=stat.S_IXOTH)
