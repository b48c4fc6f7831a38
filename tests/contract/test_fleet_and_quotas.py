"""The contract of issue 9's ports, held by the fakes (tests/fakes.py) and the
real adapters alike: fleet generations and their sweeps (NodeStore.fleet_of,
fleets, mark_swept), parked never-fitting jobs (Jobs.parked, park, unpark)
and each tenant's count of PENDING jobs under ``max_pending``."""
from __future__ import annotations

from datetime import timedelta

import pytest

from chalicelib.domain import idempotency
from chalicelib.domain.clock import utcnow
from chalicelib.domain.fleet import ALL_TYPES, Fleet
from chalicelib.domain.queue import Entry, Line, holder_of
from chalicelib.domain.states import JobState
from chalicelib.service.ports import IdemClaim, PendingLimitReached

NEVER = "can never fit: needs 16 GPUs; the fleet has 8"


def _now():
    """Now, to the millisecond (as the adapters store it)."""
    t = utcnow()
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _ids(jobs) -> list[str]:
    return [j.job_id for j in jobs]


# -- fleet generations (domain/fleet.py) --------------------------------------------
def test_a_type_never_registered_has_the_empty_fleet(ports):
    assert ports.nodes.fleet_of(ports.gpu_type(7)) == Fleet(ports.gpu_type(7))
    assert ports.nodes.fleet_of(None).key == ALL_TYPES


def test_every_change_of_a_types_registered_gpus_is_a_new_generation(ports):
    gpu = ports.gpu_type()
    everything = ports.nodes.fleet_of(None).generation
    first = _now()
    ports.node(0, gpus=8, now=first)
    fleet = ports.nodes.fleet_of(gpu)
    assert (fleet.key, fleet.gpus, fleet.largest_node) == (gpu, 8, 8)
    assert fleet.generation > 0 and fleet.unswept and fleet.changed_at == first
    assert ports.nodes.fleet_of(None).generation > everything, "* moves with every type"

    everything = ports.nodes.fleet_of(None).generation
    ports.node(0, gpus=8, now=first + timedelta(seconds=5))
    assert ports.nodes.fleet_of(gpu) == fleet, "a repeated registration changes nothing"
    assert ports.nodes.fleet_of(None).generation == everything

    later = first + timedelta(seconds=10)
    ports.node(1, gpus=4, now=later)
    grown = ports.nodes.fleet_of(gpu)
    assert (grown.gpus, grown.largest_node) == (12, 8)
    assert grown.generation > fleet.generation and grown.changed_at == later
    assert ports.nodes.fleet_of(None).generation > everything


def test_a_node_that_changes_type_is_a_new_generation_of_both_types(ports):
    old, new = ports.gpu_type(), ports.gpu_type(1)
    ports.node(0, gpus=4)
    before_old, before_new = ports.nodes.fleet_of(old), ports.nodes.fleet_of(new)
    everything = ports.nodes.fleet_of(None).generation
    ports.node(0, gpus=4, gpu_type=new)
    after_old, after_new = ports.nodes.fleet_of(old), ports.nodes.fleet_of(new)
    assert (after_old.gpus, after_new.gpus) == (0, 4)
    assert after_old.generation > before_old.generation, "its GPUs left the old type"
    assert after_new.generation > before_new.generation
    assert after_new.room_version > before_new.room_version
    assert ports.nodes.fleet_of(None).generation > everything, \
        "the total did not change, but some type did"


def test_a_node_back_from_down_makes_room_but_no_new_generation(ports):
    gpu = ports.gpu_type()
    node = ports.node(0)
    assert ports.nodes.mark_down(node) is True
    before = ports.nodes.fleet_of(gpu)
    ports.node(0, now=node.last_seen_at + timedelta(seconds=60))
    after = ports.nodes.fleet_of(gpu)
    assert after.room_version > before.room_version
    assert (after.generation, after.gpus, after.largest_node) == (
        before.generation, before.gpus, before.largest_node)


def test_a_sweep_is_recorded_for_the_generation_read_unless_the_fleet_moved_on(ports):
    gpu = ports.gpu_type()
    ports.node(0, gpus=8)
    stale = ports.nodes.fleet_of(gpu)
    ports.node(1, gpus=8)
    ports.nodes.mark_swept(stale)
    moved = ports.nodes.fleet_of(gpu)
    assert moved.unswept and moved.swept_generation != stale.generation, \
        "the fleet changed since it was read: its jobs are judged once more"
    ports.nodes.mark_swept(moved)
    swept = ports.nodes.fleet_of(gpu)
    assert not swept.unswept and swept.swept_generation == moved.generation
    assert swept.generation == moved.generation and swept.gpus == 16
    nowhere = Fleet(ports.gpu_type(7))
    ports.nodes.mark_swept(nowhere)
    assert ports.nodes.fleet_of(ports.gpu_type(7)) == nowhere, "nothing to sweep: unwritten"


