"""The job store's contract (ports.Jobs, Attempts, Outbox, Transitions),
held by tests/fakes.FakeJobStore and adapters/store.DynamoStore alike."""
from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from pynamodb.exceptions import TransactWriteError

from chalicelib.adapters.dynamo import ConditionFailed
from chalicelib.domain import idempotency
from chalicelib.domain.attempts import LOST
from chalicelib.domain.clock import iso, utcnow
from chalicelib.domain.errors import RecordTooLarge
from chalicelib.domain.intents import cancel_intent
from chalicelib.domain.states import JobState
from chalicelib.fastjson import RawJSON
from chalicelib.service.ports import CapacityChanged, IdemClaim, IdempotencyConflict, StateChanged
from chalicelib.service.views import view_of


# -- create and read ---------------------------------------------------------
def test_a_created_job_reads_back_as_written(ports):
    job = ports.created()
    got = ports.store.get(job.job_id)
    assert (got.tenant, got.state, got.spec, got.name, got.attempt) == (
        job.tenant, JobState.PENDING, job.spec, "contract", 0)
    assert got.created_at == job.created_at and got.health == job.health
    assert ports.store.get(job.job_id[:-4] + "ZZZZ") is None


def test_another_job_created_under_a_taken_id_is_refused_and_changes_nothing(ports):
    """Both raise PynamoDB's TransactWriteError (the cancelled transaction), not a
    fake's own exception."""
    job = ports.created()
    other = replace(ports.job(tenant=ports.tenant(1)), job_id=job.job_id)
    with pytest.raises(TransactWriteError):
        ports.store.create(other, None)
    assert ports.store.get(job.job_id).tenant == job.tenant
    assert ports.store.page(other.tenant, None, 10, None)[0] == []


def test_a_create_retried_after_a_lost_answer_changes_nothing(ports):
    job = ports.job()
    ports.store.create(job, None)
    ports.store.create(job, None)
    assert [j["job_id"] for j in ports.store.page(job.tenant, None, 10, None)[0]] == [job.job_id]


def test_an_idempotency_key_makes_one_job_and_names_its_holder(ports):
    """Invariant 1: the same key never makes a second job."""
    first, second = ports.job(), ports.job()
    claim = IdemClaim(idempotency.record_id(first.tenant, ports.tag), "hash-1")
    ports.store.create(first, claim)
    ports.store.create(first, claim)  # the same create, retried: no conflict
    with pytest.raises(IdempotencyConflict) as taken:
        ports.store.create(second, IdemClaim(claim.idem_id, "hash-2"))
    held = taken.value.record
    assert (held.job_id, held.body_hash, held.expires_at) == (first.job_id, "hash-1", None)
    assert ports.store.get(second.job_id) is None
    assert ports.store.get(first.job_id).idem_id == claim.idem_id


def test_a_key_expires_when_its_job_finishes_and_may_then_be_reclaimed(ports):
    first, second, third = ports.job(), ports.job(), ports.job()
    claim = IdemClaim(idempotency.record_id(first.tenant, ports.tag), "hash")
    ports.store.create(first, claim)
    now = utcnow()
    ports.store.cancel_unplaced(ports.store.get(first.job_id), now, None)
    with pytest.raises(IdempotencyConflict) as taken:
        ports.store.create(second, claim)
    held = taken.value.record
    assert held.expires_at == idempotency.expires_at(now)
    stale = replace(held, expires_at=held.expires_at - timedelta(seconds=1))
    with pytest.raises(IdempotencyConflict):
        ports.store.create(third, claim, reclaim=stale)  # not as it was read
    ports.store.create(second, claim, reclaim=held)
    assert ports.store.get(second.job_id).idem_id == claim.idem_id


def test_pages_are_newest_first_without_skips_or_repeats(ports):
    """Invariant 3, at the store: a page resumes right after its last job."""
    tenant = ports.tenant()
    ids = [ports.created(tenant=tenant).job_id for _ in range(5)]
    ports.created(tenant=ports.tenant(1))  # another tenant's job is never listed
    seen, after = [], None
    while True:
        jobs, after = ports.store.page(tenant, None, 2, after)
        assert len(jobs) <= 2
        seen += [j["job_id"] for j in jobs]
        if after is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert ports.store.page(tenant, None, 5, None)[1] is None, "nothing follows a full last page"


