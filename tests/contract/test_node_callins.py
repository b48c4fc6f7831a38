"""Node call-ins at scale (issue 30), on moto: a call-in that changed nothing
writes the base item's ``last_seen_at`` alone and neither placement index;
what does change still reaches the indexes and the fleet totals."""
from __future__ import annotations

import re
from datetime import timedelta

import boto3
import pytest
import yaml
from botocore.client import BaseClient

from chalicelib.adapters import models
from chalicelib.domain.clock import utcnow
from chalicelib.domain.nodes import NodeState
from tests.contract.ports import Ports, real_ports

TEMPLATE = "infra/template.yaml"
INDEXES = ("ready_by_type", "ready_any")


@pytest.fixture
def real(aws_env) -> Ports:
    return real_ports(aws_env)


@pytest.fixture
def calls(monkeypatch):
    """Every AWS request sent from now on, as (operation, parameters)."""
    seen: list[tuple[str, dict]] = []
    send = BaseClient._make_api_call

    def recorded(self, operation, params):
        seen.append((operation, params))
        return send(self, operation, params)
    monkeypatch.setattr(BaseClient, "_make_api_call", recorded)
    return seen


def _projected(aws_env) -> dict[str, set[str]]:
    """Index -> every attribute it stores (keys and projection), as the table has it."""
    ddb = boto3.client("dynamodb", endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"],
                       region_name="us-east-1")
    table = ddb.describe_table(TableName=models.NodeModel.Meta.table_name)["Table"]
    base = {k["AttributeName"] for k in table["KeySchema"]}
    out = {}
    for index in table["GlobalSecondaryIndexes"]:
        projection = index["Projection"]
        assert projection["ProjectionType"] != "ALL", index["IndexName"]
        out[index["IndexName"]] = base | {k["AttributeName"] for k in index["KeySchema"]} | set(
            projection.get("NonKeyAttributes", ()))
    return out


def _updates(calls) -> list[dict]:
    return [p for op, p in calls if op == "UpdateItem"]


def _named(request: dict) -> set[str]:
    """The stored attributes an UpdateItem's expression writes."""
    names = request.get("ExpressionAttributeNames", {})
    return {names[n] for n in re.findall(r"#\w+", request["UpdateExpression"])}


def _register(ports: Ports, n: int = 0, **kw):
    """A call-in of node ``n``, its inbox a real queue: the node stays READY
    on the shared stack, where another test's placer may send to it (and
    tests/test_iam_policy.py holds every send to the policy)."""
    node_id = ports.node_id(n)
    args = {"gpus": 8, "gpu_type": ports.gpu_type(), "labels": {"zone": "a"},
            "address": f"10.0.0.{n}", "inbox_queue_url": ports.inbox.ensure(node_id),
            "now": utcnow(), "isolation": "none", **kw}
    return ports.nodes.register(node_id, current=ports.nodes.get(node_id), **args)


def test_the_placement_indexes_do_not_project_last_seen_at(real, aws_env):
    with open(TEMPLATE) as f:
        template = yaml.load(f, Loader=yaml.BaseLoader)  # !Sub etc. as plain text
    declared = {i["IndexName"]: i["Projection"] for i in
                template["Resources"]["NodesTable"]["Properties"]["GlobalSecondaryIndexes"]}
    for name in INDEXES:
        assert declared[name] == {"ProjectionType": "INCLUDE",
                                  "NonKeyAttributes": models.READY_PROJECTED}, \
            "the template and the model declare the same projection"
    projected = _projected(aws_env)
    for name in INDEXES:
        assert "last_seen_at" not in projected[name], name


def test_a_call_in_that_changed_nothing_sets_only_last_seen_at(real, calls, aws_env):
    first = _register(real)
    current = real.nodes.get(first.node_id)
    calls.clear()
    later = first.last_seen_at + timedelta(seconds=10)
    again = real.nodes.register(first.node_id, gpus=8, gpu_type=real.gpu_type(),
                                labels={"zone": "a"}, address="10.0.0.0",
                                inbox_queue_url=first.inbox_queue_url, now=later,
                                current=current, isolation="none")
    assert [op for op, _ in calls] == ["UpdateItem"], "one small write, nothing else"
    [update] = _updates(calls)
    assert re.fullmatch(r"SET #\w+ = :\w+", update["UpdateExpression"]), update
    assert _named(update) == {"last_seen_at"}
    for name, stored in _projected(aws_env).items():
        assert not _named(update) & stored, f"the call-in writes index {name}"
    assert again.last_seen_at == later and again.state is NodeState.READY
    assert again.labels == {"zone": "a"} and again.gpus_free == 8
    assert real.nodes.get(first.node_id) == again


