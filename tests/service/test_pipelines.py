"""Pipelines and sweeps on fakes (issue 27): dependencies end or release
their dependents the moment they can, down the chain, and arrays make their
children as room opens, never more than max_parallel at once, each with
its own retries, counted against the tenant like that many jobs."""
from __future__ import annotations

import pytest

from chalicelib.domain.errors import InvalidArgument, QuotaExceeded
from chalicelib.domain.quotas import Limits, TenantLimits
from chalicelib.domain.states import JobState
from chalicelib.service.pipelines import RECHECK_S

from .helpers import AGENTS, register, submit


def _run(svc, job_id: str, exit_code: int = 0):
    """The placed job's one rank starts and exits with ``exit_code``."""
    job = svc.store.get(job_id)
    attempt = svc.store.attempt(job_id, job.attempt)
    [node] = attempt.node_ranks
    svc.attempts.report(AGENTS, job_id, job.attempt, {"type": "STARTED", "node_id": node,
                                                      "ranks": [0]})
    return svc.attempts.report(AGENTS, job_id, job.attempt, {
        "type": "EXITED", "node_id": node, "ranks": [0], "exit_code": exit_code})


def _one(svc, **body):
    return submit(svc, ranks=1, **body)


def _state(svc, job) -> JobState:
    return svc.store.get(job.job_id).state


@pytest.fixture
def nodes(svc):
    register(svc, "n1", gpus=8)
    return svc


def test_a_dependent_waits_out_of_the_queue_saying_for_what_then_runs(nodes):
    svc = nodes
    prepare = _one(svc)
    train = _one(svc, depends_on=[{"job_id": prepare.job_id}])
    assert train.waiting_for == [prepare.job_id]
    assert train.pending_reason == f"waiting for {prepare.job_id} to succeed"
    assert svc.placer.run().placed == [prepare.job_id]  # the dependent is not tried
    _run(svc, prepare.job_id)
    train = svc.store.get(train.job_id)
    assert (train.state, train.waiting_for, train.pending_reason) == (JobState.PENDING, None,
                                                                      None)
    assert svc.placer.run().placed == [train.job_id]


def test_a_failed_dependency_ends_its_dependents_down_the_chain_and_releases_the_rest(nodes):
    svc = nodes
    a = _one(svc)
    b = _one(svc, depends_on=[{"job_id": a.job_id}])
    c = _one(svc, depends_on=[{"job_id": b.job_id, "condition": "succeeded"}])
    on_failure = _one(svc, depends_on=[{"job_id": a.job_id, "condition": "failed"}])
    after_any = _one(svc, depends_on=[{"job_id": c.job_id, "condition": "ended"}])
    svc.placer.run()
    _run(svc, a.job_id, exit_code=3)
    b, c = svc.store.get(b.job_id), svc.store.get(c.job_id)
    assert (b.state, b.exit["reason"], b.exit["dependency"]) == (
        JobState.FAILED, "dependency_failed", a.job_id)
    assert b.exit["detail"] == f"{a.job_id} ended FAILED; this job needed it to succeed"
    assert (c.state, c.exit["dependency"]) == (JobState.FAILED, b.job_id)
    assert svc.store.get(on_failure.job_id).waiting_for is None  # released
    assert svc.store.get(after_any.job_id).waiting_for is None  # c ended: any end will do
    assert set(svc.placer.run().placed) == {on_failure.job_id, after_any.job_id}
    [finished] = [e for e in svc.store.events(c.job_id) if e["type"] == "finished"]
    assert finished["reason"] == "dependency_failed"


def test_a_cancel_the_placer_finishes_ends_the_dependents_at_once(nodes, world):
    """A retry that raced a cancel leaves the job PENDING with its cancel
    recorded; the placer's run that finishes the cancel ends the dependents
    in the same run, not at the reconciler's recheck."""
    svc = nodes
    a = _one(svc)
    b = _one(svc, depends_on=[{"job_id": a.job_id}])
    svc.placer.run()
    svc.jobs.cancel("acme", a.job_id, None)
    raced = world.store._job(a.job_id)  # the state such a retry's write leaves
    raced.state, raced.attempt = JobState.PENDING, raced.attempt + 1
    svc.placer.run()
    assert _state(svc, a) is JobState.CANCELLED
    b = svc.store.get(b.job_id)
    assert (b.state, b.exit["reason"], b.exit["dependency"]) == (
        JobState.FAILED, "dependency_failed", a.job_id)


