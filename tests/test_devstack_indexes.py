"""The local stack's state saved by an older checkout gets the indexes the
template added since (here the jobs table's by_parent), so a restart after
an upgrade still lists an array's children. On the session's moto server, in
a stage of its own (moto's in-process mock would reset the backends that
server shares with every other test of this worker)."""
from __future__ import annotations

import uuid

import boto3

from devstack import resources


def test_restored_tables_get_the_indexes_added_since(moto_server):
    stage = f"idx{uuid.uuid4().hex[:8]}"
    resources.deploy(moto_server.endpoint_url, stage=stage)
    ddb = boto3.client("dynamodb", endpoint_url=moto_server.endpoint_url,
                       region_name="us-east-1", aws_access_key_id="local",
                       aws_secret_access_key="local")
    table = f"gpujobs-{stage}-jobs"
    ddb.update_table(TableName=table, GlobalSecondaryIndexUpdates=[
        {"Delete": {"IndexName": "by_parent"}}])  # as an older template made it
    added = resources.add_missing_indexes(moto_server.endpoint_url, stage=stage)
    assert added == [f"{table}/by_parent"]
    assert resources.add_missing_indexes(moto_server.endpoint_url, stage=stage) == []
    ddb.put_item(TableName=table, Item={"job_id": {"S": "job_child"},
                                        "parent_id": {"S": "job_parent"}})
    found = ddb.query(TableName=table, IndexName="by_parent",
                      KeyConditionExpression="parent_id = :p",
                      ExpressionAttributeValues={":p": {"S": "job_parent"}})
    assert [i["job_id"]["S"] for i in found["Items"]] == ["job_child"]


def test_an_index_whose_projection_changed_is_made_again(moto_server):
    # DynamoDB cannot change a projection in place: state saved before the
    # nodes' placement indexes projected only what the placer reads (issue 30)
    stage = f"idx{uuid.uuid4().hex[:8]}"
    resources.deploy(moto_server.endpoint_url, stage=stage)
    ddb = boto3.client("dynamodb", endpoint_url=moto_server.endpoint_url,
                       region_name="us-east-1", aws_access_key_id="local",
                       aws_secret_access_key="local")
    table = f"gpujobs-{stage}-nodes"
    ddb.update_table(TableName=table, GlobalSecondaryIndexUpdates=[
        {"Delete": {"IndexName": "ready_any"}}])
    ddb.update_table(TableName=table, AttributeDefinitions=[
        {"AttributeName": "ready_any", "AttributeType": "S"},
        {"AttributeName": "gpus_free", "AttributeType": "N"}],
        GlobalSecondaryIndexUpdates=[{"Create": {
            "IndexName": "ready_any", "Projection": {"ProjectionType": "ALL"},
            "KeySchema": [{"AttributeName": "ready_any", "KeyType": "HASH"},
                          {"AttributeName": "gpus_free", "KeyType": "RANGE"}]}}])
    assert resources.add_missing_indexes(moto_server.endpoint_url, stage=stage) == [
        f"{table}/ready_any"]
    assert resources.add_missing_indexes(moto_server.endpoint_url, stage=stage) == []
    [index] = [i for i in ddb.describe_table(TableName=table)["Table"]["GlobalSecondaryIndexes"]
               if i["IndexName"] == "ready_any"]
    assert index["Projection"]["ProjectionType"] == "INCLUDE"
    assert "last_seen_at" not in index["Projection"]["NonKeyAttributes"]
