"""Where a waiting job stands, on fakes: each placement run records the jobs
it leaves waiting in the order it tries them (class, fair share, priority),
and reading a PENDING job by id shows its place from that record alone."""
from __future__ import annotations

from chalicelib.domain.states import JobState

from .helpers import register, submit


def standing(svc, job, tenant: str = "acme") -> dict | None:
    return svc.jobs.look(tenant, job.job_id).get("queue")


def test_a_waiting_job_reads_its_place_the_jobs_ahead_and_when_it_may_start(svc, world, clock):
    """8 GPUs held by a job with a 10 min limit; two 8-GPU jobs wait behind
    it: the first would start when the limit frees the GPUs, the second
    after it (unknown: nothing else ends), and each says so."""
    register(svc, "n1", gpus=8)
    holder = submit(svc, ranks=8, max_runtime_s=600)
    svc.placer.run()
    first = submit(svc, ranks=8)
    second = submit(svc, ranks=8)
    clock.advance(60)
    svc.placer.run()
    one, two = standing(svc, first), standing(svc, second)
    assert (one["position"], one["of"], two["position"]) == (1, 2, 2)
    assert two["ahead"] == [{"job_id": first.job_id, "gpus": 8}]
    assert one["waiting_for"][0]["job_id"] == holder.job_id
    assert one["basis"] == f"about 9 min, when {holder.job_id} reaches its 10 min limit"
    assert two["estimated_start"] is None and two["basis"].startswith("unknown")


def test_the_line_is_the_placers_order_fair_between_tenants(svc, world):
    """Heavy queued four jobs before light's one; fair share puts light's
    second in line, as the placer will try it, not fifth by age."""
    register(svc, "n1", gpus=2)
    blocker = submit(svc, tenant="blocker", ranks=2)
    svc.placer.run()
    heavy = [submit(svc, tenant="heavy", ranks=2) for _ in range(4)]
    light = submit(svc, tenant="light", ranks=2)
    svc.placer.run()
    assert world.store.get(blocker.job_id).state is JobState.SCHEDULED
    assert standing(svc, light, "light")["position"] == 2
    assert standing(svc, heavy[0], "heavy")["position"] == 1
    assert standing(svc, heavy[1], "heavy")["position"] == 3
    # another tenant's jobs ahead are GPUs and no id
    assert standing(svc, light, "light")["ahead"] == [{"job_id": None, "gpus": 2}]


def test_only_a_pending_job_read_by_id_has_a_place(svc, world):
    """A placed job and a list page show none; a job the placer has not
    ordered yet shows none until its run."""
    register(svc, "n1", gpus=2)
    placed = submit(svc, ranks=2)
    svc.placer.run()
    waiting = submit(svc, ranks=2)
    assert standing(svc, waiting) is None, "not ordered by a run yet"
    svc.placer.run()
    assert standing(svc, waiting)["position"] == 1
    assert "queue" not in svc.jobs.look("acme", placed.job_id)
    page = svc.jobs.list("acme", state=None, page_size=10, page_token=None)
    assert all("queue" not in view for view in page[0])


def test_a_run_that_changes_nothing_writes_no_line_and_reads_no_placed_jobs(svc, world, clock):
    """The capacity summary's promise holds for the line too: while nothing
    is placed or released, a run re-reads none of the GPUs held (until
    LINE_REFRESH_S has passed) and writes nothing."""
    from chalicelib.service.placement import LINE_REFRESH_S

    register(svc, "n1", gpus=2)
    submit(svc, ranks=2)
    submit(svc, ranks=2)
    writes, reads = [], []
    original, active = world.nodes.set_line, world.store.active
    world.nodes.set_line = lambda line: (writes.append(line), original(line))
    world.store.active = lambda state, limit: (reads.append(state), active(state, limit))[1]
    svc.placer.run()
    assert len(writes) == 1 and reads, "the first run reads who holds GPUs and writes"
    reads.clear()
    svc.placer.run()
    svc.placer.run()
    assert (len(writes), reads) == (1, []), "unchanged: nothing read again, nothing written"
    clock.advance(LINE_REFRESH_S)
    svc.placer.run()
    assert reads and len(writes) == 1, "read again after the refresh, the same line unwritten"
