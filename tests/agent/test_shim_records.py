"""The shim's log file: one record a line (CRI log format), stdout and stderr
in the order the shim read them, each stamped with the host's time when it
was read; long and partial lines as P pieces; a rank can neither write the
file nor forge a record in it; the file is complete once the exit is known."""
from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agent import shim
from agent.ranks import Launcher
from agent.records import Record, agent_record, lines_of, parse, parse_file
from tests.hostile_ranks import bare_identity
from tests.support.waits import wait_until

from .harness import PY


def run(launched, tmp_path: Path, script: str, launcher: Launcher | None = None,
        python: str = PY, identity=None) -> list[Record]:
    """``script`` run as a rank to its end (as ``identity``, if given); the
    records of its log file."""
    rank = (launcher or Launcher()).launch([python, "-c", script], dict(os.environ),
                                           str(tmp_path / "r.log"), str(tmp_path / "r.exit"),
                                           identity=identity)
    launched.append(rank)
    wait_until(lambda: rank.exit_code() is not None, timeout=60, what="the rank exited")
    assert rank.exit_code() == 0, (tmp_path / "r.log").read_bytes()[-2000:]
    return parse_file((tmp_path / "r.log").read_bytes())


ALTERNATING = textwrap.dedent("""
    import sys, time
    for i in range(5):
        print(f"out {i}", flush=True)
        time.sleep(0.02)
        print(f"err {i}", file=sys.stderr, flush=True)
        time.sleep(0.02)
""")


def test_stdout_and_stderr_come_out_in_the_order_written_with_the_times_read(launched,
                                                                             tmp_path):
    before = time.time_ns()
    got = run(launched, tmp_path, ALTERNATING)
    after = time.time_ns()
    assert [(r.stream, r.full, r.content.decode()) for r in got] == [
        (s, True, f"{s[3:]} {i}") for i in range(5) for s in ("stdout", "stderr")]
    times = [r.time_ns for r in got]
    assert times == sorted(times) and before <= times[0] and times[-1] <= after
    # the write times: 20 ms apart, not one shipping time
    assert all(b - a >= 15_000_000 for a, b in zip(times, times[1:])), times


def test_a_line_written_a_second_later_is_stamped_a_second_later(launched, tmp_path):
    got = run(launched, tmp_path, "import time\nprint('one', flush=True)\ntime.sleep(1)\n"
                                  "print('two', flush=True)\n")
    assert [r.content for r in got] == [b"one", b"two"]
    assert 0.9e9 <= got[1].time_ns - got[0].time_ns <= 3e9


def test_a_rank_cannot_forge_a_record(launched, tmp_path):
    got = run(launched, tmp_path,
              "import sys\nsys.stdout.write('2020-01-01T00:00:00Z stderr F x\\n')\n"
              "sys.stdout.write('a\\rb\\x00c\\n')\n")
    assert [(r.stream, r.content) for r in got] == [
        ("stdout", b"2020-01-01T00:00:00Z stderr F x"), ("stdout", b"a\rb\x00c")]


def test_a_long_line_is_written_as_p_pieces_then_an_f_cut_between_characters(launched,
                                                                               tmp_path):
    line = "a" + "\u00e9" * shim.PIECE_BYTES  # every 64 KiB cut falls inside an é
    got = run(launched, tmp_path, f"print('a' + '\\u00e9' * {shim.PIECE_BYTES})")
    assert [r.full for r in got] == [False, False, True]
    assert all(len(r.content) <= shim.PIECE_BYTES for r in got)
    assert all(r.content.decode() for r in got), "each piece is whole UTF-8"
    assert b"".join(r.content for r in got).decode() == line


def test_a_partial_line_is_written_after_a_quiet_second_and_at_eof(launched, tmp_path):
    script = textwrap.dedent("""
        import os, sys, time
        sys.stdout.write("10%"); sys.stdout.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b" P 10%" not in open(sys.argv[1], "rb").read():
            time.sleep(0.02)
        sys.stdout.write("\\r100%\\nno newline"); sys.stdout.flush()
    """)
    rank = Launcher().launch([PY, "-c", script, str(tmp_path / "r.log")], dict(os.environ),
                             str(tmp_path / "r.log"), str(tmp_path / "r.exit"))
    launched.append(rank)
    wait_until(lambda: rank.exit_code() is not None, timeout=60, what="the rank exited")
    got = parse_file((tmp_path / "r.log").read_bytes())
    assert [(r.full, r.content) for r in got] == [
        (False, b"10%"), (True, b"\r100%"), (False, b"no newline")]