def test_fleets_lists_every_types_fleet_and_all_types(whole):
    whole.node(0, gpus=8)
    whole.node(1, gpus=2, gpu_type=whole.gpu_type(1))
    listed = whole.nodes.fleets()
    fleets = {f.key: f for f in listed}
    assert set(fleets) == {whole.gpu_type(), whole.gpu_type(1), ALL_TYPES}
    assert [f.key for f in listed] == sorted(fleets), "by key, in both stores"
    for key, fleet in fleets.items():
        assert whole.nodes.fleet_of(None if key == ALL_TYPES else key) == fleet
    assert (fleets[ALL_TYPES].gpus, fleets[ALL_TYPES].largest_node) == (10, 8)


# -- the placer's line (domain/queue.py) ---------------------------------------------
def test_the_line_reads_back_as_last_written_and_is_no_fleet(whole):
    """One record beside the fleets: nothing before the first write, the
    last write after it, and never listed among the fleets."""
    assert whole.nodes.line() is None
    whole.node(0, gpus=8)
    now = _now()
    first = Line.of(now, [Entry("job_a", "acme", 8, whole.gpu_type())],
                    [holder_of("job_h", "globex", 8, ALL_TYPES, now, 600)],
                    {whole.gpu_type(): 8, ALL_TYPES: 8})
    whole.nodes.set_line(first)
    assert whole.nodes.line() == first
    second = Line.of(now + timedelta(seconds=1), [], [], {})
    whole.nodes.set_line(second)
    assert whole.nodes.line() == second
    assert {f.key for f in whole.nodes.fleets()} == {whole.gpu_type(), ALL_TYPES}


# -- parked never-fitting jobs ---------------------------------------------------------
def test_a_parked_job_leaves_the_queue_with_its_reason_until_unparked(whole):
    gpu = whole.gpu_type()
    whole.node(0, gpus=8)
    job = whole.created(ranks=2, gpus_per_rank=8)
    other = whole.created(ranks=1)
    assert whole.store.park(job, NEVER, whole.nodes.fleet_of(gpu)) is True
    got = whole.store.get(job.job_id)
    assert (got.state, got.pending_reason, got.attempt) == (JobState.PENDING, NEVER, 0)
    assert _ids(whole.store.pending(10)) == [other.job_id], "the queue no longer reads it"
    assert _ids(whole.store.active(JobState.PENDING, 10)) == [other.job_id]
    assert _ids(whole.store.parked(gpu)) == [job.job_id]
    assert _ids(whole.store.parked(whole.gpu_type(1))) == [], "another type's"
    assert _ids(whole.store.parked(None)) == [], "jobs that take any type"
    assert [(e["type"], e["reason"]) for e in whole.store.events(job.job_id)
            if e["type"] == "waiting"] == [("waiting", NEVER)], "the story says why it waits"

    assert whole.store.unpark(got) is True
    assert sorted(_ids(whole.store.pending(10))) == sorted([job.job_id, other.job_id])
    assert _ids(whole.store.parked(gpu)) == []


def test_parked_jobs_are_listed_in_queue_order(ports):
    gpu = ports.gpu_type()
    fleet = ports.nodes.fleet_of(gpu)
    low, high, low2 = (ports.created(priority=p) for p in (0, 5, 0))
    for job in (low2, low, high):
        assert ports.store.park(job, NEVER, fleet) is True
    assert _ids(ports.store.parked(gpu)) == [high.job_id, low.job_id, low2.job_id]


def test_a_job_is_not_parked_against_a_fleet_that_moved_on(ports):
    gpu = ports.gpu_type()
    ports.node(0, gpus=8)
    job = ports.created(ranks=2, gpus_per_rank=8)
    stale = ports.nodes.fleet_of(gpu)
    ports.node(1, gpus=8)
    assert ports.store.park(job, NEVER, stale) is False
    assert _ids(ports.store.parked(gpu)) == []
    assert ports.store.get(job.job_id).pending_reason is None, "nothing written"
    assert ports.store.park(job, NEVER, ports.nodes.fleet_of(gpu)) is True
    assert _ids(ports.store.parked(gpu)) == [job.job_id]


def test_a_job_of_a_type_never_registered_is_parked_against_the_empty_fleet(ports):
    gpu = ports.gpu_type(5)
    job = ports.created(gpu_type=gpu)
    assert ports.store.park(job, NEVER, ports.nodes.fleet_of(gpu)) is True
    assert _ids(ports.store.parked(gpu)) == [job.job_id]


