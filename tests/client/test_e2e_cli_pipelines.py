"""Pipelines and sweeps (issue 27) submitted with the CLI against the local
stack with real agents, read back from what a person sees: `gpujobs
describe`, `list`, `list --parent`, `watch` and `logs`.

The stack is the session's (tests/conftest.py agent_stack), shared with the
other tests: these isolate by the ids they make and poll conditions (watch,
logs_until), never a fixed sleep. The commands are the README's quickstart
("A pipeline", "A sweep"), tiny so the test is fast.
"""
from __future__ import annotations

import json
import re

import pytest

from devstack.agents import make_traversable
from tests.support.cli import cli_runner, logs_until

from .test_cli import panel

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpujobs(agent_stack, tmp_path):
    return cli_runner(agent_stack.api, tmp_path / "xdg")


def submit(gpujobs, *args: str) -> str:
    """`JOB=$(gpujobs submit -q ...)`: the job id, alone on stdout."""
    r = gpujobs("submit", "-q", *args)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    assert re.fullmatch(r"job_[0-9A-Z]{26}", job_id), r.stdout
    return job_id


def described(gpujobs, job_id: str) -> dict[str, str]:
    r = gpujobs("describe", job_id)
    assert r.returncode == 0, r.stderr
    return panel(r.stdout)


def rows(stdout: str) -> dict[str, list[str]]:
    """A listing's rows by their job id (cells split on runs of 2+ spaces)."""
    out = {}
    for line in stdout.splitlines():
        cells = re.split(r" {2,}", line.strip())
        ids = [c for c in cells if re.fullmatch(r"job_[0-9A-Z]{26}", c)]
        if ids:
            out[ids[0]] = cells
    return out


def got(gpujobs, job_id: str) -> dict:
    r = gpujobs("get", job_id, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_pipeline_runs_each_step_after_the_one_before_and_a_failed_step_ends_what_needed_it(
        gpujobs, tmp_path):
    """prepare -> train (--after-ok prepare) -> evaluate (--after train); train
    fails (exit 3), so evaluate still runs (any end will do) and succeeds,
    and export (--after-ok train) ends FAILED, dependency_failed. prepare
    waits for a file the test makes, so the waiting is seen for sure."""
    # the rank, a uid of its own, must reach the file: pytest's folders are
    # 0700 (unseen, prepare waited out its 90 s and the test took 100 s)
    make_traversable(tmp_path)
    go = tmp_path / "go"
    prep = submit(gpujobs, "--ranks", "1", "--name", "prepare", "--", "sh", "-c",
                  f"for i in $(seq 900); do [ -e {go} ] && break; sleep 0.1; done; "
                  "echo data ready")
    made = [prep]
    try:
        train = submit(gpujobs, "--ranks", "2", "--name", "train", "--after-ok", prep, "--",
                       "python", "-c", "import sys; print('diverged'); sys.exit(3)")
        made.append(train)
        evaluate = submit(gpujobs, "--ranks", "1", "--name", "evaluate", "--after", train,
                          "--", "python", "-c", "print('evaluated')")
        made.append(evaluate)
        export = submit(gpujobs, "--ranks", "1", "--name", "export", "--after-ok", train,
                        "--", "python", "-c", "print('exported')")
        made.append(export)

        # while prepare runs, each waits for the step before it, and says so
        waiting = described(gpujobs, train)
        assert waiting["state"] == "PENDING"
        assert waiting["pending reason"] == f"waiting for {prep} to succeed"
        assert waiting["waiting for"] == prep
        assert waiting["dependencies"] == f"{prep} to succeed: waiting"
        after_any = described(gpujobs, evaluate)
        assert after_any["pending reason"] == f"waiting for {train} to end"
        assert after_any["dependencies"] == f"{train} to end: waiting"
        listed = rows(gpujobs("list", "--limit", "50", COLUMNS="1000").stdout)  # no wrap
        assert listed[train][2] == "PENDING" and listed[train][-1] == \
            f"waiting for {prep} to succeed"
        assert listed[export][-1] == f"waiting for {train} to succeed"

        go.touch()
        r = gpujobs("watch", evaluate, "--interval", "0.5", "--timeout", "120")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1] == "Job finished: SUCCEEDED (succeeded, exit code 0)"

        assert described(gpujobs, prep)["state"] == "SUCCEEDED"
        failed = described(gpujobs, train)
        assert failed["state"] == "FAILED"
        assert failed["exit"].startswith("rank_failed, exit code 3, rank ")
        assert failed["dependencies"] == f"{prep} to succeed: met"
        ended = described(gpujobs, export)
        assert ended["state"] == "FAILED"
        assert ended["exit"] == (f"dependency_failed, {train} ended FAILED; this job needed it "
                                 "to succeed")
        assert ended["dependencies"] == f"{train} to succeed: can no longer be met"
        assert "pending reason" not in ended
        r = gpujobs("watch", export, "--interval", "0.5", "--timeout", "5")
        assert r.returncode == 8
        assert r.stdout.splitlines()[-1] == (f"Job finished: FAILED (dependency_failed: {train} "
                                             "ended FAILED; this job needed it to succeed)")
        ran = described(gpujobs, evaluate)
        assert ran["dependencies"] == f"{train} to end: met"

        listed = rows(gpujobs("list", "--limit", "50", COLUMNS="1000").stdout)  # no wrap
        assert [listed[j][2] for j in made] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "FAILED"]
        # each step started only once the one before it had ended
        times = {j: got(gpujobs, j) for j in made}
        assert times[train]["started_at"] >= times[prep]["finished_at"]
        assert times[evaluate]["started_at"] >= times[train]["finished_at"]
        assert times[export]["started_at"] is None and times[export]["attempt"] == 0
        logs_until(gpujobs, evaluate, r"(?m)^\[rank 0\] evaluated$", 1)
        logs_until(gpujobs, prep, r"(?m)^\[rank 0\] data ready$", 1)
    finally:
        go.touch()  # prepare never waits past the test
        for job_id in made:
            gpujobs("cancel", job_id)


