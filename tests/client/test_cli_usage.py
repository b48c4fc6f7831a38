"""`gpujobs describe` says what a job's GPU time bought (``job.usage``): one
sentence, productive first, then each cause, largest first, the failed
attempt named by its first failed rank, and a bar of the same parts."""
from __future__ import annotations

import json


def _failed_then_succeeded(fake, usage):
    job = fake.add_job(ranks=4, max_attempts=2)
    first = fake.place(job["id"], ["n1", "n2"])
    first.update(state="FAILED", finished_at=fake.now(),
                 exit={"reason": "rank_failed", "exit_code": 1, "rank": 3, "node_id": "n2"})
    fake.place(job["id"], ["n1", "n2"])
    fake.end(job["id"], "SUCCEEDED")
    fake.update_job(job["id"], usage=usage)
    return job


USAGE = {"gpu_seconds": 44640, "productive_gpu_seconds": 36360,
         "lost_gpu_seconds": {"failed_attempt": 5760, "stalled": 1800, "startup": 720},
         "goodput": 0.8145, "estimated": False}


def test_describe_says_what_the_gpu_time_bought_in_a_sentence_and_a_bar(run, fake):
    job = _failed_then_succeeded(fake, USAGE)
    r = run("describe", job["id"])
    assert r.exit_code == 0, r.output
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    at = lines.index("usage")
    assert lines[at + 1] == ("held 12.4 GPU-h: 10.1 productive (81 %), 1.6 failed attempt 1 "
                             "(rank 3 exited 1), 0.5 stalled, 0.2 startup")
    bar = lines[at + 2]
    # productive, then each cause in the sentence's order, each its share of
    # 40 marks by largest remainder (32.6, 5.2, 1.6, 0.6)
    assert bar == "█" * 32 + "▓" * 5 + "▒" * 2 + "░"


def test_an_estimated_usage_says_so_and_small_jobs_count_in_gpu_minutes(run, fake):
    job = _failed_then_succeeded(fake, {
        "gpu_seconds": 1280, "productive_gpu_seconds": 800,
        "lost_gpu_seconds": {"failed_attempt": 360, "startup": 120}, "goodput": 0.625,
        "estimated": True})
    lines = [ln.strip() for ln in run("describe", job["id"]).stdout.splitlines()]
    assert lines[lines.index("usage") + 1] == (
        "held 21.3 GPU-min: 13.3 productive (62 %), 6.0 failed attempt 1 (rank 3 exited 1), "
        "2.0 startup (estimated: no steps recorded)")


def test_a_job_that_held_nothing_says_so_and_json_has_the_usage(run, fake):
    job = fake.add_job(ranks=2)
    fake.update_job(job["id"], usage={"gpu_seconds": 0, "productive_gpu_seconds": 0,
                                      "lost_gpu_seconds": {}, "goodput": None,
                                      "estimated": False})
    lines = [ln.strip() for ln in run("describe", job["id"]).stdout.splitlines()]
    assert lines[lines.index("usage") + 1] == "held no GPU time yet"
    out = json.loads(run("describe", job["id"], "-o", "json").stdout)
    assert out["job"]["usage"]["gpu_seconds"] == 0


def test_a_server_without_usage_shows_none(run, fake):
    job = fake.add_job(ranks=2)
    assert "usage" not in [ln.strip() for ln in run("describe", job["id"]).stdout.splitlines()]
