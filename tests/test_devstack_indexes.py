"""The local stack's state saved by an older checkout gets the indexes the
template added since (here the jobs table's by_parent), so a restart after
an upgrade still lists an array's children."""
from __future__ import annotations

import boto3
from moto import mock_aws

from devstack import resources


def test_restored_tables_get_the_indexes_added_since():
    with mock_aws():
        resources.deploy(None)
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        ddb.update_table(TableName="gpujobs-local-jobs", GlobalSecondaryIndexUpdates=[
            {"Delete": {"IndexName": "by_parent"}}])  # as an older template made it
        assert resources.add_missing_indexes(None) == ["gpujobs-local-jobs/by_parent"]
        assert resources.add_missing_indexes(None) == []
        ddb.put_item(TableName="gpujobs-local-jobs", Item={
            "job_id": {"S": "job_child"}, "parent_id": {"S": "job_parent"}})
        found = ddb.query(TableName="gpujobs-local-jobs", IndexName="by_parent",
                          KeyConditionExpression="parent_id = :p",
                          ExpressionAttributeValues={":p": {"S": "job_parent"}})
        assert [i["job_id"]["S"] for i in found["Items"]] == ["job_child"]
