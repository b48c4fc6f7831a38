"""Ranks never outlive their attempt, with real processes: an agent paused
(SIGSTOP) past DOWN, then resumed (SIGCONT), stops every rank of the attempt the
server failed meanwhile, and its node takes the next job. And no rank can make
its node go DOWN: a rank that replaces its heartbeat file with a FIFO (which
once blocked the agent's loop for ever, the node DOWN, the job FAILED
node_lost and its rank left running with no attempt), a link to /dev/zero or
a 10 GiB sparse file leaves the node READY and its neighbour's job beating.

One stack for the module, with a short GPUJOBS_NODE_DOWN_AFTER_S; the agent is
started by the test (the stack starts none) so the test can pause it by its pid.
"""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from chalicelib.domain.clock import parse_iso
from tests.hostile_ranks import HOSTILE, KINDS, steady
from tests.support.agents import ISOLATION, start_agent
from tests.support.cli import cli_runner
from tests.support.procs import alive, stop_agent
from tests.support.stacks import Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

NODE, GPU_TYPE = "lost-1", "lostgpu"
#: twelve call-ins (every 0.5 s): at 3 s, a fresh clone's run on 2 busy cores
#: once saw the node DOWN again and again, its jobs at attempt 10 after 2 min
DOWN_AFTER_S = 6