def test_a_state_filter_lists_only_that_state(ports):
    tenant = ports.tenant()
    kept, cancelled = ports.created(tenant=tenant), ports.created(tenant=tenant)
    ports.store.cancel_unplaced(cancelled, utcnow(), "no longer needed")
    assert [j["job_id"] for j in ports.store.page(tenant, "CANCELLED", 10, None)[0]] == [
        cancelled.job_id]
    assert [j["job_id"] for j in ports.store.page(tenant, "PENDING", 10, None)[0]] == [
        kept.job_id]


def test_views_show_the_jobs_as_they_read(ports):
    """get and list serve views (JobView) read straight from the store: the
    same as the Job read, through view_of, for a new and a finished job."""
    tenant = ports.tenant()
    kept, cancelled = ports.created(tenant=tenant), ports.created(tenant=tenant)
    ports.store.cancel_unplaced(cancelled, utcnow(), "no longer needed")
    for job in (kept, cancelled):
        assert ports.store.view(job.job_id) == view_of(ports.store.get(job.job_id))
    assert ports.store.view(kept.job_id[:-4] + "ZZZZ") is None
    newest = max(kept.job_id, cancelled.job_id)
    page, after = ports.store.page(tenant, None, 1, None)
    assert (page, after) == ([view_of(ports.store.get(newest))], newest)
    assert ports.store.page(tenant, "CANCELLED", 10, None)[0] == [
        view_of(ports.store.get(cancelled.job_id))]


def test_a_views_stored_json_is_one_type_and_is_not_read_as_a_dict(ports):
    """The JSON values of a view (spec, health, exit) are the stored text,
    of one type (fastjson.RawJSON) whichever store made the view: a service
    reading ``view["spec"]["ranks"]`` fails on the fake as on DynamoDB, and
    decoding it (``.value()``) gives the spec."""
    tenant = ports.tenant()
    kept, cancelled = ports.created(tenant=tenant), ports.created(tenant=tenant)
    ports.store.cancel_unplaced(cancelled, utcnow(), None)
    views = [ports.store.view(kept.job_id), *ports.store.page(tenant, None, 10, None)[0]]
    for view in views:
        assert {type(view[k]) for k in ("spec", "health")} == {RawJSON}
        with pytest.raises(TypeError):
            view["spec"]["ranks"]
        assert view["spec"].value()["ranks"] == kept.spec.ranks
    assert type(ports.store.view(cancelled.job_id)["exit"]) is RawJSON
    assert ports.store.view(kept.job_id)["exit"] is None


# -- transitions ---------------------------------------------------------------
def test_cancel_of_an_unplaced_job_finishes_it_once(ports):
    job = ports.created()
    now = utcnow()
    done = ports.store.cancel_unplaced(job, now, "oops")
    assert (done.state, done.cancel_requested_at, done.finished_at) == (
        JobState.CANCELLED, now, now)
    got = ports.store.get(job.job_id)
    assert (got.state, got.cancel_reason, got.exit) == (
        JobState.CANCELLED, "oops", {"reason": "cancelled", "exit_code": None})
    assert ports.store.cancel_unplaced(job, now, "oops").state is JobState.CANCELLED, \
        "the same cancel retried answers as the first"
    with pytest.raises(StateChanged):
        ports.store.cancel_unplaced(job, now + timedelta(seconds=1), "again")


def test_placing_reserves_every_node_and_writes_the_attempt(ports):
    a, b = ports.node(0, gpus=4), ports.node(1, gpus=4)
    job = ports.created(ranks=3, gpus_per_rank=2)
    placed, intent = ports.place(job, {a.node_id: [0, 1], b.node_id: [2]})
    assert (placed.state, placed.attempt, placed.inboxes) == (
        JobState.SCHEDULED, 1, intent.targets)
    got = ports.store.get(job.job_id)
    assert (got.state, got.attempt, got.pending_reason) == (JobState.SCHEDULED, 1, None)
    attempt = ports.store.attempt(job.job_id, 1)
    assert attempt.node_ranks == {a.node_id: [0, 1], b.node_id: [2]}
    assert attempt.node_gpus == {a.node_id: 4, b.node_id: 2}
    assert [p["node_id"] for p in attempt.placement] == [a.node_id, a.node_id, b.node_id]
    assert attempt.node_types == {a.node_id: a.gpu_type, b.node_id: b.gpu_type}
    assert ports.nodes.get(a.node_id).gpus_free == 0
    assert ports.nodes.get(b.node_id).gpus_free == 2
    assert ports.nodes.attempts_on(b.node_id) == [(job.job_id, 1)]
    assert ports.store.attempt(job.job_id, 2) is None


