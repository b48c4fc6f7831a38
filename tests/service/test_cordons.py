"""Cordon, drain and uncordon on fakes (issue 28), and the auto-cordon of a
node where attempts keep failing."""
from __future__ import annotations

import pytest

from chalicelib.domain.errors import InvalidArgument, NotFound
from chalicelib.domain.nodes import NodeState
from chalicelib.domain.principal import Principal
from chalicelib.domain.states import JobState

from .helpers import AGENTS, placed, register, submit

OPS = Principal("operator", "ops-oncall")


def _started(svc, job, attempt=1):
    for n, ranks in (("n1", [0, 1]), ("n2", [2, 3])):
        job = svc.attempts.report(AGENTS, job.job_id, attempt, {"type": "STARTED",
                                                                "node_id": n, "ranks": ranks})
    return job


def test_a_cordoned_node_takes_no_placement_and_its_jobs_run_on(svc, world):
    register(svc, "n2", gpus=2)
    running = submit(svc, ranks=2)
    assert svc.placer.run().placed == [running.job_id]  # fills n2
    register(svc, "n1", gpus=2)
    blocker = submit(svc, ranks=2)
    assert svc.placer.run().placed == [blocker.job_id]  # fills n1
    node = svc.cordons.cordon(OPS, "n2", "bad ECC")
    assert node.state is NodeState.DRAINING
    assert (node.cordon["reason"], node.cordon["by"], node.cordon["drain"]) == (
        "bad ECC", "ops-oncall", "keep")
    assert svc.store.get(running.job_id).state is JobState.SCHEDULED, "its job runs on"
    assert [m["type"] for m in world.inbox.drain(world.inbox.ensure("n2"))] == ["LAUNCH"]
    svc.attempts.report(AGENTS, running.job_id, 1, {"type": "EXITED", "node_id": "n2",
                                                    "ranks": [0, 1], "exit_code": 0})
    assert world.nodes.get("n2").gpus_free == 2
    waiting = submit(svc, ranks=2)
    assert svc.placer.run().placed == [], "n2 is free but cordoned, n1 is full"
    svc.cordons.uncordon(OPS, "n2")
    assert world.nodes.get("n2").state is NodeState.READY
    assert svc.placer.run().placed == [waiting.job_id], "room appeared: it looks again"


def test_a_cordon_outlives_the_node_going_down_and_coming_back(svc, world, clock):
    register(svc, "n1", gpus=2)
    svc.cordons.cordon(OPS, "n1", "reboot for a driver")
    clock.advance(61)
    assert svc.reconciler.mark_silent_nodes_down() == ["n1"]
    register(svc, "n1", gpus=2)
    node = world.nodes.get("n1")
    assert node.state is NodeState.DRAINING and node.cordon["reason"] == "reboot for a driver"


def test_a_drain_preempts_the_running_jobs_which_requeue_without_counting(svc, world):
    job = _started(svc, placed(svc, world, ranks=4))  # on n1 and n2
    svc.cordons.drain(OPS, "n2", "bad ECC")
    job = svc.store.get(job.job_id)
    assert (job.state, job.uncounted_retries) == (JobState.PENDING, 1), "max_attempts 1"
    [attempt] = svc.jobs.attempts("acme", job.job_id)
    assert attempt["exit"] == {
        "reason": "preempted", "exit_code": None, "node_id": "n2",
        "detail": "node n2 drained: bad ECC",
        "decision": "preempted (node n2 drained: bad ECC): retried, not counted "
                    "(uncounted retry 1 of 10)"}
    for n in ("n1", "n2"):  # SIGTERM and the grace period, as any stop
        [stop] = world.inbox.drain(world.inbox.ensure(n))
        assert stop["type"] == "CANCEL"
    svc.cordons.drain(OPS, "n2", "bad ECC")  # again: nothing more is preempted
    assert svc.store.get(job.job_id).uncounted_retries == 1
    for n in ("n1", "n2"):
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": n})
    assert svc.placer.run().placed == [], "4 ranks no longer fit without n2"
    register(svc, "n3", gpus=2)
    assert svc.placer.run().placed == [job.job_id]
    [_, second] = svc.jobs.attempts("acme", job.job_id)
    assert {p["node_id"] for p in second["placement"]} == {"n1", "n3"}