#: writes its pid where the test reads it; rank 1 ignores SIGTERM, so only the
#: SIGKILL after the grace ends it
RANK = """
import os, signal, sys, time
rank = os.environ["RANK"]
if rank == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = os.path.join(sys.argv[1], f"rank-{rank}.pid")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def loss_stack(nodes_stack):
    with borrowed(nodes_stack, [NODE], GPUJOBS_SCAN_PERIOD_S="0.5",
                  GPUJOBS_NODE_DOWN_AFTER_S=str(DOWN_AFTER_S)) as s:
        yield s


@pytest.fixture
def agent_proc(loss_stack, tmp_path, request):
    """A real agent for NODE (2 GPUs, or the parameter's), stopped by its own pid,
    and every rank its state file records killed, also when the test fails."""
    state_dir = tmp_path / NODE
    log = open(tmp_path / "agent.log", "w")
    proc = start_agent(loss_stack.api, NODE, getattr(request, "param", 2), GPU_TYPE,
                       tmp_path, log, grace_s=1,
                       extra=("--watchdog-s", "1"))  # a slow pass is in the log
    try:
        yield proc
    finally:
        stop_agent(proc, state_dir)
        log.close()


def node(tenant: Api) -> dict | None:
    r = tenant.get(f"/v1/nodes/{NODE}")
    return r.json() if r.status_code == 200 else None


def submit(tenant: Api, command: list[str]) -> str:
    # its node's loss fails it (by default it would be retried, uncounted)
    r = tenant.post("/v1/jobs", json={"command": command, "ranks": 2, "gpu_type": GPU_TYPE,
                                      "max_attempts": 1,
                                      "retry": {"rules": [{"reasons": ["node_lost"],
                                                           "action": "fail"}]},
                                      "heartbeat": {"startup_grace_s": 600}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def state(tenant: Api, job_id: str) -> dict:
    return tenant.get(f"/v1/jobs/{job_id}").json()


def test_an_agent_paused_past_down_stops_the_failed_attempts_ranks_when_resumed(
        loss_stack, agent_proc, shared_dir):
    tenant = Api(loss_stack.api, "e2e-tenant")
    poll("the agent's registration", lambda: (node(tenant) or {}).get("state") == "READY",
         timeout=60)
    assert node(tenant)["isolation"] == ISOLATION, "ranks run as make up's agents run them"
    first = submit(tenant, [sys.executable, "-c", RANK, str(shared_dir)])
    poll("the first job RUNNING", lambda: state(tenant, first)["state"] == "RUNNING", timeout=60)
    paths = [shared_dir / f"rank-{r}.pid" for r in (0, 1)]
    poll("both ranks' pids", lambda: all(p.exists() for p in paths), timeout=60)
    pids = [int(Path(p).read_text()) for p in paths]
    assert all(alive(p) for p in pids)

    agent_proc.send_signal(signal.SIGSTOP)  # the fault: the agent stops calling in
    failed = poll("the first job failed with its node",
                  lambda: (lambda j: j if j["state"] == "FAILED" else None)(
                      state(tenant, first)), timeout=DOWN_AFTER_S + 30)
    assert failed["exit"]["reason"] == "node_lost"
    # a call-in sent just before the SIGSTOP may land seconds late on a loaded
    # machine and bring the node back READY until it is silent again
    down = poll("the node DOWN", lambda: (lambda n: n if n["state"] == "DOWN" else None)(
        node(tenant)), timeout=DOWN_AFTER_S + 30)
    assert down["gpus_free"] == 0, "the lost ranks may still run: their GPUs stay held"
    assert all(alive(p) for p in pids), "a paused agent stops nothing: the ranks outlive DOWN"
    second = submit(tenant, [sys.executable, "-c", "pass"])
    assert state(tenant, second)["state"] == "PENDING", "a DOWN node takes nothing"

    agent_proc.send_signal(signal.SIGCONT)
    poll("every rank of the failed attempt gone", lambda: not any(alive(p) for p in pids),
         timeout=30)
    done = poll("the next job on the node finished",
                lambda: (lambda j: j if j["state"] in ("SUCCEEDED", "FAILED") else None)(
                    state(tenant, second)), timeout=60)
    assert done["state"] == "SUCCEEDED", done
    [attempt] = tenant.get(f"/v1/jobs/{second}/attempts").json()["attempts"]
    assert {p["node_id"] for p in attempt["placement"]} == {NODE}
    back = poll("the node READY with every GPU free",
                lambda: (lambda n: n if n["state"] == "READY" and n["gpus_free"] == 2
                         else None)(node(tenant)), timeout=60)
    assert back["gpus"] == 2
    assert agent_proc.poll() is None, "the agent runs on"

def test_a_busy_node_whose_call_ins_rest_is_kept_up_by_its_beats(loss_stack, agent_proc,
                                                                  tmp_path):
    """Invariant (issue 30): a busy agent calls in only every few minutes, on
    a heartbeat POST (one request an interval); its posts keep its node up.
    Its last call-in grows older than GPUJOBS_NODE_DOWN_AFTER_S, by far, and
    the node stays READY in the API and in `gpujobs nodes`, its job RUNNING."""
    tenant = Api(loss_stack.api, "e2e-tenant")
    poll("the agent's registration", lambda: (node(tenant) or {}).get("state") == "READY",
         timeout=60)
    job = submit_one(tenant, [sys.executable, "-c", STEADY])
    try:
        poll("the job RUNNING and beating", lambda: state(tenant, job)["state"] == "RUNNING"
             and (rank0(tenant, job)["step"] or 0) > 0, timeout=180)
        longest, until = 0.0, time.monotonic() + 4 * DOWN_AFTER_S
        while time.monotonic() < until:  # every look: READY, the job running
            n = node(tenant)
            assert n["state"] == "READY" and state(tenant, job)["state"] == "RUNNING", n
            now = tenant.get(f"/v1/jobs/{job}/ranks").json()["now"]
            longest = max(longest, (parse_iso(now) - parse_iso(n["last_seen_at"])
                                    ).total_seconds())
            time.sleep(0.3)
        assert longest > 2 * DOWN_AFTER_S, f"the last call-in was never older than {longest} s"
        gpujobs = cli_runner(loss_stack.api, tmp_path)
        [row] = [line for line in gpujobs("nodes").stdout.splitlines()
                 if line.startswith(NODE)]
        assert "READY" in row.split(), row
    finally:  # its GPU back for the next test of the module
        end_jobs(tenant, [job])



STEADY = steady(0.1)


def submit_one(tenant: Api, command: list[str]) -> str:
    r = tenant.post("/v1/jobs", json={"command": command, "ranks": 1, "gpu_type": GPU_TYPE,
                                      "max_attempts": 1, "heartbeat": {"interval_s": 0.5}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def end_jobs(tenant: Api, jobs: list[str]) -> None:
    """Cancel ``jobs`` and wait until each is over: their GPUs back before the
    module's next test starts an agent of its own for the node."""
    for job in jobs:
        tenant.post(f"/v1/jobs/{job}/cancel")
    poll("the jobs over", lambda: all(state(tenant, j)["state"] in ("SUCCEEDED", "CANCELLED",
                                                                    "FAILED") for j in jobs),
         timeout=60)


def rank0(tenant: Api, job_id: str) -> dict:
    return tenant.get(f"/v1/jobs/{job_id}/ranks").json()["ranks"][0]


@pytest.mark.parametrize("agent_proc", [4], indirect=True)
def test_ranks_that_replace_their_heartbeat_files_never_take_their_node_down(
        loss_stack, agent_proc, tmp_path):
    """Invariant: whatever a rank puts where its heartbeat file was (a FIFO, a
    link to /dev/zero, a 10 GiB sparse file), its agent keeps calling in: the
    node stays READY for several times GPUJOBS_NODE_DOWN_AFTER_S, no job fails
    node_lost, the neighbour job's beats keep advancing, and only the hostile
    ranks go silent (each refusal logged once)."""
    def slow_passes() -> list[str]:  # the agent's watchdog: what held its loop
        return [line for line in (tmp_path / "agent.log").read_text().splitlines()
                if "gpujobs.agent.watchdog" in line][-10:]

    tenant = Api(loss_stack.api, "e2e-tenant")
    poll("the agent's registration", lambda: (node(tenant) or {}).get("state") == "READY"
         and node(tenant)["gpus"] == 4, timeout=60)
    steady = submit_one(tenant, [sys.executable, "-c", STEADY])
    hostile = {kind: submit_one(tenant, [sys.executable, "-c", HOSTILE, kind])
               for kind in KINDS}
    every = [steady, *hostile.values()]
    try:
        try:
            poll("every job RUNNING",
                 lambda: all(state(tenant, j)["state"] == "RUNNING" for j in every), timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}: {[state(tenant, j) for j in every]} {node(tenant)} "
                                 f"{slow_passes()}") from None
        logs = {kind: tmp_path / NODE / "logs" / j / "1" / "rank-0.log"
                for kind, j in hostile.items()}
        try:  # a loaded machine (the whole suite on 2 cores) starts ranks slowly
            poll("every hostile rank replaced its file",
                 lambda: all(p.exists() and "REPLACED" in p.read_text() for p in logs.values()),
                 timeout=120)
        except AssertionError as e:
            said = {k: p.read_text()[-500:] if p.exists() else None for k, p in logs.items()}
            raise AssertionError(f"{e}: {said} {[state(tenant, j) for j in every]}") from None
        first = rank0(tenant, steady)["step"] or 0

        seen, until = set(), time.monotonic() + 3 * DOWN_AFTER_S
        while time.monotonic() < until:  # every look: READY, nothing failed
            n = node(tenant)
            seen.add(n["state"])
            assert n["state"] == "READY", (n, slow_passes())
            for j in every:
                assert state(tenant, j)["state"] == "RUNNING", (state(tenant, j), slow_passes())
            time.sleep(0.3)
        assert seen == {"READY"}
        assert poll("the steady job's beats advancing",
                    lambda: (rank0(tenant, steady)["step"] or 0) >= first + 20, timeout=60)
        for kind, j in hostile.items():
            r = rank0(tenant, j)
            assert (r["step"] or 0) <= 4 and r["silence_s"] >= 2 * DOWN_AFTER_S, (kind, r)
        assert agent_proc.poll() is None, "the agent runs on"
        log = (tmp_path / "agent.log").read_text()
        refused = [line for line in log.splitlines() if "not reading" in line]
        assert len(refused) == len(KINDS), refused
        for reason in ("a FIFO", "a symbolic link", "10737418240 bytes"):
            assert sum(reason in line for line in refused) == 1, (reason, refused)
    finally:  # their GPUs back for the next test of the module
        end_jobs(tenant, every)


