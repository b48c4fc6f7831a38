"""docs/capacity_model.py takes its per-operation counts from bench/op_counts.py
(recorded in docs/op_counts.json, which must equal a fresh count), and the
bench counts capacity by DynamoDB's rules (checked on small examples)."""
from __future__ import annotations

import copy
import importlib.util
import pathlib
import subprocess
import sys
import uuid

import pytest

from bench import harness
from bench.op_counts import Meter, read_units

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _model():
    spec = importlib.util.spec_from_file_location("capacity_model", ROOT / "docs/capacity_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the model reads the bench's counts ------------------------------------------------
def test_the_model_types_in_no_per_operation_count():
    text = (ROOT / "docs/capacity_model.py").read_text()
    for gone in ("HEARTBEAT_ITEM", "JOB_ITEM", "NODE_ITEM", "JOB_GET_RRU", "ATTEMPT_RRU",
                 "NODE_GSIS_WRITTEN_PER_CALL_IN", "WRU_PER_JOB", "WRU_PER_HOST_START",
                 "ENSURE_EVERY_S"):
        assert gone not in text


def test_deploy_md_shows_what_the_model_prints_now():
    """The bill in docs/deploy.md is the model's output on the recorded counts,
    not an older run's: re-run `python docs/capacity_model.py` into it."""
    printed = subprocess.run([sys.executable, "docs/capacity_model.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    doc = (ROOT / "docs/deploy.md").read_text()
    shown = doc.split("<!-- capacity_model.py output -->\n", 1)[1].split(
        "\n<!-- end of capacity_model.py output -->", 1)[0]
    assert shown == printed.rstrip("\n")


def test_the_model_follows_the_counts():
    cm = _model()
    counted = cm.counts()
    more = copy.deepcopy(counted)
    for ranks in (8, 64, 256):
        more[f"heartbeat_post_{ranks}"]["wru"] *= 2
    base, doubled = cm.model(100_000, counted), cm.model(100_000, more)
    assert doubled["w_beats"] == pytest.approx(2 * base["w_beats"])
    assert doubled["total"] > base["total"]
    # one item per host and no index write per call-in: the keys and the verdict follow
    for ranks in (8, 64, 256):
        more[f"heartbeat_post_{ranks}"]["wru"] = 1
    more["node_call_in"]["keys"]["w"] = {}
    assert "ready_any" not in cm.verdict(cm.model(100_000, more))


def test_agents_pay_http_api_tiers_and_tenants_rest_api_tiers():
    """Beats (carrying call-ins) and attempt events go to the agents' HTTP API; job
    reads and creates stay on the REST API (docs/deploy.md)."""
    cm = _model()
    counted = cm.counts()
    row = cm.model(100_000, counted)
    one, two = counted["lifecycle_1_host"]["http"], counted["lifecycle_2_host"]["http"]
    assert one - (two - one) == counted["job_create"]["http"]  # a job's own: its create
    # a busy node's call-ins ride on its heartbeat POSTs: no request of their own
    assert counted["heartbeat_call_in_8"]["http"] == counted["heartbeat_post_8"]["http"] == 1
    assert row["node"] > 0
    assert row["agent_api"] == pytest.approx(row["hb"] + row["agent_lifecycle"])
    assert row["agent_lifecycle"] == pytest.approx((two - one) * row["host_starts_h"] / 3600)
    assert row["tenant_api"] == pytest.approx(
        row["gets"] + counted["job_create"]["http"] * row["starts_h"] / 3600)
    assert row["agent_api"] + row["tenant_api"] == pytest.approx(row["api"])
    month = cm.SECONDS_PER_MONTH
    assert row["cost"]["API Gateway HTTP API (agents)"] == pytest.approx(
        cm.tiered(row["agent_api"] * month, cm.APIGW_HTTP_TIERS))
    assert row["cost"]["API Gateway REST API (tenants)"] == pytest.approx(
        cm.tiered(row["tenant_api"] * month, cm.APIGW_REST_TIERS))
    apigw = sum(v for k, v in row["cost"].items() if k.startswith("API Gateway"))
    assert apigw < row["rest_api"]


# that docs/op_counts.json equals a fresh count is checked on bench/op_counts.py's
# one run of the suite: tests/test_bench_smoke.py,
# test_the_recorded_op_counts_equal_what_the_code_does_now


# -- DynamoDB's rules ------------------------------------------------------------------
def test_read_units_follow_dynamodbs_rules():
    # GetItem: 4 KB a unit, per item, at least one; eventually consistent: half
    assert read_units([3_500], True, per_item=True) == 1
    assert read_units([8 * 1024], True, per_item=True) == 2
    assert read_units([8 * 1024], False, per_item=True) == 1
    assert read_units([0], True, per_item=True) == 1          # no item still costs a unit
    assert read_units([100, 100], True, per_item=True) == 2   # BatchGetItem: per item
    # Query: the items' summed size, rounded up once
    assert read_units([100] * 40, True, per_item=False) == 1  # 4,000 B
    assert read_units([200] * 1000, True, per_item=False) == 49  # 200,000 B
    assert read_units([200] * 1000, False, per_item=False) == 24.5


def test_item_size_of_a_heartbeat_like_item():
    item = {"shard_key": {"S": "job_01ABC#1#0"}, "rank": {"N": "7"},
            "heard_at": {"S": "2026-01-05T12:00:01.000Z"}}
    # names and values: 9 + 13, 4 + (1 digit: 1 + 1), 8 + 24
    assert harness.item_size(item) == (9 + 13) + (4 + 2) + (8 + 24)


@pytest.mark.moto
def test_the_meter_counts_table_index_transaction_and_read_units(moto_server):
    import boto3

    t = f"oc-meter-{uuid.uuid4().hex[:8]}"
    args = {"region_name": harness.REGION, "endpoint_url": moto_server.endpoint_url,
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    raw, ddb = boto3.client("dynamodb", **args), boto3.client("dynamodb", **args)
    harness.meter_client(ddb)
    ddb.create_table(
        TableName=t, BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"} for a in ("id", "g")],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[{"IndexName": "by_g",
                                 "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                                 "Projection": {"ProjectionType": "ALL"}}])
    big = {"id": {"S": "a"}, "g": {"S": "1"}, "pad": {"S": "x" * 1500}}  # 2 KB started

    def units(fn) -> Meter:
        with Meter(raw) as m:
            fn()
        assert m.errors == 0
        return m

    put = units(lambda: ddb.put_item(TableName=t, Item=big))
    assert (put.total, put.keys["w"]) == (4, {t + "|a": 2, t + "/by_g|1": 2})
    # the index key changes: a delete and a put in the index
    moved = units(lambda: ddb.update_item(
        TableName=t, Key={"id": {"S": "a"}}, UpdateExpression="SET g = :v",
        ExpressionAttributeValues={":v": {"S": "2"}}))
    assert moved.total == 2 + 4
    # a transaction: twice at the table, the index entry once
    tx = units(lambda: ddb.transact_write_items(TransactItems=[
        {"Put": {"TableName": t, "Item": {"id": {"S": "b"}, "n": {"N": "1"}}}}]))
    assert tx.total == 2
    # reads: a consistent GetItem of 1.5 KB, an eventual one, an index Query
    # whose filter drops the item (read all the same, at its whole size)
    get = units(lambda: ddb.get_item(TableName=t, Key={"id": {"S": "a"}}, ConsistentRead=True,
                                     ProjectionExpression="id"))
    assert get.rru == 1
    assert units(lambda: ddb.get_item(TableName=t, Key={"id": {"S": "a"}})).rru == 0.5
    q = units(lambda: ddb.query(
        TableName=t, IndexName="by_g", KeyConditionExpression="g = :g",
        FilterExpression="#p = :no", ExpressionAttributeNames={"#p": "pad"},
        ExpressionAttributeValues={":g": {"S": "2"}, ":no": {"S": "no"}}))
    assert (q.rru, q.keys["r"]) == (0.5, {t + "/by_g|2": 0.5})
