"""Stragglers on fakes (API.md "Stragglers"): one rank's steps take 2.4× the
others' outside collectives; the scan calls it slow only after a sustained
window, tells each episode once, and never calls a paused rank slow."""
from __future__ import annotations

from chalicelib.domain import straggler
from chalicelib.domain.states import JobState

from .helpers import AGENTS, register, submit

SCAN_S = 20.0
FAST, SLOW = 0.5, 1.2
SENTENCE = "rank 1 on n1 is slow: its steps take 2.4× the fastest rank's"


def _running(svc, world, clock, **heartbeat):
    register(svc, "n1", gpus=2)
    register(svc, "n2", gpus=2)
    job = submit(svc, ranks=4, heartbeat={"interval_s": 5, "startup_grace_s": 10, **heartbeat})
    svc.placer.run()
    for n, ranks in (("n1", [0, 1]), ("n2", [2, 3])):
        svc.attempts.report(AGENTS, job.job_id, 1, {"type": "STARTED", "node_id": n,
                                                    "ranks": ranks})
    clock.advance(5)
    return world.store.get(job.job_id)


class Steps:
    def __init__(self, svc, world, clock, job):
        self.svc, self.world, self.clock, self.job, self.step = svc, world, clock, job, 0

    def scan(self, times: dict[int, float], paused: dict[int, float] | None = None) -> dict:
        """A scan period of beats (every 5 s, each rank reporting its step
        time; ``paused`` ranks inside a declared pause of that many seconds
        left), then a scan; the job's health after it."""
        for _ in range(int(SCAN_S // 5)):
            self.step += 1
            entries = []
            for r, t in times.items():
                e: dict = {"rank": r, "step": self.step, "step_time_s": t}
                if paused and r in paused:
                    e["pause"] = {"reason": "checkpoint", "remaining_s": paused[r]}
                entries.append(e)
            self.svc.heartbeats.ingest(AGENTS, self.job.job_id, {"attempt": 1, "ranks": entries})
            self.clock.advance(5)
        self.svc.scanner.run()
        return self.world.store.get(self.job.job_id).health

    def slow_events(self) -> list[dict]:
        return [e for e in self.svc.store.events(self.job.job_id) if e["type"] == "rank_slow"]


def _scans_to_call() -> int:
    # MIN_SCANS in a row, spanning MIN_SUSTAIN_S
    return max(straggler.MIN_SCANS, int(straggler.MIN_SUSTAIN_S // SCAN_S) + 1)


def test_a_rank_slower_for_a_sustained_window_is_called_slow_once(svc, world, clock):
    job = _running(svc, world, clock)
    steps = Steps(svc, world, clock, job)
    slow = {0: FAST, 1: SLOW, 2: FAST, 3: FAST * 1.05}
    needed = _scans_to_call()
    for i in range(needed - 1):
        health = steps.scan(slow)
        assert health["slow_ranks"] == [], f"called slow after only {i + 1} scans"
    health = steps.scan(slow)
    assert health["slow_ranks"] == [1]
    for _ in range(3):
        assert steps.scan(slow)["slow_ranks"] == [1]
    [event] = steps.slow_events()
    assert (event["rank"], event["node_id"], event["reason"], event["episode"]) == (
        1, "n1", SENTENCE, 1)
    assert event["score"] == round(FAST / SLOW, 3)
    # the ranks view: every rank's step time and score, and the sentence
    ranks = {r["rank"]: r for r in svc.heartbeats.ranks(world.store.get(job.job_id))["ranks"]}
    assert ranks[1]["step_time_s"] == SLOW and ranks[1]["slow_score"] == round(FAST / SLOW, 3)
    assert ranks[0]["slow_score"] == 1.0 and ranks[0]["slow_text"] is None
    assert ranks[1]["slow_text"] == SENTENCE
    assert world.store.get(job.job_id).state is JobState.RUNNING


def test_a_checkpoint_pause_never_makes_a_rank_slow(svc, world, clock):
    job = _running(svc, world, clock)
    steps = Steps(svc, world, clock, job)
    slow = {0: FAST, 1: SLOW, 2: FAST, 3: FAST}
    # rank 1 reports a long step time while it checkpoints, every other scan
    for i in range(10):
        health = steps.scan(slow, paused={1: 30.0} if i % 2 == 0 else None)
        assert health["slow_ranks"] == []
    assert steps.slow_events() == []


def test_a_recovered_rank_ends_its_episode_and_a_new_slowdown_is_a_second(svc, world, clock):
    job = _running(svc, world, clock)
    steps = Steps(svc, world, clock, job)
    slow, ok = {0: FAST, 1: SLOW, 2: FAST, 3: FAST}, {0: FAST, 1: FAST, 2: FAST, 3: FAST}
    needed = _scans_to_call()
    for _ in range(needed):
        steps.scan(slow)
    assert len(steps.slow_events()) == 1
    for _ in range(straggler.RECOVER_SCANS):
        health = steps.scan(ok)
    assert health["slow_ranks"] == []
    for _ in range(needed):
        health = steps.scan(slow)
    assert health["slow_ranks"] == [1]
    assert [e["episode"] for e in steps.slow_events()] == [1, 2]


def test_the_jobs_threshold_decides(svc, world, clock):
    job = _running(svc, world, clock, slow_score=0.3)
    steps = Steps(svc, world, clock, job)
    for _ in range(6):  # 0.417 is above 0.3
        assert steps.scan({0: FAST, 1: SLOW, 2: FAST, 3: FAST})["slow_ranks"] == []
    assert steps.slow_events() == []
