"""Nodes an operator takes out of service, with real agents and real ranks on a
local stack (issue 28): a drain preempts a training job, which gets SIGTERM,
saves a checkpoint, requeues without using up max_attempts and resumes on
another node; a drain that waits lets the job finish; a node where attempts
keep failing cordons itself, and uncordoning it brings it back.

One stack for the module; its agents (two nodes of one GPU type, one of
another) are started here by pid and stopped by it, also when a test fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.agents import job, log_lines, real_agents, submitted
from tests.support.cli import cli_runner
from tests.support.reach import example
from tests.support.stacks import Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

GPU_TYPE, FLAKY = "draingpu", "flakygpu"
NODES = {"drain-1": GPU_TYPE, "drain-2": GPU_TYPE, "flaky-1": FLAKY}
OPERATOR = "e2e-operator"
EXAMPLE = example("resume_training.py")
#: 10 s of steps: longer than a loaded machine takes to ship the first line
#: and drain (at 40 steps of 0.1 s, a fresh clone's job once finished first)
STEPS = "200"


@pytest.fixture(scope="module")
def drain_stack(nodes_stack):
    with borrowed(nodes_stack, NODES, GPUJOBS_SCAN_PERIOD_S="0.5",
                  GPUJOBS_AUTO_CORDON_FAILURES="2") as s:
        yield s


@pytest.fixture(scope="module")
def agents(drain_stack, tmp_path_factory):
    with real_agents(drain_stack.api,
                     {n: (2 if t == GPU_TYPE else 1, t) for n, t in NODES.items()},
                     tmp_path_factory.mktemp("drain-agents"), grace_s=5) as procs:
        yield procs


@pytest.fixture
def tenant(drain_stack, agents):
    return Api(drain_stack.api, "e2e-tenant")


@pytest.fixture
def gpujobs(drain_stack, agents, tmp_path):
    return cli_runner(drain_stack.api, tmp_path / "xdg")


@pytest.fixture
def ops(drain_stack, agents):
    return Api(drain_stack.api, OPERATOR)


def submit(tenant: Api, command: list[str], **spec) -> str:
    return submitted(tenant, command, **{"gpu_type": GPU_TYPE, **spec})


def node(tenant: Api, node_id: str) -> dict:
    return tenant.get(f"/v1/nodes/{node_id}").json()


def running_on(tenant: Api, job_id: str) -> str:
    """The one node the job's first attempt runs on, once it runs."""
    def placed():
        attempts = tenant.get(f"/v1/jobs/{job_id}/attempts").json()["attempts"]
        return attempts and job(tenant, job_id)["state"] == "RUNNING" and attempts[0]
    [where] = {p["node_id"] for p in poll("attempt 1 runs", placed)["placement"]}
    return where


def uncordon_all(ops: Api) -> None:
    for n in NODES:
        assert ops.post(f"/v1/nodes/{n}/uncordon").status_code == 200


def test_a_drained_node_s_job_saves_its_checkpoint_requeues_and_resumes_elsewhere(
        tenant, ops, shared_dir):
    job_id = submit(tenant, [sys.executable, EXAMPLE, "--steps", STEPS, "--step-s", "0.05",
                             "--save-every", "1000"],  # saves only when told to stop
                    checkpoint_dir=str(shared_dir))
    first = running_on(tenant, job_id)
    poll("a few steps done", lambda: any("starting from step 0" in line
                                         for line in log_lines(tenant, job_id, 1)))
    try:
        r = ops.post(f"/v1/nodes/{first}/drain", json={"reason": "bad ECC on GPU 1"})
        assert r.status_code == 202, r.text
        assert r.json()["state"] == "DRAINING" and r.json()["cordon"]["by"] == "ops-oncall"
        done = poll("the job ends", lambda: (j := job(tenant, job_id))["state"] in (
            "SUCCEEDED", "FAILED") and j)
        assert (done["state"], done["attempt"], done["uncounted_retries"]) == (
            "SUCCEEDED", 2, 1), "max_attempts 1: the preemption did not count"
        second_at = tenant.get(f"/v1/jobs/{job_id}/attempts").json()["attempts"][1]
        assert {p["node_id"] for p in second_at["placement"]} == {"drain-1", "drain-2"} - {
            first}, "elsewhere: the drained node takes nothing"
        [retried] = [e for e in tenant.get(f"/v1/jobs/{job_id}/events").json()["events"]
                     if e["type"] == "retried"]
        assert retried["reason"] == "preempted"
        assert retried["decision"] == (f"preempted (node {first} drained: bad ECC on GPU 1): "
                                       "retried, not counted (uncounted retry 1 of 10)")
        # rank 0's: the lines come in time order, and the ranks step on their own
        try:
            stopped = poll("rank 0's last words in attempt 1", lambda: [
                line for line in log_lines(tenant, job_id, 1)
                if line.startswith("0: ") and "saved" in line])
        except AssertionError as e:  # what each attempt said, and how attempt 1 ended
            raise AssertionError(f"{e}: {log_lines(tenant, job_id, 1)} "
                                 f"{log_lines(tenant, job_id, 2)} "
                                 f"{tenant.get(f'/v1/jobs/{job_id}/attempts').text}") from None
        step = int(stopped[0].split("stopped at step ")[1].split(",")[0])
        second = poll("attempt 2's log", lambda: (got := log_lines(tenant, job_id, 2))
                      and f"0: rank 0: done at step {STEPS}" in got and got)
        assert f"0: rank 0 attempt 2: resuming from step {step}" in second, second
        assert json.loads(Path(shared_dir, job_id, "rank-0.json").read_text())["step"] == int(STEPS)
        assert node(tenant, first)["state"] == "DRAINING", "it stays out until uncordoned"
    finally:
        uncordon_all(ops)


