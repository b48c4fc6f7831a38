"""The training lifecycle on fakes (issue 26): retries decided by cause, the
attempt's time limit on both sides, the wait's limit, and what each end says."""
from __future__ import annotations

import pytest

from chalicelib.domain import deadlines
from chalicelib.domain.states import JobState

from .helpers import AGENTS, placed, register, submit


def _started(svc, job, attempt=1):
    for n, ranks in (("n1", [0, 1]), ("n2", [2, 3])):
        job = svc.attempts.report(AGENTS, job.job_id, attempt, {"type": "STARTED",
                                                                "node_id": n, "ranks": ranks})
    return job


def _stopped(svc, job, attempt=1):
    for n in ("n1", "n2"):
        svc.attempts.report(AGENTS, job.job_id, attempt, {"type": "STOPPED", "node_id": n})


def _events(svc, job, kind):
    return [e for e in svc.store.events(job.job_id) if e["type"] == kind]


def test_a_lost_node_is_retried_without_using_up_max_attempts(svc, world, clock):
    job = _started(svc, placed(svc, world))  # max_attempts 1
    clock.advance(61)
    register(svc, "n1", gpus=2)  # n2 went silent
    assert svc.reconciler.mark_silent_nodes_down() == ["n2"]
    job = svc.store.get(job.job_id)
    assert (job.state, job.attempt, job.uncounted_retries) == (JobState.PENDING, 1, 1)
    assert job.pending_since == clock()
    [retried] = _events(svc, job, "retried")
    assert retried["decision"] == "node_lost (rank 2): retried, not counted (uncounted retry " \
                                  "1 of 10)"
    assert retried["node_id"] == "n2"
    [attempt] = svc.jobs.attempts("acme", job.job_id)
    assert attempt["exit"]["decision"] == retried["decision"]


def test_an_exit_code_ruled_fail_fails_at_once_whatever_attempts_remain(svc, world):
    job = _started(svc, placed(svc, world, max_attempts=3, retry={"rules": [
        {"exit_codes": [42], "action": "fail"}]}))
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n2",
                                                      "ranks": [3], "exit_code": 42})
    assert (job.state, job.attempt) == (JobState.FAILED, 1)
    assert job.exit == {"reason": "rank_failed", "exit_code": 42, "rank": 3, "node_id": "n2",
                        "decision": "rank_failed (rank 3, exit code 42): not retried "
                                    "(rule 1 says fail)"}
    [finished] = _events(svc, job, "finished")
    assert (finished["decision"], finished["node_id"]) == (job.exit["decision"], "n2")


def test_a_crash_looping_job_stops_at_its_cap(svc, world):
    job = placed(svc, world, max_attempts=3)
    for attempt in (1, 2, 3):
        job = _started(svc, job, attempt)
        job = svc.attempts.report(AGENTS, job.job_id, attempt, {
            "type": "EXITED", "node_id": "n1", "ranks": [0], "exit_code": 1})
        _stopped(svc, job, attempt)
        if attempt < 3:
            assert job.state is JobState.PENDING
            assert svc.placer.run().placed == [job.job_id]
            job = svc.store.get(job.job_id)
    assert (job.state, job.attempt) == (JobState.FAILED, 3)
    assert [e["decision"] for e in _events(svc, job, "retried")] == [
        "rank_failed (rank 0, exit code 1): retried (counted attempt 1 of 3)",
        "rank_failed (rank 0, exit code 1): retried (counted attempt 2 of 3)"]
    assert job.exit["decision"] == ("rank_failed (rank 0, exit code 1): not retried "
                                    "(counted attempt 3 of 3, none left)")


def test_an_agent_s_timed_out_report_ends_the_attempt_and_stops_every_node(svc, world):
    job = _started(svc, placed(svc, world, max_attempts=2, max_runtime_s=60))
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "TIMED_OUT", "node_id": "n1",
                                                      "ranks": [0, 1]})
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    [attempt] = svc.jobs.attempts("acme", job.job_id)
    assert attempt["exit"] == {"reason": "timeout", "exit_code": None,
                               "decision": "timeout: retried (counted attempt 1 of 2)"}
    for n in ("n1", "n2"):
        [stop] = world.inbox.drain(world.inbox.ensure(n))
        assert (stop["type"], stop["reason"]) == ("CANCEL", "the attempt timed out")
    assert world.nodes.get("n1").gpus_free == 0, "held until the agent confirms its stop"
    _stopped(svc, job)
    assert world.nodes.get("n1").gpus_free == 2
    again = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "TIMED_OUT", "node_id": "n2"})
    assert again.state is JobState.PENDING, "a repeated report ends nothing twice"
    assert len(_events(svc, job, "retried")) == 1


