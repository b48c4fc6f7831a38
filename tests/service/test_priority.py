"""Priority classes and preemption on fakes (issue 28): higher classes first,
victims chosen as Kueue chooses, no thrash, one preemption per job."""
from __future__ import annotations

import pytest

from chalicelib.domain.errors import InvalidArgument
from chalicelib.domain.priority import PriorityClasses
from chalicelib.domain.states import JobState

from .helpers import AGENTS, register, submit

CLASSES = PriorityClasses.parse(
    '{"urgent": {"value": 1000, "preempts": true}, "high": {"value": 100},'
    ' "batch": {"value": -100}}')
MIN_RUNTIME_S = 300


@pytest.fixture
def svc(world):
    return world.services(classes=CLASSES, preempt_min_runtime_s=MIN_RUNTIME_S)


def running(svc, world, clock, node: str, ranks: int = 2, tenant: str = "acme", **spec):
    """A job of ``ranks`` placed on ``node`` and started, its inbox drained."""
    job = submit(svc, tenant=tenant, ranks=ranks, **spec)
    assert job.job_id in svc.placer.run().placed
    [attempt] = svc.jobs.attempts(tenant, job.job_id)
    assert {p["node_id"] for p in attempt["placement"]} == {node}
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": node,
                                                "ranks": list(range(ranks))})
    world.inbox.drain(world.inbox.ensure(node))
    return svc.store.get(job.job_id)


def events(svc, job_id, kind):
    return [e for e in svc.store.events(job_id) if e["type"] == kind]


def test_higher_classes_are_placed_first_whatever_their_age_or_tenant(svc, world):
    register(svc, "n1", gpus=2)
    blocker = submit(svc, ranks=2)
    svc.placer.run()
    older = submit(svc, ranks=2, priority=999)  # the tenant's own highest priority
    newer = submit(svc, tenant="globex", ranks=2, priority_class="high")
    svc.attempts.report(AGENTS, blocker.job_id, 1, {"type": "EXITED", "node_id": "n1",
                                                    "ranks": [0, 1], "exit_code": 0})
    assert svc.placer.run().placed == [newer.job_id]
    assert svc.store.get(older.job_id).state is JobState.PENDING


def test_an_unknown_priority_class_is_named(svc):
    with pytest.raises(InvalidArgument) as caught:
        submit(svc, priority_class="vip")
    assert caught.value.field == "priority_class"
    assert caught.value.detail == ("priority_class 'vip' is not one of this deployment's "
                                   "classes: urgent, high, default, batch")