def test_a_job_placed_meanwhile_is_not_placed_again(ports):
    ports.node(0)
    job = ports.created()
    now = utcnow()
    ports.place(job, {ports.node_id(0): [0, 1]}, now=now)
    assert ports.place(job, {ports.node_id(0): [0, 1]}, now=now)[0].state \
        is JobState.SCHEDULED, "our own placement, retried"
    with pytest.raises(StateChanged):  # another placer, with the PENDING job read before
        ports.place(job, {ports.node_id(0): [0, 1]}, now=now + timedelta(seconds=1))
    assert ports.nodes.get(ports.node_id(0)).gpus_free == 6, "reserved once"


def test_a_reservation_without_room_names_the_full_nodes_and_writes_nothing(ports):
    roomy, small = ports.node(0, gpus=8), ports.node(1, gpus=2)
    job = ports.created(ranks=4, gpus_per_rank=1)
    with pytest.raises(CapacityChanged) as full:
        ports.place(job, {roomy.node_id: [0], small.node_id: [1, 2, 3]})
    assert full.value.node_ids == [small.node_id]
    assert ports.store.get(job.job_id).state is JobState.PENDING
    assert ports.nodes.get(roomy.node_id).gpus_free == 8
    assert ports.store.attempt(job.job_id, 1) is None


def test_start_moves_a_scheduled_job_to_running_once(ports):
    ports.node(0)
    job, _ = ports.place(ports.created(), {ports.node_id(0): [0, 1]})
    now = utcnow()
    running = ports.store.start(job, now)
    assert (running.state, running.started_at) == (JobState.RUNNING, now)
    assert ports.store.start(job, now).state is JobState.RUNNING, "our own start, retried"
    with pytest.raises(StateChanged):
        ports.store.start(job, now + timedelta(seconds=1))


def test_ending_an_attempt_finishes_the_job_and_the_attempt(ports):
    job, attempt = ports.running()
    now = utcnow()
    exit_ = {"reason": "succeeded", "exit_code": 0}
    ended = ports.store.end_attempt(job, attempt, JobState.SUCCEEDED, exit_, now)
    assert (ended.state, ended.exit, ended.finished_at) == (JobState.SUCCEEDED, exit_, now)
    assert ended.health["frozen_at"] is not None
    stored = ports.store.attempt(job.job_id, 1)
    assert (stored.state, stored.finished_at, stored.exit) == ("SUCCEEDED", now, exit_)
    assert ports.store.end_attempt(job, attempt, JobState.SUCCEEDED, exit_, now).state \
        is JobState.SUCCEEDED, "our own end, retried"
    with pytest.raises(StateChanged):
        ports.store.end_attempt(job, attempt, JobState.FAILED, {"reason": "x"},
                                now + timedelta(seconds=1))


def test_a_retry_returns_the_job_to_the_queue_with_its_attempt_failed(ports):
    job, attempt = ports.running(max_attempts=2)
    ended = ports.store.end_attempt(job, attempt, JobState.PENDING,
                                    {"reason": "rank_failed", "exit_code": 1, "rank": 0},
                                    utcnow())
    assert (ended.state, ended.attempt, ended.inboxes, ended.finished_at) == (
        JobState.PENDING, 1, {}, None)
    assert ports.store.attempt(job.job_id, 1).state == "FAILED"


