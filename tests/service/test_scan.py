"""Stall verdicts on fakes: the culprit named, strict > at the threshold, no
conviction while the collector is blind (invariant 4)."""
from __future__ import annotations

from datetime import timedelta

from chalicelib.domain.clock import iso
from chalicelib.domain.states import JobState

from .helpers import AGENTS, register, submit


def _running(svc, world, clock):
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    job = submit(svc, ranks=4, heartbeat={"interval_s": 5, "startup_grace_s": 10})
    svc.placer.run()
    for n, ranks in (("n1", [0, 1]), ("n2", [2, 3])):
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": n,
                                                    "ranks": ranks})
    clock.advance(20)
    return world.store.get(job.job_id)


def _beat(svc, job, ranks, step=1):
    svc.heartbeats.ingest(AGENTS, job.job_id, {"attempt": 1, "ranks": [
        {"rank": r, "step": step} for r in ranks]})


def test_the_rank_silent_longest_is_named_strictly_past_the_threshold(svc, world, clock):
    job = _running(svc, world, clock)
    threshold = job.health["threshold_s"]
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(2)
    _beat(svc, job, [0, 1, 3], step=2)  # rank 2 falls silent first
    clock.advance(threshold - 2)
    at_threshold = svc.heartbeats.verdict(job, clock())
    assert at_threshold.first is None, "silent exactly the threshold is not stalled"
    clock.advance(0.001)
    _beat(svc, job, [0, 1], step=3)
    svc.scanner.collector.record_scan(clock() - timedelta(seconds=30))
    assert svc.scanner.run()["incidents"] == 1
    health = world.store.get(job.job_id).health
    assert (health["status"], health["first_stalled_rank"], health["stalled_ranks"]) == (
        "STALLED", 2, [2])
    assert svc.scanner.run()["incidents"] == 0, "one incident, however many scans see it"
    assert world.store.get(job.job_id).state is JobState.RUNNING, "on_stall: report"


def test_a_culprit_that_beats_again_was_a_counted_false_alarm(svc, world, clock):
    job = _running(svc, world, clock)
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(job.health["threshold_s"] + 1)
    _beat(svc, job, [0, 1, 3], step=2)
    svc.scanner.run()
    assert world.store.get(job.job_id).health["status"] == "STALLED"
    clock.advance(1)
    _beat(svc, job, [0, 1, 2, 3], step=3)
    svc.scanner.run()
    health = world.store.get(job.job_id).health
    assert (health["status"], health["false_alarms"]) == ("OK", 1)


def test_a_recovery_after_a_stall_is_an_event_of_the_story_with_its_time(svc, world, clock):
    """Invariant (issue 47): when the scan sees a stall incident end (its
    culprit beat again), the job's story tells it: one ``recovered`` event,
    timed at that scan, naming the incident it ends and its rank; later
    scans add none."""
    job = _running(svc, world, clock)
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(job.health["threshold_s"] + 1)
    _beat(svc, job, [0, 1, 3], step=2)
    svc.scanner.run()
    stalled = world.store.get(job.job_id)
    assert stalled.health["status"] == "STALLED"
    assert not [e for e in svc.store.events(job.job_id) if e["type"] == "recovered"]
    clock.advance(7)
    _beat(svc, job, [0, 1, 2, 3], step=3)  # SIGCONT: rank 2 beats again
    svc.scanner.run()
    at = iso(clock())
    for _ in range(2):
        clock.advance(1)
        _beat(svc, job, [0, 1, 2, 3], step=4)
        svc.scanner.run()
    [recovered] = [e for e in svc.store.events(job.job_id) if e["type"] == "recovered"]
    assert recovered["time"] == at and recovered["attempt"] == 1
    assert (recovered["incident"], recovered["rank"]) == (stalled.incident_key, 2)
    assert recovered["detected_at"] == stalled.health["detected_at"]
    assert recovered["reason"] == ("rank 2 beat again 7 s after the stall was detected: "
                                   "the job recovered (false alarm 1)")
    types = [e["type"] for e in svc.store.events(job.job_id)]
    assert types.index("stalled") < types.index("recovered"), types


def test_nobody_is_convicted_while_nothing_reaches_the_collector(svc, world, clock):
    job = _running(svc, world, clock)
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(job.health["threshold_s"] + 300)  # everyone silent, ingest quiet
    report = svc.scanner.run()
    assert report["incidents"] == 0 and "ingest looks down" in report["suppressed"]
    assert world.store.get(job.job_id).health["status"] != "STALLED"


