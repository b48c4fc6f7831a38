"""agent/watchdog.py: a main loop that has not completed a pass for
``stall_s`` is reported (a WARNING naming its step, the rank file it is
opening and where it is), once per ``stall_s`` while it lasts, and its
recovery too; the watchdog never calls in for it."""
from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from agent import rankfiles
from agent.__main__ import parse_settings
from agent.runner import Settings, _loop
from agent.watchdog import STALL_S, Watchdog
from tests.support.waits import wait_until

from .test_cli import REQUIRED, TOKEN


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "gpujobs.agent.watchdog" and r.levelno == logging.WARNING]


def test_a_stalled_pass_is_warned_once_per_stall_s_and_its_end_told(caplog):
    """Quiet while passes complete; past ``stall_s`` one WARNING naming the
    step and how long, again only after another ``stall_s``; an INFO once a
    pass completes."""
    caplog.set_level(logging.INFO, logger="gpujobs.agent.watchdog")
    clock = Clock()
    dog = Watchdog(5.0, clock=clock)
    for _ in range(10):
        clock.t += 1
        dog.step("tick (rank exits, grace periods, reports)")
        dog.passed()
        assert dog.check() is None
    dog.step("posting the ranks' beats")
    clock.t += 4.9
    assert dog.check() is None
    clock.t += 0.2
    message = dog.check()
    assert message is not None and "5.1s" in message
    assert "posting the ranks' beats for 5.1s" in message
    assert "goes DOWN" in message
    clock.t += 4
    assert dog.check() is None, "not once a check"
    clock.t += 1.5
    assert "10.6s" in (dog.check() or "")
    assert len(warnings(caplog)) == 2
    dog.passed()
    assert dog.check() is None
    [moved] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "moves again" in moved and "10.6s" in moved
    clock.t += 1
    assert dog.check() is None and len(warnings(caplog)) == 2


def test_the_warning_names_the_blocked_frames_and_the_rank_file_being_opened(caplog):
    """The stack of the loop's thread (its innermost frames) and the path
    rankfiles.py is opening there, so the culprit is named, not guessed."""
    release = threading.Event()
    ready = threading.Event()
    ident: list[int] = []

    def blocked_in_a_rank_file():
        ident.append(threading.get_ident())
        rankfiles._opening[ident[0]] = "/state/heartbeats/job_a/1/rank-0"
        try:
            ready.set()
            release.wait(10)
        finally:
            rankfiles._opening.pop(ident[0], None)

    t = threading.Thread(target=blocked_in_a_rank_file, daemon=True)
    t.start()
    try:
        assert ready.wait(5)
        clock = Clock()
        dog = Watchdog(1.0, thread_id=ident[0], clock=clock)
        dog.step("posting the ranks' beats")
        clock.t += 2
        message = dog.check() or ""
    finally:
        release.set()
        t.join(5)
    assert "opening /state/heartbeats/job_a/1/rank-0" in message
    assert "blocked_in_a_rank_file (agent/test_watchdog.py:" in message


class FakePoller:
    def get(self, timeout: float):
        return None

    def done(self) -> None:
        pass


def test_the_agents_loop_under_a_watchdog_thread_reports_a_stuck_step(caplog):
    """The runner's loop with a real watchdog thread: a step that blocks (here
    posting beats) is reported by name while it blocks, the node's call-ins
    stay on the loop (none while it is stuck), and the loop goes on once the
    step is released."""
    caplog.set_level(logging.INFO, logger="gpujobs.agent.watchdog")
    stop, release = threading.Event(), threading.Event()
    passes: list[int] = []
    calls_in: list[int] = []
    agent = SimpleNamespace(tick=lambda: None, handle=lambda m: None)

    def post_beats(carry):
        passes.append(1)
        if len(passes) == 3:
            release.wait(20)
        if len(passes) >= 6:
            stop.set()
        return False  # no beat carried the call-in: the loop calls in by PUT

    settings = Settings(node_id="n", gpus=1, gpu_type="t", api="http://x", token="t",
                        state_dir="/nonexistent", tick_s=0.01, node_heartbeat_s=0.01)
    dogs: list[Watchdog] = []

    def run_loop():
        dogs.append(Watchdog(0.3).start())  # made on the loop's thread: it watches that one
        _loop(agent, FakePoller(), stop, settings, lambda: calls_in.append(1),  # type: ignore[arg-type]
              post_beats, watchdog=dogs[0])

    loop = threading.Thread(target=run_loop, daemon=True)
    loop.start()
    try:
        stuck = wait_until(lambda: warnings(caplog), 15, what="the watchdog's warning")
        assert "posting the ranks' beats" in stuck[0]
        assert "post_beats (agent/test_watchdog.py:" in stuck[0]
        n = len(calls_in)
        assert not release.wait(0.5)
        assert len(calls_in) == n, "a stuck loop does not call in"
    finally:
        release.set()
        loop.join(10)
        if dogs:
            dogs[0].stop()
    assert not loop.is_alive() and len(passes) >= 6
    dogs[0].check()  # its next look (the thread is stopped: no race for it)
    assert any("moves again" in r.getMessage() for r in caplog.records)


def test_the_watchdog_flag_and_its_default():
    """``--watchdog-s`` (``GPUJOBS_AGENT_WATCHDOG_S``), default STALL_S; 0 turns
    it off; a negative or non-finite value is a bad argument."""
    assert parse_settings(REQUIRED, environ=TOKEN)[0].watchdog_s == STALL_S == 30.0
    assert parse_settings(REQUIRED + ["--watchdog-s", "0"], environ=TOKEN)[0].watchdog_s == 0
    env = {**TOKEN, "GPUJOBS_AGENT_WATCHDOG_S": "2.5"}
    assert parse_settings(REQUIRED, environ=env)[0].watchdog_s == 2.5
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            parse_settings(REQUIRED + ["--watchdog-s", bad], environ=TOKEN)