def test_a_retry_counts_from_now_and_an_uncounted_one_is_counted_as_such(ports):
    """A retry's wait starts at its end (max_pending_s counts from it), and
    a retry the rules do not count adds one to uncounted_retries; placing
    the job ends the wait."""
    job, attempt = ports.running(max_attempts=2)
    now = utcnow()
    ended = ports.store.end_attempt(job, attempt, JobState.PENDING,
                                    {"reason": "node_lost", "exit_code": None, "rank": 0},
                                    now, uncounted=True)
    read = ports.store.get(job.job_id)
    assert (read.pending_since, read.uncounted_retries) == (now, 1) == (
        ended.pending_since, ended.uncounted_retries)
    assert ports.store.view(job.job_id) == view_of(read)
    ports.node(1)
    placed, _ = ports.place(read, {ports.node_id(1): [0, 1]})
    assert ports.store.get(job.job_id).pending_since is None
    assert ports.store.get(job.job_id).uncounted_retries == 1


def test_a_job_past_its_wait_ends_failed_keeping_its_pending_reason(ports):
    job = ports.created(max_pending_s=60)
    assert ports.store.get(job.job_id).pending_since == job.created_at
    ports.store.set_pending_reason(job, "waiting for 2 x 1 free GPUs")
    job = ports.store.get(job.job_id)
    now = utcnow()
    exit_ = {"reason": "pending_timeout", "exit_code": None, "decision": "waited too long"}
    ended = ports.store.expire_pending(job, now, exit_)
    read = ports.store.get(job.job_id)
    assert (read.state, read.exit, read.finished_at, read.pending_reason) == (
        JobState.FAILED, exit_, now, "waiting for 2 x 1 free GPUs")
    assert ended.state is JobState.FAILED
    assert job.job_id not in [j.job_id for j in ports.store.pending(1000)]
    assert ports.store.expire_pending(job, now, exit_).state is JobState.FAILED, \
        "our own end, retried"
    with pytest.raises(StateChanged):
        ports.store.expire_pending(job, now + timedelta(seconds=1), exit_)
    [finished] = [e for e in ports.store.events(job.job_id) if e["type"] == "finished"]
    assert (finished["reason"], finished["decision"]) == ("pending_timeout", "waited too long")


def test_a_placed_job_does_not_expire_as_pending(ports):
    ports.node(0)
    job, _ = ports.place(ports.created(max_pending_s=60), {ports.node_id(0): [0, 1]})
    with pytest.raises(StateChanged):
        ports.store.expire_pending(replace(job, state=JobState.PENDING), utcnow(),
                                   {"reason": "pending_timeout", "exit_code": None})


def test_a_recorded_cancel_wins_over_a_retry(ports):
    job, attempt = ports.running(max_attempts=2)
    now = utcnow()
    job = ports.store.request_cancel(job, now, None, cancel_intent(job, None),
                                     now + timedelta(seconds=30))
    with pytest.raises(StateChanged):
        ports.store.end_attempt(job, attempt, JobState.PENDING, {"reason": "rank_failed"},
                                utcnow())
    assert ports.store.end_attempt(job, attempt, JobState.CANCELLED,
                                   {"reason": "cancelled"}, utcnow()).state \
        is JobState.CANCELLED


def test_a_cancel_request_is_recorded_once_with_its_reason(ports):
    job, _ = ports.running()
    now = utcnow()
    asked = ports.store.request_cancel(job, now, "superseded", cancel_intent(job, "superseded"),
                                       now + timedelta(seconds=30))
    assert (asked.state, asked.cancel_requested_at, asked.cancel_reason) == (
        JobState.RUNNING, now, "superseded")
    assert ports.store.get(job.job_id).cancel_requested_at == now
    with pytest.raises(StateChanged):
        ports.store.request_cancel(job, now + timedelta(seconds=1), None,
                                   cancel_intent(job, None), now)


def test_a_pending_reason_is_noted_only_on_the_pending_job_read(ports):
    job = ports.created()
    ports.store.set_pending_reason(job, "waiting for 2 x 1 free GPUs", "3@x")
    got = ports.store.get(job.job_id)
    assert (got.pending_reason, got.waiting_on) == ("waiting for 2 x 1 free GPUs", "3@x")
    ports.store.set_pending_reason(job, None)
    got = ports.store.get(job.job_id)
    assert (got.pending_reason, got.waiting_on) == (None, None)
    ports.store.cancel_unplaced(got, utcnow(), None)
    ports.store.set_pending_reason(job, "too late")  # no longer PENDING: nothing
    assert ports.store.get(job.job_id).pending_reason is None