def test_the_scan_ends_an_attempt_its_agents_did_not_time_out(svc, world, clock):
    """The agent's enforcement failed (cut off, or an agent that does not
    enforce limits): the stall scan ends the attempt BACKSTOP_S past it."""
    job = _started(svc, placed(svc, world, max_runtime_s=600,
                                heartbeat={"mode": "off"}))
    clock.advance(600 + deadlines.BACKSTOP_S - 1)
    svc.scanner.run()
    assert svc.store.get(job.job_id).state is JobState.RUNNING, "the agents' turn still"
    clock.advance(2)
    svc.scanner.run()
    job = svc.store.get(job.job_id)
    assert job.state is JobState.FAILED and job.exit["reason"] == "timeout"
    assert job.exit["decision"] == "timeout: not retried (counted attempt 1 of 1, none left)"
    assert [m["reason"] for m in world.inbox.drain(world.inbox.ensure("n1"))] == [
        "the attempt timed out"]


def test_a_job_waiting_past_max_pending_s_ends_with_its_reason_and_is_never_placed_late(
        svc, world, clock):
    register(svc, "n1", gpus=4)
    blocker = submit(svc, ranks=4)
    assert svc.placer.run().placed == [blocker.job_id]
    job = submit(svc, ranks=4, max_pending_s=60)
    svc.placer.run()
    waiting = svc.store.get(job.job_id).pending_reason
    assert waiting == "waiting for 4 x 1 free a100 GPUs on READY nodes"
    clock.advance(60)
    svc.placer.run()
    assert svc.store.get(job.job_id).state is JobState.PENDING, "60 s is not past 60 s"
    clock.advance(1)
    # room at last, but too late: the placer ran late
    svc.attempts.report(AGENTS, blocker.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                    "ranks": [0, 1, 2, 3], "exit_code": 0})
    assert world.nodes.get("n1").gpus_free == 4
    report = svc.placer.run()
    assert report.placed == [] and report.expired == [job.job_id]
    job = svc.store.get(job.job_id)
    assert (job.state, job.pending_reason) == (JobState.FAILED, waiting)
    assert job.exit == {"reason": "pending_timeout", "exit_code": None,
                        "decision": f"waited longer than max_pending_s (60 s): {waiting}"}
    [finished] = _events(svc, job, "finished")
    assert finished["reason"] == "pending_timeout" and finished["decision"] == job.exit[
        "decision"]
    assert world.store.t.tenants["acme"] == 0, "out of the tenant's PENDING count"


def test_a_job_that_can_never_fit_is_not_parked_when_its_wait_is_timed(svc, world, clock):
    register(svc, "n1", gpus=2)
    job = submit(svc, ranks=64, max_pending_s=30)
    svc.placer.run()
    assert svc.store.get(job.job_id).pending_reason.startswith("can never fit")
    clock.advance(31)
    svc.placer.run()
    assert svc.store.get(job.job_id).exit["reason"] == "pending_timeout"


def test_a_retried_job_s_wait_counts_from_its_retry(svc, world, clock):
    job = _started(svc, placed(svc, world, max_attempts=2, max_pending_s=100))
    clock.advance(500)  # ran long: its first wait is long over
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                      "ranks": [0], "exit_code": 1})
    assert job.state is JobState.PENDING and job.pending_since == clock()
    clock.advance(50)
    svc.placer.run()  # the ranks still being stopped hold the GPUs: it waits
    assert svc.store.get(job.job_id).state is JobState.PENDING
    _stopped(svc, job)
    assert svc.placer.run().placed == [job.job_id]
    assert svc.store.get(job.job_id).pending_since is None


def test_a_retry_waits_until_its_last_attempt_s_ranks_are_gone_even_with_room_elsewhere(
        svc, world):
    """Two attempts of a job never overlap: a rank still stopping may be
    saving the checkpoint the next attempt resumes from."""
    job = _started(svc, placed(svc, world, max_attempts=2))
    register(svc, "n3", gpus=2)
    register(svc, "n4", gpus=2)  # room for the whole job elsewhere
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                      "ranks": [0], "exit_code": 1})
    assert svc.placer.run().placed == []
    assert svc.store.get(job.job_id).pending_reason == (
        "waiting for attempt 1's ranks to stop on n1, n2")
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n2"})
    assert svc.placer.run().placed == []
    assert svc.store.get(job.job_id).pending_reason == (
        "waiting for attempt 1's ranks to stop on n1")
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert svc.placer.run().placed == [job.job_id]


def test_a_retry_does_not_wait_for_ranks_lost_with_their_node(svc, world, clock):
    job = _started(svc, placed(svc, world))
    register(svc, "n3", gpus=2)
    clock.advance(61)
    register(svc, "n1", gpus=2)
    register(svc, "n3", gpus=2)
    assert svc.reconciler.mark_silent_nodes_down() == ["n2"]  # never answers again
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert svc.placer.run().placed == [job.job_id], "n2's lost ranks are not waited for"


def test_a_timed_out_report_for_a_job_without_a_limit_is_refused_and_ends_nothing(svc, world):
    from chalicelib.domain.errors import InvalidArgument
    job = _started(svc, placed(svc, world))
    with pytest.raises(InvalidArgument) as caught:
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "TIMED_OUT", "node_id": "n1"})
    assert caught.value.field == "type"
    assert svc.store.get(job.job_id).state is JobState.RUNNING
    assert world.inbox.drain(world.inbox.ensure("n2")) == [], "no CANCEL"