def test_only_the_pending_job_read_is_parked_or_unparked(ports):
    gpu = ports.gpu_type()
    placed, _ = ports.running()
    fleet = ports.nodes.fleet_of(gpu)
    assert ports.store.park(placed, NEVER, fleet) is False
    assert ports.store.unpark(placed) is False
    assert ports.store.get(placed.job_id).pending_reason is None
    cancelled = ports.created()
    ports.store.cancel_unplaced(cancelled, utcnow(), None)
    assert ports.store.park(cancelled, NEVER, fleet) is False
    assert _ids(ports.store.parked(gpu)) == []


def test_a_parked_job_that_is_cancelled_or_placed_leaves_the_parked_list(ports):
    gpu = ports.gpu_type()
    ports.node(0, gpus=8)
    gone, placed = ports.created(), ports.created()
    fleet = ports.nodes.fleet_of(gpu)
    assert ports.store.park(gone, NEVER, fleet) and ports.store.park(placed, NEVER, fleet)
    assert ports.store.cancel_unplaced(gone, utcnow(), None).state is JobState.CANCELLED
    placed, _ = ports.place(placed, {ports.node_id(0): [0, 1]})
    assert placed.state is JobState.SCHEDULED
    assert _ids(ports.store.parked(gpu)) == []


# -- each tenant's PENDING count under max_pending -------------------------------------
def test_a_create_at_the_tenants_pending_limit_is_refused_and_writes_nothing(ports):
    first, second, third = ports.job(), ports.job(), ports.job()
    ports.store.create(first, None, max_pending=2)
    ports.store.create(second, None, max_pending=2)
    claim = IdemClaim(idempotency.record_id(first.tenant, ports.tag), "hash")
    with pytest.raises(PendingLimitReached) as refused:
        ports.store.create(third, claim, max_pending=2)
    assert refused.value.limit == 2
    assert ports.store.get(third.job_id) is None
    assert sorted(j["job_id"] for j in ports.store.page(first.tenant, None, 10, None)[0]) == sorted(
        [first.job_id, second.job_id])
    ports.store.create(ports.job(tenant=ports.tenant(1)), None, max_pending=2)  # its own count
    ports.store.cancel_unplaced(first, utcnow(), None)
    ports.store.create(third, claim, max_pending=2)  # the key was not taken by the refusal
    assert ports.store.get(third.job_id).idem_id == claim.idem_id


def test_a_limit_of_zero_refuses_every_create(ports):
    job = ports.job()
    with pytest.raises(PendingLimitReached):
        ports.store.create(job, None, max_pending=0)
    assert ports.store.get(job.job_id) is None


def test_without_a_limit_a_create_is_counted_but_never_refused(ports):
    for _ in range(3):
        ports.store.create(ports.job(), None)
    with pytest.raises(PendingLimitReached):
        ports.store.create(ports.job(), None, max_pending=3)
    ports.store.create(ports.job(), None, max_pending=4)


def test_a_create_or_replay_retried_is_counted_once(ports):
    job, keyed = ports.job(), ports.job()
    ports.store.create(job, None, max_pending=3)
    ports.store.create(job, None, max_pending=3)  # retried after a lost answer
    claim = IdemClaim(idempotency.record_id(keyed.tenant, ports.tag), "hash")
    ports.store.create(keyed, claim, max_pending=3)
    ports.store.create(keyed, claim, max_pending=3)  # the same key, the same job
    ports.store.create(ports.job(), None, max_pending=3)
    with pytest.raises(PendingLimitReached):
        ports.store.create(ports.job(), None, max_pending=3)


def test_the_pending_count_follows_jobs_in_and_out_of_pending(ports):
    """Placing leaves PENDING, a retry enters it again (counted, never refused: the
    job was admitted once), a cancel of an unplaced job leaves it; parking does not."""
    job, attempt = ports.running(max_attempts=2)  # created, counted, placed: 0 pending
    waiting = ports.job()
    ports.store.create(waiting, None, max_pending=1)
    ports.store.end_attempt(job, attempt, JobState.PENDING, {"reason": "rank_failed"},
                            utcnow())
    with pytest.raises(PendingLimitReached):
        ports.store.create(ports.job(), None, max_pending=2)
    assert ports.store.park(waiting, NEVER, ports.nodes.fleet_of(ports.gpu_type())) is True
    with pytest.raises(PendingLimitReached):
        ports.store.create(ports.job(), None, max_pending=2)  # a parked job is PENDING
    ports.store.cancel_unplaced(waiting, utcnow(), None)
    ports.store.create(ports.job(), None, max_pending=2)
