"""Benchmarks that cannot rot: every script in bench/ runs with ``--quick``
against the current code, exits 0 and prints its machine-readable line; the
baselines of bench/endpoints.py and bench/placement.py prove, in that same
run, that their items equal the adapters' (``parity:`` lines).

The scripts run as real processes, at most ``AT_ONCE`` (two) at a time. Each
is CPU-bound and mostly single-threaded, so two fill the 2-core machine the
suite runs on. A third saves little wall time (on a busy machine, within
the noise: docs/benchmarks.md, "Bench smoke, quicker") and spends more CPU
competing for the same two cores, CPU that whatever else shares the
machine then lacks. Run alone (``make bench-quick``, or this file in one
pytest process) all are queued at once, longest first, two at a time.
Under pytest-xdist (``make test``: ``-n 2 --dist loadfile``, this file on
one worker) a run starts only when its test asks for it, so one at a time:
the other worker keeps the other core. Running two here too would not make
the suite faster (the same CPU seconds on the same two cores), and it would
starve the other worker's timing-sensitive tests. Each run is started in
its own session and, if it overruns, its process group is killed by its own
id, so a stack it started cannot outlive it.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest

from bench import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMEOUT_S = 240
#: runs at a time when this file runs alone (see the module's docstring)
AT_ONCE = 2

#: script -> the lines its --quick run must print (regular expressions), longest
#: runs first so that the two at a time finish together
EXPECTED = {
    "op_counts": [r"^OPCOUNTS \{.*\}$",
                  r"^per host-interval: requests \S+, WRU \S+, RRU \S+ \(floor: 1 request, 1 WRU\)$",
                  r"^opcounts-bench: requests_per_host_interval=\S+ wru_per_host_interval=\S+ "
                  r"rru_per_host_interval=\S+$"],
    "endpoints": [r"^parity: the baselines' \d+ items equal the adapters'",
                  r"^every endpoint made exactly its minimum number of requests$",
                  r"^worst ratio: \d+\.\d\d \(.+\)$"],
    "load": [r"^load-bench: clients=5 rps=\d+\.\d p99_ms=\d+\.\d errors_5xx=0 "
             r"retry_after_503=\d+$"],
    "flood": [r"^flood-bench: during_ratio=\d+\.\d\d after_ratio=\d+\.\d\d "
              r"create_p50_ms=\d+ cancel_p50_ms=\d+$"],
    "scale": [r"^scale-bench: first_request_ms=\d+\.\d+ filtered_list_ratio=\d+\.\d+ "
              r"largest_response_bytes=\d+ waiting_job_reads=\d+$"],
    "arrays": [r"^arrays-bench: create_ms=\d+\.\d\d create_ratio=\d+\.\d\d create_wru=\d+ "
               r"make_wru_per_child=\d+\.\d place_ratio=\d+\.\d\d "
               r"place_requests_per_child=\d+\.\d\d place_wru_ratio=\d+\.\d\d$"],
    "endpoints --moto server": [r"^parity: the baselines' \d+ items equal the adapters'",
                                r"^worst client-side ratio over HTTP: \d+\.\d\d \(.+\)$"],
    "dashboard": [r"^dashboard-bench: first_paint_ms=\d+ rows_ms=\d+ heatmap_ratio=\d+\.?\d*$"],
    "first_request": [r"^first-request: worst \+\d+\.\d ms \(\w+\)$"],
    "placement": [r"^N=10: parity: the baseline's \d+ items equal placement's",
                  r"^placement-bench: ratio=\d+\.\d\d reads_per_job_10=\d+\.\d "
                  r"reads_per_job_1000=\d+\.\d$"],
    "scan_rank_cost": [r"^scan-rank-bench: us_per_rank=\d+\.\d reads_us_per_rank=\d+\.\d "
                       r"ratio_vs_reads=\d+\.\d\d us_per_job=\d+$"],
    "scan": [r"^scan-bench: history_ratio=\d+\.\d\d$"],
    "stall_sim": [r"^stall-bench: fp_per_hour=\d+\.\d+ median_delay_vs_fixed=\d+\.\d+ "
                  r"culprit_accuracy=\d+\.\d+$",
                  r"^stall-bench-v2: default_fp_per_job_hour=\d+\.\d+ .*"
                  r"torch_sim_fa=\d+\.\d\d torch_real_fa=\d+\.\d\d "
                  r"torch_sim_delay_s=\d+\.\d\d torch_real_delay_s=\d+\.\d\d "
                  r"torch_sim_named=\d\.\d\d torch_real_named=\d\.\d\d agree=(yes|no)$"],
    "beat_write": [r"^beat-write-bench: ranks=\d+ requests=\d+ ms_whole=\d+\.\d "
                   r"ms_clauses=\d+\.\d ratio=\d+\.\d\d$"],
    "coldstart_powertools": [r"^powertools-bench: app_ms=\d+\.\d app_powertools_ms=\d+\.\d$"],
    "moto_wall": [r"^moto-wall-bench: sockets=\d+ us_lookup=\d+\.\d ms_open=\d+\.\d\d "
                  r"ms_walled=\d+\.\d\d ratio=\d+\.\d\d$"],
    "beat_cost": [r"^beat-bench: us_per_beat=\d+\.\d\d ratio_vs_pwrite=\d+\.\d\d$",
                  r"^marker-bench: us_per_arrive=\d+\.\d\d arrive_vs_beat=\d+\.\d\d "
                  r"collective_cm_vs_beat=\d+\.\d\d$"],
    "telemetry_cost": [r"^telemetry-bench: us_gpujobs=\d+\.\d us_powertools=\d+\.\d "
                       r"ratio=\d+\.\d\d$"],
}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


#: the runs still going, stopped by their own process group if the session ends first
_LIVE: set[subprocess.Popen] = set()


def _run(script: str) -> subprocess.CompletedProcess:
    """``script`` is a script's name, then any options of its own."""
    name, *options = script.split()
    proc = subprocess.Popen([sys.executable, f"bench/{name}.py", *options, "--quick"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            env={**os.environ, "POWERTOOLS_METRICS_DISABLED": "true"})
    _LIVE.add(proc)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own group: the stacks it started too
        out, _ = proc.communicate()
        out += f"\n!! killed after {TIMEOUT_S} s"
    finally:
        _LIVE.discard(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


class _Runs:
    """The scripts' --quick runs on a pool of AT_ONCE; a test waits for its own.
    In one process all are started at once (longest first); under
    pytest-xdist, where this module's tests may be spread over workers, each
    run starts when a test asks for it, so no script runs twice."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor, eager: bool) -> None:
        self.pool, self.runs = pool, {}
        for script in (EXPECTED if eager else ()):
            if script != "dashboard" or CHROMIUM:
                self[script]

    def __getitem__(self, script: str) -> concurrent.futures.Future:
        if script not in self.runs:
            self.runs[script] = self.pool.submit(_run, script)
        return self.runs[script]


@pytest.fixture(scope="module")
def quick_runs():
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        try:
            yield _Runs(pool, eager="PYTEST_XDIST_WORKER" not in os.environ)
        finally:  # interrupted: nothing more starts, and what still runs stops here
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(_LIVE):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def test_every_script_in_bench_has_a_smoke_case():
    # record_torch needs torch and minutes of real runs: what it records
    # (bench/traces/torch_ddp.json) is read by stall_sim's quick run, through
    # real_traces, a module of stall_sim's
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")
               if not p.stem.startswith("_")
               and p.stem not in ("harness", "parity", "record_torch", "real_traces")}
    assert scripts == {case.split()[0] for case in EXPECTED}


@pytest.mark.moto  # moto and local stacks, in the scripts' own processes
@pytest.mark.e2e
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_quick_run_exits_0_and_prints_its_machine_line(script, quick_runs):
    if script == "dashboard" and not CHROMIUM:
        pytest.skip("!! CHROMIUM IS NOT INSTALLED: bench/dashboard.py cannot run "
                    "(apt-get install chromium chromium-driver)")
    done = quick_runs[script].result()
    tail = done.stdout[-4000:]
    assert done.returncode == 0, f"bench/{script} --quick exited {done.returncode}:\n{tail}"
    lines = done.stdout.splitlines()
    for pattern in EXPECTED[script]:
        assert any(re.search(pattern, line) for line in lines), \
            f"bench/{script} --quick printed no line matching {pattern!r}:\n{tail}"


def test_the_recorded_op_counts_equal_what_the_code_does_now(quick_runs):
    """docs/capacity_model.py reads docs/op_counts.json: it must equal what the
    code costs now, as op_counts.py counts it (its counts do not depend on
    --quick; the one run serves both this and the smoke case above)."""
    done = quick_runs["op_counts"].result()
    assert done.returncode == 0, done.stdout[-4000:]
    fresh = [line.removeprefix("OPCOUNTS ") for line in done.stdout.splitlines()
             if line.startswith("OPCOUNTS ")]
    assert len(fresh) == 1, done.stdout[-4000:]
    recorded = json.loads((ROOT / "docs/op_counts.json").read_text())
    assert json.loads(fresh[0]) == recorded, (
        "docs/op_counts.json differs from what the code costs now: run "
        "`python bench/op_counts.py --write docs/op_counts.json`")


# -- the parity check itself must be able to fail ----------------------------------------
ITEM = {"job_id": {"S": "job_A"}, "state": {"S": "SCHEDULED"},
        "updated_at": {"S": "2026-11-30T10:00:00.123456Z"},
        "message": {"S": '{"job_id": "job_A", "master_port": 1234}'},
        "ttl_epoch": {"N": "100"}}


def test_parity_ignores_only_ids_times_and_named_attributes():
    twin = {**ITEM, "job_id": {"S": "job_B"}, "updated_at": {"S": "2026-11-30T10:00:01Z"},
            "message": {"S": '{"job_id": "job_B", "master_port": 1234}'},
            "ttl_epoch": {"N": "101"}}
    harness.same_items("twin", ITEM, twin, ids=["job_A", "job_B"], ignore=["ttl_epoch"])


@pytest.mark.parametrize("change", [
    {"state": {"S": "RUNNING"}},                     # a different value
    {"events": {"M": {}}},                           # an attribute the other lacks
    {"message": {"S": '{"job_id": "job_A", "master_port": 4321}'}},  # inside JSON text
])
def test_parity_fails_on_any_other_difference(change):
    with pytest.raises(harness.Fail, match="parity drift"):
        harness.same_items("drift", {**ITEM, **change}, ITEM, ids=["job_A"],
                           ignore=["ttl_epoch"])


# -- the write-unit meter counts as DynamoDB bills -----------------------------------------
def test_item_sizes_follow_dynamodbs_rules():
    assert harness.value_size({"S": "héllo"}) == 6  # UTF-8 bytes
    assert harness.value_size({"N": "12345"}) == 4  # 5 significant digits: 3 + 1
    assert harness.value_size({"N": "-0.0012"}) == 2
    assert harness.value_size({"BOOL": True}) == harness.value_size({"NULL": True}) == 1
    assert harness.value_size({"SS": ["ab", "cde"]}) == 5
    assert harness.value_size({"L": [{"S": "ab"}, {"N": "1"}]}) == 3 + (1 + 2) + (1 + 2)
    assert harness.value_size({"M": {"k": {"S": "v"}}}) == 3 + 1 + 1 + 1
    assert harness.item_size({"job_id": {"S": "x" * 10}, "n": {"N": "7"}}) == 6 + 10 + 1 + 2
    assert harness.item_size(None) == 0


@pytest.mark.moto
def test_write_units_meter_the_table_transactions_and_each_index_entry(moto_server):
    """On the session's moto server (in this process, so the meter reads the
    items it holds), in a table of this test's own: moto's in-process
    mock would reset the backends every other test of the worker shares."""
    import uuid

    import boto3

    t = f"wu-meter-{uuid.uuid4().hex[:8]}"
    ddb = boto3.client("dynamodb", region_name=harness.REGION, endpoint_url=moto_server.endpoint_url,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    harness.meter_client(ddb)
    ddb.create_table(
        TableName=t, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"}
                              for a in ("id", "g", "sp")],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {"IndexName": name, "KeySchema": [{"AttributeName": key, "KeyType": "HASH"}],
             "Projection": {"ProjectionType": "ALL"}}
            for name, key in (("by_g", "g"), ("by_sp", "sp"))])
    big = {"id": {"S": "a"}, "g": {"S": "1"}, "pad": {"S": "x" * 1500}}  # 2 KB started

    def units(fn) -> tuple[int, int]:
        with harness.write_units() as wu:
            fn()
        assert wu.errors == 0
        return wu.table, wu.index

    assert units(lambda: ddb.put_item(TableName=t, Item=big)) == (2, 2)  # sparse: 0
    # a projected attribute changed: one put in by_g; its key changed: a delete and a put
    assert units(lambda: ddb.update_item(
        TableName=t, Key={"id": {"S": "a"}}, UpdateExpression="SET pad2 = :v",
        ExpressionAttributeValues={":v": {"S": "y"}})) == (2, 2)
    assert units(lambda: ddb.update_item(
        TableName=t, Key={"id": {"S": "a"}}, UpdateExpression="SET g = :v",
        ExpressionAttributeValues={":v": {"S": "2"}})) == (2, 4)
    # a transaction's items cost twice at the table, its index entries once
    assert units(lambda: ddb.transact_write_items(TransactItems=[
        {"Put": {"TableName": t, "Item": {**big, "id": {"S": "b"}}}},
        {"Update": {"TableName": t, "Key": {"id": {"S": "c"}},
                    "UpdateExpression": "SET sp = :v",
                    "ExpressionAttributeValues": {":v": {"S": "s"}}}}])) == (4 + 2, 2 + 1)
    # a write that fails its condition: the table's units, no index entry
    failed = harness.write_units()
    with failed, pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        ddb.put_item(TableName=t, Item=big, ConditionExpression="attribute_not_exists(id)")
    assert (failed.table, failed.index, failed.failed) == (2, 0, 1)
    assert units(lambda: ddb.delete_item(TableName=t, Key={"id": {"S": "b"}})) == (2, 2)
