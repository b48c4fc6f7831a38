"""Ranks' Python stacks (issue 23, item 4, the agent side): py-spy's dump read
into frames, taken only for silent ranks and never more often than the period,
posted with the rank's process sample until it beats again, and taken for
every live rank before a CANCEL's SIGTERM, into the STOPPED report."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from agent.beats import BeatPoster
from agent.procs import ProcSampler, own_processes
from agent.stacks import (
    MAX_CHARS,
    MAX_FRAMES,
    PySpy,
    StackSampler,
    find_py_spy,
    parse_dump,
    read_wchan,
    report_stacks,
    source_line,
)
from tests.support.waits import wait_until

from .harness import cancel, launch, message, run_until
from .test_beats import FakeApi, attempt, hb, writer

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed")

SLEEPER = """
import pathlib, sys, time
def hang_in_here():
    pathlib.Path(sys.argv[1]).touch()
    time.sleep(3600)
hang_in_here()
"""


def _frame(name, filename, line, short=None):
    return {"name": name, "filename": filename, "short_filename": short or Path(filename).name,
            "line": line, "module": None, "locals": None, "is_entry": False}


def _dump(*threads):
    return json.dumps([{"pid": 7, "thread_id": 1, "thread_name": name, "os_thread_id": tid,
                        "active": False, "owns_gil": False, "frames": frames}
                       for name, tid, frames in threads])


# ---------------------------------------------------------------- parsing


def test_the_main_threads_frames_are_read_innermost_first_with_the_focused_line(tmp_path):
    """Invariant: frames are ``func (short_filename:line)`` of the main thread,
    innermost first, and ``code`` is the source line of the frame focus()
    picks (the rank's own, not torch's)."""
    train = tmp_path / "train.py"
    train.write_text("import torch\n\ndef step():\n    loss.backward()   \n")
    out = parse_dump(_dump(
        ("Thread-1", 9, [_frame("run", "/usr/lib/python3.11/threading.py", 975)]),
        ("MainThread", 8, [
            _frame("_engine_run_backward", "/v/site-packages/torch/autograd/graph.py", 979,
                   "torch/autograd/graph.py"),
            _frame("step", str(train), 4, "train.py"),
            _frame("<module>", str(train), 9, "train.py")])), pid=7)
    assert out == {"frames": ["_engine_run_backward (torch/autograd/graph.py:979)",
                              "step (train.py:4)", "<module> (train.py:9)"],
                   "code": "loss.backward()"}


def test_without_thread_names_the_thread_with_the_pids_id_is_the_main_one():
    """Invariant: ``--nonblocking`` dumps name no thread; the main thread is the
    one whose os thread id is the pid, else the first."""
    dump = _dump((None, 99, [_frame("worker", "/x/w.py", 1)]),
                 (None, 7, [_frame("main", "/x/m.py", 2)]))
    assert parse_dump(dump, pid=7)["frames"] == ["main (m.py:2)"]
    assert parse_dump(dump, pid=None)["frames"] == ["worker (w.py:1)"]


def test_frames_are_bounded_and_a_bad_dump_or_unreadable_source_never_fails():
    """Invariant: at most 16 frames of at most 200 characters; garbage in, None
    out; a source file that is gone gives no ``code``, never an error."""
    deep = [_frame("f" * 300, f"/gone/m{i}.py", i + 1) for i in range(40)]
    out = parse_dump(_dump(("MainThread", 7, deep)))
    assert len(out["frames"]) == MAX_FRAMES and all(len(f) <= MAX_CHARS for f in out["frames"])
    assert "code" not in out
    for bad in ("", "not json", "{}", "[]", json.dumps([{"frames": []}])):
        assert parse_dump(bad) is None


def test_py_spy_is_found_by_setting_beside_python_or_not_at_all(tmp_path):
    """Invariant: GPUJOBS_PY_SPY wins (empty: none); a py-spy that is absent
    gives no stack and no error."""
    assert find_py_spy({"GPUJOBS_PY_SPY": "/opt/x/py-spy"}) == "/opt/x/py-spy"
    assert find_py_spy({"GPUJOBS_PY_SPY": ""}) is None
    absent = PySpy(str(tmp_path / "no-such-py-spy"))
    assert absent(os.getpid()) is None and absent(os.getpid()) is None
    assert not absent.available, "gone once: not tried again"


def test_the_report_stacks_fit_their_budget_outer_frames_first():
    """Invariant: a STOPPED report's stacks stay under the budget (the API takes
    64 KiB bodies): outer frames go first, each rank keeps its ``where``."""
    frames = [f"fn{i} ({'d/' * 80}m.py:{i})" for i in range(16)]
    by_rank = {r: {"frames": frames, "code": "x()"} for r in range(64)}
    out = report_stacks(by_rank, budget_b=40 * 1024)
    assert [e["rank"] for e in out] == list(range(64))
    assert len(json.dumps(out)) <= 40 * 1024
    assert all(e["frames"] == frames[:len(e["frames"])] and e["where"] for e in out)
    assert report_stacks({3: {"frames": ["forward (train.py:88)"], "code": "time.sleep(1)"}}) == [
        {"rank": 3, "where": "train.py:88 in forward → time.sleep(1)",
         "frames": ["forward (train.py:88)"]}]


# ---------------------------------------------------------------- the sampling policy


class Clock:
    def __init__(self):
        self.ns = time.monotonic_ns()

    def __call__(self):
        return self.ns


@pytest.fixture
def clock(monkeypatch):
    """One fake monotonic clock for the poster, the sampler and the ranks' beats."""
    c = Clock()
    monkeypatch.setattr(hb, "time", types.SimpleNamespace(monotonic_ns=c))
    return c


