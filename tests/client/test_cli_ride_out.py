"""`watch` and `logs -f` ride through an outage of the API (a restart of the
control plane) against the fake server: they retry with backoff, say so on
stderr (nothing with -o json), go on from where they were, each log line
once, and end with the job's exit code; past the budget they give up (exit
6); a restarted local stack's new address is picked up from its file. The
real restart of a stack is tests/client/test_e2e_cli_restart.py."""
from __future__ import annotations

import json

from gpujobs_client.client import _LogFollow, _ms
from gpujobs_client.config import save_file

from .fakeserver import FakeApi
from .test_cli_logs import line, running_job

DOWN = "the API at {url} does not answer"
BACK = "the API answers again, after"


def outage(fake, path: str, drops: int = 2, unavailable: int = 6) -> None:
    """The next reads of ``path`` get no answer (``drops``), then a 503 with
    Retry-After: 0 (a gateway whose backend restarts; no wait, so the test
    is quick): more failed sends in a row than a plain command's 5."""
    fake.fail("GET", path, "drop_before", times=drops)
    fake.fail("GET", path, "status", times=unavailable, status=503, code="unavailable",
              headers={"Retry-After": "0"})


def test_logs_follow_rides_through_an_outage_each_line_once(run, fake):
    """Invariant: reads of `logs -f` that get no answer (or a 503) are
    retried past a plain command's 5 sends until the API answers again; the lines printed are every line once, in order,
    and the command ends 0 when the job does; stderr says the API did not
    answer and then did."""
    job = running_job(fake, ranks=2)
    lines = fake.logs[job["id"]] = [line(0, "a0", "2030-01-01T00:00:00.000Z", seq=0),
                                    line(1, "a1", "2030-01-01T00:00:00.001Z", seq=0)]
    gets = []

    def on_get(_):
        gets.append(1)
        if len(gets) == 2:  # the outage: the next reads of the logs and the job drop
            outage(fake, rf"/v1/jobs/{job['id']}/logs")
            outage(fake, rf"/v1/jobs/{job['id']}", drops=1)
            lines.append(line(0, "b0", "2030-01-01T00:00:01.000Z", seq=3))
            lines.append(line(1, "b1", "2030-01-01T00:00:01.001Z", seq=3))
        if len(gets) == 3:
            fake.update_job(job["id"], state="SUCCEEDED")
            lines.append(line(1, "c1", "2030-01-01T00:00:02.000Z", seq=6))

    fake.on_get_job.append(on_get)
    r = run("logs", job["id"], "-f", "--interval", "0")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == ["[rank 0] a0", "[rank 1] a1", "[rank 0] b0",
                                     "[rank 1] b1", "[rank 1] c1"]
    assert DOWN.format(url=fake.url) in r.stderr and BACK in r.stderr
    assert "retrying for up to 60 s" in r.stderr


def test_watch_rides_through_an_outage_and_exits_by_how_the_job_ended(run, fake):
    """Invariant: `watch` retries through reads that get no answer (more
    failed sends than a plain command's 5) and ends
    with the job's own exit code (8: FAILED), not 6; with -o json stdout is
    the snapshots and stderr only the final error object."""
    for output in ("table", "json"):
        job = fake.add_job(ranks=1)
        gets = []

        def on_get(j, gets=gets, job_id=job["id"]):
            if j["id"] != job_id:
                return
            gets.append(1)
            if len(gets) == 1:
                outage(fake, rf"/v1/jobs/{job_id}")
            if len(gets) == 2:
                j.update(state="FAILED", finished_at=fake.now(),
                         exit={"reason": "rank_failed", "exit_code": 1})

        fake.on_get_job.append(on_get)
        r = run("watch", job["id"], "--interval", "0", "-o", output)
        assert r.exit_code == 8, r.output
        if output == "table":
            assert "Job finished: FAILED" in r.stdout
            assert DOWN.format(url=fake.url) in r.stderr and BACK in r.stderr
        else:
            states = [json.loads(x)["job"]["state"] for x in r.stdout.splitlines()]
            assert states == ["PENDING", "FAILED"]
            (err,) = r.stderr.splitlines()
            assert json.loads(err)["error"]["code"] == "job_failed"


def test_past_the_budget_the_follow_gives_up_with_exit_6(run, fake):
    """Invariant: the ride-out has an end: here --retries 2 (3 sends), after
    which the connection error is reported and the exit code is 6."""
    job = running_job(fake, ranks=1)
    fake.fail("GET", rf"/v1/jobs/{job['id']}/logs", "drop_before", times=10)
    r = run("logs", job["id"], "-f", "--interval", "0", "--retries", "2")
    assert r.exit_code == 6, r.output
    assert "Error: cannot reach the API" in r.stderr and "(after 3 attempts)" in r.stderr


def test_watch_follows_a_restarted_local_stack_to_its_new_address(run, fake, tmp_path):
    """Invariant: when the API came from the local stack's file and stops
    answering, each retry reads the file again: a restarted stack on another
    port is found there, said on stderr, and the watch ends by the job."""
    state = tmp_path / "state"
    save_file(state / "cli.toml", {"api_url": fake.url, "token": "t1"})
    job = fake.add_job(ranks=1)
    second = FakeApi().start()
    try:
        second.jobs, second.tenant_of = fake.jobs, fake.tenant_of  # the restored state

        def restart(_):
            if len(fake.sent("GET", rf"/v1/jobs/{job['id']}")) == 2:
                fake.fail("GET", r".*", "drop_before", times=1000)  # the old one is gone
                save_file(state / "cli.toml", {"api_url": second.url, "token": "t1"})

        fake.on_get_job.append(restart)
        second.on_get_job.append(lambda j: j.update(state="CANCELLED", finished_at=fake.now()))
        r = run("watch", job["id"], "--interval", "0", url=False, token=False,
                env={"GPUJOBS_STATE_DIR": str(state)})
        assert r.exit_code == 9, r.output
        assert "Job finished: CANCELLED" in r.stdout
        assert f"the local stack now answers at {second.url}" in r.stderr
        assert second.sent("GET", rf"/v1/jobs/{job['id']}")
    finally:
        second.stop()


def test_a_long_read_widens_the_follow_lookback_by_as_long():
    """Invariant: after a read that took 45 s (a restart ridden through), the
    next polls read from far enough back for the lines written meanwhile
    (shipped late by as long), then the lookback is the usual 30 s again."""
    now = [0.0]
    f = _LogFollow(30, clock=lambda: now[0])
    f.ranks = {0, 1}
    from gpujobs_client.models import LogLine
    f.seen(LogLine.from_json({"rank": 0, "stream": "stdout", "time": "2030-01-01T00:01:00.000Z",
                              "line": "x", "seq": 1, "id": "a"}, 1))
    newest = _ms("2030-01-01T00:01:00.000Z")
    assert _ms(f.since()) == newest - 30_000  # rank 1 not seen: the usual bound
    now[0] = 45.0
    f.waited(45.0)
    assert _ms(f.since()) == newest - 75_000
    now[0] = 60.0
    f.waited(0.01)  # short reads meanwhile keep the widening for its span
    assert _ms(f.since()) == newest - 75_000
    now[0] = 76.0
    assert _ms(f.since()) == newest - 30_000
