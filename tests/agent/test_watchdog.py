"""agent/watchdog.py: a loop that has not completed a pass for ``stall_s`` is
reported (a WARNING naming its step, the rank file it is opening and where it
is), once per ``stall_s`` while it lasts, and its recovery too; the watchdog
never calls in for it. And agent/runner.py's two loops, each under its own
watchdog, never hold each other up."""
from __future__ import annotations

import logging
import threading
import time

import pytest

from agent import rankfiles, runner
from agent.__main__ import parse_settings
from agent.runner import Pulse, Settings, _beat_loop, _loop
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


class Ticks:
    """An agent whose ``tick`` blocks from its ``block_at``-th call until released."""

    def __init__(self, block_at: int = 0) -> None:
        self.n, self.block_at, self.release = 0, block_at, threading.Event()

    def tick(self) -> None:
        self.n += 1
        if self.n == self.block_at:
            self.release.wait(20)

    def handle(self, message) -> None:
        pass


def test_a_stuck_beat_post_is_warned_by_the_beat_loops_watchdog_and_holds_up_nothing_else(
        caplog):
    """Invariant (issue 41): the beat loop's blocked step (a post waiting out
    a slow server) is reported by name by its own watchdog; it makes no
    call-in meanwhile, and the main loop (inbox, ticks, reports) keeps
    passing; both loops go on once it is released."""
    caplog.set_level(logging.INFO, logger="gpujobs.agent.watchdog")
    stop, release = threading.Event(), threading.Event()
    passes: list[int] = []
    calls_in: list[int] = []
    agent = Ticks()

    def post_beats(carry):
        passes.append(1)
        if len(passes) == 3:
            release.wait(20)
        return False  # no beat carried the call-in: the loop calls in by PUT

    settings = Settings(node_id="n", gpus=1, gpu_type="t", api="http://x", token="t",
                        state_dir="/nonexistent", tick_s=0.01, node_heartbeat_s=0.01,
                        watchdog_s=0.3)
    main, beats = Pulse(), threading.Thread(
        target=_beat_loop, args=(stop, settings, lambda: calls_in.append(1), post_beats),
        daemon=True)
    loop = threading.Thread(target=_loop, args=(agent, FakePoller(), stop, settings),
                            kwargs={"pulse": main}, daemon=True)
    beats.start()
    loop.start()
    try:
        stuck = wait_until(lambda: warnings(caplog), 15, what="the watchdog's warning")
        assert "the agent's beat loop has not completed a pass" in stuck[0]
        assert "posting the ranks' beats" in stuck[0]
        assert "post_beats (agent/test_watchdog.py:" in stuck[0]
        n, ticks = len(calls_in), agent.n
        assert not release.wait(0.5)
        assert len(calls_in) == n, "a stuck beat loop does not call in"
        assert agent.n > ticks + 5, "the main loop kept ticking"
        release.set()
        wait_until(lambda: len(passes) >= 6 and len(calls_in) > n, 15,
                   what="the beat loop going on")
        wait_until(lambda: any("beat loop moves again" in r.getMessage()
                               for r in caplog.records), 15, what="the recovery told")
    finally:
        release.set()
        stop.set()
        beats.join(10)
        loop.join(10)
    assert not beats.is_alive() and not loop.is_alive()


def test_beats_go_on_while_the_main_loop_waits_and_stop_once_it_is_stuck(monkeypatch):
    """Invariant (issue 41): a main loop held up by a slow step (a report the
    server takes 10 s to answer) holds up no beat; one stuck past
    MAIN_LOOP_GONE_S gets no beats and no call-ins posted for it, so its
    node goes DOWN rather than take jobs it cannot launch; both resume
    with it."""
    monkeypatch.setattr(runner, "MAIN_LOOP_GONE_S", 1.0)
    stop = threading.Event()
    posts: list[float] = []
    agent = Ticks(block_at=3)
    settings = Settings(node_id="n", gpus=1, gpu_type="t", api="http://x", token="t",
                        state_dir="/nonexistent", tick_s=0.01, node_heartbeat_s=0.01,
                        watchdog_s=0)

    def post_beats(carry):
        posts.append(time.monotonic())
        return True

    main = Pulse()
    beats = threading.Thread(target=_beat_loop, args=(stop, settings, lambda: None, post_beats),
                             kwargs={"main": main}, daemon=True)
    loop = threading.Thread(target=_loop, args=(agent, FakePoller(), stop, settings),
                            kwargs={"pulse": main}, daemon=True)
    loop.start()
    beats.start()
    try:
        wait_until(lambda: agent.n == 3, 10, what="the main loop's tick blocking")
        blocked = time.monotonic()
        wait_until(lambda: main.age_s() > 1.5, 10, what="the main loop stuck past the limit")
        while_held = [t for t in posts if blocked < t < blocked + 0.9]
        assert len(while_held) >= 5, "beats went on while the main loop was held up"
        stuck_since = time.monotonic()
        n = len(posts)
        wait_until(lambda: main.age_s() > 2.0, 10, what="the main loop stuck a while")
        assert all(t < stuck_since for t in posts[n:]), "no beats for a stuck main loop"
        agent.release.set()
        wait_until(lambda: len(posts) > n + 3, 10, what="beats once the main loop moves")
    finally:
        agent.release.set()
        stop.set()
        beats.join(10)
        loop.join(10)


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