class FakeDumper:
    """Answers a fixed stack (or hangs until released), recording the pids asked."""

    def __init__(self, hang: bool = False):
        self.pids: list[int] = []
        self.release = threading.Event()
        self.hang = hang

    def __call__(self, pid):
        self.pids.append(pid)
        if self.hang:
            self.release.wait(30)
            return None
        return {"frames": [f"hang_in_here (rank{pid}.py:4)"], "code": "time.sleep(3600)"}


class OwnSampler:
    """ProcSampler's interface, with the rank's own pid 5000 + rank."""

    def __init__(self):
        self.own_pids = {}

    def sample(self, groups):
        self.own_pids = {k: 5000 + k[1] for k in groups}
        return {k: {"cpu": 0.0, "io_bps": 0, "state": "S", "procs": 2} for k in groups}

    def forget(self, keys):
        list(keys)

    def keys(self):
        return []


def _poster(tmp_path, clock, dumper, every_s=10.0, ranks=(0, 1)):
    rec = attempt(tmp_path, ranks)
    for r, p in rec.procs.items():
        p.pid = 1000 + r
    api = FakeApi()
    stacks = StackSampler(dumper, every_s_=every_s, timeout_s=2.0, monotonic_ns=clock)
    poster = BeatPoster(api, monotonic_ns=clock, wall=lambda: "2026-01-01T00:00:00.000Z",
                        sampler=OwnSampler(), stacks=stacks)
    return rec, api, stacks, poster


def _tick(poster, rec, clock, s=1.0):
    clock.ns += int(s * 1e9)
    poster.tick([rec])


def _procs(api):
    return {e["rank"]: e.get("proc") for e in api.posts[-1][2]}


def test_a_beating_rank_pays_nothing_a_silent_one_is_dumped_once_a_period(tmp_path, clock):
    """Invariant: no dump of a rank that beat within two intervals; a rank
    silent two intervals or more (or never beating: rank 1) is dumped, at most
    once every GPUJOBS_STACK_EVERY_S."""
    dumper = FakeDumper()
    rec, api, stacks, poster = _poster(tmp_path, clock, dumper, every_s=10.0)
    w0 = writer(rec, 0)
    w0.write(1)
    poster.tick([rec])
    wait_until(lambda: dumper.pids == [5001], what="the never-beating rank dumped")
    _tick(poster, rec, clock, 1.0)
    w0.write(2)
    _tick(poster, rec, clock, 1.5)       # rank 0 beat 1.5 s ago: healthy
    assert dumper.pids == [5001], "a rank beating within two intervals is never dumped"
    _tick(poster, rec, clock, 1.0)       # 2.5 s without a beat: silent
    wait_until(lambda: 5000 in dumper.pids, what="the silent rank dumped")
    for _ in range(8):                   # 8 s more: rank 0 within its period, rank 1 past it
        _tick(poster, rec, clock, 1.0)
        wait_until(lambda: not stacks._running, what="the dumps done")
    assert dumper.pids.count(5000) == 1, "once a period"
    assert dumper.pids.count(5001) == 2, "10.5 s after its first: its second"
    _tick(poster, rec, clock, 2.0)       # 10 s since rank 0's first (each tick is a visit:
                                         # the attempt's interval is 1 s)
    wait_until(lambda: dumper.pids.count(5000) == 2, what="rank 0's next period")