# -- attempts -------------------------------------------------------------------
def test_rank_reports_only_add_and_repeats_change_nothing(ports):
    job, _ = ports.running(ranks=3)
    node = ports.node_id(0)
    ports.store.record_ranks(job.job_id, 1, "started", [0, 1], node_id=node)
    ports.store.record_ranks(job.job_id, 1, "started", [1, 2], node_id=node)
    ports.store.record_ranks(job.job_id, 1, "exited", [2], 3, node)
    again = ports.store.record_ranks(job.job_id, 1, "exited", [2], 3, node)
    assert (again.started, again.exited, again.exit_codes) == ({0, 1, 2}, {2}, {2: 3})
    assert ports.store.record_ranks(job.job_id, 1, "stopped", []).stopped == set()
    kinds = [e["type"] for e in ports.store.events(job.job_id)]
    assert kinds.count("rank_exited") == 1 and kinds.count("rank_started") == 2


@pytest.mark.parametrize("ranks", [[0], []])
def test_ranks_reported_for_a_missing_attempt_raise_the_adapters_condition_failure(ports, ranks):
    """Both raise dynamo.ConditionFailed, so a caller that catches it is tested on the fake."""
    job, _ = ports.running()
    for job_id, attempt in ((job.job_id, 2), (job.job_id[:-4] + "ZZZZ", 1)):
        with pytest.raises(ConditionFailed):
            ports.store.record_ranks(job_id, attempt, "started", ranks)
    assert ports.store.attempt(job.job_id, 2) is None, "no attempt is made up"


def test_a_node_gets_its_gpus_back_exactly_once(ports):
    job, attempt = ports.running()
    node_id = ports.node_id(0)
    before = ports.nodes.fleet_of(ports.gpu_type()).room_version
    assert ports.store.release(attempt, node_id) is True
    assert ports.store.release(attempt, node_id) is False
    node = ports.nodes.get(node_id)
    assert (node.gpus_free, node.attempts) == (8, frozenset())
    assert ports.store.attempt(job.job_id, 1).released == {node_id}
    assert ports.nodes.fleet_of(ports.gpu_type()).room_version == before + 1, \
        "the waiting jobs of its type are told room appeared"


def test_a_release_the_nodes_agent_reported_moves_its_last_seen_time_in_the_same_write(ports):
    """Invariant (issue 41): the report that gives a node's GPUs back shows
    its agent alive; a release the server makes (a lost node) does not."""
    heard, silent = ports.node(0).node_id, ports.node(1).node_id
    job, _ = ports.place(ports.created(ranks=2), {heard: [0], silent: [1]})
    attempt = ports.store.attempt(job.job_id, job.attempt)
    before = {n: ports.nodes.get(n).last_seen_at for n in (heard, silent)}
    at = before[heard] + timedelta(seconds=30)
    assert ports.store.release(attempt, heard, heard_at=at) is True
    assert ports.store.release(attempt, silent) is True
    assert ports.nodes.get(heard).last_seen_at == at
    assert ports.nodes.get(silent).last_seen_at == before[silent]


def test_the_attempt_list_shows_a_started_attempt_running(ports):
    job, _ = ports.running()
    assert [a["state"] for a in ports.store.attempts(job.job_id)] == ["SCHEDULED"]
    ports.store.record_ranks(job.job_id, 1, "started", [0])
    [listed] = ports.store.attempts(job.job_id)
    assert (listed["attempt"], listed["state"], listed["finished_at"]) == (1, "RUNNING", None)


def test_the_story_has_one_event_per_transition_in_order(ports):
    job, attempt = ports.running()
    ports.store.end_attempt(job, attempt, JobState.SUCCEEDED,
                            {"reason": "succeeded", "exit_code": 0}, utcnow())
    assert [e["type"] for e in ports.store.events(job.job_id)] == [
        "created", "placed", "started", "finished"]