def test_a_drain_that_waits_lets_the_jobs_finish(svc, world):
    job = _started(svc, placed(svc, world, ranks=4))
    node = svc.cordons.drain(OPS, "n2", "retire", wait=True)
    assert node.state is NodeState.DRAINING and node.cordon["drain"] == "wait"
    assert svc.store.get(job.job_id).state is JobState.RUNNING
    assert world.inbox.drain(world.inbox.ensure("n2")) == []
    for n, ranks in (("n1", [0, 1]), ("n2", [2, 3])):
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": n,
                                                    "ranks": ranks, "exit_code": 0})
    assert svc.store.get(job.job_id).state is JobState.SUCCEEDED
    assert world.nodes.get("n2").gpus_free == 2, "drained: nothing left on it"


def test_an_unknown_node_is_a_404(svc):
    for act in (lambda: svc.cordons.cordon(OPS, "nope", None),
                lambda: svc.cordons.drain(OPS, "nope", None),
                lambda: svc.cordons.uncordon(OPS, "nope"),
                lambda: svc.cordons.cordon(OPS, "../bad", None)):
        with pytest.raises(NotFound):
            act()


def _fail_on_n1(svc, world, clock, tenant: str = "acme"):
    job = submit(svc, tenant, ranks=1)
    assert svc.placer.run().placed == [job.job_id]
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                "ranks": [0], "exit_code": 1})
    world.inbox.drain(world.inbox.ensure("n1"))
    clock.advance(60)


def test_a_node_where_attempts_keep_failing_is_cordoned_with_the_reason(svc, world, clock):
    """Invariant (issue 41, item 7): jobs of two tenants must have failed
    there; one tenant's failing jobs, however many, cordon nothing."""
    register(svc, "n1", gpus=1)
    for _ in range(2):
        _fail_on_n1(svc, world, clock)
    assert world.nodes.get("n1").state is NodeState.READY, "2 of 3"
    for _ in range(3):
        _fail_on_n1(svc, world, clock)
    assert world.nodes.get("n1").state is NodeState.READY, "5 jobs, but of one tenant"
    _fail_on_n1(svc, world, clock, tenant="globex")
    node = world.nodes.get("n1")
    assert node.state is NodeState.DRAINING
    assert node.cordon["reason"] == "auto-cordoned: attempts of 6 jobs of 2 tenants ended " \
                                    "rank_failed here within 3600 s"
    assert node.cordon["auto"] and node.cordon["by"] == "gpujobs"
    retry = submit(svc, ranks=1)
    assert svc.placer.run().placed == [], "its next attempts go elsewhere"
    register(svc, "n2", gpus=1)
    assert svc.placer.run().placed == [retry.job_id]


def test_failures_spread_wider_than_the_window_cordon_nothing(svc, world, clock):
    register(svc, "n1", gpus=1)
    for _ in range(5):
        _fail_on_n1(svc, world, clock)
        clock.advance(1800)  # one failure every 31 min: at most 2 in an hour
    assert world.nodes.get("n1").state is NodeState.READY
    assert len(world.nodes.get("n1").failures) <= 2, "old failures are dropped"


def test_a_node_lost_is_no_failure_of_the_node_s_making(svc, world, clock):
    """Auto-cordon counts rank_failed only: a node that went DOWN is the reconciler's."""
    for _ in range(3):
        job = placed(svc, world, ranks=4)
        for n in ("n1", "n2"):
            svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": n,
                                                        "ranks": [0, 1] if n == "n1" else [2, 3],
                                                        "exit_code": 0})
    assert world.nodes.get("n1").failures == frozenset()


