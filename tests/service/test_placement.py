"""Gang placement on fakes: all ranks or none, fair between tenants, reasons noted."""
from __future__ import annotations

from chalicelib.domain.states import JobState

from .helpers import AGENTS, register, submit


def test_a_gang_is_placed_whole_most_free_nodes_first(svc, world):
    register(svc, "small", gpus=2)
    register(svc, "big", gpus=8)
    job = submit(svc, ranks=5, gpus_per_rank=2)
    assert svc.placer.run().placed == [job.job_id]
    attempt = world.store.attempt(job.job_id, 1)
    assert attempt.node_ranks == {"big": [0, 1, 2, 3], "small": [4]}
    launches = {n: world.inbox.drain(world.inbox.ensure(n)) for n in ("big", "small")}
    assert [m["ranks"] for m in launches["big"]] == [[0, 1, 2, 3]]
    assert [m["ranks"] for m in launches["small"]] == [[4]]
    assert {m["master_addr"] for ms in launches.values() for m in ms} == {"big"}


def test_a_gang_that_does_not_fit_now_reserves_nothing_and_says_why(svc, world):
    register(svc, "n1", gpus=4)
    register(svc, "n2", gpus=4)
    held = submit(svc, ranks=3)
    svc.placer.run()
    waiting = submit(svc, ranks=6)
    report = svc.placer.run()
    assert (report.placed, report.waiting) == ([], [waiting.job_id])
    assert sum(n.gpus_free for n in world.nodes.all()) == 5, "only the first job holds GPUs"
    assert world.store.get(waiting.job_id).pending_reason == \
        "waiting for 6 x 1 free a100 GPUs on READY nodes"
    assert world.store.get(held.job_id).state is JobState.SCHEDULED


def test_a_job_larger_than_the_fleet_is_noted_as_never_fitting(svc, world):
    register(svc, "n1", gpus=4)
    job = submit(svc, ranks=2, gpus_per_rank=8)
    assert world.store.get(job.job_id).pending_reason.startswith("can never fit")
    assert svc.placer.run().never == [], "noted by its create: no run reads it"


def test_placement_is_fair_between_tenants_not_first_come(svc, world):
    """A tenant with many queued jobs cannot keep another's one job waiting."""
    register(svc, "n1", gpus=4)
    heavy = [submit(svc, tenant="heavy", ranks=2) for _ in range(4)]
    light = submit(svc, tenant="light", ranks=2)
    assert sorted(svc.placer.run().placed) == sorted([heavy[0].job_id, light.job_id])


def test_priority_orders_a_tenants_own_jobs(svc):
    register(svc, "n1", gpus=2)
    low = submit(svc, ranks=2, priority=0)
    high = submit(svc, ranks=2, priority=10)
    assert svc.placer.run().placed == [high.job_id]
    assert svc.placer.run().placed == []
    assert low.job_id not in svc.placer.run().placed


def test_gpus_come_back_when_the_ranks_end_and_the_next_job_runs(svc, world):
    register(svc, "n1", gpus=2)
    first, second = submit(svc, ranks=2), submit(svc, ranks=2)
    assert svc.placer.run().placed == [first.job_id]
    for kind in ("STARTED", "EXITED"):
        svc.attempts.report(AGENTS, first.job_id, 1, {"type": kind, "node_id": "n1",
                                                      "ranks": [0, 1], "exit_code": 0})
    assert world.store.get(first.job_id).state is JobState.SUCCEEDED
    assert world.nodes.get("n1").gpus_free == 2 and world.nudge.calls >= 3
    assert svc.placer.run().placed == [second.job_id]