def test_the_stack_rides_with_every_sample_until_the_rank_beats_again(tmp_path, clock):
    """Invariant: the latest stack is posted as proc.stack {frames, code, age_s}
    (age on the host's monotonic clock) with each sample of the rank, and is
    dropped once the rank beats again."""
    dumper = FakeDumper()
    rec, api, stacks, poster = _poster(tmp_path, clock, dumper, ranks=(0,))
    w0 = writer(rec, 0)
    w0.write(1)
    clock.ns += int(2.5e9)                        # silent 2.5 s
    poster.tick([rec])
    wait_until(lambda: stacks.latest((rec.key, 0)), what="the stack taken")
    _tick(poster, rec, clock, 1.0)
    assert _procs(api)[0]["stack"] == {"frames": ["hang_in_here (rank5000.py:4)"],
                                       "code": "time.sleep(3600)", "age_s": 1.0}
    _tick(poster, rec, clock, 3.0)
    assert _procs(api)[0]["stack"]["age_s"] == 4.0
    w0.write(2)                                   # it moved on
    _tick(poster, rec, clock, 1.0)
    assert "stack" not in _procs(api)[0]
    assert stacks.latest((rec.key, 0)) is None


def test_dumps_of_several_ranks_run_at_once_and_never_hold_up_the_loop(tmp_path, clock):
    """Invariant: a tick never waits on py-spy (dumps run in a pool, several at
    once), so 8 hung dumps cost the loop nothing."""
    dumper = FakeDumper(hang=True)
    rec, api, stacks, poster = _poster(tmp_path, clock, dumper, ranks=range(8))
    try:
        started = time.monotonic()
        poster.tick([rec])
        assert time.monotonic() - started < 1.0
        wait_until(lambda: len(dumper.pids) == 8, what="8 dumps running at once")
    finally:
        dumper.release.set()
        stacks.close()


def test_capture_before_a_kill_is_concurrent_and_bounded_by_the_timeout():
    """Invariant: capture() (before SIGTERM) waits at most the timeout however
    many dumps hang, and returns what answered."""
    hung = FakeDumper(hang=True)
    sampler = StackSampler(hung, timeout_s=0.5)
    try:
        started = time.monotonic()
        assert sampler.capture({r: 100 + r for r in range(8)}) == {}
        took = time.monotonic() - started
        assert took < 1.5, f"8 hung dumps took {took:.1f}s: not run concurrently"
        assert len(hung.pids) == 8
    finally:
        hung.release.set()
    ok = StackSampler(FakeDumper(), timeout_s=0.5)
    assert ok.capture({3: 7}) == {3: {"frames": ["hang_in_here (rank7.py:4)"],
                                      "code": "time.sleep(3600)"}}


# ---------------------------------------------------------------- real processes


def _sleeper(tmp_path):
    ready, script = tmp_path / "ready", tmp_path / "rank.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, str(script), str(ready)], start_new_session=True)
    wait_until(ready.exists, timeout=20, what="the sleeper started")
    return p


