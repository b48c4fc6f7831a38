"""The stall scan fans out when one invocation would judge too many ranks
(issue 16, item 4): 100,000 running ranks are judged in parallel shards within
the period, and a slow or failing job holds up only its own shard."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from chalicelib.domain.clock import iso
from chalicelib.domain.jobs import Job
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.states import JobState
from chalicelib.service.scan_fanout import RANK_COST_S, ScanFanout, pack

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
PERIOD_S = 60.0


def job(i: int, ranks: int, state: JobState = JobState.RUNNING, attempt: int = 1) -> Job:
    return Job(job_id=f"j{i:06d}", tenant="t", state=state, spec=JobSpec(command=("x",), ranks=ranks),
               created_at=NOW, updated_at=NOW, attempt=attempt)


class Queue:
    def __init__(self) -> None:
        self.bodies: list[str] = []

    def send(self, bodies):
        self.bodies += bodies


class Store:
    def __init__(self, jobs) -> None:
        self.jobs = {j.job_id: j for j in jobs}

    def get(self, job_id):
        return self.jobs.get(job_id)


def fanout(jobs=(), clock=lambda: NOW):
    return ScanFanout(Queue(), Store(jobs), period_s=PERIOD_S, clock=clock)


def test_a_small_scan_is_judged_inline():
    f = fanout()
    assert f.send([job(i, 64) for i in range(10)], NOW, None) == 0
    assert f.queue.bodies == []


def test_100k_ranks_fan_out_into_shards_each_judged_within_the_period():
    jobs = [job(i, 1024) for i in range(98)]  # 100,352 ranks
    f = fanout(jobs)
    shards = f.send(jobs, NOW, None)
    assert shards == len(f.queue.bodies) > 1
    sent = [json.loads(b) for b in f.queue.bodies]
    assert sorted(j for m in sent for j, _ in m["jobs"]) == sorted(j.job_id for j in jobs)
    for m in sent:  # each shard's judging fits a fraction of the period
        ranks = sum(f.store.jobs[j].spec.ranks for j, _ in m["jobs"])
        assert ranks * RANK_COST_S <= PERIOD_S / 10
        assert m["scan_at"] == iso(NOW)


def test_a_job_larger_than_a_shard_goes_alone():
    shards = pack([job(0, 50_000), job(1, 10), job(2, 10)], shard_ranks=1000)
    assert [[j.job_id for j in s] for s in shards] == [["j000000"], ["j000001", "j000002"]]


def test_a_shard_judges_only_jobs_still_running_in_the_same_attempt():
    jobs = [job(1, 8), job(2, 8, state=JobState.SUCCEEDED), job(3, 8, attempt=2)]
    f = fanout(jobs)
    judged = []
    body = json.dumps({"type": "SCAN", "scan_at": iso(NOW), "suppressed": "blind",
                       "jobs": [["j000001", 1], ["j000002", 1], ["j000003", 1], ["gone", 1]]})
    f.judge(body, lambda j, now, why: judged.append((j.job_id, why)) or 1)
    assert judged == [("j000001", "blind")]


def test_a_shard_older_than_a_period_is_dropped():
    f = fanout([job(1, 8)], clock=lambda: NOW + timedelta(seconds=PERIOD_S + 1))
    body = json.dumps({"type": "SCAN", "scan_at": iso(NOW), "suppressed": None,
                       "jobs": [["j000001", 1]]})
    assert f.judge(body, lambda *a: pytest.fail("judged a stale shard")) == 0


@pytest.mark.parametrize("body", ["not json", '{"type": "PLACE"}', '{"type": "SCAN"}'])
def test_a_message_that_is_no_shard_raises(body):
    with pytest.raises(ValueError):
        fanout().judge(body, lambda *a: 0)
