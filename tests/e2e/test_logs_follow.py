"""Issue 25: `gpujobs logs -f` on a real job prints every line once, in order,
while its agents are killed and restarted, and ends right after the job.

Two ranks on two nodes (real agents of 1 GPU of a type no other test uses, on
a stack of its own) write lines at 150 lines/s (at most 9,000 each) until the
test has done its kills and asks them to stop, then how many they wrote. While the CLI
follows, each agent in turn is killed with SIGKILL and, once its rank has
written on for a while (its lines wait in the rank's file), started again: the
new agent adopts the rank and ships what the dead one had not, lines older
than what the other rank's agent shipped meanwhile. What the user reads is
checked: every line each rank wrote, each exactly once, each rank's in the
order written, and its count last.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from devstack.agents import make_traversable
from tests.support.agents import ended, job, real_agents, start_agent
from tests.support.cli import CLIENT_DIR
from tests.support.stacks import Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

NODES, GPU_TYPE = ("follow-1", "follow-2"), "followgpu"
LINES, RATE = 9_000, 150
#: how long a killed agent stays dead: the lines its rank writes meanwhile
DEAD_LINES = 450
#: `logs -f` ends within this of the job's end: one poll interval (0.5 s), then
#: one more read to the end, which reads again the last 30 s of lines
#: (FOLLOW_LOOKBACK_S: up to 9,000 of them here, some pages) and takes about
#: 2 s on a quiet machine; 10 s leaves a machine several times slower room,
#: where 4 s was crossed under doubled load. A follow that waited for
#: anything else (another attempt, a timeout) would take far longer.
END_WITHIN_S = 10.0

WRITER = f"""
import os, sys, time
r, t0, i = int(os.environ["RANK"]), time.monotonic(), 0
while i < {LINES} and not os.path.exists(sys.argv[1]):
    print(f"rank {{r}} line {{i:05d}}", flush=True)
    i += 1
    wait = t0 + i / {RATE} - time.monotonic()
    if wait > 0:
        time.sleep(wait)
print(f"rank {{r}} wrote {{i}}", flush=True)
"""
LINE_RE = re.compile(r"\[rank (\d)\] rank (\d) line (\d{5})")
LAST_RE = re.compile(r"\[rank (\d)\] rank (\d) wrote (\d+)")


@pytest.fixture(scope="module")
def stack(nodes_stack):
    """The stack for nodes of a module's own (tests/conftest.py): on the
    session's agentless one, other tests' jobs that take any GPU type (and
    wait, no node being there) took the follow nodes the moment they
    registered, and this job never ran."""
    with borrowed(nodes_stack, NODES) as s:
        yield s


@pytest.fixture(scope="module")
def follow_agents(stack, tmp_path_factory):
    base = tmp_path_factory.mktemp("follow-agents")
    with real_agents(stack.api, {n: (1, GPU_TYPE) for n in NODES}, base) as procs:
        yield procs, base


def lines_written(base, node: str, job_id: str) -> int:
    """How many lines the node's rank has written so far (in its log files)."""
    return sum(p.read_bytes().count(b"\n") for p in (base / node).rglob("rank-*")
               if job_id in str(p) and p.is_file())


def test_follow_prints_every_line_once_in_order_across_agent_restarts(
        stack, follow_agents, tmp_path):
    procs, base = follow_agents
    api = Api(stack.api, "e2e-tenant")
    make_traversable(tmp_path)  # the ranks' uids see the stop file
    stop = tmp_path / "stop"
    r = api.post("/v1/jobs", json={"name": "follow",
                                   "command": [sys.executable, "-c", WRITER, str(stop)],
                                   "ranks": 2, "gpu_type": GPU_TYPE, "max_attempts": 1,
                                   "heartbeat": {"mode": "off"}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_API_URL": stack.api, "GPUJOBS_TOKEN": "e2e-tenant", "NO_COLOR": "1",
                "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(CLIENT_DIR)})
    out_path = tmp_path / "follow.out"
    with open(out_path, "w") as out, open(tmp_path / "follow.err", "w") as err:
        cli = subprocess.Popen([sys.executable, "-m", "gpujobs_client.cli", "logs", "-f", job_id,
                                "--interval", "0.5"], stdout=out, stderr=err, env=env)
    try:
        poll("the job runs", lambda: job(api, job_id)["state"] == "RUNNING")
        for node in NODES:
            # some lines shipped, then the agent dies mid-stream
            poll(f"{node}'s rank writes",
                 lambda n=node: lines_written(base, n, job_id) > DEAD_LINES)
            procs[node].kill()
            procs[node].wait()
            written = lines_written(base, node, job_id)
            poll(f"{node}'s rank writes on without its agent",
                 lambda n=node, w=written: lines_written(base, n, job_id) > w + DEAD_LINES)
            with open(base / f"{node}.log", "a") as log:
                procs[node] = start_agent(stack.api, node, 1, GPU_TYPE, base, log)
        # the last agent started adopts a rank still writing
        written = lines_written(base, NODES[-1], job_id)
        poll("the last node's rank writes on under its new agent",
             lambda w=written: lines_written(base, NODES[-1], job_id) > w + DEAD_LINES)
        stop.touch()
        cli.wait(timeout=LINES / RATE + 120)
        left_at = time.time()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    finished = ended(api, job_id)
    assert finished["state"] == "SUCCEEDED", finished
    assert cli.returncode == 0, (tmp_path / "follow.err").read_text()[-2000:]

    printed = out_path.read_text().splitlines()
    by_rank: dict[int, list[int]] = {0: [], 1: []}
    wrote: dict[int, int] = {}
    for text in printed:
        m = LINE_RE.fullmatch(text) or LAST_RE.fullmatch(text)
        assert m and m[1] == m[2], f"not a line of the job's ranks: {text!r}"
        rank = int(m[1])
        assert rank not in wrote, f"rank {rank}: a line after its last: {text!r}"
        if m.re is LAST_RE:
            wrote[rank] = int(m[3])
        else:
            by_rank[rank].append(int(m[3]))
    assert set(wrote) == {0, 1}, f"a rank's last line never printed: {wrote}"
    for rank, numbers in by_rank.items():
        repeated = len(numbers) - len(set(numbers))
        missing = sorted(set(range(wrote[rank])) - set(numbers))
        assert (repeated, missing[:10]) == (0, []), (
            f"rank {rank}: {repeated} lines printed twice, {len(missing)} never printed")
        assert numbers == sorted(numbers), f"rank {rank}'s lines out of the order written"
    assert len(printed) == sum(wrote.values()) + 2

    done = datetime.fromisoformat(finished["finished_at"].replace("Z", "+00:00")).timestamp()
    assert left_at - done < END_WITHIN_S, (
        f"logs -f ended {left_at - done:.1f}s after the job, not within {END_WITHIN_S}s")