def _stop(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


@needs_py_spy
def test_py_spy_reads_a_real_sleeping_rank_and_its_wchan(tmp_path):
    """Invariant: a real Python process asleep in a named function dumps as
    frames naming that function, with ``time.sleep(...)`` as its code line;
    /proc's wchan says it sleeps (nanosleep), without py-spy."""
    p = _sleeper(tmp_path)
    try:
        stack = wait_until(lambda: (s := PySpy()(p.pid)) and "time.sleep" in s.get("code", "")
                           and s, timeout=20, what="a stack in time.sleep")
        assert stack["frames"][0] == "hang_in_here (rank.py:5)"
        assert stack["code"] == "time.sleep(3600)"
        assert "nanosleep" in wait_until(lambda: read_wchan(p.pid) or "", what="wchan")
    finally:
        _stop(p)


@needs_py_spy
def test_a_real_rank_under_the_shim_posts_its_wchan_and_own_pid(tmp_path):
    """Invariant: the sample's wchan and the pid stacks are taken of are the
    rank's own command's (the shim's child), not the shim's (which waits)."""
    from agent.ranks import SHIM
    ready = tmp_path / "ready"
    shim = subprocess.Popen([sys.executable, "-I", str(SHIM), "--exit-file",
                             str(tmp_path / "exit.json"), "--", sys.executable, "-c", SLEEPER,
                             str(ready)], start_new_session=True)
    try:
        wait_until(ready.exists, timeout=20, what="the rank started")
        [child] = wait_until(lambda: list(own_processes({shim.pid}).values()), what="its child")
        sampler = ProcSampler()
        seen = wait_until(lambda: sampler.sample({"r": shim.pid}).get("r"), what="a sample")
        assert sampler.own_pids["r"] == child != shim.pid
        assert "nanosleep" in seen["wchan"]
    finally:
        _stop(shim)


@needs_py_spy
def test_a_cancel_takes_each_ranks_stack_before_sigterm_into_stopped(world, tmp_path):
    """Invariant: on CANCEL the agent takes every live rank's stack before the
    first SIGTERM (it still sleeps in hang_in_here), keeps it in the state file
    with the attempt, and the STOPPED report carries it as
    stacks [{rank, where, frames}]."""
    script = tmp_path / "rank.py"
    script.write_text(SLEEPER)
    ready = tmp_path / "ready"
    sampler = StackSampler(timeout_s=5.0)
    agent = world.agent(grace_s=10.0)
    agent._stacks = sampler
    terminated = []
    real_terminate = agent._terminate

    def terminate(rec):
        terminated.append(json.loads(json.dumps(rec.stop_stacks)))
        real_terminate(rec)
    agent._terminate = terminate
    try:
        agent.handle(message(launch(command=(sys.executable, str(script), str(ready)))))
        wait_until(ready.exists, timeout=20, what="the rank started")
        agent.handle(message(cancel(), 1))
        assert terminated, "SIGTERM was sent"
        [before] = terminated
        assert [s["rank"] for s in before] == [0]
        assert before[0]["frames"][0] == "hang_in_here (rank.py:5)"
        assert before[0]["where"] == "rank.py:5 in hang_in_here → time.sleep(3600)"
        assert world.state()["attempts"]["job_a/1"]["stop_stacks"] == before, "durable"
        [stopped] = run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
        assert stopped["stacks"] == before and stopped["ranks"] == [0]
    finally:
        sampler.close()


def test_a_dump_that_misses_the_deadline_before_sigterm_falls_back_to_the_last_sampled(
        world, tmp_path):
    """Invariant: on a loaded host a rank whose dump before SIGTERM times out
    still gets its stack into the STOPPED report: the last one sampled of it
    while it was silent."""
    script = tmp_path / "rank.py"
    script.write_text(SLEEPER)
    ready = tmp_path / "ready"
    hung = FakeDumper(hang=True)
    sampler = StackSampler(hung, timeout_s=0.3)
    agent = world.agent(grace_s=10.0)
    agent._stacks = sampler
    sampled = {"frames": ["hang_in_here (rank.py:5)"], "code": "time.sleep(3600)"}
    sampler._latest[("job_a/1", 0)] = (time.monotonic_ns(), sampled)  # the poster's sample
    try:
        agent.handle(message(launch(command=(sys.executable, str(script), str(ready)))))
        wait_until(ready.exists, timeout=20, what="the rank started")
        agent.handle(message(cancel(), 1))
        [stopped] = run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
        assert [(s["rank"], s["where"]) for s in stopped["stacks"]] == [
            (0, "rank.py:5 in hang_in_here → time.sleep(3600)")]
    finally:
        hung.release.set()
        sampler.close()


def test_the_code_line_drops_its_comment_but_not_a_hash_in_a_string(tmp_path):
    src = tmp_path / "train.py"
    src.write_text('    loss.backward()  # DDP all-reduce\nx = "a # b"  # c\n')
    assert source_line(str(src), 1) == "loss.backward()"
    assert source_line(str(src), 2) == 'x = "a # b"'


def test_a_standard_library_frame_is_named_from_lib_python_not_as_the_ranks_own(tmp_path):
    """Invariant: py-spy shortens a standard-library file to a bare name
    (``weakref.py``) that would pass for the rank's own script; the frame
    keeps ``lib/pythonX.Y/`` so the focus (and the code line) is the rank's
    own frame below it."""
    script = tmp_path / "train.py"
    script.write_text("x = 1\nloss.backward()  # the all-reduce\n")
    got = parse_dump(_dump(("MainThread", 7, [
        _frame("__call__", "/usr/lib/python3.11/weakref.py", 590),
        _frame("tensor_del", "/v/lib/python3.11/site-packages/torch/_tensor.py", 40,
               short="torch/_tensor.py"),
        _frame("main", str(script), 2)])), pid=7)
    assert got["frames"][:2] == ["__call__ (lib/python3.11/weakref.py:590)",
                                 "tensor_del (torch/_tensor.py:40)"]
    assert got["code"] == "loss.backward()"