def test_a_view_with_its_story_has_the_job_and_its_own_events(ports):
    """What a job's usage is worked out from (JobsService.look): the events
    on the job's own item, not its attempts' rank events."""
    pending = ports.created()
    assert ports.store.view_with_story(pending.job_id) == (
        view_of(ports.store.get(pending.job_id)), ports.store.events(pending.job_id))
    assert ports.store.view_with_story(pending.job_id[:-4] + "ZZZZ") is None
    job, attempt = ports.running()
    ports.store.record_ranks(job.job_id, 1, "started", [0, 1])
    ports.store.end_attempt(job, attempt, JobState.SUCCEEDED,
                            {"reason": "succeeded", "exit_code": 0}, utcnow())
    view, events = ports.store.view_with_story(job.job_id)
    assert view == view_of(ports.store.get(job.job_id))
    assert events == [e for e in ports.store.events(job.job_id) if e["type"] != "rank_started"]
    assert [e["type"] for e in events] == ["created", "placed", "started", "finished"]
    stored = ports.store.attempt(job.job_id, 1)
    assert (events[1]["time"], events[3]["time"]) == (iso(stored.created_at),
                                                      iso(stored.finished_at)), \
        "an attempt's placed and end events carry its own times"


# -- health ------------------------------------------------------------------------
def test_an_incident_is_recorded_once_however_many_scans_see_it(ports):
    job, _ = ports.running()
    health = {**job.health, "status": "STALLED", "first_stalled_rank": 1}
    assert ports.store.record_health(job, health, incident_key="1#1") is True
    assert ports.store.record_health(job, health, incident_key="1#1") is False, \
        "a second scan read the job before the incident"
    got = ports.store.get(job.job_id)
    assert (got.incident_key, got.health["status"]) == ("1#1", "STALLED")
    assert ports.store.record_health(got, {**health, "status": "OK"}) is True
    assert [e["type"] for e in ports.store.events(job.job_id)].count("stalled") == 1


def test_a_health_record_over_the_item_limit_is_refused_whole(ports):
    """Invariant (issue 30): a health that would make the job's item bigger
    than DynamoDB's 400 KB is RecordTooLarge, and nothing of it is written
    (neither the health nor the incident's event), on the fake as on moto."""
    job, _ = ports.running()
    huge = {**job.health, "status": "STALLED", "stalled_ranks": list(range(100_000, 200_000))}
    with pytest.raises(RecordTooLarge):
        ports.store.record_health(job, huge, incident_key="1#1")
    got = ports.store.get(job.job_id)
    assert got.health == job.health and got.incident_key is None
    assert "stalled" not in [e["type"] for e in ports.store.events(job.job_id)]


def test_health_is_not_recorded_on_a_job_no_longer_running(ports):
    job = ports.created()
    assert ports.store.record_health(job, {"status": "OK"}) is False
    assert ports.store.get(job.job_id).health == job.health


# -- whole tables: the queue and the outbox -------------------------------------------
def test_the_queue_is_highest_priority_first_then_oldest(whole):
    low, high, low2 = (whole.created(priority=p) for p in (0, 5, 0))
    assert [j.job_id for j in whole.store.pending(10)] == [high.job_id, low.job_id, low2.job_id]
    assert [j.job_id for j in whole.store.pending(1)] == [high.job_id]
    whole.store.cancel_unplaced(high, utcnow(), None)
    assert [j.job_id for j in whole.store.pending(10)] == [low.job_id, low2.job_id]


def test_active_lists_the_jobs_in_a_placed_state(whole):
    job, _ = whole.running()
    whole.created()
    assert [j.job_id for j in whole.store.active(JobState.RUNNING, 10)] == [job.job_id]
    assert whole.store.active(JobState.SCHEDULED, 10) == []


