"""Real agents a test starts and stops by pid, and reads of a job as a tenant
makes them (its state, events, ranks' log lines): what the end-to-end tests
of the lifecycle, drains and preemption share."""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Collection, Iterator

from devstack.agents import (
    agent_command,
    agent_environment,
    isolated,
    make_traversable,
    write_token_file,
)
from tests.support.procs import stop_agent
from tests.support.stacks import ROOT, Api
from tests.support.waits import poll, wait_until

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def agent_token(node: str) -> str:
    """The agent token the module's tokens file binds to ``node``."""
    return f"e2e-{node}-agent"


def start_agent(api_url: str, node: str, gpus: int, gpu_type: str, base: Path, log, *,
                grace_s: float = 2.0, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """A real agent process for ``node``, set up as ``make up`` sets up its
    own (devstack/agents.py): its token (:func:`agent_token`) in a 0600 file,
    not its environment; the stack's environment less what is not for agents;
    and, as root, each job's ranks run as a uid of the default pool, through
    a state folder (``base/node``) they can pass through but not list. Its
    log goes to ``log``, ``extra`` are more of its options; the caller stops
    it by its pid (:func:`tests.support.procs.stop_agent`)."""
    env = agent_environment({**os.environ, "AWS_ACCESS_KEY_ID": "local",
                             "AWS_SECRET_ACCESS_KEY": "local",
                             "AWS_DEFAULT_REGION": "us-east-1"})
    state = base / node
    if isolated(env):
        make_traversable(state)
    token_file = write_token_file(base / f"{node}-secret", agent_token(node), traversable=False)
    return subprocess.Popen(
        agent_command(node, gpus, gpu_type, api_url, state, token_file, grace_s=grace_s,
                      node_heartbeat_s=0.5, log_level="INFO", extra=extra),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)


#: what a node of :func:`start_agent` reports: as root, ranks run as uids of their own
ISOLATION = "user" if os.geteuid() == 0 else "none"


def nodes_ready(api_url: str, nodes) -> None:
    """Every node READY, reporting the isolation ``make up`` gives (:data:`ISOLATION`)."""
    reader = Api(api_url, "e2e-tenant")

    def every_node_ready() -> list[dict] | None:
        got = [reader.get(f"/v1/nodes/{n}") for n in nodes]
        if all(r.status_code == 200 and r.json()["state"] == "READY" for r in got):
            return [r.json() for r in got]
        return None
    ready = poll("every node READY", every_node_ready)
    assert {n["isolation"] for n in ready} == {ISOLATION}, ready


@contextlib.contextmanager
def real_agents(api_url: str, nodes: dict[str, tuple[int, str]], base: Path, *,
                grace_s: float = 2.0) -> Iterator[dict[str, subprocess.Popen]]:
    """A real agent per node (``{node: (gpus, gpu_type)}``, :func:`start_agent`),
    READY before this yields; each stopped by its own pid, and every rank its
    state file records killed, also when a test fails. A test may replace a
    node's process in the dict (a restarted agent): the one there at the end is
    stopped."""
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        for node, (gpus, gpu_type) in nodes.items():
            log = open(base / f"{node}.log", "a")
            logs.append(log)
            procs[node] = start_agent(api_url, node, gpus, gpu_type, base, log, grace_s=grace_s)
        nodes_ready(api_url, nodes)
        yield procs
    finally:
        for node, proc in procs.items():
            stop_agent(proc, base / node)
        for log in logs:
            log.close()


def job(api: Api, job_id: str) -> dict:
    return api.get(f"/v1/jobs/{job_id}").json()


def reached(api: Api, job_id: str, states: Collection[str], timeout: float = 60) -> dict:
    """The job once its state is one of ``states``, polled; a failure names
    the state it was in and shows the job."""
    last: dict = {}

    def there() -> dict | None:
        nonlocal last
        last = job(api, job_id)
        return last if last["state"] in states else None

    try:
        return wait_until(there, timeout, 0.2, f"{job_id} in {'/'.join(sorted(states))}")
    except AssertionError as e:
        raise AssertionError(f"{e}; still {last.get('state')}: {last}") from None


def ended(api: Api, job_id: str, timeout: float = 90) -> dict:
    """The job once it is in a terminal state."""
    return reached(api, job_id, TERMINAL, timeout)


def events(api: Api, job_id: str, kind: str) -> list[dict]:
    return [e for e in api.get(f"/v1/jobs/{job_id}/events").json()["events"]
            if e["type"] == kind]


def log_lines(api: Api, job_id: str, attempt: int) -> list[str]:
    """The attempt's log lines as ``"<rank>: <line>"``."""
    r = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt})
    assert r.status_code == 200, r.text
    return [f"{line['rank']}: {line['line']}" for line in r.json()["lines"]]


def submitted(api: Api, command: list[str], **spec) -> str:
    """The id of a new job of two ranks, one attempt and no heartbeats unless
    ``spec`` says otherwise: the jobs of the modules whose own agents run a
    GPU type of theirs (lifecycle, drains, preemption), which ``spec`` names."""
    body = {"command": command, "ranks": 2, "max_attempts": 1, "heartbeat": {"mode": "off"},
            **spec}
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]
