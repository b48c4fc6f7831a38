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
import sys
from pathlib import Path

import pytest

from tests.support.agents import events, job, log_lines, real_agents, submitted
from tests.support.reach import example
from tests.support.stacks import Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

NODE, GPU_TYPE = "prio-1", "priogpu"
CLASSES = {"urgent": {"value": 1000, "preempts": True}, "batch": {"value": -100}}
EXAMPLE = example("resume_training.py")
#: 10 s of steps: longer than a loaded machine takes to ship the first line
#: and preempt it (at 40 steps of 0.1 s, a fresh clone's drained job once finished first)
STEPS = "200"


@pytest.fixture(scope="module")
def prio_stack(nodes_stack):
    with borrowed(nodes_stack, [NODE], GPUJOBS_SCAN_PERIOD_S="0.5",
                  GPUJOBS_PRIORITY_CLASSES=json.dumps(CLASSES),
                  GPUJOBS_PREEMPT_MIN_RUNTIME_S="1") as s:
        yield s


@pytest.fixture(scope="module")
def agent(prio_stack, tmp_path_factory):
    with real_agents(prio_stack.api, {NODE: (2, GPU_TYPE)}, tmp_path_factory.mktemp("prio"),
                     grace_s=5) as procs:
        yield procs[NODE]


def submit(api: Api, command: list[str], **spec) -> str:
    return submitted(api, command, **{"gpu_type": GPU_TYPE, **spec})


def test_an_urgent_job_preempts_a_batch_one_which_checkpoints_and_resumes_later(
        prio_stack, agent, shared_dir):
    acme, globex = Api(prio_stack.api, "e2e-tenant"), Api(prio_stack.api, "e2e-other")
    batch = submit(acme, [sys.executable, EXAMPLE, "--steps", STEPS, "--step-s", "0.05",
                          "--save-every", "1000"],  # saves only when told to stop
                   priority_class="batch", checkpoint_dir=str(shared_dir))
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
                  and f"0: rank 0: done at step {STEPS}" in got and got)
    assert f"0: rank 0 attempt 2: resuming from step {step}" in second, second
    assert json.loads(Path(shared_dir, batch, "rank-0.json").read_text())["step"] == int(STEPS)
    [placed_again] = [e for e in events(acme, batch, "placed") if e["attempt"] == 2]
    assert placed_again["time"] >= done["finished_at"], "it waited while the urgent job ran"