def test_a_stall_with_on_stall_restart_requeues_the_job(svc, world, clock):
    register(svc, "n1", gpus=2)
    job = submit(svc, ranks=2, max_attempts=2, on_stall="restart",
                 heartbeat={"interval_s": 5, "startup_grace_s": 10})
    svc.placer.run()
    svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": "n1",
                                                "ranks": [0, 1]})
    world.inbox.drain(world.inbox.ensure("n1"))
    clock.advance(20)
    job = world.store.get(job.job_id)
    _beat(svc, job, [0, 1])
    clock.advance(job.health["threshold_s"] + 1)
    _beat(svc, job, [0], step=2)
    assert svc.scanner.run()["incidents"] == 1
    job = world.store.get(job.job_id)
    assert (job.state, job.attempt) == (JobState.PENDING, 1)
    [stop] = world.inbox.drain(world.inbox.ensure("n1"))
    assert (stop["type"], stop["reason"]) == ("CANCEL", "the attempt stalled")


def test_a_health_too_big_for_its_record_is_said_and_kept_compact(svc, world, clock,
                                                                  monkeypatch, caplog):
    """Invariant (issue 30): a write that cannot fit is never a silent
    failure. The store refuses the full record (RecordTooLarge, injected:
    the job's item is full); the scan says so and still records the
    incident, with the verdict's sentence and counts, once."""
    from chalicelib.domain.errors import RecordTooLarge

    job = _running(svc, world, clock)
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(2)
    _beat(svc, job, [0, 1, 3], step=2)  # rank 2 falls silent first
    clock.advance(job.health["threshold_s"])
    _beat(svc, job, [0, 1, 3], step=3)
    store = svc.scanner.store
    real = store.record_health
    refused = []

    def full_item(j, h, **kw):
        if h.get("stalled_ranks"):  # any record with a rank list is too big
            refused.append(h)
            raise RecordTooLarge(f"{j.job_id}: item over 400 KB")
        return real(j, h, **kw)

    monkeypatch.setattr(store, "record_health", full_item)
    caplog.set_level("ERROR", logger="chalicelib")
    assert svc.scanner.run()["incidents"] == 1
    assert refused, "the full record was tried first"
    health = world.store.get(job.job_id).health
    assert (health["status"], health["first_stalled_rank"], health["stalled_count"]) == (
        "STALLED", 2, 1)
    assert health["verdict"]["text"] == "rank 2 on n2 went quiet first"
    assert "does not fit its record" in caplog.text
    events = world.store.events(job.job_id)
    assert [e["reason"] for e in events if e["type"] == "stalled"] == [
        "rank 2 on n2 went quiet first"]


def test_a_tie_stays_a_tie_once_the_whole_job_is_silent(svc, world, clock):
    """Issue 30 (the 65,536-rank hang): the band within which silence cannot
    order ranks is measured on the ranks still beating. Ranks 0 and 1 stop a
    second apart while 2 and 3 beat 2 s late: a tie, said so by the stall
    event. Then 2 and 3 stop too. With no rank left beating, the band was
    0 and the next scan named rank 0 "first" (its last post landed a second
    before rank 1's), the job's verdict no longer the event's. The open
    incident's band is kept as the least."""
    job = _running(svc, world, clock)
    threshold = job.health["threshold_s"]
    _beat(svc, job, [0, 1, 2, 3])
    clock.advance(1)
    _beat(svc, job, [1, 2, 3])  # rank 0 stops
    clock.advance(1)
    _beat(svc, job, [2, 3])  # rank 1 stops, a second later
    while clock() < job.started_at + timedelta(seconds=30 + threshold - 7):
        clock.advance(5)
        _beat(svc, job, [2, 3])
    clock.advance(7)  # ranks 2 and 3 a beat late: 2 s of jitter
    svc.scanner.collector.record_scan(clock() - timedelta(seconds=30))
    assert svc.scanner.run()["incidents"] == 1
    tie = world.store.get(job.job_id).health["verdict"]
    assert (tie["rank"], tie["ranks"]) == (None, [0, 1]), tie
    clock.advance(threshold + 1)  # 2 and 3 silent too: the whole job
    register(svc, "n1", gpus=2)  # the collector still hears the cluster
    svc.scanner.collector.record_scan(clock() - timedelta(seconds=30))
    svc.scanner.run()
    health = world.store.get(job.job_id).health
    assert health["stalled_count"] == 4
    assert (health["verdict"]["rank"], health["verdict"]["ranks"]) == (None, [0, 1]), \
        health["verdict"]["text"]
    [stalled] = [e for e in world.store.events(job.job_id) if e["type"] == "stalled"]
    assert stalled["reason"] == health["verdict"]["text"]
