"""Issue 46 item 2 with real agents: GET /v1/usage rows, rolled up as the
attempts ended, sum to the jobs' own usage to the GPU-second (a job failed
then retried, one cancelled while running, one succeeded), by job, by label
and in all; a failed and retried job's loss is in its rows; the operator
reads the same rows; the CLI's CSV has the same exact seconds."""
from __future__ import annotations

import csv
import io
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from tests.support.agents import ended, job, reached, real_agents, submitted
from tests.support.cli import cli_runner
from tests.support.stacks import OPERATOR, Api, borrowed
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

GPU_TYPE, NODE = "usagegpu", "usage-1"
FAILS_ONCE = ("import os, sys, time\n"
              "first = os.environ['GPUJOBS_ATTEMPT'] == '1'\n"
              "time.sleep(1.5)\n"
              "sys.exit(3 if first else 0)\n")


@pytest.fixture(scope="module")
def usage_stack(nodes_stack):
    with borrowed(nodes_stack, (NODE,), GPUJOBS_SCAN_PERIOD_S="0.5") as s:
        yield s


@pytest.fixture(scope="module")
def agents(usage_stack, tmp_path_factory):
    with real_agents(usage_stack.api, {NODE: (4, GPU_TYPE)},
                     tmp_path_factory.mktemp("usage-agents")) as procs:
        yield procs


@pytest.fixture
def tenant(usage_stack, agents):
    return Api(usage_stack.api, "e2e-usage")


def parts(u: dict) -> Counter:
    return +Counter({"productive": u["productive_gpu_seconds"], **u["lost_gpu_seconds"]})


def row_parts(rows: list[dict]) -> Counter:
    out: Counter = Counter()
    for r in rows:
        out["productive"] += r["productive_gpu_seconds"]
        out.update(r["lost_gpu_seconds"])
    return +out


def test_rows_sum_to_the_jobs_usage_with_real_agents(usage_stack, tenant, tmp_path):
    begun = datetime.now(timezone.utc) - timedelta(minutes=1)
    spec = {"gpu_type": GPU_TYPE}
    retried = submitted(tenant, [sys.executable, "-c", FAILS_ONCE], max_attempts=2,
                        labels={"team": "nlp"}, **spec)
    assert ended(tenant, retried)["state"] == "SUCCEEDED"
    cancelled = submitted(tenant, [sys.executable, "-c", "import time; time.sleep(600)"],
                          labels={"team": "cv"}, **spec)
    reached(tenant, cancelled, {"RUNNING"})
    assert tenant.post(f"/v1/jobs/{cancelled}/cancel", json={}).status_code == 202
    assert ended(tenant, cancelled)["state"] == "CANCELLED"
    succeeded = submitted(tenant, [sys.executable, "-c", "import time; time.sleep(1)"], **spec)
    assert ended(tenant, succeeded)["state"] == "SUCCEEDED"
    jobs = [retried, cancelled, succeeded]
    usage = {j: job(tenant, j)["usage"] for j in jobs}
    assert usage[retried]["lost_gpu_seconds"].get("failed_attempt", 0) >= 2
    assert usage[cancelled]["lost_gpu_seconds"].get("cancelled", 0) >= 1
    expected = sum((parts(u) for u in usage.values()), Counter())
    start = begun.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def rows(**params) -> list[dict]:
        r = tenant.get("/v1/usage", params={"start": start, **params})
        assert r.status_code == 200, r.text
        return r.json()["rows"]

    # rolled up as each attempt ended (the follow-up in the same request)
    poll("the rows sum to the jobs' usage", lambda: row_parts(rows()) == expected or None,
         timeout=30)
    for group_by in ("job", "label:team", "gpu_type"):
        for granularity in ("hour", "day"):
            assert row_parts(rows(group_by=group_by, granularity=granularity)) == expected
    by_job = rows(group_by="job")
    for j in jobs:
        assert row_parts([r for r in by_job if r["group"] == {"job": j}]) == parts(usage[j])
    assert {r["tenant"] for r in by_job} == {"e2e-usage"}
    ops = Api(usage_stack.api, OPERATOR).get(
        "/v1/usage", params={"start": start, "tenant": "e2e-usage", "group_by": "job"})
    assert ops.status_code == 200 and ops.json()["rows"] == by_job
    other = Api(usage_stack.api, "e2e-other").get("/v1/usage", params={"start": start})
    assert all(r["tenant"] == "e2e-other" for r in other.json()["rows"])
    # the CLI's CSV: the same exact seconds
    out = cli_runner(usage_stack.api, tmp_path / "xdg")(
        "usage", "--since", start, "--by", "job", "--csv", GPUJOBS_TOKEN="e2e-usage")
    assert out.returncode == 0, out.stderr
    got = list(csv.DictReader(io.StringIO(out.stdout)))
    assert sum(int(g["gpu_seconds"]) for g in got) == sum(expected.values())
