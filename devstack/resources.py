"""Create the tables and queues by deploying infra/template.yaml into moto,
exactly as CloudFormation would on AWS."""
from __future__ import annotations

import pathlib

import boto3
import yaml

TEMPLATE = pathlib.Path(__file__).resolve().parent.parent / "infra" / "template.yaml"

#: stack output -> the environment variable chalicelib.config reads
OUTPUT_ENV = {
    "JobsTableName": "GPUJOBS_JOBS_TABLE",
    "IdempotencyTableName": "GPUJOBS_IDEMPOTENCY_TABLE",
    "AttemptsTableName": "GPUJOBS_ATTEMPTS_TABLE",
    "OutboxTableName": "GPUJOBS_OUTBOX_TABLE",
    "NodesTableName": "GPUJOBS_NODES_TABLE",
    "HeartbeatsTableName": "GPUJOBS_HEARTBEATS_TABLE",
    "CollectorTableName": "GPUJOBS_COLLECTOR_TABLE",
    "FleetTableName": "GPUJOBS_FLEET_TABLE",
    "TenantsTableName": "GPUJOBS_TENANTS_TABLE",
    "EventsTableName": "GPUJOBS_EVENTS_TABLE",
    "UsageTableName": "GPUJOBS_USAGE_TABLE",
    "EventBusName": "GPUJOBS_EVENT_BUS",
    "WebhooksTableName": "GPUJOBS_WEBHOOKS_TABLE",
    "PendingQueueUrl": "GPUJOBS_PENDING_QUEUE_URL",
    "ScanQueueUrl": "GPUJOBS_SCAN_QUEUE_URL",
    "FollowUpQueueUrl": "GPUJOBS_FOLLOW_UP_QUEUE_URL",
    "WebhookQueueUrl": "GPUJOBS_WEBHOOK_QUEUE_URL",
    "InboxDeadLetterQueueArn": "GPUJOBS_INBOX_DLQ_ARN",
    "InboxQueuePrefix": "GPUJOBS_INBOX_QUEUE_PREFIX",
    "RankLogGroupName": "GPUJOBS_LOG_GROUP",
}


def _client(service: str, endpoint_url: str, region: str):
    return boto3.session.Session().client(service, endpoint_url=endpoint_url,
                                          region_name=region)


def deploy(endpoint_url: str, *, stage: str = "local", region: str = "us-east-1") -> dict:
    """Deploy the template; returns the environment the app needs to find it."""
    cfn = _client("cloudformation", endpoint_url, region)
    name = f"gpujobs-{stage}"
    cfn.create_stack(StackName=name, TemplateBody=TEMPLATE.read_text(),
                     Parameters=[{"ParameterKey": "Stage", "ParameterValue": stage}])
    cfn.get_waiter("stack_create_complete").wait(
        StackName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
    stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    _enable_ttl(endpoint_url, region, stage)
    return {env: outputs[key] for key, env in OUTPUT_ENV.items()} | {
        "GPUJOBS_AWS_ENDPOINT_URL": endpoint_url, "AWS_DEFAULT_REGION": region}


def _enable_ttl(endpoint_url: str, region: str, stage: str) -> None:
    # moto's CloudFormation ignores TimeToLiveSpecification: apply it from the
    # same template, so the deployed tables match what AWS would create
    ddb = _client("dynamodb", endpoint_url, region)
    template = yaml.load(TEMPLATE.read_text(), Loader=_CfnLoader)
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        ttl = props.get("TimeToLiveSpecification")
        if resource["Type"] != "AWS::DynamoDB::Table" or not ttl:
            continue
        table = props["TableName"].replace("${Stage}", stage)
        ddb.update_time_to_live(TableName=table, TimeToLiveSpecification={
            "AttributeName": ttl["AttributeName"], "Enabled": ttl["Enabled"]})


def add_missing_indexes(endpoint_url: str, *, stage: str = "local",
                        region: str = "us-east-1") -> list[str]:
    """Give restored tables the global indexes the template added since they
    were saved (state from an older checkout), and make again those whose
    projection it changed since (DynamoDB cannot change one in place: the
    nodes' placement indexes, issue 30); the names of those made."""
    ddb = _client("dynamodb", endpoint_url, region)
    template = yaml.load(TEMPLATE.read_text(), Loader=_CfnLoader)
    added = []
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] != "AWS::DynamoDB::Table" or not props.get("GlobalSecondaryIndexes"):
            continue
        table = props["TableName"].replace("${Stage}", stage)
        have = {i["IndexName"]: _projection(i["Projection"]) for i in ddb.describe_table(
            TableName=table)["Table"].get("GlobalSecondaryIndexes", [])}
        for index in props["GlobalSecondaryIndexes"]:
            name = index["IndexName"]
            if have.get(name) == _projection(index["Projection"]):
                continue
            if name in have:
                ddb.update_table(TableName=table, GlobalSecondaryIndexUpdates=[
                    {"Delete": {"IndexName": name}}])
            keys = {k["AttributeName"] for k in index["KeySchema"]}
            ddb.update_table(
                TableName=table,
                AttributeDefinitions=[a for a in props["AttributeDefinitions"]
                                      if a["AttributeName"] in keys],
                GlobalSecondaryIndexUpdates=[{"Create": {
                    "IndexName": index["IndexName"], "KeySchema": index["KeySchema"],
                    "Projection": index["Projection"]}}])
            added.append(f"{table}/{index['IndexName']}")
    return added


def _projection(projection: dict) -> tuple[str, frozenset[str]]:
    return projection["ProjectionType"], frozenset(projection.get("NonKeyAttributes", ()))


class _CfnLoader(yaml.SafeLoader):
    """Reads CloudFormation's short tags (!Sub, !Ref, ...) as plain values."""


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)


_CfnLoader.add_multi_constructor("!", _tag)
