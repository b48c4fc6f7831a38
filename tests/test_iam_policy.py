"""IAM: each stage's hand-written policy (.chalice/policy-<stage>.json) grants
every AWS call the code makes, and is scoped to that stage's resources.

The calls are recorded over the whole test session by tests/iam_recorder.py;
the check of the recording runs after every other test. Set IAM_POLICY_DIR
to try a candidate policy folder without touching .chalice/.
"""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from tests import iam_recorder as rec

ROOT = pathlib.Path(__file__).resolve().parents[1]
POLICY_DIR = pathlib.Path(os.environ.get("IAM_POLICY_DIR") or ROOT / ".chalice")
ACCOUNT, REGION = "123456789012", "us-east-1"

#: what the Lambda service itself does with PlaceOnNudge's role to feed it from
#: the pending queue (the event source mapping); the code never makes these calls
EVENT_SOURCE_ACTIONS = ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")


def policy(stage: str) -> dict:
    return json.loads((POLICY_DIR / f"policy-{stage}.json").read_text())


def _arn_sqs(name: str) -> str:
    return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"


# -- how calls become IAM requests, and how a policy is read ---------------------------
def test_a_transaction_is_authorised_item_by_item():
    params = {"TransactItems": [
        {"Put": {"TableName": "gpujobs-t1a2b3c4d5-idempotency"}},
        {"Update": {"TableName": "gpujobs-test-jobs"}},
        {"ConditionCheck": {"TableName": "gpujobs-test-nodes"}},
        {"Delete": {"TableName": "gpujobs-test-outbox"}},
    ]}
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/"
    assert rec.iam_requests("dynamodb", "TransactWriteItems", params) == [
        ("dynamodb:PutItem", table + "gpujobs-dev-idempotency"),
        ("dynamodb:UpdateItem", table + "gpujobs-dev-jobs"),
        ("dynamodb:ConditionCheckItem", table + "gpujobs-dev-nodes"),
        ("dynamodb:DeleteItem", table + "gpujobs-dev-outbox"),
    ]