def test_a_dependency_already_ended_is_judged_at_create(nodes):
    svc = nodes
    done = _one(svc)
    svc.placer.run()
    _run(svc, done.job_id, exit_code=1)
    ok_after_fail = _one(svc, depends_on=[{"job_id": done.job_id, "condition": "failed"}])
    assert ok_after_fail.waiting_for is None and ok_after_fail.pending_reason is None
    never = _one(svc, depends_on=[{"job_id": done.job_id}])
    assert (never.state, never.exit["reason"]) == (JobState.FAILED, "dependency_failed")


def test_a_dependency_that_ends_while_its_dependent_is_created_is_not_missed(nodes, world):
    """It ends after the dependent read it at submit, before the dependent is
    named on it: the dependent reads it again once named."""
    svc = nodes
    dep = _one(svc)
    svc.placer.run()
    create = world.store.create

    def end_first(job, *args, **kwargs):
        if job.job_id != dep.job_id:
            _run(svc, dep.job_id)  # ends now: its dependent does not exist yet
        return create(job, *args, **kwargs)

    world.store.create = end_first
    dependent = _one(svc, depends_on=[{"job_id": dep.job_id}])
    world.store.create = create
    assert (dependent.state, dependent.waiting_for) == (JobState.PENDING, None)
    assert svc.placer.run().placed == [dependent.job_id]


@pytest.mark.parametrize("who", ["missing", "foreign", "twice"])
def test_a_dependency_must_be_an_existing_job_of_the_tenant_named_once(nodes, who):
    svc = nodes
    other = _one(svc) if who != "foreign" else submit(svc, tenant="globex", ranks=1)
    named = {"missing": [{"job_id": "job_01J00000000000000000000000"}],
             "foreign": [{"job_id": other.job_id}],
             "twice": [{"job_id": other.job_id}, {"job_id": other.job_id}]}[who]
    before = len(svc.store.t.jobs)
    with pytest.raises(InvalidArgument) as e:
        _one(svc, depends_on=named)
    assert e.value.field == ("depends_on.1.job_id" if who == "twice" else "depends_on.0.job_id")
    assert len(svc.store.t.jobs) == before  # nothing written


def test_a_lost_follow_up_is_made_up_by_the_sweep(nodes, world, clock, monkeypatch):
    svc = nodes
    dep = _one(svc)
    dependent = _one(svc, depends_on=[{"job_id": dep.job_id}])
    svc.placer.run()
    def down(ids):
        raise ConnectionError("the store went away after the end was written")

    monkeypatch.setattr(svc.pipelines, "_follow", down)
    assert _run(svc, dep.job_id).state is JobState.SUCCEEDED  # the report is answered
    monkeypatch.undo()
    assert svc.store.get(dependent.job_id).waiting_for == [dep.job_id]
    clock.advance(RECHECK_S)
    register(svc, "n1", gpus=8)  # its agent called in meanwhile
    assert svc.reconciler.run()["pipelines"] == {"arrays": 0, "waiting": 1}
    assert svc.placer.run().placed == [dependent.job_id]


def _array(svc, size, body=None, **array):
    return _one(svc, name="sweep", array={"size": size, **array}, **(body or {}))


def _finish_placed(svc, world, exit_codes=None) -> list[str]:
    """Every placed child runs to its end; their ids."""
    placed = svc.placer.run().placed
    for job_id in placed:
        index = svc.store.get(job_id).array_index
        _run(svc, job_id, (exit_codes or {}).get(index, 0))
    return placed