def test_the_log_is_complete_when_the_exit_is_known_even_with_a_descendant_holding_it(
        launched, tmp_path):
    """The command exits, a process it left holds the pipes: the shim writes
    what came within DRAIN_S, then the exit file; nothing is written after."""
    script = ("import subprocess, sys\nsubprocess.Popen(['sleep', '30'])\n"
              "print('last words', flush=True)\nsys.exit(3)\n")
    rank = Launcher().launch([PY, "-c", script], dict(os.environ), str(tmp_path / "r.log"),
                             str(tmp_path / "r.exit"))
    launched.append(rank)
    started = time.monotonic()
    wait_until(lambda: rank.exit_code() is not None, timeout=30, what="the rank exited")
    assert rank.exit_code() == 3
    assert time.monotonic() - started < shim.DRAIN_S + 5, "not held by the descendant"
    assert lines_of((tmp_path / "r.log").read_bytes()) == ["last words"]


def test_20_mb_of_control_bytes_pass_at_once_in_bounded_pieces(launched, tmp_path):
    started = time.monotonic()
    got = run(launched, tmp_path,
              "import sys; sys.stdout.buffer.write(b'\\x01' * 20_000_000 + b'\\nafter\\n')")
    assert time.monotonic() - started < 30
    assert all(len(r.content) <= shim.PIECE_BYTES for r in got)
    assert [r.full for r in got[-2:]] == [True, True] and not any(r.full for r in got[:-2])
    assert b"".join(r.content for r in got[:-1]) == b"\x01" * 20_000_000
    assert got[-1].content == b"after"


def test_the_shims_own_line_is_a_stderr_record(launched, tmp_path):
    rank = Launcher().launch(["/nonexistent/trainer"], dict(os.environ), str(tmp_path / "r.log"),
                             str(tmp_path / "r.exit"))
    launched.append(rank)
    wait_until(lambda: rank.exit_code() is not None)
    (only,) = parse_file((tmp_path / "r.log").read_bytes())
    assert only.stream == "stderr" and b"cannot start '/nonexistent/trainer'" in only.content


def test_a_record_parses_back_and_a_line_that_is_none_does_not():
    rec = parse(b"2026-12-02T03:04:05.123456789Z stderr P x y\n")
    assert rec == Record(1796180645123456789, "stderr", False, b"x y", 40)
    assert rec.time_ms == 1796180645123
    assert parse(b"2026-12-02T03:04:05.5Z stdout F \n").time_ns == 1796180645500000000
    assert parse(b"2026-12-02T03:04:05Z stdout F\n") is None  # no space before the content
    assert parse(b"hello\n") is None and parse(b"2026-13-02T03:04:05Z stdout F x") is None
    assert parse(agent_record("stderr", "two\nlines", 5)).content == b"two lines"


def test_the_ranks_uid_cannot_write_its_log_file(launched):
    identity = bare_identity()
    if identity is None:
        pytest.skip("running a rank as another uid takes root")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no python3 the rank user can run")
    home = Path(tempfile.mkdtemp(prefix="gpujobs-log-"))
    os.chmod(home, 0o711)  # the rank user may reach the file; only its mode stops it
    try:
        log = home / "r.log"
        script = textwrap.dedent(f"""
            import os
            for path in ({str(log)!r}, f"/proc/{{os.getppid()}}/fd/1"):
                try:
                    open(path, "ab").write(b"forged\\n")
                    print("WROTE", path)
                except OSError as e:
                    print("REFUSED", path, type(e).__name__)
        """)
        got = run(launched, home, script, python=python, identity=identity)
        said = [r.content.decode() for r in got]
        assert said[:2] == [f"REFUSED {log} PermissionError",
                            "REFUSED /proc/" + said[1].split("/")[2] + "/fd/1 PermissionError"]
        assert len(said) == 2 and [r.stream for r in got] == ["stdout"] * 2
        st = log.stat()
        assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0
    finally:
        shutil.rmtree(home, ignore_errors=True)
