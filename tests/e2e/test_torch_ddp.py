"""Real PyTorch jobs through the local stack (issue 23, item 6): DDP over gloo
on CPU, `init_method="env://"` on the agent's environment alone (no torchrun),
4 ranks of 2 GPU slots each, so ranks 0-1 run on one agent and 2-3 on the
other. The ranks run with the cached torch virtualenv's python (`make test`
builds .venv-torch once a machine; GPUJOBS_TORCH_PYTHON names it). What is
asserted is what the CLI prints and what the events say.

The stall scenarios (issue 23, item 3) each leave one rank stopped in its own
way and expect the job's ``health.verdict`` (docs: the shared contract) to
name it, by the evidence that kind of stop leaves: a hang before the forward
of an instrumented job by its collective marks, a SIGSTOPped rank by its
process state, a hang in a job that never beats by its stack. A healthy job
whose rank 0 saves a 30 s checkpoint while its peers wait in the barrier must
not be called stalled at all."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import time

import pytest

from tests.support.cli import logs_until, stall_lines
from tests.support.torch_jobs import (
    DDP,
    JOB_TIMEOUT_S,
    assert_ran_through_without_an_alarm,
    ddp_spec,
    events,
    job,
    submit,
    watch,
)
from tests.support.waits import wait_until

pytestmark = pytest.mark.e2e


def hung_spec(python: str, heartbeat: dict | None = None, **env: str) -> dict:
    """A job that trains until a rank stops: many short steps, and a gloo
    timeout well past the detection (the peers wait, they do not fail)."""
    return ddp_spec(python, heartbeat, STEPS="100000", STEP_S="0.2", PG_TIMEOUT_S="900",
                    **env)


def exits(gpujobs, job_id: str) -> dict[int, int]:
    """rank -> exit code, from the job's rank_exited events."""
    return {r: e["exit_code"] for e in events(gpujobs, job_id) if e["type"] == "rank_exited"
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
    assert stall_lines(d.stdout) == [], "no false alarm in a healthy run:\n" + d.stdout
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
    placed = json.loads(gpujobs("attempts", job_id, "-o", "json").stdout)
    node_of_3 = {p["rank"]: p["node_id"] for p in placed["attempts"][0]["placement"]}[3]
    assert got["exit"] == {"reason": "rank_failed", "exit_code": 1, "rank": 3,
                           "node_id": node_of_3,
                           "decision": "rank_failed (rank 3, exit code 1): not retried "
                                       "(counted attempt 1 of 1, none left)"}

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


def nodes_of_ranks(gpujobs, job_id: str) -> dict[int, str]:
    return {r: e["node_id"] for e in events(gpujobs, job_id) if e["type"] == "rank_started"
            for r in e["ranks"]}


def wait_for_verdict(gpujobs, job_id: str, timeout: float = JOB_TIMEOUT_S) -> dict:
    """The job's health.verdict once it names a rank, polled."""
    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
        got = job(gpujobs, job_id)
        verdict = (got.get("health") or {}).get("verdict")
        if verdict and verdict.get("rank") is not None:
            return verdict
        assert got["state"] in ("PENDING", "SCHEDULED", "RUNNING"), got
        time.sleep(1)
    raise AssertionError(f"no rank named in {timeout} s: {got.get('health')}")


def assert_named(gpujobs, job_id: str, rank: int, by: str) -> dict:
    """``rank`` is the one named, by ``by``, on its own node (the second, rank 0
    being on the first), and every surface says it: the stalled event, `gpujobs
    ranks` and `gpujobs describe` print the verdict's sentence."""
    verdict = wait_for_verdict(gpujobs, job_id)
    assert (verdict["rank"], verdict["ranks"], verdict["by"]) == (rank, [rank], by), verdict
    nodes = nodes_of_ranks(gpujobs, job_id)
    assert verdict["node_id"] == nodes[rank] != nodes[0], (verdict, nodes)
    text = verdict["text"]
    assert text.startswith(f"rank {rank} on {nodes[rank]} "), text

    stalled = [e for e in events(gpujobs, job_id) if e["type"] == "stalled"]
    assert stalled, "a stalled event"
    assert (stalled[-1]["reason"], stalled[-1]["rank"], stalled[-1]["ranks"]) == \
        (text, rank, [rank]), stalled[-1]
    ranks = gpujobs("ranks", job_id)
    assert ranks.returncode == 0 and text in ranks.stdout, ranks.stdout
    # /ranks judges the beats as they are now, the job shows the last scan's
    # verdict: a stack sampled in between sharpens the next scan's, so the
    # two agree again within a scan or two
    same = live = stored = None
    deadline = time.monotonic() + 30
    while not same and time.monotonic() < deadline:
        live = json.loads(gpujobs("ranks", job_id, "-o", "json").stdout)["verdict"]
        stored = job(gpujobs, job_id)["health"]["verdict"]
        same = live == stored
        if not same:
            time.sleep(0.5)
    assert same, (live, stored)
    d = gpujobs("describe", job_id)
    assert d.returncode == 0 and text in d.stdout, d.stdout
    return verdict


def cancel(gpujobs, job_id: str) -> None:
    gpujobs("cancel", job_id, "--wait", "--timeout", "60")


def pid_of(gpujobs, job_id: str, rank: int) -> int:
    out = logs_until(gpujobs, job_id, rf"rank {rank} pid \d+", 1, timeout=JOB_TIMEOUT_S)
    return int(re.search(rf"rank {rank} pid (\d+)", out).group(1))


def wait_for_steps(gpujobs, job_id: str, rank: int, steps: int) -> None:
    """Until ``rank`` has beaten ``steps`` steps (the job is training)."""
    def reached() -> bool:
        view = json.loads(gpujobs("ranks", job_id, "-o", "json").stdout)
        step = next((r.get("step") for r in view["ranks"] if r["rank"] == rank), None)
        return step is not None and step >= steps
    wait_until(reached, JOB_TIMEOUT_S, 1, f"rank {rank} to reach step {steps}")


def hang_line() -> str:
    """Where examples/ddp_train.py's hang() sleeps, as a stack summary says it."""
    lines = pathlib.Path(DDP).read_text().splitlines()
    n = next(i for i, line in enumerate(lines, 1) if line.strip() == "time.sleep(3600)")
    return f"ddp_train.py:{n} in hang → time.sleep(3600)"


def test_a_30s_checkpoint_of_rank_0_is_no_stall(gpujobs, tmp_path, torch_python, shared_dir):
    """Rank 0 saves for 30 s (a declared pause, with real writes) while ranks
    1-3 wait in the barrier, silent: they wait on a paused peer, and a job set
    to restart on a stall runs through in one attempt."""
    spec = ddp_spec(torch_python, INSTRUMENT="full", STEPS="12", STEP_S="0.1", CKPT_STEP="5",
                    CKPT_S="30", CKPT_DIR=str(shared_dir))
    spec.update(on_stall="restart", max_attempts=2)  # a false alarm would restart it
    job_id = submit(gpujobs, tmp_path, spec)
    assert_ran_through_without_an_alarm(gpujobs, job_id, watch(gpujobs, job_id))
    out = logs_until(gpujobs, job_id, r"replicas in sync", 4)
    saved = float(re.search(r"checkpoint of step 5 saved in ([\d.]+) s", out).group(1))
    assert saved >= 29, out


def test_a_rank_that_hangs_before_its_forward_is_named_by_the_collective(gpujobs, tmp_path,
                                                                          torch_python):
    """Rank 3 sleeps before the forward of step 5: ranks 0-2 mark that
    forward and their gradient bucket, then wait in DDP's all-reduce, which
    rank 3 never reached."""
    job_id = submit(gpujobs, tmp_path, hung_spec(torch_python, INSTRUMENT="full",
                                                 HANG_RANK="3", HANG_STEP="5"))
    try:
        verdict = assert_named(gpujobs, job_id, 3, "collective")
        assert "ddp_allreduce" in verdict["text"] and "ranks 0-2" in verdict["text"], verdict
    finally:
        cancel(gpujobs, job_id)


def test_a_sigstopped_rank_is_named_by_its_process_state(gpujobs, tmp_path, torch_python):
    """Rank 2 is stopped (SIGSTOP) mid-training: state T, while its peers
    wait for it asleep in gloo."""
    job_id = submit(gpujobs, tmp_path, hung_spec(torch_python))
    pid = None
    try:
        pid = pid_of(gpujobs, job_id, 2)
        wait_for_steps(gpujobs, job_id, 2, 3)
        os.kill(pid, signal.SIGSTOP)
        verdict = assert_named(gpujobs, job_id, 2, "process")
        assert "stopped" in verdict["text"], verdict
    finally:
        cancel(gpujobs, job_id)
        if pid is not None:  # a stopped rank takes its SIGTERM only once continued
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_hang_in_an_uninstrumented_job_is_named_by_its_stack(gpujobs, tmp_path,
                                                               torch_python):
    """No beats, no marks (INSTRUMENT=none), the default mode: the ranks go
    idle once rank 3 sleeps in hang(); the stacks tell the sleeper from the
    ranks that wait in the all-reduce."""
    job_id = submit(gpujobs, tmp_path, hung_spec(torch_python, {"idle_s": 15},
                                                 INSTRUMENT="none", HANG_RANK="3",
                                                 HANG_STEP="5"))
    try:
        verdict = assert_named(gpujobs, job_id, 3, "stack")
        where = hang_line()
        assert verdict["stack"] == where and where in verdict["text"], verdict
        d = gpujobs("describe", job_id)
        assert where in d.stdout, d.stdout
        # the stall event keeps the stacks as they were when it was declared,
        # and describe prints them under it
        stalled = [e for e in events(gpujobs, job_id) if e["type"] == "stalled"]
        assert stalled[-1]["stacks"][0] == {"rank": 3, "where": where}, stalled[-1]
        assert f"rank 3: {where}" in d.stdout, d.stdout
        # the cancel's stop: its agent captured every rank's stack before
        # SIGTERM, and describe prints them under the rank_stopped event
        cancel(gpujobs, job_id)
        stopped = [e for e in events(gpujobs, job_id) if e["type"] == "rank_stopped"]
        got = {s["rank"]: s["where"] for e in stopped for s in e.get("stacks") or ()}
        assert got.get(3) == where, stopped
        assert set(got) == {0, 1, 2, 3}, got
        # (a peer on the other node may already be failing: its node's stop is
        # not simultaneous with this one's, and gloo breaks when the first goes)
        d = gpujobs("describe", job_id)
        assert d.stdout.count(f"rank 3: {where}") == 2, d.stdout  # the stall's and the stop's
    finally:
        cancel(gpujobs, job_id)


SLOW_SENTENCE = re.compile(r"rank 1 on (local-\d) is slow: its steps take ([\d.]+)× the fastest "
                           r"rank's")


def test_a_rank_burning_cpu_each_step_is_called_slow_and_only_it(gpujobs, tmp_path,
                                                                  torch_python):
    """Stragglers (issue 44 item 1): rank 1 burns 0.15 s of CPU a step outside
    any collective; its peers wait for it inside DDP's all-reduce. Within 5
    minutes rank 1, and only rank 1, is called slow: one rank_slow event, the
    sentence in `gpujobs ranks` and `describe`; no stall."""
    spec = ddp_spec(torch_python, INSTRUMENT="full", STEPS="100000", STEP_S="0.1",
                    PG_TIMEOUT_S="900", SLOW_RANK="1", SLOW_S="0.15")
    job_id = submit(gpujobs, tmp_path, spec)
    try:
        def slow_ranks() -> list[int]:
            got = job(gpujobs, job_id)
            assert got["state"] in ("PENDING", "SCHEDULED", "RUNNING"), got
            return (got.get("health") or {}).get("slow_ranks") or []
        wait_until(lambda: slow_ranks() == [1], 300, 2, "rank 1 to be called slow")
        nodes = nodes_of_ranks(gpujobs, job_id)
        told = [e for e in events(gpujobs, job_id) if e["type"] == "rank_slow"]
        assert [e["rank"] for e in told] == [1], told
        m = SLOW_SENTENCE.fullmatch(told[0]["reason"])
        assert m and m.group(1) == nodes[1] and float(m.group(2)) >= 1.5, told
        r = gpujobs("ranks", job_id)
        assert r.returncode == 0 and told[0]["reason"] in " ".join(r.stdout.split()), r.stdout
        d = gpujobs("describe", job_id)
        assert told[0]["reason"] in " ".join(d.stdout.split()), d.stdout
        view = json.loads(gpujobs("ranks", job_id, "-o", "json").stdout)
        scores = {x["rank"]: x["slow_score"] for x in view["ranks"]}
        assert scores[1] is not None and scores[1] < 0.7, scores
        assert all(s is not None and s >= 0.7 for r_, s in scores.items() if r_ != 1), scores
        health = job(gpujobs, job_id)["health"]
        assert health["slow_ranks"] == [1] and health["status"] == "OK", health
    finally:
        cancel(gpujobs, job_id)


def test_a_healthy_run_with_a_rank_0_checkpoint_calls_no_rank_slow(gpujobs, tmp_path,
                                                                    torch_python, shared_dir):
    """Stragglers' false positives (issue 44 item 1): 4 ranks stepping alike for
    longer than the window (3 scans over 60 s), rank 0 saving a 30 s checkpoint
    (a declared pause) while its peers wait in the barrier: no rank is called
    slow, no rank_slow event, the job succeeds in one attempt with no alarm."""
    spec = ddp_spec(torch_python, INSTRUMENT="full", STEPS="900", STEP_S="0.1",
                    CKPT_STEP="300", CKPT_S="30", CKPT_DIR=str(shared_dir))
    job_id = submit(gpujobs, tmp_path, spec)
    seen: set[int] = set()

    def over() -> bool:  # every scan's slow_ranks, as polled, until the job ends
        got = job(gpujobs, job_id)
        seen.update((got.get("health") or {}).get("slow_ranks") or [])
        return got["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
    wait_until(over, JOB_TIMEOUT_S, 2, "the healthy job to end")
    assert job(gpujobs, job_id)["state"] == "SUCCEEDED"
    assert seen == set(), f"ranks called slow in a healthy run: {seen}"
    told = [e for e in events(gpujobs, job_id) if e["type"] == "rank_slow"]
    assert told == [], told
