"""Real PyTorch jobs through the local stack (issue 23, item 6): DDP over gloo
on CPU, `init_method="env://"` on the agent's environment alone (no torchrun),
4 ranks of 2 GPU slots each, so ranks 0-1 run on one agent and 2-3 on the
other. The ranks run with the cached torch virtualenv's python (`make test`
builds .venv-torch once a machine; GPUJOBS_TORCH_PYTHON names it). What is
asserted is what the CLI prints and what the events say."""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from tests.client.conftest import cli_runner, logs_until

pytestmark = pytest.mark.e2e
ROOT = pathlib.Path(__file__).resolve().parents[2]
DDP = str(ROOT / "examples" / "ddp_train.py")
# loaded CI machines start torch slowly (several seconds an import, 4 at once)
JOB_TIMEOUT_S = 300


@pytest.fixture
def gpujobs(agent_stack, tmp_path):
    return cli_runner(agent_stack.api, tmp_path / "xdg")


def submit(gpujobs, tmp_path, spec: dict) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = gpujobs("submit", "-o", "json", "--file", str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def ddp_spec(python: str, **env: str) -> dict:
    return {"name": "ddp-e2e", "command": [python, DDP], "ranks": 4, "gpus_per_rank": 2,
            "env": env, "heartbeat": {"interval_s": 1}}


def watch(gpujobs, job_id: str):
    return gpujobs("watch", job_id, "--interval", "1", "--timeout", str(JOB_TIMEOUT_S))


def exits(gpujobs, job_id: str) -> dict[int, int]:
    """rank -> exit code, from the job's rank_exited events."""
    events = json.loads(gpujobs("describe", job_id, "-o", "json").stdout)["events"]
    return {r: e["exit_code"] for e in events if e["type"] == "rank_exited"
            for r in e["ranks"]}


def test_a_ddp_job_over_two_nodes_runs_to_succeeded(gpujobs, tmp_path,
                                                     torch_python):
    job_id = submit(gpujobs, tmp_path, ddp_spec(torch_python, STEPS="30", STEP_S="0.1"))
    r = watch(gpujobs, job_id)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Job finished: SUCCEEDED (succeeded, exit code 0)" in r.stdout

    d = gpujobs("describe", job_id)
    assert d.returncode == 0, d.stderr
    assert re.search(r"local-\d: 0-1\s+local-\d: 2-3", d.stdout), d.stdout
    assert "ranks 0-1 started" in d.stdout and "ranks 2-3 started" in d.stdout
    # each node reports its exits as it sees them: together or one by one
    assert re.search(r"ranks? [0-3](-[0-3])? exited with code 0", d.stdout), d.stdout
    assert "stall" not in d.stdout.lower(), "no false alarm in a healthy run"
    assert exits(gpujobs, job_id) == {0: 0, 1: 0, 2: 0, 3: 0}

    out = logs_until(gpujobs, job_id, r"replicas in sync", 4)
    for rank in range(4):
        assert f"rank {rank}: 30 steps" in out
    # the rendezvous the agents set up: one port, below the ephemeral range
    ports = {int(p) for p in re.findall(r"joined at [^:\s]+:(\d+)", out)}
    assert len(ports) == 1 and 20000 <= ports.pop() <= 32767, out
    # torchrun's local ranks: 0 and 1 on each node
    assert sorted(re.findall(r"\(local (\d)\)", out)) == ["0", "0", "1", "1"], out


def test_a_rank_that_exits_1_is_named_by_its_exit(gpujobs, tmp_path,
                                                  torch_python):
    """Rank 3 (on the second node) exits 1 before it joins: its peers wait in
    the rendezvous and are stopped; the job fails naming rank 3 and its code."""
    job_id = submit(gpujobs, tmp_path, ddp_spec(torch_python, FAIL_RANK="3", FAIL_STEP="-1"))
    r = watch(gpujobs, job_id)
    assert "Job finished: FAILED (rank_failed, exit code 1)" in r.stdout, r.stdout + r.stderr

    got = json.loads(gpujobs("get", job_id, "-o", "json").stdout)
    assert got["exit"] == {"reason": "rank_failed", "exit_code": 1, "rank": 3}

    d = gpujobs("describe", job_id)
    assert d.returncode == 0, d.stderr
    assert "rank 3 exited with code 1" in d.stdout, d.stdout
    assert "rank_failed (1)" in d.stdout
    assert "another rank of the attempt failed" in d.stdout or "stopped" in d.stdout
    events = json.loads(gpujobs("describe", job_id, "-o", "json").stdout)["events"]
    first = next(e for e in events if e["type"] == "rank_exited" and e["exit_code"])
    assert first["ranks"] == [3] and first["reason"] == "rank 3 exited with code 1", events
    started = {r: e["node_id"] for e in events if e["type"] == "rank_started" for r in e["ranks"]}
    assert first["node_id"] == started[3] != started[0], "rank 3 ran on the second node"
    # its peers waited in the rendezvous and were stopped; one whose store went
    # away with rank 0's stop before its own CANCEL arrived may report an exit
    # too, after the verdict
    assert exits(gpujobs, job_id)[3] == 1
    out = logs_until(gpujobs, job_id, r"rank 3: failing before it joins", 1)
    assert "replicas in sync" not in out