def test_one_crash_looping_job_does_not_cordon_its_node(svc, world, clock):
    """A crash loop is one job's bug, not the node's: different jobs must fail."""
    register(svc, "n1", gpus=1)
    job = submit(svc, ranks=1, max_attempts=5)
    for attempt in range(1, 6):
        assert svc.placer.run().placed == [job.job_id]
        svc.attempts.report(AGENTS, job.job_id, attempt, {"type": "EXITED", "node_id": "n1",
                                                          "ranks": [0], "exit_code": 1})
    assert svc.store.get(job.job_id).state is JobState.FAILED
    assert world.nodes.get("n1").state is NodeState.READY and len(
        world.nodes.get("n1").failures) == 5


def test_failing_jobs_cordon_at_most_a_tenth_of_the_fleet(world, clock):
    """A tenant submitting failing jobs everywhere takes out one node in ten,
    not the fleet; past that the failures are left for an operator."""
    svc = world.services(auto_cordon_failures=1, auto_cordon_tenants=1)
    for n in range(20):
        register(svc, f"n{n:02d}", gpus=1)
    for _ in range(20):
        job = submit(svc, ranks=1)
        [placed_id] = svc.placer.run().placed
        [attempt] = svc.jobs.attempts("acme", placed_id)
        [node_id] = {p["node_id"] for p in attempt["placement"]}
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": node_id,
                                                    "ranks": [0], "exit_code": 1})
    cordoned = [n for n in world.nodes.all() if n.cordon]
    assert len(cordoned) == 2, [n.node_id for n in cordoned]


def test_a_taken_rendezvous_port_is_retried_at_once_uncounted_on_a_new_port_and_cordons_nothing(
        svc, world):
    """Issue 41, item 3: ranks not started because MASTER_PORT was held (maybe
    by another tenant's process) end the attempt as ``port_in_use``: a cause
    outside the job, retried without counting against max_attempts, on a
    port drawn again, and never a failure of the node's for auto-cordon."""
    register(svc, "n1", gpus=1)
    seen_ports: set[int] = set()
    for _ in range(4):  # more than the auto-cordon count, all on n1
        job = submit(svc, ranks=1, max_attempts=1)
        assert svc.placer.run().placed == [job.job_id]
        [launch] = [m for m in world.inbox.drain(world.inbox.ensure("n1"))
                    if m["type"] == "LAUNCH"]
        job = svc.attempts.report(AGENTS, job.job_id, 1, {
            "type": "EXITED", "node_id": "n1", "ranks": [0], "exit_code": 98,
            "not_started": "port_in_use"})
        assert job.state is JobState.PENDING and job.attempt == 1, "retried, not failed"
        [ended] = [e for e in svc.store.events(job.job_id) if e["type"] == "rank_exited"]
        assert ended["reason"] == ("rank 0 not started on node n1: the attempt's rendezvous "
                                   "port (MASTER_PORT) was in use there")
        assert svc.placer.run().placed == [job.job_id], "placed again at once"
        [again] = [m for m in world.inbox.drain(world.inbox.ensure("n1"))
                   if m["type"] == "LAUNCH"]
        assert again["attempt"] == 2
        seen_ports.update((launch["master_port"], again["master_port"]))
        decision = svc.store.attempt(job.job_id, 1).exit["decision"]
        assert decision == ("port_in_use (rank 0): retried, not counted "
                            "(uncounted retry 1 of 10)"), decision
        svc.attempts.report(AGENTS, job.job_id, 2, {"type": "EXITED", "node_id": "n1",
                                                    "ranks": [0], "exit_code": 0})
        assert svc.store.get(job.job_id).state is JobState.SUCCEEDED
    node = world.nodes.get("n1")
    assert node.state is NodeState.READY and node.failures == frozenset()
    assert len(seen_ports) > 1, "each attempt draws its port: the taken one is not reused"


def test_not_started_goes_only_with_exited(svc, world):
    job = _started(svc, placed(svc, world, ranks=4))
    with pytest.raises(InvalidArgument) as e:
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n1",
                                                    "ranks": [0, 1],
                                                    "not_started": "port_in_use"})
    assert e.value.field == "not_started"