def test_a_drain_that_waits_lets_the_job_finish_and_leaves_the_node_empty(tenant, ops,
                                                                         gpujobs):
    job_id = submit(tenant, [sys.executable, "-c", "import time; time.sleep(3)"])
    where = running_on(tenant, job_id)
    try:
        r = gpujobs("nodes", "drain", where, "--reason", "retire", "--wait",
                    "--interval", "0.5", "--timeout", "60", GPUJOBS_TOKEN=OPERATOR)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert "its running jobs may finish" in lines[0], r.stdout
        assert lines[-1] == f"Drained: {where} has no job left (0 of 2 GPUs in use).", r.stdout
        done = job(tenant, job_id)
        assert (done["state"], done["attempt"]) == ("SUCCEEDED", 1), "it finished, unpreempted"
        listed = gpujobs("nodes")
        assert listed.returncode == 0 and "retire (by ops-oncall" in listed.stdout, \
            listed.stdout
        assert node(tenant, where)["state"] == "DRAINING"
        other = submit(tenant, ["true"], ranks=4)  # needs both nodes: waits
        assert poll("it waits", lambda: job(tenant, other)["pending_reason"]).startswith(
            "waiting for 4 x 1 free draingpu GPUs")
        uncordon_all(ops)
        assert poll("placed once uncordoned", lambda: job(tenant, other)["state"]
                    == "SUCCEEDED")
    finally:
        uncordon_all(ops)


def test_a_node_where_attempts_keep_failing_cordons_itself(drain_stack, tenant, ops):
    """...once jobs of two tenants failed there: one tenant's failing jobs,
    however many, never take a node out of service for everyone (issue 41)."""
    failing = [sys.executable, "-c", "import sys; sys.exit(5)"]
    other = Api(drain_stack.api, "e2e-other")
    try:
        for who in (tenant, tenant, other):
            job_id = submit(who, failing, ranks=1, gpu_type=FLAKY)
            poll("it fails", lambda j=job_id, who=who: job(who, j)["state"] == "FAILED")
            if who is tenant:  # the failure is noted as the job ends: no wait needed
                assert not node(tenant, "flaky-1").get("cordon"), "one tenant's failures"
        flaky = poll("auto-cordoned", lambda: (n := node(tenant, "flaky-1"))["cordon"] and n)
        assert flaky["state"] == "DRAINING"
        assert flaky["cordon"]["reason"] == ("auto-cordoned: attempts of 3 jobs of 2 tenants "
                                             "ended rank_failed here within 3600 s")
        assert (flaky["cordon"]["by"], flaky["cordon"]["auto"]) == ("gpujobs", True)
        waiting = submit(tenant, ["true"], ranks=1, gpu_type=FLAKY)
        assert poll("it waits", lambda: job(tenant, waiting)["pending_reason"])
        assert ops.post("/v1/nodes/flaky-1/uncordon").json()["state"] == "READY"
        assert poll("placed once uncordoned", lambda: job(tenant, waiting)["state"]
                    == "SUCCEEDED")
    finally:
        uncordon_all(ops)
