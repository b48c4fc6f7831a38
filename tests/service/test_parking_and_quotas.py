"""Issue 9's service logic on fakes: never-fitting jobs are parked until the fleet
changes (a run reads the jobs that could fit), made parked by their create
(issue 24: a flood of them costs its sender one write a job, no placement
run and no nudge), and a tenant over its max_pending_jobs is refused with
429, never silently queued."""
from __future__ import annotations

import pytest

from chalicelib.api.problems import answer
from chalicelib.domain.errors import QuotaExceeded
from chalicelib.domain.fleet import SETTLE_S
from chalicelib.domain.quotas import Limits, TenantLimits
from chalicelib.domain.states import JobState

from .helpers import register, submit


def _ids(jobs) -> list[str]:
    return [j.job_id for j in jobs]


def test_a_never_fitting_job_is_parked_and_not_read_again_until_the_fleet_changes(
        svc, world):
    register(svc, "n1", gpus=8)
    nudges = world.nudge.calls
    wide = submit(svc, ranks=2, gpus_per_rank=8)      # 16 GPUs: the fleet has 8
    wider = submit(svc, ranks=3, gpus_per_rank=8)     # 24
    assert world.nudge.calls == nudges, "parked by its create: no placement run asked for"
    assert _ids(world.store.pending(100)) == [], "out of the queue a run reads"
    assert sorted(_ids(world.store.parked("a100"))) == sorted([wide.job_id, wider.job_id])
    assert world.store.get(wide.job_id).pending_reason == \
        "can never fit: needs 16 a100 GPUs; the fleet has 8"
    assert [e["reason"] for e in world.store.events(wide.job_id) if e["type"] == "waiting"] \
        == ["can never fit: needs 16 a100 GPUs; the fleet has 8"], "its story says why"
    assert svc.placer.run().never == [], "parked: not judged again while nothing changed"

    register(svc, "n2", gpus=8)                        # now 16
    assert svc.placer.run().placed == [wide.job_id], "swept back and placed in one run"
    assert _ids(world.store.parked("a100")) == [wider.job_id]
    assert world.store.get(wider.job_id).pending_reason == \
        "can never fit: needs 24 a100 GPUs; the fleet has 16", "its reason follows the fleet"


def test_a_change_of_another_type_leaves_a_parked_job_parked(svc, world):
    register(svc, "n1", gpus=8)
    job = submit(svc, ranks=1, gpu_type="h100")
    assert _ids(world.store.parked("h100")) == [job.job_id]
    register(svc, "n2", gpus=8)                        # more a100s
    svc.placer.run()
    assert _ids(world.store.parked("h100")) == [job.job_id]
    register(svc, "h1", gpus=8, gpu_type="h100")
    assert svc.placer.run().placed == [job.job_id]


def test_a_sweep_counts_only_once_the_change_settled(svc, world, clock):
    """A job parked just before a change may show up late in the index the sweep
    reads: the sweep is repeated until the change is SETTLE_S old."""
    register(svc, "n1", gpus=8)
    svc.placer.run()
    assert world.nodes.fleet_of(None).unswept and world.nodes.fleet_of("a100").unswept
    clock.advance(SETTLE_S)
    svc.placer.run()
    assert not world.nodes.fleet_of(None).unswept
    assert not world.nodes.fleet_of("a100").unswept


def test_a_parked_job_can_be_cancelled(svc, world):
    register(svc, "n1", gpus=4)
    job = submit(svc, ranks=4, gpus_per_rank=4)
    assert _ids(world.store.parked("a100")) == [job.job_id]
    assert svc.jobs.cancel("acme", job.job_id, "no room").state is JobState.CANCELLED
    assert _ids(world.store.parked("a100")) == []


@pytest.fixture
def limited(world):
    return world.services(limits=TenantLimits(overrides={"acme": Limits(max_pending_jobs=2)}))


def test_over_max_pending_jobs_a_create_is_refused_and_writes_nothing(limited, world):
    first, _ = submit(limited), submit(limited)
    with pytest.raises(QuotaExceeded) as refused:
        submit(limited, key="k-3")
    status, headers, _ = answer(refused.value)
    assert status == 429 and "max_pending_jobs" in refused.value.detail
    assert headers["Retry-After"] == "60"
    assert len(world.store.page("acme", None, 10, None)[0]) == 2
    assert world.telemetry.counts["QuotaExceeded"] == 1
    submit(limited, tenant="other")                    # the default limits: its own count
    limited.jobs.cancel("acme", first.job_id, None)
    again = submit(limited, key="k-3")                 # the refusal did not take the key
    assert world.store.get(again.job_id).state is JobState.PENDING


def test_placed_jobs_make_room_under_the_pending_limit(limited):
    register(limited, "n1", gpus=8)
    submit(limited), submit(limited)
    assert len(limited.placer.run().placed) == 2
    submit(limited), submit(limited)
    with pytest.raises(QuotaExceeded):
        submit(limited)


def test_a_create_judged_against_a_fleet_that_moved_on_is_judged_again(svc, world):
    """The create is conditioned on the fleet's generation it read: a node
    registered between the read and the write makes it read again, so a job
    is never parked against a fleet no sweep will look at again."""
    register(svc, "n1", gpus=8)
    read = svc.jobs._fleets._read
    calls = []

    def fleet_of(gpu_type):
        fleet = read(gpu_type)
        if not calls:
            register(svc, "n2", gpus=8)                # after the read: 16 GPUs now
        calls.append(fleet.generation)
        return fleet
    svc.jobs._fleets._read = fleet_of
    job = submit(svc, ranks=2, gpus_per_rank=8)        # 16: fits the fleet as it is now
    assert len(calls) == 2 and calls[0] != calls[1], "read again after the write lost"
    assert _ids(world.store.pending(100)) == [job.job_id] and not job.pending_reason
    assert svc.placer.run().placed == [job.job_id]


def test_jobs_whose_wait_is_timed_or_that_wait_on_others_are_left_to_the_placer(svc, world):
    register(svc, "n1", gpus=8)
    timed = submit(svc, ranks=4, gpus_per_rank=8, max_pending_s=600)
    first = submit(svc, ranks=1)
    after = submit(svc, ranks=4, gpus_per_rank=8, depends_on=[{"job_id": first.job_id}])
    assert _ids(world.store.parked("a100")) == []
    assert timed.pending_reason is None, "its wait is timed: the placer notes it each run"
    assert svc.placer.run().never == [timed.job_id]
    assert world.store.get(after.job_id).waiting_for == [first.job_id]
