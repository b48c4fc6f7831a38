"""What follows a job's end, off the request that ended it (issue 41: an end
that released 999 dependents inside the agent's report took the server 10 s,
the report timed out, and another tenant's job on that node was recorded
stalled). With a follow-up queue the report does the same work whatever the
job's dependents and hands the job to the queue; its consumer (app.py
``follow_up``) then releases them, down the chain."""
from __future__ import annotations

import pytest

from chalicelib.domain.states import JobState
from tests.fakes import FakeFollowUps, World

from .helpers import AGENTS, register, submit


def requests_made(store) -> list[str]:
    """Every call of a public method of ``store`` from now on, by name."""
    made: list[str] = []
    for name in dir(store):
        method = getattr(store, name)
        if name.startswith("_") or not callable(method):
            continue

        def counted(*args, __name=name, __method=method, **kwargs):
            made.append(__name)
            return __method(*args, **kwargs)

        setattr(store, name, counted)
    return made


def finish(svc, job_id: str) -> None:
    """The placed one-rank job starts and succeeds (its agent's reports)."""
    job = svc.store.get(job_id)
    [node] = svc.store.attempt(job_id, job.attempt).node_ranks
    svc.attempts.report(AGENTS, job_id, job.attempt,
                        {"type": "STARTED", "node_id": node, "ranks": [0]})
    svc.attempts.report(AGENTS, job_id, job.attempt,
                        {"type": "EXITED", "node_id": node, "ranks": [0], "exit_code": 0})


@pytest.fixture
def queue():
    return FakeFollowUps()


@pytest.fixture
def svc(world: World, queue):
    s = world.services(follow_up_queue=queue)
    register(s, "n1", gpus=8)
    return s


def test_an_end_costs_the_same_whatever_its_dependents_then_the_queue_releases_them(
        svc, world, queue):
    """Invariant: the report that ends a job with 300 dependents makes the
    same store requests as the end of a job with none (plus nothing); the job
    goes to the follow-up queue, and its consumer releases every dependent."""
    lone, prepare = submit(svc, ranks=1), submit(svc, ranks=1)
    dependents = [submit(svc, ranks=1, depends_on=[{"job_id": prepare.job_id}]).job_id
                  for _ in range(300)]
    assert set(svc.placer.run().placed) == {lone.job_id, prepare.job_id}
    made = requests_made(world.store)
    finish(svc, lone.job_id)
    alone = list(made)
    made.clear()
    finish(svc, prepare.job_id)
    assert made == alone, "the end did work for its dependents"
    assert queue.sent == [prepare.job_id]
    assert {svc.store.get(j).waiting_for[0] for j in dependents} == {prepare.job_id}

    assert queue.deliver(svc.pipelines.follow_up) == 1
    released = [svc.store.get(j) for j in dependents]
    assert {(j.state, tuple(j.waiting_for or ())) for j in released} == {(JobState.PENDING, ())}


def test_a_follow_up_goes_down_the_chain_and_takes_only_follow_ups(svc, queue):
    """Invariant: the consumer follows an ended job's dependents down the
    chain (a failed dependency ends its dependents, and theirs); a message
    that is no follow-up is refused (it is received again, then
    dead-lettered), one naming no job does nothing."""
    first = submit(svc, ranks=1)
    second = submit(svc, ranks=1, depends_on=[{"job_id": first.job_id}])
    third = submit(svc, ranks=1, depends_on=[{"job_id": second.job_id}])
    svc.placer.run()
    job = svc.store.get(first.job_id)
    [node] = svc.store.attempt(first.job_id, job.attempt).node_ranks
    svc.attempts.report(AGENTS, first.job_id, job.attempt,
                        {"type": "STARTED", "node_id": node, "ranks": [0]})
    svc.attempts.report(AGENTS, first.job_id, job.attempt, {
        "type": "EXITED", "node_id": node, "ranks": [0], "exit_code": 3})
    assert svc.store.get(first.job_id).state is JobState.FAILED
    assert svc.store.get(third.job_id).state is JobState.PENDING
    queue.deliver(svc.pipelines.follow_up)
    assert [svc.store.get(j.job_id).state for j in (second, third)] == [JobState.FAILED] * 2

    for bad in ("", "[]", '{"job": "x"}', '{"job_id": 7}'):
        with pytest.raises(ValueError):
            svc.pipelines.follow_up(bad)
    svc.pipelines.follow_up('{"job_id": "job_none"}')
