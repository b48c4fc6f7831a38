"""agent/rankfiles.py: a file a rank can replace is read without blocking,
never through a link, only when it is a regular file (of the rank's user),
and never more than a small bound; a refusal is logged once per path.

Every read that could block is run in a thread of its own (``promptly``): a
regression fails the test after a few seconds instead of hanging it, and the
FIFO is then opened for writing to release the thread."""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import tracemalloc

import pytest

from agent.beats import gpujobs_heartbeat as hb  # the module the agent reads records with
from agent.logship import Shipper
from agent.rankfiles import forget_refusals, open_rank_file, read_rank_file
from agent.ranks import Rank
from agent.records import agent_record
from agent.shim import CANNOT_START, read_exit_file, write_exit_file
from agent.stacks import source_line

GIB = 1 << 30


@pytest.fixture(autouse=True)
def _fresh_refusals():
    forget_refusals()
    yield
    forget_refusals()


def promptly(fn, *args, timeout: float = 5.0, fifo: str | None = None, **kw):
    """``fn(*args, **kw)``, which must return within ``timeout`` seconds."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args, **kw)), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if fifo is not None:  # let the blocked open go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        raise AssertionError(f"{fn.__name__}({args}) blocked for more than {timeout}s")
    return out[0]


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gpujobs.agent.rankfiles" and r.levelno == logging.WARNING]


def record_bytes(seq: int = 3, step: int = 7) -> bytes:
    return hb._FORMAT.pack(seq, step, 123, 0, b"", 0, b"", 0, seq)


def test_a_regular_file_is_read_whole_and_at_most_max_bytes(tmp_path):
    """A regular file is read; never more than ``max_bytes`` from ``offset``, and
    with ``whole`` a larger file is no record at all."""
    f = tmp_path / "rec"
    f.write_bytes(b"0123456789")
    assert open_rank_file(f, 10) == b"0123456789"
    data, st = read_rank_file(f, 4, offset=3, whole=False)
    assert data == b"3456" and st.st_size == 10
    assert open_rank_file(f, 100, offset=8, whole=False) == b"89", "never past the end"
    assert open_rank_file(f, 9) is None, "whole: larger than a record is no record"
    assert open_rank_file(tmp_path / "missing", 10) is None


def test_a_missing_file_is_no_file_and_not_logged(tmp_path, caplog):
    """Missing is the normal case of a rank that never beat: None, no warning."""
    caplog.set_level(logging.WARNING)
    assert open_rank_file(tmp_path / "missing", hb.RECORD_SIZE) is None
    assert refusals(caplog) == []


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path, caplog):
    """A FIFO (the incident: ``rm F; mkfifo F``) neither blocks the open nor is
    read: refused as not a regular file."""
    caplog.set_level(logging.WARNING)
    fifo = str(tmp_path / "rank-0")
    os.mkfifo(fifo)
    assert promptly(open_rank_file, fifo, hb.RECORD_SIZE, fifo=fifo) is None
    assert promptly(hb.read, fifo, lambda p, n: open_rank_file(p, n), fifo=fifo) is None
    [warning] = refusals(caplog)
    assert fifo in warning and "a FIFO" in warning


def test_a_symlink_to_dev_zero_is_refused_and_reads_nothing(tmp_path, caplog):
    """A symbolic link (to /dev/zero, or to a file the rank may not read) is
    not followed (O_NOFOLLOW); a device named directly is not a regular file."""
    caplog.set_level(logging.WARNING)
    link = tmp_path / "rank-0"
    link.symlink_to("/dev/zero")
    assert promptly(open_rank_file, link, hb.RECORD_SIZE) is None
    target = tmp_path / "secret"
    target.write_bytes(record_bytes())
    other = tmp_path / "rank-1"
    other.symlink_to(target)
    assert open_rank_file(other, hb.RECORD_SIZE) is None, "a link to a regular file is refused too"
    assert promptly(open_rank_file, "/dev/zero", hb.RECORD_SIZE) is None
    messages = refusals(caplog)
    assert len(messages) == 3
    assert "a symbolic link" in messages[0] and "a symbolic link" in messages[1]
    assert "a character device" in messages[2]


def test_a_10_gib_sparse_file_is_no_record_and_costs_a_small_bound(tmp_path):
    """A 10 GiB sparse file: refused as a record (larger than one), and a
    window of it (a log) costs what was asked, not the file's size."""
    big = tmp_path / "rank-0"
    big.touch()
    os.truncate(big, 10 * GIB)
    tracemalloc.start()
    try:
        assert open_rank_file(big, hb.RECORD_SIZE) is None
        assert hb.read(str(big), lambda p, n: open_rank_file(p, n)) is None
        window = open_rank_file(big, 1000, offset=5 * GIB, whole=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert window == b"\0" * 1000
    assert peak < 256 * 1024, f"allocated {peak} bytes reading a 10 GiB file"


def test_a_directory_and_a_socket_are_refused(tmp_path, caplog):
    """What is not a regular file is refused, whether it opens (a directory)
    or not (a socket: ENXIO)."""
    caplog.set_level(logging.WARNING)
    (tmp_path / "dir").mkdir()
    assert open_rank_file(tmp_path / "dir", hb.RECORD_SIZE) is None
    sock_path = str(tmp_path / "sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(sock_path)
        assert promptly(open_rank_file, sock_path, hb.RECORD_SIZE) is None
    first, second = refusals(caplog)
    assert "a directory" in first and "cannot be opened" in second


def test_a_file_of_another_user_is_refused_unless_everyone_may_read_it(tmp_path, caplog):
    """With the rank's uid given, a file owned by anyone else (a hard link to
    another user's file) is refused; ``world_readable_ok`` lets through a file
    every user may read (a stack's source in site-packages), not a private one."""
    caplog.set_level(logging.WARNING)
    f = tmp_path / "rec"
    f.write_bytes(record_bytes())
    mine = f.stat().st_uid
    assert open_rank_file(f, hb.RECORD_SIZE, uid=mine) == record_bytes()
    assert open_rank_file(f, hb.RECORD_SIZE, uid=mine + 1) is None
    os.chmod(f, 0o644)
    assert open_rank_file(f, hb.RECORD_SIZE, uid=mine + 1, world_readable_ok=True) == record_bytes()
    os.chmod(f, 0o640)
    assert open_rank_file(f, hb.RECORD_SIZE, uid=mine + 1, world_readable_ok=True) is None
    assert all(f"owned by uid {mine}" in m for m in refusals(caplog))


def test_a_refusal_is_logged_once_per_path_not_per_read(tmp_path, caplog):
    """A rank that keeps its FIFO costs one WARNING, not one per tick; once
    the file was fine in between, a new refusal is logged again."""
    caplog.set_level(logging.WARNING)
    path = str(tmp_path / "rank-0")
    os.mkfifo(path)
    for _ in range(50):
        assert open_rank_file(path, hb.RECORD_SIZE) is None
    assert len(refusals(caplog)) == 1
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(record_bytes())
    assert open_rank_file(path, hb.RECORD_SIZE) == record_bytes()
    os.unlink(path)
    os.symlink("/dev/zero", path)
    for _ in range(5):
        assert open_rank_file(path, hb.RECORD_SIZE) is None
    assert len(refusals(caplog)) == 2


def test_the_heartbeat_record_reads_the_same_through_the_safe_reader(tmp_path):
    """The format is parsed in one place (gpujobs_heartbeat.read): a record
    read through the agent's reader is the same as a plain read, both sizes
    (the current record and an older helper's); any other size is no record."""
    f = tmp_path / "rank-0"
    f.write_bytes(record_bytes(seq=5, step=41))
    safe = hb.read(str(f), lambda p, n: open_rank_file(p, n))
    assert safe == hb.read(str(f)) and safe is not None and safe.step == 41
    v1 = hb._FORMAT_V1.pack(2, 9, 1, 0, b"", 2)
    f.write_bytes(v1)
    assert hb.read(str(f), lambda p, n: open_rank_file(p, n)).step == 9
    f.write_bytes(record_bytes() + b"x")
    assert hb.read(str(f)) is None and hb.read(str(f), lambda p, n: open_rank_file(p, n)) is None
    f.write_bytes(struct.pack("<Q", 1))
    assert hb.read(str(f), lambda p, n: open_rank_file(p, n)) is None


# -- every reader of a rank-reachable path goes through it ---------------------------


def test_an_exit_file_that_is_a_fifo_does_not_block_the_rank_check(tmp_path):
    """Without rank isolation a rank can reach its exit file: a FIFO there is
    "nothing recorded yet" for the agent, read without blocking."""
    fifo = str(tmp_path / "rank-0.json")
    os.mkfifo(fifo)
    assert promptly(read_exit_file, fifo, open_rank_file, fifo=fifo) is None
    rank = Rank(pid=None, pgid=None, start_time=None, exit_file=fifo)
    assert promptly(rank.exit_code, fifo=fifo) == CANNOT_START, "no shim, no code: 127"
    os.unlink(fifo)
    write_exit_file(fifo, 3)
    assert read_exit_file(fifo, open_rank_file) == 3


def test_a_stacks_source_line_is_read_as_a_rank_file(tmp_path):
    """A stack names any file (the rank sets co_filename): a FIFO or a link
    yields no code line, and with ranks run as another user, neither does a
    file that user could not read itself (the agent is root)."""
    fifo = str(tmp_path / "train.py")
    os.mkfifo(fifo)
    assert promptly(source_line, fifo, 1, fifo=fifo) is None
    link = tmp_path / "zero.py"
    link.symlink_to("/dev/zero")
    assert promptly(source_line, str(link), 1) is None
    private = tmp_path / "shadow"
    private.write_text("root:$6$secret:19000:0:99999:7:::\n")
    os.chmod(private, 0o600)
    other_uid = private.stat().st_uid + 1
    assert source_line(str(private), 1) is not None, "ranks as the agent: it may read it"
    assert source_line(str(private), 1, uid=other_uid) is None
    os.chmod(private, 0o644)
    assert source_line(str(private), 1, uid=other_uid) == "root:$6$secret:19000:0:99999:7:::"
    big = tmp_path / "big.py"
    big.touch()
    os.truncate(big, 10 * GIB)
    code = promptly(source_line, str(big), 1)
    assert code is None or len(code) <= 200, "a 10 GiB line is cut, never read whole"


class FakeLogs:
    def __init__(self) -> None:
        self.events: dict[str, list[str]] = {}

    def create_log_stream(self, logGroupName, logStreamName):  # noqa: N803 - boto3's names
        self.events.setdefault(logStreamName, [])

    def put_log_events(self, logGroupName, logStreamName, logEvents):  # noqa: N803
        self.events.setdefault(logStreamName, []).extend(e["message"] for e in logEvents)

    def get_log_events(self, logGroupName, logStreamName, **_):  # noqa: N803
        return {"events": [{"message": m, "timestamp": 0}
                           for m in self.events.get(logStreamName, [])[-1:]]}


def test_the_log_shipper_skips_a_fifo_and_links_and_ships_the_rest(tmp_path, caplog):
    """Rank logs a rank could replace (no rank isolation): a FIFO, a link to
    /dev/zero and a linked attempt directory are skipped without blocking
    (logged once); the regular log beside them is shipped."""
    caplog.set_level(logging.WARNING)
    attempt = tmp_path / "logs" / "job_a" / "1"
    attempt.mkdir(parents=True)
    os.mkfifo(attempt / "rank-0.log")
    (attempt / "rank-1.log").symlink_to("/dev/zero")
    (attempt / "rank-2.log").write_bytes(agent_record("stdout", "hello"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text("not this job's\n")
    (tmp_path / "logs" / "job_a" / "2").symlink_to(elsewhere)
    logs = FakeLogs()
    shipper = Shipper(tmp_path / "logs", tmp_path / "state", "group",
                      client_factory=lambda: logs)
    for _ in range(3):
        promptly(shipper.tick, fifo=str(attempt / "rank-0.log"))
    assert logs.events == {"job_a/1/rank-2": ['{"stream": "stdout", "line": "hello", "seq": 0, "next": %d}' % len(
        agent_record("stdout", "hello"))]}
    assert len(refusals(caplog)) == 2, refusals(caplog)
