"""devstack/mototx.py on the session's moto server: a cancelled transaction
leaves every item as it was (puts undone, updates undone, deletes undone)
and answers the reasons moto answers; one that succeeds writes them all."""
from __future__ import annotations

import uuid

import boto3
import pytest
from botocore.exceptions import ClientError


@pytest.fixture
def ddb(moto_server):
    client = boto3.client("dynamodb", endpoint_url=moto_server.endpoint_url,
                          region_name="us-east-1", aws_access_key_id="local",
                          aws_secret_access_key="local")
    names = {}
    for kind, keys in (("hash", [("pk", "HASH")]), ("range", [("pk", "HASH"), ("sk", "RANGE")])):
        names[kind] = f"mototx-{kind}-{uuid.uuid4().hex[:8]}"
        client.create_table(TableName=names[kind], BillingMode="PAY_PER_REQUEST",
                            KeySchema=[{"AttributeName": a, "KeyType": t} for a, t in keys],
                            AttributeDefinitions=[{"AttributeName": a, "AttributeType": "S"}
                                                  for a, _ in keys])
    try:
        yield client, names
    finally:
        for name in names.values():
            client.delete_table(TableName=name)


def _all(client, name):
    return sorted((i for i in client.scan(TableName=name)["Items"]), key=str)


def test_a_cancelled_transaction_leaves_every_item_as_it_was(ddb):
    client, t = ddb
    client.put_item(TableName=t["hash"], Item={"pk": {"S": "a"}, "n": {"N": "1"},
                                               "m": {"M": {"x": {"S": "y"}}}})
    client.put_item(TableName=t["range"], Item={"pk": {"S": "a"}, "sk": {"S": "1"}})
    client.put_item(TableName=t["hash"], Item={"pk": {"S": "gone"}})
    before = {k: _all(client, n) for k, n in t.items()}
    with pytest.raises(ClientError) as cancelled:
        client.transact_write_items(TransactItems=[
            {"Update": {"TableName": t["hash"], "Key": {"pk": {"S": "a"}},
                        "UpdateExpression": "SET n = :two, m.x = :z",
                        "ExpressionAttributeValues": {":two": {"N": "2"}, ":z": {"S": "z"}}}},
            {"Put": {"TableName": t["range"], "Item": {"pk": {"S": "a"}, "sk": {"S": "2"}}}},
            {"Put": {"TableName": t["hash"], "Item": {"pk": {"S": "new"}}}},
            {"Delete": {"TableName": t["hash"], "Key": {"pk": {"S": "gone"}}}},
            {"ConditionCheck": {"TableName": t["range"],
                                "Key": {"pk": {"S": "a"}, "sk": {"S": "1"}},
                                "ConditionExpression": "attribute_exists(nope)"}}])
    error = cancelled.value.response
    assert error["Error"]["Code"] == "TransactionCanceledException"
    assert [r["Code"] for r in error["CancellationReasons"]] == \
        ["None", "None", "None", "None", "ConditionalCheckFailed"]
    assert {k: _all(client, n) for k, n in t.items()} == before


def test_a_transaction_that_succeeds_writes_every_item(ddb):
    client, t = ddb
    client.transact_write_items(TransactItems=[
        {"Put": {"TableName": t["hash"], "Item": {"pk": {"S": "a"}, "n": {"N": "1"}}}},
        {"Put": {"TableName": t["range"], "Item": {"pk": {"S": "a"}, "sk": {"S": "1"}}}}])
    client.transact_write_items(TransactItems=[
        {"Update": {"TableName": t["hash"], "Key": {"pk": {"S": "a"}},
                    "UpdateExpression": "ADD n :one", "ConditionExpression": "n = :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}}}}])
    assert _all(client, t["hash"]) == [{"pk": {"S": "a"}, "n": {"N": "2"}}]
    assert _all(client, t["range"]) == [{"pk": {"S": "a"}, "sk": {"S": "1"}}]
