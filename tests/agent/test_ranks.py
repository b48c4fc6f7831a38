"""The shim and rank handles, with real processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from agent.ranks import LOST_EXIT_CODE, Launcher, ProcTable, Rank, catches, read_stat
from agent.records import lines_of, parse_file
from agent.shim import FORWARDED, WARNINGS, read_exit_file
from chalicelib.domain.wire import WARN_SIGNALS
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import PY


def start(launched, tmp_path, command, name="r", env=None) -> Rank:
    rank = Launcher().launch(list(command), dict(os.environ if env is None else env),
                             str(tmp_path / f"{name}.log"), str(tmp_path / f"{name}.exit"))
    launched.append(rank)
    return rank


def test_exit_code_is_recorded_by_the_shim(launched, tmp_path):
    rank = start(launched, tmp_path, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert wait_until(lambda: rank.exit_code() is not None) and rank.exit_code() == 7
    assert read_exit_file(rank.exit_file) == 7
    # one file of records, stdout and stderr told apart, in the order written
    got = parse_file((tmp_path / "r.log").read_bytes())
    assert [(r.stream, r.full, r.content) for r in got] == [
        ("stdout", True, b"out"), ("stderr", True, b"err")]
    assert not (tmp_path / "r.err").exists()


def test_a_command_that_cannot_start_exits_127_with_the_reason_in_the_log(launched, tmp_path):
    rank = start(launched, tmp_path, ["/nonexistent/trainer", "--x"])
    wait_until(lambda: rank.exit_code() is not None)
    assert rank.exit_code() == 127
    assert "cannot start '/nonexistent/trainer'" in lines_of(
        (tmp_path / "r.log").read_bytes(), "stderr")[0]


def test_the_rank_runs_in_its_own_session_and_group_led_by_the_shim(launched, tmp_path):
    rank = start(launched, tmp_path, ["sleep", "30"])
    assert rank.pgid == rank.pid and os.getpgid(rank.pid) == rank.pid
    assert os.getsid(rank.pid) == rank.pid and os.getsid(rank.pid) != os.getsid(0)
    members = wait_until(lambda: len(rank.members(ProcTable.read())) == 2 and
                         rank.members(ProcTable.read()), what="shim and sleep")
    assert rank.pid in members


COUNT_TERMS = textwrap.dedent("""
    import os, signal, sys, time
    path = sys.argv[1]
    def on_term(*_):
        with open(path, "a") as f:
            f.write("TERM\\n")
    signal.signal(signal.SIGTERM, on_term)
    open(path + ".ready", "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not os.path.exists(path):
        time.sleep(0.01)
    time.sleep(0.5)  # time for a second SIGTERM to arrive, if one were sent
    sys.exit(5)
""")


def test_sigterm_reaches_every_process_of_the_group_exactly_once(launched, tmp_path):
    counts = tmp_path / "terms"
    rank = start(launched, tmp_path, [PY, "-c", COUNT_TERMS, str(counts)])
    wait_until(lambda: (tmp_path / "terms.ready").exists(), what="handler installed")
    rank.terminate()
    wait_until(lambda: rank.exit_code() is not None, what="exit after SIGTERM")
    assert counts.read_text() == "TERM\n"
    assert rank.exit_code() == 5  # the shim kept waiting and recorded the command's own code


#: a parent and its child in the rank's group, each appending its role to
#: argv[1] on signal argv[2]; each says it is ready once its handler is in place
COUNT_SIGNAL = textwrap.dedent("""
    import signal, subprocess, sys, time
    path, name, role = sys.argv[1], sys.argv[2], sys.argv[3]
    def on_signal(*_):
        with open(path, "a") as f:
            f.write(role + "\\n")
    signal.signal(getattr(signal, name), on_signal)
    if role == "parent":
        subprocess.Popen([sys.executable, "-c", sys.argv[4], path, name, "child"])
    open(path + "." + role, "w").close()
    while True:
        time.sleep(0.05)
""")


def test_the_shim_survives_every_signal_a_warning_may_be():
    assert {signal.Signals[name] for name in WARN_SIGNALS} == set(WARNINGS) | set(FORWARDED)


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGHUP", "SIGINT"])
def test_a_warning_reaches_every_process_of_the_group_once_and_the_shim_survives_it(
        launched, tmp_path, name):
    got = tmp_path / "got"
    rank = start(launched, tmp_path, [PY, "-c", COUNT_SIGNAL, str(got), name, "parent",
                                      COUNT_SIGNAL])
    wait_until(lambda: all((tmp_path / f"got.{role}").exists() for role in ("parent", "child")),
               what="handlers installed")
    sig = signal.Signals[name]
    assert rank.ready_for(sig)
    rank.signal(sig)
    wait_until(lambda: got.exists() and len(got.read_text().split()) == 2, what="both signalled")
    time.sleep(0.3)  # a negative check: time for a second copy to arrive, if one were sent
    assert sorted(got.read_text().split()) == ["child", "parent"]
    assert rank.shim_alive() and rank.exit_code() is None, "the rank keeps running"
    rank.terminate()
    wait_until(lambda: rank.exit_code() is not None, what="exit after SIGTERM")
    assert rank.exit_code() == 128 + signal.SIGTERM, "recorded by the shim, which survived"


def test_a_shim_is_ready_for_a_warning_once_it_catches_it(launched, tmp_path):
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        assert catches(os.getpid(), signal.SIGUSR2) is True
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert catches(os.getpid(), signal.SIGUSR2) is False
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert catches(other.pid, signal.SIGUSR1) is False
    finally:
        other.kill()
        other.wait()
    assert catches(other.pid, signal.SIGUSR1) is None  # no such process
    rank = start(launched, tmp_path, ["sleep", "30"])
    wait_until(lambda: rank.ready_for(signal.SIGUSR1), what="the shim catches SIGUSR1")
    assert catches(rank.pid, signal.SIGUSR1)


def test_sigterm_stops_a_whole_process_tree(launched, tmp_path):
    rank = start(launched, tmp_path, ["sh", "-c", "sleep 30 & sleep 30; wait"])
    members = wait_until(lambda: len(rank.members(ProcTable.read())) == 4 and
                         rank.members(ProcTable.read()), what="shim, sh and two sleeps")
    rank.terminate()
    wait_until(lambda: not rank.members(ProcTable.read()), what="group gone")
    assert not any(alive(pid) for pid in members)
    assert rank.exit_code() == 128 + signal.SIGTERM


def test_kill_ends_a_group_that_ignores_sigterm(launched, tmp_path):
    rank = start(launched, tmp_path, ["sh", "-c", 'trap "" TERM; sleep 30 & sleep 30; wait'])
    members = wait_until(lambda: len(rank.members(ProcTable.read())) == 4 and
                         rank.members(ProcTable.read()), what="group up")
    rank.terminate()
    time.sleep(0.3)  # a negative check: give SIGTERM time to (not) work
    assert rank.members(ProcTable.read()) == members
    rank.kill()
    wait_until(lambda: not rank.members(ProcTable.read()), what="group killed")
    assert not any(alive(pid) for pid in members)


def test_an_adopted_rank_is_not_signalled_when_its_pid_now_belongs_to_another_process(
        launched, tmp_path):
    # a process of "someone else", leading its own group like a shim would
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        real_start = read_stat(other.pid).start_time
        stale = Launcher().adopt(pid=other.pid, pgid=other.pid, start_time=real_start - 1,
                                 exit_file=str(tmp_path / "none"))
        assert not stale.shim_alive()
        assert stale.members(ProcTable.read()) == []
        stale.terminate()
        stale.kill()
        time.sleep(0.2)  # a negative check: a signal would have landed by now
        assert other.poll() is None
        assert stale.exit_code() == LOST_EXIT_CODE  # gone without a record
        ours = Launcher().adopt(pid=other.pid, pgid=other.pid, start_time=real_start,
                                exit_file=str(tmp_path / "none"))
        assert ours.shim_alive()
        ours.kill()
        assert other.wait(5) == -signal.SIGKILL
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()


def test_an_adopted_rank_reports_the_exit_code_its_shim_recorded(launched, tmp_path):
    gate = tmp_path / "gate"
    rank = start(launched, tmp_path, ["sh", "-c", f'while [ ! -e "{gate}" ]; do sleep 0.02; '
                                                  f'done; exit 4'])
    adopted = Launcher().adopt(pid=rank.pid, pgid=rank.pgid, start_time=rank.start_time,
                               exit_file=rank.exit_file)
    assert adopted.shim_alive() and adopted.exit_code() is None
    gate.touch()
    wait_until(lambda: adopted.exit_code() is not None, what="adopted exit")
    assert adopted.exit_code() == 4


def test_a_rank_runs_in_the_directory_it_is_given(launched, tmp_path):
    """The job's working_dir: the command runs there, a relative path is read there."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "where.py").write_text("import os\nprint(os.getcwd())\n")
    rank = Launcher().launch([PY, "where.py"], dict(os.environ), str(tmp_path / "r.log"),
                             str(tmp_path / "r.exit"), cwd=str(work))
    launched.append(rank)
    assert wait_until(lambda: rank.exit_code() is not None) and rank.exit_code() == 0
    assert lines_of((tmp_path / "r.log").read_bytes()) == [str(work)]


def test_a_working_dir_that_is_not_there_is_a_rank_that_cannot_start(launched, tmp_path):
    rank = Launcher().launch(["sh", "-c", "exit 0"], dict(os.environ), str(tmp_path / "r.log"),
                             str(tmp_path / "r.exit"), cwd=str(tmp_path / "missing"))
    launched.append(rank)
    assert wait_until(lambda: rank.exit_code() is not None) and rank.exit_code() == 127
    assert "missing" in lines_of((tmp_path / "r.log").read_bytes(), "stderr")[0]


def test_a_sigterm_that_comes_while_the_command_is_being_started_still_reaches_it(tmp_path):
    """Invariant (a stop is carried out): a SIGTERM that reaches the shim
    after its handlers are in and before its command runs is held and sent
    to the command once it runs, not lost (the command then ran on until the
    grace period's SIGKILL: a restarted agent's stop took minutes, CI runs
    15 and 17). The window is held open by the shim's one write before its
    command starts, its cgroup's ``cgroup.procs``, here a FIFO that nobody
    reads until the test has sent the signal."""
    from agent.ranks import SHIM

    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    os.mkfifo(cgroup / "cgroup.procs")
    exit_file = tmp_path / "exit.json"
    shim = subprocess.Popen(
        [sys.executable, "-I", str(SHIM), "--exit-file", str(exit_file), "--cgroup", str(cgroup),
         "--", "sleep", "600"], start_new_session=True)
    try:
        # the shim blocks opening the FIFO for writing: its handlers are in
        wait_until(lambda: _blocked_in_open(shim.pid), timeout=30,
                   what="the shim waiting on its cgroup's cgroup.procs")
        os.kill(shim.pid, signal.SIGTERM)  # pending now: handled before the open returns
        with open(cgroup / "cgroup.procs") as fifo:  # lets the shim go on: it starts sleep
            fifo.read()
        assert shim.wait(timeout=60) == 128 + signal.SIGTERM
        assert read_exit_file(str(exit_file)) == 128 + signal.SIGTERM
    finally:
        if shim.poll() is None:
            os.killpg(shim.pid, signal.SIGKILL)
            shim.wait(timeout=30)


def _blocked_in_open(pid: int) -> bool:
    """Whether ``pid`` sleeps in a FIFO's open, waiting for a reader (its
    wchan: ``wait_for_partner``)."""
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read() == "wait_for_partner"
    except OSError:
        return False