def test_a_sweep_runs_each_index_with_its_value_at_most_two_at_once(gpujobs):
    lrs = ["0.1", "0.03", "0.01", "0.003", "0.001", "0.0003"]
    sweep = submit(gpujobs, "--ranks", "1", "--name", "sweep", "--array", "0-5%2",
                   "--array-env", "LR=" + ",".join(lrs), "--", "sh", "-c",
                   'echo "index $GPUJOBS_ARRAY_INDEX of $GPUJOBS_ARRAY_SIZE, lr $LR"')
    try:
        r = gpujobs("watch", sweep, "--interval", "0.5", "--timeout", "150")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "indexes 6: 6 succeeded" in r.stdout
        assert r.stdout.splitlines()[-1] == "Job finished: SUCCEEDED"

        listing = gpujobs("list", "--parent", sweep)
        assert listing.returncode == 0, listing.stderr
        lines = listing.stdout.strip().splitlines()
        assert re.split(r" {2,}", lines[0].strip())[:4] == ["INDEX", "ID", "NAME", "STATE"]
        children = [re.split(r" {2,}", line.strip()) for line in lines[1:]]
        assert [(c[0], c[2], c[3]) for c in children] == [
            (str(i), f"sweep[{i}]", "SUCCEEDED") for i in range(6)]
        ids = [c[1] for c in children]

        out = logs_until(gpujobs, ids[3], r"(?m)^\[rank 0\] index 3 of 6, lr 0\.003$", 1)
        assert out.strip() == "[rank 0] index 3 of 6, lr 0.003", out
        rows_ = described(gpujobs, sweep)
        assert rows_["state"] == "SUCCEEDED"
        assert rows_["indexes"] == "6: 6 succeeded"
        assert rows_["array"] == "6 indexes (0-5), at most 2 at once; env LR"
        child = described(gpujobs, ids[3])
        assert (child["name"], child["parent"], child["index"]) == ("sweep[3]", sweep,
                                                                   "3 of 0-5")
        # max_parallel 2: no three indexes ever ran at the same time
        spans = [(j["started_at"], j["finished_at"]) for j in (got(gpujobs, i) for i in ids)]
        assert all(sum(s <= start < e for s, e in spans) <= 2 for start, _ in spans), spans
        listed = rows(gpujobs("list", "--limit", "50", COLUMNS="1000").stdout)  # no wrap
        assert listed[sweep][2] == "SUCCEEDED" and "6: 6 succeeded" in listed[sweep]
    finally:
        gpujobs("cancel", sweep)