#: beats every 0.1 s until ``sys.argv[1]`` exists, then ends (``end``) or
#: keeps running silent, as all ranks of a hung DDP job do (``hang``)
BEAT_THEN = """
import os, sys, time
from gpujobs_heartbeat import beat
step = 0
while not os.path.exists(sys.argv[1]):
    beat(step)
    step += 1
    time.sleep(0.1)
if sys.argv[2] == "hang":
    time.sleep(3600)
"""


def node_states_while(tenant: Api, seconds: float) -> list[str]:
    """The node's states seen, every 0.2 s, for ``seconds``: the claim is
    about a whole stretch of time, so it is watched for that long."""
    seen, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        n = node(tenant)
        seen.append(n["state"] if n else "gone")
        time.sleep(0.2)
    return seen


@pytest.mark.parametrize("then", ["end", "hang"])
def test_a_healthy_agent_keeps_its_node_ready_after_a_long_job_and_while_its_ranks_hang(
        loss_stack, agent_proc, tmp_path, shared_dir, then):
    """Invariant (issue 41, item 5): a node is DOWN only when its agent is.
    After a job whose beats kept the node up longer than
    GPUJOBS_NODE_DOWN_AFTER_S (its call-ins resting), and while its ranks
    hang silent, the agent calls in: the node stays READY, for three times
    the DOWN time, and no attempt is lost with it."""
    tenant = Api(loss_stack.api, "e2e-tenant")
    poll("the agent's registration", lambda: (node(tenant) or {}).get("state") == "READY",
         timeout=60)
    stop = shared_dir / "stop"
    job = submit_one(tenant, [sys.executable, "-c", BEAT_THEN, str(stop), then])
    try:
        poll("the job RUNNING and beating", lambda: state(tenant, job)["state"] == "RUNNING"
             and (rank0(tenant, job)["step"] or 0) > 0, timeout=180)
        poll("the node's last call-in older than the DOWN time, its beats keeping it up",
             lambda: (parse_iso(tenant.get(f"/v1/jobs/{job}/ranks").json()["now"])
                      - parse_iso(node(tenant)["last_seen_at"])).total_seconds()
             > DOWN_AFTER_S, timeout=60)
        stop.touch()
        if then == "end":
            poll("the job SUCCEEDED", lambda: state(tenant, job)["state"] == "SUCCEEDED",
                 timeout=60)
        seen = node_states_while(tenant, 3 * DOWN_AFTER_S)
        assert set(seen) == {"READY"}, f"the node was {sorted(set(seen))}: {seen}"
        assert state(tenant, job)["state"] == ("SUCCEEDED" if then == "end" else "RUNNING")
    finally:
        end_jobs(tenant, [job])
