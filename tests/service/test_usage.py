"""A job's usage on GET (JobsService.look, domain/usage.py), as its attempts
go: a failed attempt's time is lost to it, the retry's is productive, each
attempt's start is startup. The fakes' clock moves by hand, so the figures
are exact."""
from __future__ import annotations

from chalicelib.api.representation import job_view_json

from .helpers import AGENTS, placed

NODES = {"n1": [0, 1], "n2": [2, 3]}  # 2 GPUs each: 4 GPUs an attempt


def _report(svc, job, attempt, kind, code=None, nodes=NODES):
    for n, ranks in nodes.items():
        body = {"type": kind, "node_id": n, "ranks": ranks}
        if code is not None:
            body["exit_code"] = code
        job = svc.attempts.report(AGENTS, job.job_id, attempt, body)
    return job


def test_a_job_that_failed_once_then_succeeded(svc, world, clock):
    job = placed(svc, world, max_attempts=2)
    assert svc.jobs.look("acme", job.job_id)["usage"]["gpu_seconds"] == 0
    clock.advance(10)
    _report(svc, job, 1, "STARTED")
    clock.advance(60)
    running = svc.jobs.look("acme", job.job_id)["usage"]
    assert running == {"gpu_seconds": 4 * 70, "productive_gpu_seconds": 4 * 60,
                       "lost_gpu_seconds": {"startup": 4 * 10}, "goodput": round(60 / 70, 4),
                       "estimated": True}
    clock.advance(30)
    job = _report(svc, job, 1, "EXITED", 1, {"n2": [3]})  # rank 3 exits 1 at 100 s
    job = _report(svc, job, 1, "STOPPED", nodes={"n1": [0, 1], "n2": [2]})
    clock.advance(10)
    assert svc.placer.run().placed == [job.job_id]  # attempt 2, placed at 110 s
    clock.advance(20)
    _report(svc, job, 2, "STARTED")
    clock.advance(200)
    job = _report(svc, job, 2, "EXITED", 0)
    assert job.state.value == "SUCCEEDED"
    clock.advance(3600)  # an ended job's usage no longer grows
    u = svc.jobs.look("acme", job.job_id)["usage"]
    assert u == {"gpu_seconds": 4 * (100 + 220), "productive_gpu_seconds": 4 * 200,
                 "lost_gpu_seconds": {"failed_attempt": 4 * 90, "startup": 4 * (10 + 20)},
                 "goodput": round(200 / 320, 4), "estimated": True}
    # as the API shows it, on GET only: a page of jobs does not work it out
    assert job_view_json(svc.jobs.look("acme", job.job_id))["usage"] == u
    [listed], _ = svc.jobs.list("acme", state=None, page_size=10, page_token=None)
    assert job_view_json(listed)["usage"] is None


def test_a_false_alarm_stall_is_counted_from_the_last_beat_to_its_recovery(svc, world, clock):
    from chalicelib.domain.clock import iso
    job = placed(svc, world)
    clock.advance(10)
    job = _report(svc, job, 1, "STARTED")
    beat = iso(clock.advance(20))
    clock.advance(40)
    health = {**job.health, "status": "STALLED", "last_heard_at": beat,
              "detected_at": iso(clock()), "first_stalled_rank": 1}
    assert svc.store.record_health(job, health, incident_key="1#1")
    job = svc.store.get(job.job_id)
    clock.advance(30)
    assert svc.store.record_health(job, {**health, "status": "OK"}, recovered=True)
    clock.advance(100)
    u = svc.jobs.look("acme", job.job_id)["usage"]
    # placed 0, started 10, last beat 30, detected 70, recovered 100, now 200
    assert u["lost_gpu_seconds"] == {"startup": 4 * 10, "stalled": 4 * 70}
    assert u["productive_gpu_seconds"] == 4 * (200 - 10 - 70)
