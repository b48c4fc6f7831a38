"""The CLI against the local stack with real agents: nodes, watch until done,
ranks naming a hung rank, cancel --wait of a running job."""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.support.cli import cli_runner, logs_until
from tests.support.reach import example
from tests.support.waits import poll

pytestmark = pytest.mark.e2e
HANG = example("hang.py")


@pytest.fixture
def gpujobs(agent_stack, tmp_path):
    return cli_runner(agent_stack.api, tmp_path / "xdg")


def submit(gpujobs, *args: str) -> str:
    r = gpujobs("submit", "-o", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["id"]


def test_nodes_lists_the_simulated_agents(gpujobs):
    r = gpujobs("nodes", "-o", "json")
    assert r.returncode == 0
    nodes = json.loads(r.stdout)
    nodes = nodes["nodes"] if isinstance(nodes, dict) else nodes
    assert sorted(n["node_id"] for n in nodes) == ["local-1", "local-2"]
    table = gpujobs("nodes")
    assert "local-1" in table.stdout and "h100" in table.stdout
    assert gpujobs("nodes", "nope").returncode == 3


def test_watch_follows_a_job_until_it_succeeds(gpujobs):
    job_id = submit(gpujobs, "--ranks", "2", "--", "python", "-c",
                    "import time; time.sleep(2); print('hello')")
    r = gpujobs("watch", job_id, "--interval", "0.5", "--timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCEEDED" in r.stdout
    attempts = json.loads(gpujobs("attempts", job_id, "-o", "json").stdout)
    attempts = attempts["attempts"] if isinstance(attempts, dict) else attempts
    assert len(attempts) == 1 and attempts[0]["placement"]


def test_ranks_names_the_hung_rank_first(gpujobs, tmp_path):
    spec = {"command": ["python", HANG], "ranks": 4,
            "heartbeat": {"interval_s": 1, "startup_grace_s": 10}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    job_id = submit(gpujobs, "--file", str(path))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = json.loads(gpujobs("ranks", job_id, "-o", "json").stdout)
            if (view.get("health") or {}).get("status") == "STALLED":
                break
            time.sleep(0.5)
        assert view["health"]["first_stalled_rank"] == 3
        assert view["ranks"][0]["rank"] == 3 and view["ranks"][0]["stalled"]
        table = gpujobs("ranks", job_id)
        assert table.returncode == 0
        assert "3" in table.stdout and "stalled" in table.stdout.lower()
    finally:
        gpujobs("cancel", job_id)


def test_cancel_wait_returns_when_the_agents_confirm(gpujobs):
    job_id = submit(gpujobs, "--ranks", "2", "--", "sleep", "617")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if json.loads(gpujobs("get", job_id, "-o", "json").stdout)["state"] == "RUNNING":
            break
        time.sleep(0.3)
    r = gpujobs("cancel", job_id, "--wait", "--timeout", "30", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "CANCELLED"


def test_a_job_runs_in_its_working_dir_as_the_cli_submitted_and_describes_it(gpujobs,
                                                                             shared_dir):
    """`--working-dir` (the spec's working_dir) reaches the agents in the LAUNCH
    and the ranks run there: the command's relative script path is the job's,
    not the agent's; `describe` shows the directory."""
    work = shared_dir / "work"
    work.mkdir(mode=0o755)
    (work / "where.py").write_text("import os\nprint('ran in', os.getcwd(), flush=True)\n")
    job_id = submit(gpujobs, "--ranks", "2", "--working-dir", str(work), "--",
                    "python", "where.py")
    r = gpujobs("watch", job_id, "--interval", "0.5", "--timeout", "60")
    assert r.returncode == 0 and "SUCCEEDED" in r.stdout, r.stdout + r.stderr
    described = gpujobs("describe", job_id)
    assert f"working dir  {work}" in described.stdout, described.stdout
    out = logs_until(gpujobs, job_id, f"ran in {re.escape(str(work))}", 2)
    assert out.count(f"ran in {work}") == 2, out


def test_describe_says_where_a_waiting_job_stands_and_when_it_may_start(gpujobs):
    """Issue 47: the stack's 8 GPUs are held by a job with a 10 min limit; of
    the two 8-GPU jobs submitted after it, the first reads that it starts
    when that limit frees the GPUs, the second that it is behind the first,
    as the placer's line says (one read, never the queue)."""
    holder = submit(gpujobs, "--ranks", "2", "--gpus-per-rank", "4", "--max-runtime", "10m",
                    "--", "sleep", "600")
    jobs = [holder]
    try:
        poll("the holder runs", lambda: json.loads(
            gpujobs("get", holder, "-o", "json").stdout)["state"] == "RUNNING", timeout=60)
        first = submit(gpujobs, "--ranks", "2", "--gpus-per-rank", "4", "--", "true")
        second = submit(gpujobs, "--ranks", "2", "--gpus-per-rank", "4", "--", "true")
        jobs += [first, second]

        def described() -> dict[str, str] | None:  # once a placement run has ordered both
            shown = {j: " ".join(gpujobs("describe", j).stdout.split()) for j in (first, second)}
            return shown if all("in line" in text for text in shown.values()) else None
        shown = poll("both waiting jobs are in line", described, timeout=60, interval=0.5)
        assert f"when {holder} reaches its 10 min limit" in shown[first], shown[first]
        assert re.search(r"estimated start \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(about "
                         r"(9|10) min", shown[first]), shown[first]
        assert f"behind {first} (8 GPUs)" in shown[second], shown[second]
        assert f"waiting for {holder} (8 GPUs)" in shown[second], shown[second]
        queue = json.loads(gpujobs("get", second, "-o", "json").stdout)["queue"]
        assert queue["position"] == queue["of"] and queue["ahead"][-1]["job_id"] == first
    finally:
        for job_id in jobs:
            gpujobs("cancel", job_id)