def test_a_preempting_class_takes_the_gpus_of_a_lower_one_which_requeues(svc, world, clock):
    register(svc, "n1", gpus=2)
    victim = running(svc, world, clock, "n1", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = submit(svc, tenant="globex", ranks=2, priority_class="urgent")
    report = svc.placer.run()
    assert report.placed == [] and report.preempting == [urgent.job_id]
    victim = svc.store.get(victim.job_id)
    assert (victim.state, victim.uncounted_retries) == (JobState.PENDING, 1)
    [attempt] = svc.jobs.attempts("acme", victim.job_id)
    assert attempt["exit"]["decision"] == (
        f"preempted (by {urgent.job_id}, priority class urgent): retried, not counted "
        "(uncounted retry 1 of 10)")
    [stop] = world.inbox.drain(world.inbox.ensure("n1"))
    assert stop["type"] == "CANCEL", "SIGTERM and its grace: it can checkpoint"
    waiting = svc.store.get(urgent.job_id)
    assert waiting.pending_reason == (f"preempting {victim.job_id} (2 GPUs of lower "
                                      "priority classes) to make room (urgent)")
    [told] = events(svc, urgent.job_id, "preempting")
    assert told["jobs"] == [victim.job_id]
    assert svc.placer.run().placed == [], "the victim's ranks still stop: nothing twice"
    assert svc.store.get(victim.job_id).uncounted_retries == 1
    svc.attempts.report(AGENTS, victim.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert svc.placer.run().placed == [urgent.job_id], "the higher class goes first"
    assert svc.store.get(urgent.job_id).preempting is None
    assert svc.store.get(victim.job_id).state is JobState.PENDING, "it waits its turn"


def test_victims_are_the_lowest_class_then_the_most_recently_started_and_no_more(
        svc, world, clock):
    for n in ("n1", "n2", "n3"):
        register(svc, n, gpus=2)
    old_batch = running(svc, world, clock, "n1", priority_class="batch")
    clock.advance(100)
    default = running(svc, world, clock, "n2")
    clock.advance(100)
    new_batch = running(svc, world, clock, "n3", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = submit(svc, tenant="globex", ranks=2, priority_class="urgent")
    assert svc.placer.run().preempting == [urgent.job_id]
    states = {j.job_id: svc.store.get(j.job_id).state for j in (old_batch, default, new_batch)}
    assert states == {old_batch.job_id: JobState.RUNNING, default.job_id: JobState.RUNNING,
                      new_batch.job_id: JobState.PENDING}, "one is enough: the newest batch"


def test_a_job_that_ran_less_than_the_minimum_is_not_preempted(svc, world, clock):
    register(svc, "n1", gpus=2)
    victim = running(svc, world, clock, "n1", priority_class="batch")
    clock.advance(MIN_RUNTIME_S - 1)
    urgent = submit(svc, ranks=2, priority_class="urgent")
    report = svc.placer.run()
    assert report.preempting == [] and report.waiting == [urgent.job_id]
    assert svc.store.get(victim.job_id).state is JobState.RUNNING


def test_nothing_is_preempted_for_a_job_that_still_would_not_fit(svc, world, clock):
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    victim = running(svc, world, clock, "n1", priority_class="batch")
    peer = running(svc, world, clock, "n2", priority_class="urgent")
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = submit(svc, ranks=4, priority_class="urgent")  # needs n1 and n2
    assert svc.placer.run().preempting == []
    assert svc.store.get(victim.job_id).state is JobState.RUNNING
    assert svc.store.get(peer.job_id).state is JobState.RUNNING
    assert svc.store.get(urgent.job_id).state is JobState.PENDING


def test_a_class_that_does_not_preempt_only_goes_first(svc, world, clock):
    register(svc, "n1", gpus=2)
    victim = running(svc, world, clock, "n1", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    submit(svc, ranks=2, priority_class="high")
    assert svc.placer.run().preempting == []
    assert svc.store.get(victim.job_id).state is JobState.RUNNING


def test_a_preempted_job_is_not_preempted_again_before_the_minimum_runtime(svc, world, clock):
    """No thrash under a steady stream of urgent jobs: each batch attempt runs
    at least the minimum before the next urgent job may take its GPUs."""
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    batch = running(svc, world, clock, "n1", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    hog = running(svc, world, clock, "n2", priority_class="urgent")
    first = submit(svc, ranks=2, priority_class="urgent")
    assert svc.placer.run().preempting == [first.job_id]
    svc.attempts.report(AGENTS, batch.job_id, 1, {"type": "STOPPED", "node_id": "n1"})
    assert svc.placer.run().placed == [first.job_id]
    svc.attempts.report(AGENTS, hog.job_id, 1, {"type": "EXITED", "node_id": "n2",
                                                "ranks": [0, 1], "exit_code": 0})
    assert svc.placer.run().placed == [batch.job_id]  # requeued, runs again on n2
    svc.attempts.report(AGENTS, batch.job_id, 2, {"type": "STARTED", "node_id": "n2",
                                                  "ranks": [0, 1]})
    second = submit(svc, ranks=2, priority_class="urgent")
    clock.advance(MIN_RUNTIME_S - 1)
    assert svc.placer.run().preempting == [], "it just started again"
    clock.advance(2)
    assert svc.placer.run().preempting == [second.job_id]


def test_of_two_placers_racing_for_one_job_one_preempts(svc, world, clock):
    """The preemption is recorded on the job by a conditional write first:
    a placer that read the job before it loses, and preempts nothing."""
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    first_victim = running(svc, world, clock, "n1", priority_class="batch")
    second_victim = running(svc, world, clock, "n2", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = submit(svc, ranks=2, priority_class="urgent")
    read_by_both = svc.store.get(urgent.job_id)
    other = world.services(classes=CLASSES, preempt_min_runtime_s=MIN_RUNTIME_S)
    assert svc.placer._preempt_for(read_by_both, _pool(svc))
    assert not other.placer._preempt_for(read_by_both, _pool(other))
    ended = [j for j in (first_victim, second_victim)
             if svc.store.get(j.job_id).state is JobState.PENDING]
    assert len(ended) == 1, "one victim, preempted once"
    assert len(events(svc, urgent.job_id, "preempting")) == 1


def _pool(svc):
    from chalicelib.service.placement import _Pool
    return _Pool(svc.placer.nodes)


def test_a_class_the_operator_keeps_for_some_tenants_is_refused_to_the_others(world):
    from chalicelib.domain.errors import Forbidden
    svc = world.services(classes=PriorityClasses.parse(
        '{"urgent": {"value": 1000, "preempts": true, "tenants": ["acme"]}}'))
    assert submit(svc, tenant="acme", priority_class="urgent").spec.priority_class == \
        "urgent"
    with pytest.raises(Forbidden) as caught:
        submit(svc, tenant="globex", priority_class="urgent")
    assert caught.value.field == "priority_class"
    assert str(caught.value) == "tenant globex may not submit to priority class urgent"


def _limits(raw: str):
    from chalicelib.domain.quotas import TenantLimits
    return TenantLimits.parse(None, None, raw)


def test_a_tenant_reclaims_its_guaranteed_gpus_from_a_borrower_within_one_run(world, clock):
    """Borrowed GPUs go back to their owner within one placement run."""
    svc = world.services(limits=_limits('{"acme": {"guaranteed_gpus": {"a100": 4}}}'))
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    borrowed = [running(svc, world, clock, n, tenant="globex") for n in ("n1", "n2")]
    mine = submit(svc, tenant="acme", ranks=2)  # within its 4 guaranteed GPUs
    report = svc.placer.run()
    assert report.preempting == [mine.job_id]
    ended = [j for j in borrowed if svc.store.get(j.job_id).state is JobState.PENDING]
    assert len(ended) == 1, "only what it needs"
    [attempt] = svc.jobs.attempts("globex", ended[0].job_id)
    assert attempt["exit"]["detail"] == f"by {mine.job_id}, reclaiming acme's guaranteed GPUs"
    assert "borrowed beyond their tenants' guarantees" in svc.store.get(
        mine.job_id).pending_reason


def test_a_borrower_is_never_preempted_below_its_own_guarantee(world, clock):
    svc = world.services(limits=_limits(
        '{"acme": {"guaranteed_gpus": {"a100": 2}}, "globex": {"guaranteed_gpus": {"a100": 2}}}'))
    register(svc, "n1", gpus=2)
    theirs = running(svc, world, clock, "n1", tenant="globex")  # within its own guarantee
    submit(svc, tenant="acme", ranks=2)
    assert svc.placer.run().preempting == []
    assert svc.store.get(theirs.job_id).state is JobState.RUNNING


def test_a_tenant_beyond_its_guarantee_reclaims_nothing(world, clock):
    svc = world.services(limits=_limits('{"acme": {"guaranteed_gpus": {"a100": 2}}}'))
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    running(svc, world, clock, "n1", tenant="acme")  # holds its 2 already
    theirs = running(svc, world, clock, "n2", tenant="globex")
    submit(svc, tenant="acme", ranks=2)
    assert svc.placer.run().preempting == []
    assert svc.store.get(theirs.job_id).state is JobState.RUNNING


def test_fair_share_follows_the_tenants_weights(world, clock):
    svc = world.services(limits=_limits('{"acme": {"weight": 3}}'))
    register(svc, "n1", gpus=4)
    acme = [submit(svc, tenant="acme", ranks=1) for _ in range(4)]
    globex = [submit(svc, tenant="globex", ranks=1) for _ in range(4)]
    placed = set(svc.placer.run().placed)
    assert len(placed & {j.job_id for j in acme}) == 3, "three shares to one"
    assert len(placed & {j.job_id for j in globex}) == 1


def test_a_victim_s_gpus_on_a_cordoned_node_make_no_room(svc, world, clock):
    from chalicelib.domain.principal import Principal
    register(svc, "n1", gpus=2)
    victim = running(svc, world, clock, "n1", priority_class="batch")
    svc.cordons.cordon(Principal("operator", "ops"), "n1", "bad ECC")
    clock.advance(MIN_RUNTIME_S + 1)
    submit(svc, ranks=2, priority_class="urgent")
    assert svc.placer.run().preempting == [], "stopping it would free nothing usable"
    assert svc.store.get(victim.job_id).state is JobState.RUNNING


def test_two_urgent_jobs_in_one_run_preempt_different_victims(svc, world, clock):
    for n in ("n1", "n2"):
        register(svc, n, gpus=2)
    victims = [running(svc, world, clock, n, priority_class="batch") for n in ("n1", "n2")]
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = [submit(svc, ranks=2, priority_class="urgent") for _ in range(2)]
    assert sorted(svc.placer.run().preempting) == sorted(j.job_id for j in urgent)
    chosen = [svc.store.get(j.job_id).preempting["jobs"] for j in urgent]
    assert sorted(sum(chosen, [])) == sorted(v.job_id for v in victims), chosen


def test_a_preemption_reads_the_attempts_of_its_candidates_only(svc, world, clock,
                                                                 monkeypatch):
    """Jobs of the same or a higher class, or that ran too briefly, are never
    victims: their attempts are not read (one read of the placed jobs a run)."""
    for n in ("n1", "n2", "n3"):
        register(svc, n, gpus=2)
    peers = [running(svc, world, clock, n, priority_class="urgent") for n in ("n1", "n2")]
    clock.advance(MIN_RUNTIME_S + 1)
    batch = running(svc, world, clock, "n3", priority_class="batch")
    clock.advance(MIN_RUNTIME_S + 1)
    urgent = submit(svc, ranks=2, priority_class="urgent")
    read, attempt = [], world.store.attempt
    monkeypatch.setattr(world.store, "attempt",
                        lambda job_id, n: read.append(job_id) or attempt(job_id, n))
    active, listed = world.store.active, []
    monkeypatch.setattr(world.store, "active",
                        lambda state, limit: listed.append(state) or active(state, limit))
    assert svc.placer.run().preempting == [urgent.job_id]
    assert set(read) == {batch.job_id}, "not the peers': " + str([p.job_id for p in peers])
    assert sorted(s.value for s in listed) == ["RUNNING", "SCHEDULED"], "once each a run"