def test_an_array_never_runs_more_than_max_parallel_and_succeeds_when_all_did(nodes, world):
    svc = nodes
    parent = _array(svc, 20, max_parallel=3, env={"LR": [str(i / 100) for i in range(20)]})
    assert parent.state is JobState.PENDING
    assert parent.array_counts["materialized"] == 3  # made by the create
    seen = []
    while svc.store.get(parent.job_id).state not in (JobState.SUCCEEDED, JobState.FAILED):
        placed = _finish_placed(svc, world)
        assert 0 < len(placed) <= 3
        seen += placed
    children = [svc.store.get(j) for j in seen]
    assert sorted(c.array_index for c in children) == list(range(20))
    for c in children:
        assert c.spec.env["GPUJOBS_ARRAY_INDEX"] == str(c.array_index)
        assert c.spec.env["LR"] == str(c.array_index / 100)
        assert c.name == f"sweep[{c.array_index}]" and c.spec.array is None
    parent = svc.store.get(parent.job_id)
    assert parent.state is JobState.SUCCEEDED
    assert parent.array_counts == {"materialized": 20, "placed": 0, "succeeded": 20,
                                   "failed": 0, "cancelled": 0}
    assert svc.store.t.tenants["acme"] == 0  # every index left the PENDING count


def test_each_index_retries_on_its_own_budget(nodes, world):
    svc = nodes
    parent = _array(svc, 2, {"max_attempts": 2})
    first = _finish_placed(svc, world, {0: 1})  # index 0 fails once
    assert len(first) == 2
    assert _finish_placed(svc, world) == [first[0]]  # its second attempt
    parent = svc.store.get(parent.job_id)
    assert (parent.state, parent.array_counts["succeeded"]) == (JobState.SUCCEEDED, 2)


def test_past_max_failed_indexes_the_array_fails_fast_and_cancels_the_rest(nodes, world):
    svc = nodes
    parent = _array(svc, 50, max_parallel=4, max_failed_indexes=1)
    placed = svc.placer.run().placed
    _run(svc, placed[0], 1)
    parent = svc.store.get(parent.job_id)
    assert parent.state is not JobState.FAILED  # one is allowed
    assert parent.array_counts["materialized"] == 5  # its slot went to index 4
    _run(svc, placed[1], 1)
    for job_id in placed[2:]:  # the open ones got a CANCEL; their agents confirm
        job = svc.store.get(job_id)
        assert job.cancel_requested_at is not None
        node = next(iter(svc.store.attempt(job_id, 1).node_ranks))
        svc.attempts.report(AGENTS, job_id, 1, {"type": "STOPPED", "node_id": node})
    parent = svc.store.get(parent.job_id)
    assert (parent.state, parent.exit["reason"]) == (JobState.FAILED, "max_failed_indexes")
    assert parent.exit["detail"] == ("2 indexes failed, more than max_failed_indexes 1; 0 of "
                                     "50 indexes succeeded, 2 failed, 48 cancelled (45 never "
                                     "started)")
    assert parent.array_counts["materialized"] == 5
    assert svc.store.t.tenants["acme"] == 0


