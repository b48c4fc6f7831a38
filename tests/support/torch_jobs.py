"""Real PyTorch DDP jobs through the CLI (tests/e2e/test_torch_ddp.py and
test_torch_trainers.py): examples/ddp_train.py's spec over the session's two
agents, submitted and watched with ``gpujobs`` (:func:`tests.support.cli.cli_runner`),
and what a healthy run that must raise no alarm leaves."""
from __future__ import annotations

import json

from agent.rendezvous import PORT_IN_USE
from tests.support.cli import logs_until
from tests.support.reach import example

DDP = example("ddp_train.py")
# loaded CI machines start torch slowly (several seconds an import, 4 at once)
JOB_TIMEOUT_S = 300


def submit(gpujobs, tmp_path, spec: dict) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    r = gpujobs("submit", "-o", "json", "--file", str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def ddp_spec(python: str, heartbeat: dict | None = None, **env: str) -> dict:
    return {"name": "ddp-e2e", "command": [python, DDP], "ranks": 4, "gpus_per_rank": 2,
            "env": env, "heartbeat": {"interval_s": 1, **(heartbeat or {})}}


def watch(gpujobs, job_id: str):
    return gpujobs("watch", job_id, "--interval", "1", "--timeout", str(JOB_TIMEOUT_S))


def job(gpujobs, job_id: str) -> dict:
    r = gpujobs("get", job_id, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def events(gpujobs, job_id: str) -> list[dict]:
    return json.loads(gpujobs("describe", job_id, "-o", "json").stdout)["events"]


def assert_ran_through_without_an_alarm(gpujobs, job_id: str, watched) -> None:
    """The job SUCCEEDED (as ``watched``, its `gpujobs watch`, printed) in one
    attempt that trained, with no stalled event, no false alarm and no verdict.

    An earlier attempt that never trained is no restart of the job: the
    rendezvous port (fixed by the job id and the attempt) was taken on rank
    0's host, so that agent started none of its ranks (agent/rendezvous.py,
    exit code 98), the other node's waited for a store that never came and
    were stopped, and the next attempt got another port. A host whose ephemeral
    port range reaches below 32768 hands such ports to its own outgoing
    connections (FIELD-NOTES). It says nothing of the pause under test, so
    it is let through, by that exit code and the agent's reason in the
    rank's log alone. (A CI run once found two attempts here, no stall
    among its events; what it printed fits this cause, a first attempt over
    before its ranks ran, and did not show which. The message below now
    does: the job's story as `gpujobs describe` tells it.)"""
    assert "Job finished: SUCCEEDED (succeeded, exit code 0)" in watched.stdout, \
        watched.stdout + watched.stderr + gpujobs("logs", job_id, ranks_output=True).stdout
    assert not [e for e in events(gpujobs, job_id) if e["type"] == "stalled"]
    health = job(gpujobs, job_id)["health"]
    assert health["false_alarms"] == 0 and health.get("verdict") is None, health
    attempts = json.loads(gpujobs("attempts", job_id, "-o", "json").stdout)["attempts"]
    story = gpujobs("describe", job_id).stdout  # on failure: why it retried
    assert attempts and attempts[-1]["state"] == "SUCCEEDED", story
    for earlier in attempts[:-1]:
        assert (earlier.get("exit") or {}).get("exit_code") == PORT_IN_USE, story
        out = logs_until(gpujobs, job_id, r"MASTER_PORT \d+ is in use on this host", 1,
                         args=("--attempt", str(earlier["attempt"])))
        assert "were not started (exit code 98)" in out, out
