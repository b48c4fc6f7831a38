"""The runner's registration: retried with backoff while adopted ranks stay watched."""
from __future__ import annotations

import random
import threading

import pytest

from agent.api import ApiError
from agent.ranks import ProcTable
from agent.runner import StateDirBusy, StateDirLock, _register, kill_recorded_ranks
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import launch, message, run_until


class TickCounter:
    def __init__(self) -> None:
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1


def scripted(agent: TickCounter, *outcomes):
    """A register function answering ``outcomes`` in turn; ``calls`` holds the
    agent's tick count at each call."""
    calls: list[int] = []

    def register():
        calls.append(agent.ticks)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return register, calls


def test_registration_is_retried_while_the_agent_keeps_ticking():
    agent = TickCounter()
    register, calls = scripted(agent, ApiError("503", status=503, retryable=True),
                               ApiError("no answer", retryable=True),
                               {"inbox_queue_url": "http://q"})
    node = _register(register, agent, threading.Event(), 0.001, random.Random(0),
                     base=0.02, cap=0.05)
    assert node == {"inbox_queue_url": "http://q"}
    assert len(calls) == 3
    assert calls[1] > calls[0] and calls[2] > calls[1]  # ticked between the tries


def test_retry_after_is_honoured_between_registration_tries():
    agent = TickCounter()
    register, calls = scripted(
        agent, ApiError("429", status=429, retryable=True, retry_after=0.3), {"node_id": "n"})
    _register(register, agent, threading.Event(), 0.01, random.Random(0), base=0.001,
              cap=0.001)
    assert agent.ticks >= 20  # about 0.3 s of 0.01 s ticks before the second try


def test_a_registration_refused_outright_is_not_retried():
    agent = TickCounter()
    register, calls = scripted(agent, ApiError("401", status=401, code="unauthenticated"))
    with pytest.raises(ApiError):
        _register(register, agent, threading.Event(), 0.001, random.Random(0))
    assert len(calls) == 1


def test_stopping_while_the_api_is_away_returns_none():
    stop = threading.Event()
    agent = TickCounter()

    def register():
        stop.set()
        raise ApiError("down", retryable=True)
    assert _register(register, agent, stop, 0.001, random.Random(0)) is None


def test_one_agent_per_state_directory(tmp_path):
    with StateDirLock(tmp_path):
        with pytest.raises(StateDirBusy):
            with StateDirLock(tmp_path):
                pass
    with StateDirLock(tmp_path):  # released with the first
        pass


def test_a_throwaway_stack_can_kill_every_rank_an_agent_left(world):
    agent = world.agent()
    agent.handle(message(launch(ranks=[0, 1], command=["sh", "-c", "sleep 30 & sleep 30; wait"]),
                         1))
    agent.handle(message(launch("job_b", command=["true"]), 2))
    run_until(agent, lambda: world.state()["attempts"]["job_b/1"]["phase"] == "DONE",
              what="job_b done")
    pids = wait_until(lambda: all(len(r.members(ProcTable.read())) == 4
                                  for r in world.launchers[0].launched[:2]) and
                      [p for r in world.launchers[0].launched[:2]
                       for p in r.members(ProcTable.read())], what="groups up")
    agent.close()
    assert kill_recorded_ranks(world.paths.state_dir) == 2  # job_b's rank had ended
    wait_until(lambda: not any(alive(p) for p in pids), what="every process gone")
