"""The tenant event feed over real HTTP on the local stack: followed while six
threads create and cancel jobs, it returns each of their events exactly once,
in id order; ``gpujobs events -f`` prints them as they happen and, killed and
started again, resumes after the last one it printed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.cli import CLIENT_DIR
from tests.support.waits import wait_until

THREADS, JOBS_EACH = 6, 8


def spec(tag: str) -> dict:
    # a GPU type no node has: every job stays PENDING, and a cancel ends it
    return {"command": ["true"], "ranks": 1, "gpu_type": "no-such-gpu", "name": tag}


def read_to_end(api, cursor: str | None = None) -> tuple[list[dict], str]:
    """Every event after ``cursor`` now, and the cursor after them."""
    got: list[dict] = []
    while True:
        r = api.get("/v1/events", params={"page_size": 500, **({"after": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        page = r.json()
        got += page["events"]
        cursor = page["next_cursor"]
        if not page["events"]:
            return got, cursor


def test_a_feed_followed_while_six_threads_create_and_cancel_skips_and_repeats_nothing(api):
    """Invariant (issue 45): following next_cursor from any point returns
    every event recorded after it exactly once, in id order, while events
    are being recorded concurrently with the reads (real threads, real HTTP)."""
    _, start = read_to_end(api)  # from here on
    seen: list[dict] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def follow() -> None:
        cursor = start
        try:
            while not stop.is_set():
                r = api.get("/v1/events", params={"after": cursor, "wait_s": 1})
                assert r.status_code == 200, r.text
                seen.extend(r.json()["events"])
                cursor = r.json()["next_cursor"]
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    def write(n: int) -> list[str]:
        ids = []
        for i in range(JOBS_EACH):
            r = api.post("/v1/jobs", json=spec(f"race-{n}-{i}"))
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
            if i % 2:  # half of them also move: PENDING -> CANCELLED
                c = api.post(f"/v1/jobs/{ids[-1]}/cancel", json={"reason": "race"})
                assert c.status_code == 202, c.text
        return ids

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            created = [j for ids in pool.map(write, range(THREADS)) for j in ids]
        cancelled = {j for n in range(THREADS) for i, j in
                     enumerate(created[n * JOBS_EACH:(n + 1) * JOBS_EACH]) if i % 2}
        expected = len(created) + len(cancelled)
        wait_until(lambda: failures or sum(e["job_id"] in set(created) for e in seen) >= expected,
                   timeout=120, what="the follower to see every event of the racing writers")
    finally:
        stop.set()
        follower.join(timeout=30)
    assert not failures, failures
    ids = [e["id"] for e in seen]
    assert len(ids) == len(set(ids)), "no event twice"
    assert ids == sorted(ids), "in id order"
    mine = [e for e in seen if e["job_id"] in set(created)]
    assert sorted(e["job_id"] for e in mine if e["type"] == "job.created") == sorted(created)
    moved = [(e["job_id"], e["data"]["from"], e["data"]["to"]) for e in mine
             if e["type"] == "job.state_changed"]
    assert sorted(moved) == sorted((j, "PENDING", "CANCELLED") for j in cancelled)
    # and a read from the start agrees with what was followed
    everything, _ = read_to_end(api)
    assert [e["id"] for e in everything if e["job_id"] in set(created)] == \
        [e["id"] for e in mine]


@pytest.fixture
def follow_cli(stack, tmp_path):
    """``gpujobs events -f ...`` as a user runs it, a process of its own with
    its stdout read line by line; each stopped (by its own pid) at the end."""
    procs: list[subprocess.Popen] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_API_URL": stack.api, "GPUJOBS_TOKEN": "e2e-tenant",
                "XDG_CONFIG_HOME": str(tmp_path / "config"),
                "XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "200",
                "NO_COLOR": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(CLIENT_DIR),
                                                          env.get("PYTHONPATH")) if p)})

    def start(*args: str) -> tuple[subprocess.Popen, list[str]]:
        p = subprocess.Popen([sys.executable, "-m", "gpujobs_client.cli", "events", "-f", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True)
        procs.append(p)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")),
                         daemon=True).start()
        return p, lines

    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_events_follow_prints_as_it_happens_and_resumes_after_a_kill(api, follow_cli):
    job = api.post("/v1/jobs", json=spec("follow-me")).json()["id"]
    first, lines = follow_cli("--job", job)
    wait_until(lambda: any("job.created" in line for line in lines), timeout=60,
               what="gpujobs events -f to print the job's creation")
    assert any(job in line and "created" in line for line in lines), lines
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    assert api.post(f"/v1/jobs/{job}/cancel", json={"reason": "enough"}).status_code == 202
    _, again = follow_cli("--job", job)
    wait_until(lambda: any("CANCELLED" in line for line in again), timeout=60,
               what="the restarted follow to print the cancel")
    assert [line for line in again if job in line] == \
        [next(line for line in again if "CANCELLED" in line)], \
        f"resumed after the creation, not from the start: {again}"
    assert "PENDING -> CANCELLED" in "".join(again)


def test_a_jobs_events_reach_a_webhook_signed_and_the_bus_as_they_happen(api, stack):
    """Invariant (issue 45): what the feed tells is pushed, off the request
    path, to the tenant's webhooks (a real receiver verifies each signature
    with the standardwebhooks library) and to the bus, once per event id."""
    from standardwebhooks.webhooks import Webhook

    from tests.support.webhook_receiver import Receiver

    with Receiver() as receiver:
        made = api.post("/v1/webhooks", json={"url": receiver.url("/feed"),
                                              "types": ["job.created", "job.state_changed"]})
        assert made.status_code == 201, made.text
        hook = made.json()
        try:
            job = api.post("/v1/jobs", json=spec("told")).json()["id"]
            assert api.post(f"/v1/jobs/{job}/cancel", json={}).status_code == 202

            def mine() -> list[dict]:
                out = []
                for r in receiver.at("/feed"):
                    event = Webhook(hook["secret"]).verify(r.body, r.headers)
                    assert r.headers["webhook-id"] == event["id"]
                    if event["job_id"] == job:
                        out.append(event)
                return out
            got = wait_until(lambda: len({e["id"] for e in mine()}) >= 2 and mine(), timeout=60,
                             what="the job's creation and cancel at the webhook")
            assert sorted({(e["type"], e["data"].get("to")) for e in got}) == [
                ("job.created", None), ("job.state_changed", "CANCELLED")]
            feed_ids = [e["id"] for e in api.get("/v1/events", params={"job_id": job}).json()[
                "events"]]
            assert sorted({e["id"] for e in got}) == sorted(feed_ids)
        finally:
            api.delete(f"/v1/webhooks/{hook['id']}")