def test_an_intent_stays_due_until_every_target_acknowledged(whole):
    """Invariant 2: an intent is never lost; it is resent to the nodes that
    have not acknowledged it, and only to them."""
    a, b = whole.node(0), whole.node(1)
    job = whole.created()
    now = utcnow()
    _, intent = whole.place(job, {a.node_id: [0], b.node_id: [1]}, now=now, resend_at=now)
    [due] = whole.store.due_intents(now, 10)
    assert (due.intent.intent_id, due.unacked, due.sends, due.due_at) == (
        "LAUNCH#1", {a.node_id, b.node_id}, 1, now)
    assert due.intent.message_for(a.node_id) == intent.message_for(a.node_id)
    assert whole.store.due_intents(now - timedelta(seconds=1), 10) == [], "not due yet"
    whole.store.ack_intent(job.job_id, "LAUNCH#1", a.node_id)
    later = now + timedelta(seconds=30)
    [due] = whole.store.due_intents(now, 10)
    assert due.unacked == {b.node_id}
    whole.store.reschedule_intent(due, later)
    assert whole.store.due_intents(now, 10) == []
    [due] = whole.store.due_intents(later, 10)
    assert (due.sends, due.due_at) == (2, later)
    whole.store.ack_intent(job.job_id, "LAUNCH#1", b.node_id)
    assert whole.store.due_intents(later, 10) == []
    whole.store.reschedule_intent(due, later)  # acknowledged meanwhile: nothing
    whole.store.ack_intent(job.job_id, "CANCEL#9", a.node_id)  # unknown: nothing
    assert whole.store.due_intents(later + timedelta(days=1), 10) == []


def test_a_cancel_request_records_its_intent_and_retires_the_launch(whole):
    job, _ = whole.running()
    now = utcnow()
    due_at = now + timedelta(seconds=30)
    whole.store.request_cancel(job, now, None, cancel_intent(job, None), due_at)
    [due] = whole.store.due_intents(due_at, 10)
    assert (due.intent.kind, due.unacked, due.due_at) == ("CANCEL", {whole.node_id(0)}, due_at)


def test_an_ended_attempt_records_the_stop_for_the_nodes_still_running(whole):
    job, attempt = whole.running()
    stop = replace(cancel_intent(job, "another rank of the attempt failed"))
    now = utcnow()
    whole.store.end_attempt(job, attempt, JobState.FAILED,
                            {"reason": "rank_failed", "exit_code": 1, "rank": 0}, now, stop)
    [due] = whole.store.due_intents(now, 10)
    assert (due.intent.intent_id, due.unacked) == ("CANCEL#1", {whole.node_id(0)})


@pytest.mark.slow
def test_a_65536_rank_attempt_records_every_report(ports):
    """Invariant (issue 30): an attempt's record grows with its nodes' reports,
    not its ranks. 65,536 ranks on 64 nodes of 1,024 GPUs start, then stop,
    one report a node: every rank is recorded, on both sides of the contract
    (as four sets of every rank, the attempt item went past DynamoDB's 400 KB
    and the reports failed)."""
    nodes, gpus = 64, 1024
    by_node = {}
    for n in range(nodes):
        ports.node(n, gpus=gpus)
        by_node[ports.node_id(n)] = list(range(n * gpus, (n + 1) * gpus))
    job, _ = ports.place(ports.created(ranks=nodes * gpus), by_node)
    for kind in ("started", "stopped"):
        for node, ranks in by_node.items():
            got = ports.store.record_ranks(job.job_id, 1, kind, ranks, node_id=node)
    assert got.started == got.stopped == set(range(nodes * gpus))
    assert got.done == got.started and got.exit_codes == {}
    rank_events = [e for e in ports.store.events(job.job_id) if e["type"].startswith("rank_")]
    assert len(rank_events) == 2 * nodes
    assert sorted(r for e in rank_events if e["type"] == "rank_stopped"
                  for r in e["ranks"]) == list(range(nodes * gpus)), "served as the ranks"


def test_a_rank_reported_exited_twice_keeps_its_later_code(ports):
    """Invariant: the reconciler's LOST, then the agent's real code for the
    same rank: the real code stands (later, or at the same millisecond), and
    a repeat of the LOST report changes nothing (a report is recorded once),
    so the node is confirmed done."""
    job, _ = ports.running(ranks=1)
    node = ports.node_id(0)
    ports.store.record_ranks(job.job_id, 1, "exited", [0], LOST, node)
    lost = ports.store.attempt(job.job_id, 1)
    assert lost.exit_codes == {0: LOST} and lost.node_confirmed(node) is False
    ports.store.record_ranks(job.job_id, 1, "exited", [0], 0, node)
    again = ports.store.record_ranks(job.job_id, 1, "exited", [0], LOST, node)
    assert again.exit_codes == {0: 0} and again.node_confirmed(node) is True
