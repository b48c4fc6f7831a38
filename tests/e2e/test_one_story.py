"""One story on every surface (issue 47, item 3), with real agents and real
ranks: a finished job's ranks end at their last step, and a rank stopped
(SIGSTOP) and continued (SIGCONT) leaves a ``recovered`` event with its time."""
from __future__ import annotations

import contextlib
import os
import signal
import sys

import pytest

from tests.support.agents import reached
from tests.support.stacks import Api
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

#: steps 1..60 in about a second and a half, then exits 0: with the default
#: 10 s interval the agent's interval post sees an early step at best
SIXTY_STEPS = ("import time\n"
               "from gpujobs_heartbeat import beat\n"
               "for i in range(1, 61):\n"
               "    beat(step=i)\n"
               "    time.sleep(0.025)\n")

#: rank 1 says its pid, then every rank beats every 0.1 s until stopped
BEATS_ON = ("import os, time\n"
            "from gpujobs_heartbeat import beat\n"
            "if os.environ['RANK'] == '1': print('pid', os.getpid(), flush=True)\n"
            "i = 0\n"
            "while True:\n"
            "    i += 1\n"
            "    beat(step=i)\n"
            "    time.sleep(0.1)\n")


@pytest.fixture
def tenant(agent_stack):
    return Api(agent_stack.api, "e2e-tenant")


def test_a_finished_jobs_ranks_show_their_last_step(tenant, gpujobs):
    """Invariant: a job whose ranks beat step 60 and exited shows step 60 for
    each rank once it finished (the agent posts the last beats before the
    exit), in the API's ranks view and in `gpujobs ranks`'s STEP column."""
    job = tenant.post("/v1/jobs", json={"command": [sys.executable, "-c", SIXTY_STEPS],
                                        "ranks": 2}).json()
    done = reached(tenant, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert done["state"] == "SUCCEEDED", done
    view = tenant.get(f"/v1/jobs/{job['id']}/ranks").json()
    assert {r["rank"]: r["step"] for r in view["ranks"]} == {0: 60, 1: 60}, view
    shown = gpujobs("ranks", job["id"])
    assert shown.returncode == 0, shown.stderr
    rows = [ln.split() for ln in shown.stdout.splitlines() if ln.split()
            and ln.split()[0].isdigit()]
    assert sorted((row[0], row[2]) for row in rows) == [("0", "60"), ("1", "60")], shown.stdout


def _pid(tenant, job_id: str) -> int | None:
    lines = tenant.get(f"/v1/jobs/{job_id}/logs").json().get("lines") or []
    said = [ln["line"].split()[1] for ln in lines if ln["line"].startswith("pid ")]
    return int(said[0]) if said else None


def test_a_rank_stopped_then_continued_is_a_recovered_event_with_its_time(tenant, gpujobs):
    """Invariant: once a stalled rank beats again (SIGSTOP, then SIGCONT),
    the job's story has a `recovered` event, after its `stalled` event, with
    its time and the incident it ends; health is OK with one false alarm,
    and `gpujobs describe` shows the event's line."""
    job_id = tenant.post("/v1/jobs", json={
        "command": [sys.executable, "-c", BEATS_ON], "ranks": 2,
        "heartbeat": {"interval_s": 1, "startup_grace_s": 10}}).json()["id"]
    pid = None
    try:
        reached(tenant, job_id, {"RUNNING"})
        pid = poll("rank 1's pid in its log", lambda: _pid(tenant, job_id), timeout=60)
        poll("both ranks beating", lambda: all(
            (r["step"] or 0) >= 3 for r in tenant.get(f"/v1/jobs/{job_id}/ranks").json()["ranks"]),
            timeout=60)
        os.kill(pid, signal.SIGSTOP)
        poll("the stall convicted", lambda: tenant.get(
            f"/v1/jobs/{job_id}").json()["health"]["status"] == "STALLED", timeout=60)
        os.kill(pid, signal.SIGCONT)

        def recovered():
            events = tenant.get(f"/v1/jobs/{job_id}/events").json()["events"]
            return events if any(e["type"] == "recovered" for e in events) else None
        events = poll("a recovered event", recovered, timeout=60)
        [stalled] = [e for e in events if e["type"] == "stalled"]
        [back] = [e for e in events if e["type"] == "recovered"]
        assert events.index(stalled) < events.index(back)
        assert back["rank"] == 1 and back["incident"] == "1#1" and back["time"] > stalled["time"]
        assert back["reason"].startswith("rank 1 beat again"), back
        health = tenant.get(f"/v1/jobs/{job_id}").json()["health"]
        assert health["status"] == "OK" and health["false_alarms"] == 1, health
        shown = gpujobs("describe", job_id)
        line = next((ln for ln in shown.stdout.splitlines() if " recovered " in ln), None)
        assert line is not None and "rank 1 beat again" in line, shown.stdout
    finally:
        tenant.post(f"/v1/jobs/{job_id}/cancel")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


#: an instrumented job whose ranks take a few seconds to their first beat
#: (imports, data loading), then beat until stopped
SLOW_START = ("import time\n"
              "from gpujobs_heartbeat import beat\n"
              "time.sleep(4)\n"
              "i = 0\n"
              "while True:\n"
              "    i += 1\n"
              "    beat(step=i)\n"
              "    time.sleep(0.1)\n")


def test_an_instrumented_job_waits_for_its_first_beat_and_never_reads_not_instrumented(
        tenant, gpujobs):
    """Invariant: before its first beat, inside its startup grace, a job's
    ranks are awaiting their first beat (the CLI: "waiting for the first
    beat"), never "not instrumented"; then they are live."""
    job_id = tenant.post("/v1/jobs", json={
        "command": [sys.executable, "-c", SLOW_START], "ranks": 2,
        "heartbeat": {"interval_s": 1, "startup_grace_s": 30}}).json()["id"]
    seen: set[str] = set()
    try:
        reached(tenant, job_id, {"RUNNING"})
        shown = gpujobs("ranks", job_id).stdout

        def live():
            view = tenant.get(f"/v1/jobs/{job_id}/ranks").json()
            statuses = {r["status"] for r in view["ranks"]}
            seen.update(statuses)
            return statuses == {"live"}
        poll("both ranks live", live, timeout=60)
        assert "not_instrumented" not in seen, seen
        assert "awaiting_first_beat" in seen, seen
        assert "waiting for the first beat" in shown and "not instrumented" not in shown, shown
    finally:
        tenant.post(f"/v1/jobs/{job_id}/cancel")