def test_index_batch_queue_and_parameter_requests():
    table = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/"
    assert rec.iam_requests("dynamodb", "Query", {
        "TableName": "gpujobs-local-jobs", "IndexName": "by_tenant"}) == [
        ("dynamodb:Query", table + "gpujobs-dev-jobs/index/by_tenant")]
    assert rec.iam_requests("dynamodb", "BatchWriteItem", {
        "RequestItems": {"gpujobs-test-heartbeats": []}}) == [
        ("dynamodb:BatchWriteItem", table + "gpujobs-dev-heartbeats")]
    assert rec.iam_requests("sqs", "SendMessageBatch", {
        "QueueUrl": "http://127.0.0.1:5000/123456789012/gpujobs-test-inbox-n1"}) == [
        ("sqs:SendMessage", _arn_sqs("gpujobs-dev-inbox-n1"))]
    assert rec.iam_requests("sqs", "CreateQueue", {"QueueName": "gpujobs-test-inbox-n1"}) == [
        ("sqs:CreateQueue", _arn_sqs("gpujobs-dev-inbox-n1"))]
    assert rec.iam_requests("ssm", "GetParameter", {"Name": "/gpujobs/test/page-token-key"}) \
        == [("ssm:GetParameter",
             f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/gpujobs/dev/page-token-key")]


def test_policy_evaluation_wildcards_deny_and_conditions():
    p = {"Statement": [
        {"Effect": "Allow", "Action": "sqs:Send*", "Resource": "arn:aws:sqs:*:*:q-*"},
        {"Effect": "Deny", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:*:*:q-dlq"},
        {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "*",
         "Condition": {"Bool": {"aws:SecureTransport": "true"}}},
    ]}
    assert rec.allowed(p, "sqs:SendMessage", _arn_sqs("q-1"))
    assert rec.allowed(p, "SQS:sendmessage", _arn_sqs("q-1"))  # actions ignore case
    assert not rec.allowed(p, "sqs:SendMessage", _arn_sqs("Q-1"))  # resources do not
    assert not rec.allowed(p, "sqs:SendMessage", _arn_sqs("q-dlq"))
    assert not rec.allowed(p, "sqs:CreateQueue", _arn_sqs("q-1"))
    assert not rec.allowed(p, "dynamodb:GetItem", "arn:aws:dynamodb:x:y:table/t")


def test_only_the_application_code_is_recorded():
    import sys

    assert rec.caller(sys._getframe()) == (False, "")  # this file is test code
    # a frame of chalicelib's scan service (compiled under its file name) is the app's
    ns: dict = {}
    exec(compile("import sys\ndef run():\n    return sys._getframe()\nframe = run()\n",
                 str(ROOT / "chalicelib" / "service" / "scan.py"), "exec"), ns)
    assert rec.caller(ns["frame"]) == (True, "scan")


# -- the policies as written -------------------------------------------------------------
@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_no_wildcard_actions_and_only_the_stage_resources(stage):
    for st in policy(stage)["Statement"]:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        assert all("*" not in a for a in actions), st
        if st["Effect"] != "Allow":
            continue
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        for r in resources:
            assert r != "*", st
            if r.startswith(("arn:aws:dynamodb:", "arn:aws:sqs:")):
                assert f"gpujobs-{stage}-" in r, (stage, r)
            if r.startswith("arn:aws:ssm:"):
                assert f":parameter/gpujobs/{stage}/" in r, (stage, r)


def test_prod_policy_is_the_dev_policy_for_prod():
    dev = json.dumps(policy("dev"), sort_keys=True)
    expected = dev.replace("gpujobs-dev-", "gpujobs-prod-").replace(
        "/gpujobs/dev/", "/gpujobs/prod/").replace("event-bus/gpujobs-dev", "event-bus/gpujobs-prod")
    assert json.loads(expected) == policy("prod")


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_the_pending_queue_event_source_can_poll(stage):
    queue = _arn_sqs(f"gpujobs-{stage}-pending")
    missing = [a for a in EVENT_SOURCE_ACTIONS if not rec.allowed(policy(stage), a, queue)]
    assert not missing, f"policy-{stage}.json must grant {missing} on {queue}"


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_the_functions_may_read_the_secrets(stage):
    for name in ("page-token-key", "token-hashes"):
        arn = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/gpujobs/{stage}/{name}"
        assert rec.allowed(policy(stage), "ssm:GetParameter", arn), arn


# -- the recording, checked after everything else ran ---------------------------------------
@pytest.mark.iam_last
def test_every_call_the_code_made_is_granted_by_the_dev_policy():
    if rec.RECORDER is None:
        pytest.fail('tests.iam_recorder is not loaded: tests/conftest.py needs '
                    'pytest_plugins = ["tests.iam_recorder"]')
    records = {r for r in rec.RECORDER.records() if r.function != rec.AGENT}
    if not any(r.action.split(":")[0] in ("dynamodb", "sqs") for r in records):
        pytest.skip("no DynamoDB or SQS call by the application in this session: "
                    "run the whole suite (make test)")
    p = policy("dev")
    missing: dict[tuple[str, str], set[str]] = {}
    for r in records:
        if not rec.allowed(p, r.action, r.resource):
            missing.setdefault((r.action, rec.generalised(r.resource)), set()).add(r.function)
    lines = [f"  {action} on {resource} (by {', '.join(sorted(fns))})"
             for (action, resource), fns in sorted(missing.items())]
    assert not missing, (f"{POLICY_DIR / 'policy-dev.json'} does not grant what the code "
                         "called:\n" + "\n".join(lines)
                         + "\n(all calls: build/iam-recorded.json)")


# -- the host agent's role ------------------------------------------------------------
def agent_policy(stage: str) -> dict:
    return json.loads((ROOT / "infra" / f"agent-policy-{stage}.json").read_text())


def test_log_calls_are_authorised_on_their_group_and_stream():
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:gpujobs-dev-ranks"
    assert rec.iam_requests("logs", "PutLogEvents", {
        "logGroupName": "gpujobs-test-ranks", "logStreamName": "job_x/1/rank-0"}) == [
        ("logs:PutLogEvents", f"{group}:log-stream:job_x/1/rank-0")]
    assert rec.iam_requests("logs", "FilterLogEvents", {"logGroupName": "gpujobs-t1-ranks"}) \
        == [("logs:FilterLogEvents", f"{group}:*")]


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_the_agent_role_is_scoped_to_inboxes_and_rank_logs(stage):
    p = agent_policy(stage)
    for st in p["Statement"]:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        assert all("*" not in a for a in actions), st
        assert all(f"gpujobs-{stage}-" in r for r in resources), st
    stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:gpujobs-{stage}-ranks:log-stream:j/1/rank-0"
    assert rec.allowed(p, "logs:PutLogEvents", stream)
    assert not rec.allowed(p, "logs:FilterLogEvents",
                           f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:gpujobs-{stage}-ranks:*"), \
        "an agent reads no other job's logs"
    assert not rec.allowed(p, "sqs:SendMessage", _arn_sqs(f"gpujobs-{stage}-inbox-n1"))
    assert not rec.allowed(p, "dynamodb:GetItem",
                           f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpujobs-{stage}-jobs")
    assert json.loads(json.dumps(agent_policy("dev")).replace("gpujobs-dev-", "gpujobs-prod-")) \
        == agent_policy("prod")


@pytest.mark.iam_last
def test_every_call_the_agent_made_is_granted_by_the_agent_policy():
    records = {r for r in rec.RECORDER.records() if r.function == rec.AGENT} \
        if rec.RECORDER else set()
    if not records:
        pytest.skip("no AWS call by the agent in this session: run tests/agent")
    p = agent_policy("dev")
    missing = sorted({(r.action, rec.generalised(r.resource)) for r in records
                      if not rec.allowed(p, r.action, r.resource)})
    assert not missing, f"infra/agent-policy-dev.json does not grant: {missing}"
