"""The Pipelines port's contract (dependencies and arrays), held by
tests/fakes.FakeJobStore and adapters/pipeline_store.DynamoPipelines alike:
a child is made once, an array's counters move with its children's
transitions, and a waiting job changes only as it was read."""
from __future__ import annotations

from dataclasses import replace

import pytest

from chalicelib.adapters.dynamo import ConditionFailed
from chalicelib.domain import arrays
from chalicelib.domain.clock import utcnow
from chalicelib.domain.ids import child_job_id
from chalicelib.domain.jobs import Job
from chalicelib.domain.states import JobState
from chalicelib.service.ports import StateChanged
from chalicelib.service.views import view_of


def _parent(ports, size=5, **array) -> Job:
    job = ports.job(ranks=1, array={"size": size, **array})
    job = replace(job, array_counts={k: 0 for k in arrays.COUNTERS})
    ports.store.create(job, None)
    return job


def _children(parent: Job, indexes) -> list[Job]:
    now = utcnow()
    return [Job(job_id=child_job_id(parent.job_id, i), tenant=parent.tenant,
                state=JobState.PENDING, spec=parent.spec.child(i), created_at=now,
                updated_at=now, name=f"contract[{i}]", health=parent.health,
                parent_id=parent.job_id, array_index=i) for i in indexes]


def _pending(ports, tenant) -> int:
    """The tenant's PENDING count, as placing under a limit reads it."""
    store = ports.store
    if ports.kind == "fake":
        return store.t.tenants.get(tenant, 0)
    from chalicelib.adapters.models import TenantModel
    try:  # read by the test itself, not through the adapter's private parts
        return int(TenantModel.get(tenant, consistent_read=True).pending or 0)
    except TenantModel.DoesNotExist:
        return 0


# -- dependencies --------------------------------------------------------------
def test_dependents_are_recorded_on_the_job_and_read_with_it(ports):
    dep = ports.created()
    ports.store.add_dependent(dep.job_id, "job_01J0000000000000000000000A")
    ports.store.add_dependent(dep.job_id, "job_01J0000000000000000000000A")  # a retry
    ports.store.add_dependent(dep.job_id, "job_01J0000000000000000000000B")
    assert ports.store.get(dep.job_id).dependents == {"job_01J0000000000000000000000A",
                                                       "job_01J0000000000000000000000B"}
    assert ports.store.states([dep.job_id], count_dependents=True)[dep.job_id][2] == 2
    with pytest.raises(ConditionFailed):
        ports.store.add_dependent(dep.job_id[:-4] + "ZZZZ", "job_01J0000000000000000000000C")


def test_states_name_each_existing_job_s_tenant_and_state(ports):
    a, b = ports.created(), ports.created(tenant=ports.tenant(1))
    missing = a.job_id[:-4] + "ZZZZ"
    assert ports.store.states([a.job_id, b.job_id, missing, a.job_id]) == {
        a.job_id: (a.tenant, JobState.PENDING, 0), b.job_id: (b.tenant, JobState.PENDING, 0)}


def test_a_waiting_job_is_out_of_the_queue_and_changes_only_as_read(whole):
    ports = whole
    dep = ports.created()
    job = ports.job(depends_on=[{"job_id": dep.job_id, "condition": "succeeded"}])
    job = replace(job, waiting_for=[dep.job_id], pending_reason="waiting")
    ports.store.create(job, None)
    assert [j.job_id for j in ports.store.pending(10)] == [dep.job_id]
    assert [j.job_id for j in ports.store.waiting(10)] == [job.job_id]
    stale = replace(job, waiting_for=[dep.job_id, "job_01J0000000000000000000000A"])
    assert not ports.store.wait_for(stale, [], None, utcnow())
    assert ports.store.wait_for(job, [], None, utcnow())
    released = ports.store.get(job.job_id)
    assert (released.waiting_for, released.pending_reason) == (None, None)
    assert released.pending_since is not None
    assert {j.job_id for j in ports.store.pending(10)} == {dep.job_id, job.job_id}
    assert ports.store.waiting(10) == []
    assert not ports.store.wait_for(job, [], None, utcnow())  # read before: changed since


def test_a_dependency_failed_job_ends_out_of_the_count(ports):
    job = ports.created()
    before = _pending(ports, job.tenant)
    exit_ = {"reason": "dependency_failed", "exit_code": None, "dependency": "job_x",
             "detail": "job_x ended FAILED; this job needed it to succeed"}
    ended = ports.store.fail_dependency(job, utcnow(), exit_)
    got = ports.store.get(job.job_id)
    assert (ended.state, got.state, got.exit) == (JobState.FAILED, JobState.FAILED, exit_)
    assert _pending(ports, job.tenant) == before - 1


def test_an_open_array_is_not_ended_as_an_unplaced_job(ports):
    """Its unplaced cancel holds only while it waits: made children stay counted."""
    parent = _parent(ports, size=3)  # not waiting: open
    with pytest.raises(StateChanged):
        ports.store.cancel_unplaced(parent, utcnow(), None)
    assert ports.store.get(parent.job_id).state is JobState.PENDING


