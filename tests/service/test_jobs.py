"""Jobs use cases on fakes: idempotent create, reads, listing, cancel as an intent."""
from __future__ import annotations

import pytest

from chalicelib.domain.errors import (
    AlreadyFinished,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidPageToken,
    NotFound,
)
from chalicelib.domain.states import JobState

from .helpers import AGENTS, register, submit


def test_the_same_key_and_body_replay_the_first_job(svc, world):
    register(svc, "n1", gpus=8)  # a job that may fit asks for a placement run
    world.nudge.calls = 0
    body = {"command": ["python", "train.py"], "ranks": 2}
    first, replay = svc.jobs.submit("acme", body, "key-1")
    again, replayed = svc.jobs.submit("acme", body, "key-1")
    assert (replay, replayed, again["job_id"]) == (False, True, first["job_id"])
    assert world.nudge.calls == 1, "a replay asks for no placement"
    assert world.telemetry.counts == {"JobsCreated": 1, "IdempotentReplays": 1}


def test_a_key_reused_with_another_body_is_refused_naming_the_header(svc):
    svc.jobs.submit("acme", {"command": ["a"], "ranks": 1}, "key-1")
    with pytest.raises(IdempotencyKeyReused) as refused:
        svc.jobs.submit("acme", {"command": ["b"], "ranks": 1}, "key-1")
    assert refused.value.field == "Idempotency-Key"


def test_keys_are_per_tenant(svc):
    body = {"command": ["a"], "ranks": 1}
    mine, _ = svc.jobs.submit("acme", body, "key-1")
    theirs, replay = svc.jobs.submit("other", body, "key-1")
    assert theirs["job_id"] != mine["job_id"] and not replay


def test_another_tenants_job_reads_as_missing(svc):
    job = submit(svc)
    assert svc.jobs.get("acme", job.job_id).job_id == job.job_id
    for tenant, job_id in (("other", job.job_id), ("acme", "not-a-job-id")):
        with pytest.raises(NotFound):
            svc.jobs.get(tenant, job_id)


def test_listing_pages_through_every_job_once_newest_first(svc):
    ids = [submit(svc).job_id for _ in range(7)]
    submit(svc, tenant="other")
    seen, token = [], None
    while True:
        jobs, token = svc.jobs.list("acme", state=None, page_size=3, page_token=token)
        seen += [j["job_id"] for j in jobs]
        if token is None:
            break
    assert seen == sorted(ids, reverse=True)


def test_a_page_token_is_bound_to_its_tenant_and_filter(svc):
    for _ in range(3):
        submit(svc)
    _, token = svc.jobs.list("acme", state=None, page_size=1, page_token=None)
    with pytest.raises(InvalidPageToken):
        svc.jobs.list("other", state=None, page_size=1, page_token=token)
    with pytest.raises(InvalidPageToken):
        svc.jobs.list("acme", state="PENDING", page_size=1, page_token=token)


@pytest.mark.parametrize("args, field", [
    ({"state": "DONE", "page_size": 10}, "state"),
    ({"state": None, "page_size": 0}, "page_size"),
    ({"state": None, "page_size": 501}, "page_size"),
])
def test_bad_list_arguments_name_their_field(svc, args, field):
    with pytest.raises(InvalidArgument) as bad:
        svc.jobs.list("acme", page_token=None, **args)
    assert bad.value.field == field


def test_cancel_of_an_unplaced_job_is_final_at_once(svc, world):
    job = submit(svc)
    cancelled = svc.jobs.cancel("acme", job.job_id, "not needed")
    assert (cancelled.state, cancelled.cancel_reason) == (JobState.CANCELLED, "not needed")
    assert svc.jobs.cancel("acme", job.job_id, None).state is JobState.CANCELLED, "a repeat"
    assert world.inbox.sent == [], "no agent holds it: nothing to tell"


def test_cancel_of_a_placed_job_is_an_intent_sent_to_its_nodes(svc, world):
    """Invariant 2: recorded first, then sent; the agents confirm the stop."""
    register(svc, "n1")
    job = submit(svc)
    assert svc.placer.run().placed == [job.job_id]
    world.inbox.drain(world.inbox.ensure("n1"))  # the LAUNCH
    asked = svc.jobs.cancel("acme", job.job_id, "superseded")
    assert asked.state is JobState.SCHEDULED and asked.cancel_requested_at is not None
    assert svc.jobs.cancel("acme", job.job_id, None).cancel_reason == "superseded", \
        "a repeat records nothing new"
    [cancel] = world.inbox.drain(world.inbox.ensure("n1"))
    assert (cancel["type"], cancel["reason"]) == ("CANCEL", "superseded")
    [due] = world.store.due_intents(world.clock.advance(3600), 10)
    assert (due.intent.kind, due.unacked) == ("CANCEL", {"n1"}), "resent until acknowledged"
    job = svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert job.state is JobState.CANCELLED
    assert world.store.due_intents(world.clock.advance(3600), 10) == []
    assert world.nodes.get("n1").gpus_free == 8


def test_cancel_of_a_finished_job_is_already_finished(svc):
    register(svc, "n1")
    job = submit(svc, ranks=1)
    svc.placer.run()
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                "ranks": [0], "exit_code": 0})
    with pytest.raises(AlreadyFinished):
        svc.jobs.cancel("acme", job.job_id, None)
