"""The job side's requests, built without DynamoDB: what the stores send
(adapters/job_store.py, transitions.py), in the order their error handling
reads the cancellation reasons in, stamped by the injected clock."""
from __future__ import annotations

from datetime import datetime, timezone
from unittest import mock

from chalicelib.adapters.dynamo import Dynamo
from chalicelib.adapters.job_store import DynamoJobs, cancel_unplaced_writes, create_writes
from chalicelib.adapters.models import AttemptModel, JobModel, NodeModel, OutboxModel, TenantModel
from chalicelib.adapters.store import DynamoStore
from chalicelib.adapters.transitions import place_writes
from chalicelib.domain.health import initial_health
from chalicelib.domain.intents import launch_intent
from chalicelib.domain.jobs import Job
from chalicelib.domain.placement import Plan
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.states import JobState
from chalicelib.service.ports import IdemClaim

T0 = datetime(2026, 12, 1, 2, 3, 4, 567000, tzinfo=timezone.utc)
LATER = datetime(2027, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)


def _job(**changes) -> Job:
    spec = JobSpec.parse({"command": ["python", "train.py"], "ranks": 4})
    values = dict(job_id="j-0123456789abcdef", tenant="acme", state=JobState.PENDING,
                  spec=spec, created_at=T0, updated_at=T0, health=initial_health(spec, 60))
    return Job(**{**values, **changes})


def _sent(items: list[dict]) -> dict:
    """The transaction's lists as the connection gets them."""
    connection = mock.Mock()
    connection.transact_write_items.return_value = {}  # DynamoDB's answer to a write
    with Dynamo(connection).transaction() as tx:
        tx.add(items)
    return connection.transact_write_items.call_args.kwargs


def test_a_placements_reasons_are_attempt_intent_job_nodes_then_the_tenant():
    """place reads reason [0] as the attempt (another placer got there),
    [3:3+n] as the nodes in sorted order and the last as the tenant's
    counter: DynamoDB lists reasons checks, deletes, puts, updates."""
    job = _job()
    plan = Plan({"n2": [2, 3], "n1": [0, 1]}, 1)
    intent = launch_intent(job, 1, plan.ranks_by_node, {"n1": "q1", "n2": "q2"}, "n1", 29500)
    sent = _sent(place_writes(job, plan, intent, T0))
    ordered = [*sent["condition_check_items"], *sent["delete_items"], *sent["put_items"],
               *sent["update_items"]]
    tables = [r["TableName"] for r in ordered]
    assert tables == [AttemptModel.Meta.table_name, OutboxModel.Meta.table_name,
                      JobModel.Meta.table_name, NodeModel.Meta.table_name,
                      NodeModel.Meta.table_name, TenantModel.Meta.table_name]
    assert [r["Key"] for r in ordered[3:5]] == [{"node_id": {"S": "n1"}},
                                                {"node_id": {"S": "n2"}}]
    assert ordered[2]["ConditionExpression"] == "#state = :in0 AND #attempt = :at"
    assert ordered[2]["ExpressionAttributeValues"][":in0"] == {"S": "PENDING"}


def test_a_keyed_create_puts_the_key_first_and_counts_last():
    """create reads reason [0] as the key's record and the last as the counter."""
    items = create_writes(_job(), IdemClaim("acme#k", "h"), max_pending=3)
    assert [next(iter(i)) for i in items] == ["Put", "Put", "Update"]
    assert items[0]["Put"]["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert items[2]["Update"]["ConditionExpression"] == \
        "attribute_not_exists(#pending) OR #pending <= :room"


def test_a_keyed_cancel_also_expires_the_key():
    assert len(cancel_unplaced_writes(_job(), T0, None)) == 2
    keyed = cancel_unplaced_writes(_job(idem_id="acme#k"), T0, None)
    assert keyed[2]["Update"]["Key"] == {"idem_id": {"S": "acme#k"}}


def test_a_stores_events_carry_the_injected_clocks_time():
    """Stores take bootstrap's clock: an event a write stamps itself (the
    waiting reason here) is at that clock's time, not the machine's."""
    dynamo = mock.Mock(spec=Dynamo)
    DynamoJobs(dynamo, clock=lambda: LATER).set_pending_reason(_job(), "no room")
    (request,), _ = dynamo.update.call_args
    [event] = [v for k, v in request["ExpressionAttributeValues"].items() if k.startswith(":k")]
    assert event["M"]["time"] == {"S": "2027-01-02T03:04:05.678Z"}


def test_one_store_object_serves_every_port_of_the_job_tables():
    store = DynamoStore(mock.Mock(spec=Dynamo))
    for method in ("create", "view", "page", "attempt", "record_ranks", "release",
                   "due_intents", "ack_intent", "place", "request_cancel", "end_attempt"):
        assert callable(getattr(store, method))
