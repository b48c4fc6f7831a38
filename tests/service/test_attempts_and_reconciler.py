"""Attempt reports and the reconciler on fakes: retries, stops, lost nodes, resends."""
from __future__ import annotations

import pytest

from chalicelib.domain.errors import Forbidden, StaleAttempt
from chalicelib.domain.principal import Principal
from chalicelib.domain.states import JobState

from .helpers import AGENTS, placed, register, submit


def test_a_failed_rank_with_attempts_left_stops_the_rest_and_requeues(svc, world):
    job = placed(svc, world, max_attempts=2)
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": "n1",
                                                "ranks": [0, 1]})
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                      "ranks": [0], "exit_code": 3})
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    [stop] = world.inbox.drain(world.inbox.ensure("n2"))
    assert stop["type"] == "CANCEL" and stop["attempt"] == 1
    assert world.inbox.drain(world.inbox.ensure("n1")) != [], "rank 1 still runs on n1"
    assert world.nodes.get("n1").gpus_free == 0, "held until its ranks are confirmed gone"
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n2"})
    assert job.state is JobState.PENDING, "a stop of the ended attempt moves nothing"
    assert world.nodes.get("n2").gpus_free == 2
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert svc.placer.run().placed == [job.job_id]
    with pytest.raises(StaleAttempt):
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": "n1",
                                                    "ranks": [0]})


def test_an_agent_token_reports_only_for_its_own_node(svc, world):
    job = placed(svc, world)
    with pytest.raises(Forbidden):
        svc.attempts.report(Principal("agent", "n1"), job.job_id, 1,
                            {"type": "STARTED", "node_id": "n2", "ranks": [2]})
    with pytest.raises(Forbidden):
        svc.attempts.report(Principal("agent", "n1"), job.job_id, 1,
                            {"type": "STARTED", "ranks": [2]})


def test_an_unacknowledged_launch_is_resent_only_to_the_silent_node(svc, world, clock):
    job = placed(svc, world)
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": "n1",
                                                "ranks": [0, 1]})
    assert svc.reconciler.resend_due_intents() == 0, "not due yet"
    clock.advance(31)
    assert svc.reconciler.resend_due_intents() == 1
    assert world.inbox.drain(world.inbox.ensure("n1")) == []
    [launch] = world.inbox.drain(world.inbox.ensure("n2"))
    assert (launch["type"], launch["ranks"]) == ("LAUNCH", [2, 3])
    assert svc.reconciler.resend_due_intents() == 0, "rescheduled, not resent at once"


def test_a_send_that_failed_is_resent_by_the_reconciler(svc, world, clock):
    register(svc, "n1", gpus=2)
    world.inbox.failing.add(world.inbox.ensure("n1"))
    job = submit(svc, ranks=2)
    assert svc.placer.run().placed == [job.job_id], "the intent is durable before the send"
    assert world.inbox.drain(world.inbox.ensure("n1")) == []
    world.inbox.failing.clear()
    clock.advance(31)
    assert svc.reconciler.resend_due_intents() == 1
    assert [m["type"] for m in world.inbox.drain(world.inbox.ensure("n1"))] == ["LAUNCH"]


def test_a_silent_node_goes_down_and_its_attempt_fails_with_it(svc, world, clock):
    job = placed(svc, world, retry={"rules": [{"reasons": ["node_lost"], "action": "retry"}]})
    clock.advance(61)
    register(svc, "n1", gpus=2)  # n1 still calls in; n2 went silent
    assert svc.reconciler.mark_silent_nodes_down() == ["n2"]
    job = world.store.get(job.job_id)
    assert (job.state, job.exit["reason"]) == (JobState.FAILED, "node_lost")
    assert [m["reason"] for m in world.inbox.drain(world.inbox.ensure("n2"))] == ["node_lost"]
    assert world.nodes.get("n2").gpus_free == 0, "held until its agent confirms"
    svc.nodes.register(AGENTS, "n2", {"gpus": 2, "gpu_type": "a100", "running": []})
    assert world.nodes.get("n2").gpus_free == 2
