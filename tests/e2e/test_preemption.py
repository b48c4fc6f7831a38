"""Preemption by priority class with a real agent and real ranks on a local
stack (issue 28): an urgent job that does not fit takes the GPUs of a running
batch training job. The victim gets SIGTERM, saves its checkpoint, requeues
without using up max_attempts, waits while the urgent job runs, and resumes
from its saved step.

One stack for the module with two classes; its agent (one node of 2 GPUs of a
type no other test uses) is started here by pid and stopped by it, also when
the test fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import stop_agent, wait_until
from tests.stacks import ROOT, TOKENS, Api, start_stack

pytestmark = pytest.mark.e2e

NODE, GPU_TYPE, AGENT_TOKEN = "prio-1", "priogpu", "e2e-prio-agent"
CLASSES = {"urgent": {"value": 1000, "preempts": True}, "batch": {"value": -100}}
EXAMPLE = str(ROOT / "examples" / "resume_training.py")


@pytest.fixture(scope="module")
def prio_stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("prio"),
                    TOKENS + [{"token": AGENT_TOKEN, "agent": NODE}],
                    GPUJOBS_AGENTS="0", GPUJOBS_SCAN_PERIOD_S="0.5",
                    GPUJOBS_PRIORITY_CLASSES=json.dumps(CLASSES),
                    GPUJOBS_PREEMPT_MIN_RUNTIME_S="1")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def agent(prio_stack, tmp_path_factory):
    base = tmp_path_factory.mktemp("prio-agent")
    log = open(base / "agent.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--node-id", NODE, "--gpus", "2", "--gpu-type",
         GPU_TYPE, "--api", prio_stack.api, "--state-dir", str(base / "state"),
         "--grace-s", "5", "--poll-wait-s", "1", "--node-heartbeat-s", "0.5",
         "--log-level", "INFO", "--rank-user", ""],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
        env={**os.environ, "GPUJOBS_AGENT_TOKEN": AGENT_TOKEN,
             "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
             "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        reader = Api(prio_stack.api, "e2e-tenant")
        wait_until(lambda: (r := reader.get(f"/v1/nodes/{NODE}")).status_code == 200
                   and r.json()["state"] == "READY", 60, 0.2, "the node READY")
        yield proc
    finally:
        stop_agent(proc, base / "state")
        log.close()


def poll(what: str, fn, timeout: float = 90):
    return wait_until(fn, timeout, 0.2, what)


def submit(api: Api, command: list[str], **spec) -> str:
    body = {"command": command, "ranks": 2, "gpu_type": GPU_TYPE, "max_attempts": 1,
            "heartbeat": {"mode": "off"}, **spec}
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def job(api: Api, job_id: str) -> dict:
    return api.get(f"/v1/jobs/{job_id}").json()


def events(api: Api, job_id: str, kind: str) -> list[dict]:
    return [e for e in api.get(f"/v1/jobs/{job_id}/events").json()["events"]
            if e["type"] == kind]


def log_lines(api: Api, job_id: str, attempt: int) -> list[str]:
    r = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt})
    assert r.status_code == 200, r.text
    return [f"{line['rank']}: {line['line']}" for line in r.json()["lines"]]


def test_an_urgent_job_preempts_a_batch_one_which_checkpoints_and_resumes_later(
        prio_stack, agent, tmp_path):
    acme, globex = Api(prio_stack.api, "e2e-tenant"), Api(prio_stack.api, "e2e-other")
    shared = tmp_path / "shared"
    batch = submit(acme, [sys.executable, EXAMPLE, "--steps", "40", "--step-s", "0.1",
                          "--save-every", "1000"],  # saves only when told to stop
                   priority_class="batch", checkpoint_dir=str(shared))
    poll("the batch job trains", lambda: any(
        "starting from step 0" in line for line in log_lines(acme, batch, 1)))
    urgent = submit(globex, [sys.executable, "-c", "import time; time.sleep(2)"],
                    priority_class="urgent")
    preempting = poll("it preempts", lambda: events(globex, urgent, "preempting"))
    assert preempting[0]["jobs"] == [batch]
    assert "preempting " + batch in preempting[0]["reason"]
    done = poll("the urgent job ends", lambda: (j := job(globex, urgent))["state"] in (
        "SUCCEEDED", "FAILED") and j)
    assert (done["state"], done["attempt"]) == ("SUCCEEDED", 1)
    resumed = poll("the batch job ends", lambda: (j := job(acme, batch))["state"] in (
        "SUCCEEDED", "FAILED") and j, timeout=120)
    assert (resumed["state"], resumed["attempt"], resumed["uncounted_retries"]) == (
        "SUCCEEDED", 2, 1), "max_attempts 1: the preemption did not count"
    [retried] = events(acme, batch, "retried")
    assert retried["decision"] == (f"preempted (by {urgent}, priority class urgent): retried, "
                                   "not counted (uncounted retry 1 of 10)")
    stopped = poll("its last words", lambda: [
        line for line in log_lines(acme, batch, 1) if line.startswith("0: rank 0: stopped")])
    step = int(stopped[0].split("stopped at step ")[1].split(",")[0])
    second = poll("attempt 2's log", lambda: (got := log_lines(acme, batch, 2))
                  and "0: rank 0: done at step 40" in got and got)
    assert f"0: rank 0 attempt 2: resuming from step {step}" in second, second
    assert json.loads(Path(shared, batch, "rank-0.json").read_text())["step"] == 40
    [placed_again] = [e for e in events(acme, batch, "placed") if e["attempt"] == 2]
    assert placed_again["time"] >= done["finished_at"], "it waited while the urgent job ran"