def test_what_changes_still_reaches_the_indexes_and_the_fleet(real, calls, aws_env):
    node = _register(real, gpus=4)
    fleet = real.nodes.fleet_of(real.gpu_type())
    calls.clear()
    grown = _register(real, gpus=8)
    writes = [p for op, p in calls if op == "TransactWriteItems"]
    assert len(writes) == 1, "the node and the fleet totals in one transaction"
    [node_update] = [i["Update"] for i in writes[0]["TransactItems"]
                     if i["Update"]["TableName"] == models.NodeModel.Meta.table_name]
    assert {"gpus", "gpus_free", "last_seen_at"} == _named(node_update)
    assert (grown.gpus, grown.gpus_free) == (8, 8)
    assert real.nodes.fleet_of(real.gpu_type()).gpus == fleet.gpus + 4
    [page] = list(real.nodes.ready_pages(real.gpu_type(), 1))
    assert [(n.node_id, n.gpus, n.gpus_free) for n in page] == [(node.node_id, 8, 8)]

    calls.clear()
    relabelled = _register(real, gpus=8, labels={"zone": "b"}, address="10.9.9.9")
    assert _named(_updates(calls)[0]) == {"last_seen_at", "labels", "address"}
    assert relabelled.labels == {"zone": "b"}
    [page] = list(real.nodes.ready_pages(real.gpu_type(), 1))
    assert page[0].address == "10.9.9.9", "the placer's MASTER_ADDR follows the node"

    retyped = _register(real, gpus=8, gpu_type=real.gpu_type(1))
    assert retyped.gpu_type == real.gpu_type(1)
    assert list(real.nodes.ready_pages(real.gpu_type(), 1)) == []
    assert [n.node_id for p in real.nodes.ready_pages(real.gpu_type(1), 1) for n in p] == [
        node.node_id]
    assert real.nodes.fleet_of(real.gpu_type()).gpus == 0, "it left its old type's fleet"
    assert real.nodes.fleet_of(real.gpu_type(1)).gpus == 8


def test_a_return_from_down_puts_the_node_back_in_the_indexes(real):
    node = _register(real)
    assert real.nodes.mark_down(node)
    assert list(real.nodes.ready_pages(real.gpu_type(), 1)) == []
    room = real.nodes.fleet_of(real.gpu_type()).room_version
    back = _register(real, now=node.last_seen_at + timedelta(seconds=90))
    assert back.state is NodeState.READY
    assert [n.node_id for p in real.nodes.ready_pages(real.gpu_type(), 1) for n in p] == [
        node.node_id]
    assert real.nodes.fleet_of(real.gpu_type()).room_version > room, "room appeared"


def test_a_call_in_within_its_fresh_lease_changing_nothing_writes_nothing(ports):
    """Half the node writes (issue 30): a call-in that changes nothing is not
    written while the recorded ``last_seen_at`` is younger than ``fresh_s``;
    past it, or with anything changed, it is written as before."""
    first = _register(ports)
    t0 = first.last_seen_at
    kept = _register(ports, now=t0 + timedelta(seconds=10), fresh_s=15)
    assert kept == first and ports.nodes.get(first.node_id).last_seen_at == t0
    renewed = _register(ports, now=t0 + timedelta(seconds=20), fresh_s=15)
    assert renewed.last_seen_at == t0 + timedelta(seconds=20)
    assert ports.nodes.get(first.node_id) == renewed
    relabelled = _register(ports, now=t0 + timedelta(seconds=21), fresh_s=15,
                           labels={"zone": "b"})
    assert relabelled.labels == {"zone": "b"}
    assert relabelled.last_seen_at == t0 + timedelta(seconds=21), "a change is written at once"