def test_cancelling_an_array_cancels_every_child_as_intents(nodes, world):
    svc = nodes
    parent = _array(svc, 30, max_parallel=10)
    register(svc, "n1", gpus=4)  # room for 4 of the 10 made
    placed = svc.placer.run().placed
    assert len(placed) == 4
    parent = svc.jobs.cancel("acme", parent.job_id, "wrong data")
    assert parent.state is JobState.PENDING or parent.state is JobState.RUNNING
    assert parent.cancel_requested_at is not None
    sent = [m for m in world.inbox.sent if m["type"] == "CANCEL"]
    assert sorted(m["job_id"] for m in sent) == sorted(placed)
    for job_id in placed:
        svc.attempts.report(AGENTS, job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    parent = svc.store.get(parent.job_id)
    assert parent.state is JobState.CANCELLED
    assert parent.array_counts["cancelled"] == 30
    assert svc.placer.run().placed == []  # nothing more is made or placed
    assert svc.store.t.tenants["acme"] == 0


def test_an_array_counts_as_its_size_against_max_pending_jobs(world):
    svc = world.services(limits=TenantLimits(overrides={"acme": Limits(max_pending_jobs=5)}))
    with pytest.raises(QuotaExceeded) as e:
        _array(svc, 6)
    assert "an array of 6 indexes counts as 6 PENDING jobs" in str(e.value)
    _array(svc, 4)
    _one(svc)
    with pytest.raises(QuotaExceeded):
        _one(svc)  # 4 indexes + 1 job: the limit, though only one item is PENDING


def test_a_job_waits_on_a_whole_array_and_an_array_on_a_job(nodes, world):
    svc = nodes
    prepare = _one(svc)
    parent = _array(svc, 3)
    sweep = _one(svc, array={"size": 2}, depends_on=[{"job_id": prepare.job_id}])
    evaluate = _one(svc, depends_on=[{"job_id": parent.job_id}])
    assert svc.store.get(sweep.job_id).pending_reason == \
        f"waiting for {prepare.job_id} to succeed"
    placed = svc.placer.run().placed
    assert prepare.job_id in placed and len(placed) == 4  # prepare and parent's 3
    for job_id in placed:
        _run(svc, job_id)
    assert svc.store.get(parent.job_id).state is JobState.SUCCEEDED
    assert svc.store.get(evaluate.job_id).waiting_for is None
    assert len(svc.placer.run().placed) == 3  # evaluate, and the sweep's 2


def test_children_are_listed_in_index_order_with_the_jobs_cursors(nodes):
    svc = nodes
    parent = _array(svc, 7)
    svc.placer.run()
    ids, token = [], None
    while True:
        page, token = svc.jobs.list("acme", state=None, page_size=3, page_token=token,
                                    parent=parent.job_id)
        ids += [v["array_index"] for v in page]
        if token is None:
            break
    assert ids == list(range(7))
    with pytest.raises(Exception) as e:
        svc.jobs.list("globex", state=None, page_size=3, page_token=None, parent=parent.job_id)
    assert e.value.field == "parent"


@pytest.mark.slow
def test_a_1000_index_array_with_max_parallel_8_never_has_more_than_8_open(world):
    """However fast its indexes end, and with room for 64: never more than 8
    made and not ended, every index run once."""
    svc = world.services()
    register(svc, "n1", gpus=64)
    parent = _array(svc, 1000, max_parallel=8)
    runs: list[int] = []
    while svc.store.get(parent.job_id).state is not JobState.SUCCEEDED:
        opened = [j for j in svc.store.t.jobs.values()
                  if j.parent_id == parent.job_id and not j.state.terminal]
        assert len(opened) <= 8
        placed = svc.placer.run().placed
        assert 0 < len(placed) <= 8
        for job_id in placed:
            runs.append(svc.store.get(job_id).array_index)
            _run(svc, job_id)
    assert sorted(runs) == list(range(1000))  # each index once
    assert svc.store.get(parent.job_id).array_counts["succeeded"] == 1000


def test_an_array_cannot_bypass_the_tenant_s_gpu_limit(world):
    """Its children are placed one by one as ordinary jobs, under max_running_gpus."""
    svc = world.services(limits=TenantLimits(overrides={"acme": Limits(max_running_gpus=3)}))
    register(svc, "n1", gpus=8)
    parent = _array(svc, 10)
    assert len(svc.placer.run().placed) == 3
    assert svc.store.get(parent.job_id).array_counts["placed"] == 3
    assert svc.placer.run().placed == []  # at its limit, however many indexes wait


def test_a_create_whose_follow_up_fails_is_still_a_create_and_the_sweep_follows_up(nodes, world,
                                                                                   monkeypatch):
    svc = nodes

    def down(*args, **kwargs):
        raise ConnectionError("the store is unreachable")

    monkeypatch.setattr(world.store, "make_children", down)
    parent = _array(svc, 4)  # answered: the job is written
    assert parent.array_counts["materialized"] == 0
    monkeypatch.undo()
    assert svc.reconciler.run()["pipelines"]["arrays"] == 1
    assert svc.store.get(parent.job_id).array_counts["materialized"] == 4


def test_a_waiting_array_released_while_its_cancel_is_recorded_is_cancelled_whole(nodes,
                                                                                  world):
    """The unplaced cancel of an array holds only while it waits (no child
    made); released meanwhile, its cancel is the array's: every child too."""
    svc = nodes
    dep = _one(svc)
    svc.placer.run()
    parent = _one(svc, array={"size": 6, "max_parallel": 2},
                  depends_on=[{"job_id": dep.job_id}])
    real = world.store.cancel_unplaced

    def released_first(job, now, reason):
        if job.job_id == parent.job_id:
            _run(svc, dep.job_id)  # its dependency succeeds: two children are made
        return real(job, now, reason)

    world.store.cancel_unplaced = released_first
    try:
        shown = svc.jobs.cancel("acme", parent.job_id, "changed my mind")
    finally:
        world.store.cancel_unplaced = real
    children = [j for j in world.store.t.jobs.values() if j.parent_id == parent.job_id]
    assert len(children) == 2 and all(c.state is JobState.CANCELLED for c in children)
    assert shown.state is JobState.CANCELLED
    assert shown.array_counts["cancelled"] == 6
    assert world.store.t.tenants["acme"] == 0


def test_a_create_that_writes_nothing_names_nothing_on_its_dependencies(world):
    svc = world.services(limits=TenantLimits(overrides={"acme": Limits(max_pending_jobs=2)}))
    register(svc, "n1", gpus=8)
    dep = _one(svc)
    body = {"command": ["x"], "ranks": 1, "depends_on": [{"job_id": dep.job_id}]}
    first, replayed = svc.jobs.submit("acme", body, "key-1")
    again, replayed = svc.jobs.submit("acme", body, "key-1")
    assert replayed and again["job_id"] == first["job_id"]
    with pytest.raises(QuotaExceeded):
        svc.jobs.submit("acme", body, "key-2")
    assert svc.store.get(dep.job_id).dependents == {first["job_id"]}


def test_a_job_with_all_its_dependents_takes_no_more(nodes, monkeypatch):
    from chalicelib.domain import dependencies
    svc = nodes
    monkeypatch.setattr(dependencies, "MAX_DEPENDENTS", 2)
    dep = _one(svc)
    _one(svc, depends_on=[{"job_id": dep.job_id}])
    _one(svc, depends_on=[{"job_id": dep.job_id}])
    with pytest.raises(InvalidArgument) as e:
        _one(svc, depends_on=[{"job_id": dep.job_id}])
    assert e.value.field == "depends_on.0.job_id" and "already has 2 dependents" in str(e.value)


def test_cancelling_an_array_of_many_open_children_answers_at_once_and_the_sweep_ends_them(
        world):
    """Issue 41 (medium): a cancel of an array with 999 open children took one
    request over a minute, a 504 behind API Gateway's 29 s. The request
    cancels a bounded number itself and answers; the sweep cancels the rest,
    with the cancel's own reason, a bounded number a run, until the array
    ends CANCELLED."""
    from chalicelib.service.pipelines import CANCELS_INLINE, CANCELS_PER_SWEEP

    svc = world.services(limits=TenantLimits(overrides={"acme": Limits(max_pending_jobs=5000)}))
    size = CANCELS_INLINE + CANCELS_PER_SWEEP + 50
    parent = _array(svc, size, max_parallel=size)
    for _ in range(10):  # children are made a bounded number a sweep
        if len(svc.store.open_children(parent.job_id)) == size:
            break
        svc.reconciler.run()
    assert len(svc.store.open_children(parent.job_id)) == size, "every child made, open"
    parent = svc.jobs.cancel("acme", parent.job_id, "wrong data")
    assert parent.cancel_requested_at is not None and not parent.state.terminal
    assert len(svc.store.open_children(parent.job_id)) == size - CANCELS_INLINE
    svc.reconciler.run()
    left = svc.store.open_children(parent.job_id)
    assert len(left) == 50, "a sweep's bounded share"
    svc.reconciler.run()
    parent = svc.store.get(parent.job_id)
    assert parent.state is JobState.CANCELLED
    assert parent.array_counts["cancelled"] == size
    assert svc.store.get(left[0].job_id).cancel_reason == "wrong data", \
        "the sweep gives the children the cancel's own reason"