# -- arrays ------------------------------------------------------------------
def test_an_array_counts_as_its_size_and_its_children_are_made_once(whole):
    ports = whole
    parent = _parent(ports, size=5)
    assert _pending(ports, parent.tenant) == 5
    assert [j.job_id for j in ports.store.arrays(10)] == [parent.job_id]
    assert list(ports.store.pending(10)) == []  # the parent is never placed
    assert ports.store.make_children(parent, _children(parent, range(3)), utcnow())
    assert not ports.store.make_children(parent, _children(parent, range(3)), utcnow())
    parent = ports.store.get(parent.job_id)
    assert parent.array_counts["materialized"] == 3
    assert _pending(ports, parent.tenant) == 5  # a made child counts for itself
    queued = [j.array_index for j in ports.store.pending(10)]
    assert sorted(queued) == [0, 1, 2]
    view = ports.store.view(parent.job_id)
    assert view == view_of(ports.store.get(parent.job_id))


def test_children_are_listed_in_index_order_and_filtered_by_state(ports):
    parent = _parent(ports, size=5)
    ports.store.make_children(parent, _children(parent, range(5)), utcnow())
    page, after = ports.store.children(parent.job_id, None, 2, None)
    assert [v["array_index"] for v in page] == [0, 1]
    page, after = ports.store.children(parent.job_id, None, 2, after)
    assert [v["array_index"] for v in page] == [2, 3]
    page, after = ports.store.children(parent.job_id, None, 2, after)
    assert ([v["array_index"] for v in page], after) == ([4], None)
    first = ports.store.get(child_job_id(parent.job_id, 1))
    ports.store.cancel_unplaced(first, utcnow(), None)
    assert [v["array_index"] for v in ports.store.children(
        parent.job_id, "CANCELLED", 10, None)[0]] == [1]
    assert [j.array_index for j in ports.store.open_children(parent.job_id)] == [0, 2, 3, 4]
    assert [j.array_index for j in ports.store.open_children(parent.job_id, 2)] == [0, 2], \
        "the first open ones, in index order"


def test_an_array_s_counters_move_with_its_children(ports):
    ports.node(0)
    parent = _parent(ports, size=3)
    ports.store.make_children(parent, _children(parent, range(3)), utcnow())
    a, b, c = (ports.store.get(child_job_id(parent.job_id, i)) for i in range(3))
    a, _ = ports.place(a, {ports.node_id(0): [0]})
    assert ports.store.get(parent.job_id).array_counts["placed"] == 1
    attempt = ports.store.attempt(a.job_id, 1)
    ports.store.end_attempt(a, attempt, JobState.SUCCEEDED,
                            {"reason": "succeeded", "exit_code": 0}, utcnow())
    ports.store.cancel_unplaced(b, utcnow(), None)
    counts = ports.store.get(parent.job_id).array_counts
    assert counts == {"materialized": 3, "placed": 0, "succeeded": 1, "failed": 0,
                      "cancelled": 1}
    assert ports.store.mark_array_running(parent.job_id, parent.tenant, utcnow())
    assert not ports.store.mark_array_running(parent.job_id, parent.tenant, utcnow())
    assert ports.store.get(parent.job_id).state is JobState.RUNNING
    del c


def test_an_array_ends_once_and_its_indexes_never_made_leave_the_count(ports):
    parent = _parent(ports, size=10)
    ports.store.make_children(parent, _children(parent, range(2)), utcnow())
    stale = parent  # read before the children were made
    parent = ports.store.get(parent.job_id)
    for child in ports.store.open_children(parent.job_id):
        ports.store.cancel_unplaced(child, utcnow(), None)
    assert ports.store.request_array_cancel(parent, utcnow(), "stop")
    assert not ports.store.request_array_cancel(parent, utcnow(), "stop")
    parent = ports.store.get(parent.job_id)
    exit_ = {"reason": "cancelled", "exit_code": None, "detail": "..."}
    assert not ports.store.finish_array(stale, JobState.CANCELLED, exit_, utcnow())
    assert not ports.store.make_children(parent, _children(parent, range(2, 4)), utcnow())
    assert ports.store.finish_array(parent, JobState.CANCELLED, exit_, utcnow())
    assert not ports.store.finish_array(parent, JobState.CANCELLED, exit_, utcnow())
    done = ports.store.get(parent.job_id)
    assert (done.state, done.exit, done.array_counts["cancelled"]) == (
        JobState.CANCELLED, exit_, 10)
    assert _pending(ports, parent.tenant) == 0
    assert ports.store.arrays(10) == [] or parent.job_id not in {
        j.job_id for j in ports.store.arrays(10)}


def test_an_unplaced_end_holds_only_for_the_dependents_read(ports):
    """So what follows the end is told from the job as read, no read after it."""
    job = ports.created()
    ports.store.add_dependent(job.job_id, "job_01J0000000000000000000000A")  # after the read
    with pytest.raises(StateChanged):
        ports.store.cancel_unplaced(job, utcnow(), None)
    fresh = ports.store.get(job.job_id)
    done = ports.store.cancel_unplaced(fresh, utcnow(), None)
    assert done.state is JobState.CANCELLED
    assert done.dependents == {"job_01J0000000000000000000000A"}
