"""The training lifecycle with real agents and real ranks on a local stack
(issue 26), one test per kind of rule: a lost node retried without using up
max_attempts, a time limit's warning then SIGTERM, a wait past max_pending_s,
a crash loop stopped at its cap, an exit code that fails at once, and a
retried job resuming from its checkpoint (examples/resume_training.py).

One stack for the module, with a short GPUJOBS_NODE_DOWN_AFTER_S; its two
agents (2 GPUs of a type no other test uses) are started here, by pid, so a
test can pause one. Every assertion on an end reads the event text and
`gpujobs describe` as a person would.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from tests.support.agents import ended, events, job, log_lines, real_agents, submitted
from tests.support.cli import cli_runner
from tests.support.reach import example
from tests.support.stacks import Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

GPU_TYPE, NODES = "lifegpu", ("life-1", "life-2")
#: short enough for the lost-node test, long enough that a loaded machine
#: does not take a live agent for lost (that would add uncounted retries)
DOWN_AFTER_S = 6
EXAMPLE = example("resume_training.py")


@pytest.fixture(scope="module")
def life_stack(nodes_stack):
    with borrowed(nodes_stack, NODES, GPUJOBS_SCAN_PERIOD_S="0.5",
                  GPUJOBS_NODE_DOWN_AFTER_S=str(DOWN_AFTER_S)) as s:
        yield s


@pytest.fixture(scope="module")
def agents(life_stack, tmp_path_factory):
    with real_agents(life_stack.api, {n: (2, GPU_TYPE) for n in NODES},
                     tmp_path_factory.mktemp("lifecycle-agents")) as procs:
        yield procs


@pytest.fixture
def tenant(life_stack, agents):
    return Api(life_stack.api, "e2e-tenant")


def submit(tenant: Api, command: list[str], **spec) -> str:
    return submitted(tenant, command, **{"gpu_type": GPU_TYPE, **spec})


@pytest.fixture
def gpujobs(life_stack, tmp_path):
    return cli_runner(life_stack.api, tmp_path / "xdg")


def describe(gpujobs, job_id: str) -> str:
    """What `gpujobs describe` prints for the job."""
    out = gpujobs("describe", job_id)
    assert out.returncode == 0, out.stderr
    return out.stdout


#: attempt 1 runs until it is stopped; a later attempt ends at once, well
RUNS_UNTIL_RETRIED = ("import os, time\n"
                      "if os.environ['GPUJOBS_ATTEMPT'] == '1':\n"
                      "    time.sleep(3600)\n"
                      "print('attempt', os.environ['GPUJOBS_ATTEMPT'], 'done', flush=True)\n")


def test_a_node_lost_mid_run_is_retried_without_using_up_max_attempts(
        life_stack, agents, tenant, gpujobs):
    job_id = submit(tenant, [sys.executable, "-c", RUNS_UNTIL_RETRIED], ranks=2)
    first = poll("attempt 1 runs", lambda: (a := tenant.get(
        f"/v1/jobs/{job_id}/attempts").json()["attempts"]) and job(
            tenant, job_id)["state"] == "RUNNING" and a[0])
    [lost] = {p["node_id"] for p in first["placement"]}
    agents[lost].send_signal(signal.SIGSTOP)  # its node stops calling in
    try:
        done = ended(tenant, job_id)
    finally:
        agents[lost].send_signal(signal.SIGCONT)  # and stops the failed attempt's ranks
    assert (done["state"], done["attempt"], done["uncounted_retries"]) == (
        "SUCCEEDED", 2, 1), "max_attempts 1, yet a second attempt: the loss did not count"
    [retried] = events(tenant, job_id, "retried")
    assert retried["reason"] == "node_lost" and retried["node_id"] == lost
    assert retried["decision"] == (
        "node_lost (rank 0): retried, not counted (uncounted retry 1 of 10)")
    shown = describe(gpujobs, job_id)
    assert "1 not counted" in shown, shown


#: prints when warned (SIGUSR1) and when told to stop (SIGTERM), then exits
WARNED_THEN_STOPPED = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGUSR1, lambda s, f: print('warned: checkpointing', flush=True))\n"
    "def term(s, f):\n"
    "    print('got SIGTERM', flush=True)\n"
    "    sys.exit(143)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('training', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.05)\n")


def test_an_attempt_over_max_runtime_s_is_warned_then_stopped_and_ends_timeout(
        life_stack, tenant, gpujobs):
    job_id = submit(tenant, [sys.executable, "-c", WARNED_THEN_STOPPED], ranks=1,
                    max_runtime_s=6, warn_before_s=3)
    done = ended(tenant, job_id)
    assert done["state"] == "FAILED" and done["exit"]["reason"] == "timeout", done["exit"]
    assert done["exit"]["decision"] == "timeout: not retried (counted attempt 1 of 1, none left)"
    lines = poll("the rank's log", lambda: (got := log_lines(tenant, job_id, 1))
                 and "0: got SIGTERM" in got and got)
    assert lines.index("0: warned: checkpointing") < lines.index("0: got SIGTERM"), lines
    [finished] = events(tenant, job_id, "finished")
    assert finished["reason"] == "timeout"
    assert "timeout: not retried" in describe(gpujobs, job_id)


def test_a_pending_job_over_max_pending_s_ends_with_the_reason_it_waited(life_stack, tenant):
    job_id = submit(tenant, ["true"], ranks=5, max_pending_s=2)  # 4 GPUs of the type
    done = ended(tenant, job_id)
    assert done["state"] == "FAILED" and done["exit"]["reason"] == "pending_timeout"
    assert done["pending_reason"] == "can never fit: needs 5 lifegpu GPUs; the fleet has 4"
    assert done["exit"]["decision"] == ("waited longer than max_pending_s (2 s): can never "
                                        "fit: needs 5 lifegpu GPUs; the fleet has 4")
    assert done["attempt"] == 0 and tenant.get(
        f"/v1/jobs/{job_id}/attempts").json()["attempts"] == []


def test_a_crash_looping_job_stops_at_its_cap(life_stack, tenant):
    job_id = submit(tenant, [sys.executable, "-c", "import sys; sys.exit(3)"], ranks=1,
                    max_attempts=3)
    done = ended(tenant, job_id)
    assert (done["state"], done["attempt"], done["uncounted_retries"]) == ("FAILED", 3, 0)
    assert [e["decision"] for e in events(tenant, job_id, "retried")] == [
        "rank_failed (rank 0, exit code 3): retried (counted attempt 1 of 3)",
        "rank_failed (rank 0, exit code 3): retried (counted attempt 2 of 3)"]
    assert done["exit"]["decision"] == ("rank_failed (rank 0, exit code 3): not retried "
                                        "(counted attempt 3 of 3, none left)")


def test_an_exit_code_listed_as_fail_now_fails_on_the_first_attempt(life_stack, tenant, gpujobs):
    job_id = submit(tenant, [sys.executable, "-c", "import sys; sys.exit(42)"], ranks=1,
                    max_attempts=5, retry={"rules": [{"exit_codes": [42], "action": "fail"}]})
    done = ended(tenant, job_id)
    assert (done["state"], done["attempt"]) == ("FAILED", 1)
    assert done["exit"]["decision"] == ("rank_failed (rank 0, exit code 42): not retried "
                                        "(rule 1 says fail)")
    assert done["exit"]["node_id"] in NODES
    shown = describe(gpujobs, job_id)
    assert "rule 1 says fail" in shown, shown


def test_a_retried_job_resumes_from_its_checkpoint(life_stack, tenant, shared_dir):
    job_id = submit(tenant, [sys.executable, EXAMPLE, "--steps", "6", "--step-s", "0.1",
                             "--save-every", "1", "--fail-first-attempt-at", "3"],
                    ranks=2, max_attempts=2, checkpoint_dir=str(shared_dir))
    done = ended(tenant, job_id)
    # its second counted attempt (a node taken for lost on a loaded machine
    # would add an uncounted one)
    assert done["state"] == "SUCCEEDED" and done["attempt"] - done["uncounted_retries"] == 2, \
        done
    last = done["attempt"]
    first = poll("attempt 1's log", lambda: (got := log_lines(tenant, job_id, 1))
                 and "0: rank 0: crashing at step 3 (--fail-first-attempt-at)" in got and got)
    assert "0: rank 0 attempt 1: starting from step 0" in first
    second = poll("the last attempt's log", lambda: (got := log_lines(tenant, job_id, last))
                  and "0: rank 0: done at step 6" in got and got)
    [resumed] = [line for line in second if line.startswith(f"0: rank 0 attempt {last}: ")]
    assert resumed.startswith(f"0: rank 0 attempt {last}: resuming from step "), second
    assert int(resumed.rsplit(" ", 1)[1]) >= 3, "from what the first attempt saved, or later"
    saved = json.loads(Path(shared_dir, job_id, "rank-0.json").read_text())
    assert saved["step"] == 6


#: attempt 1: rank 0 exits 3 after a second, rank 1 runs until stopped;
#: attempt 2: both ranks end well after a second
FAILS_ONCE = ("import os, sys, time\n"
              "first, rank = os.environ['GPUJOBS_ATTEMPT'] == '1', os.environ['RANK']\n"
              "time.sleep(1.5 if rank == '0' or not first else 3600)\n"
              "sys.exit(3 if first else 0)\n")


def test_a_failed_then_retried_jobs_usage_is_its_attempts_own_times(life_stack, tenant, gpujobs):
    """Issue 46: the job's usage against what its attempts and story say,
    to a GPU-second a GPU: held is 2 GPUs x each attempt's placement to
    end; attempt 1's time after its ranks started is lost to
    ``failed_attempt``, attempt 2's productive, the rest startup."""
    from chalicelib.domain.clock import parse_iso
    job_id = submit(tenant, [sys.executable, "-c", FAILS_ONCE], ranks=2, max_attempts=2)
    done = ended(tenant, job_id)
    assert done["state"] == "SUCCEEDED", done
    usage = job(tenant, job_id)["usage"]
    attempts = tenant.get(f"/v1/jobs/{job_id}/attempts").json()["attempts"]
    story = tenant.get(f"/v1/jobs/{job_id}/events").json()["events"]
    started = {e["attempt"]: parse_iso(e["time"]) for e in story if e["type"] == "started"}
    held = lost = productive = 0.0
    for a in attempts:
        placed, end = parse_iso(a["created_at"]), parse_iso(a["finished_at"])
        held += 2 * (end - placed).total_seconds()
        ran = 2 * (end - started[a["attempt"]]).total_seconds()
        if a["exit"]["reason"] == "succeeded":
            productive += ran
        else:
            assert a["exit"]["reason"] == "rank_failed", a  # uncounted retries add node_lost
            lost += ran
    per_gpu = 2 * len(attempts)  # a GPU-second a GPU, each attempt
    assert abs(usage["gpu_seconds"] - held) <= per_gpu, (usage, held)
    assert abs(usage["lost_gpu_seconds"].get("failed_attempt", 0) - lost) <= per_gpu, usage
    assert abs(usage["productive_gpu_seconds"] - productive) <= per_gpu, usage
    assert usage["productive_gpu_seconds"] + sum(usage["lost_gpu_seconds"].values()) == \
        usage["gpu_seconds"]
    assert usage["lost_gpu_seconds"]["failed_attempt"] >= 2, "1.5 s of 2 GPUs, at least"
    shown = " ".join(describe(gpujobs, job_id).split())
    assert "GPU-s: " in shown and " productive (" in shown, shown
    assert "failed attempt 1 (rank 0 exited 3)" in shown, shown
