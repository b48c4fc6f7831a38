"""Each Lambda function reads its own invocation's context (issue 16, item 1).

On AWS the scheduled and queue functions are Lambdas of their own that never
serve HTTP; Chalice sets ``app.lambda_context`` only when it does. A handler
or middleware that read it crashed every scheduled and queue invocation with
``AttributeError: 'Chalice' object has no attribute 'lambda_context'`` (and in
a container that had served HTTP, would name a stale request).
"""
from __future__ import annotations

import pytest

import app as app_module
from tests.fakes import RecordingTelemetry


class Context:
    """The attributes of Lambda's LambdaContext the app may read."""

    def __init__(self, request_id: str, function_name: str = "gpujobs-dev-scan") -> None:
        self.aws_request_id = request_id
        self.function_name = function_name
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def scheduled_event(rule: str) -> dict:
    return {"version": "0", "id": "5e1c2b4a-0000-4000-8000-000000000001",
            "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "123456789012", "time": "2024-05-01T12:00:00Z",
            "region": "us-east-1", "resources": [
                f"arn:aws:events:us-east-1:123456789012:rule/{rule}"], "detail": {}}


def sqs_event(queue: str, bodies: list[str]) -> dict:
    return {"Records": [{
        "messageId": f"m-{i}", "receiptHandle": f"rh-{i}", "body": body,
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1714564800000",
                       "SenderId": "AIDAEXAMPLE", "ApproximateFirstReceiveTimestamp": "1714564800001"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": f"arn:aws:sqs:us-east-1:123456789012:{queue}",
        "awsRegion": "us-east-1"} for i, body in enumerate(bodies)]}


@pytest.fixture
def telemetry(make_services, fresh_env):
    # emptied tables: a scheduled function reads whole tables, and the
    # session's shared ones hold every other test's jobs (a reconcile of
    # them took 20 s, and timed out reading moto on a loaded machine)
    t = RecordingTelemetry()
    make_services(fresh_env, telemetry=t)
    return t


@pytest.mark.parametrize("name", ["scan", "place", "reconcile"])
def test_a_scheduled_function_in_a_container_that_never_served_http_runs(
        name, telemetry, monkeypatch):
    """Invariant: a scheduled function depends on nothing an HTTP request sets."""
    monkeypatch.delattr(app_module.app, "lambda_context", raising=False)
    getattr(app_module, name)(scheduled_event(f"gpujobs-dev-{name}"), Context(f"req-{name}"))
    assert telemetry.begun == [f"req-{name}"]
    assert telemetry.flushed == 1


def test_the_queue_consumer_in_a_container_that_never_served_http_runs(telemetry, monkeypatch):
    monkeypatch.delattr(app_module.app, "lambda_context", raising=False)
    app_module.place_on_nudge(sqs_event("gpujobs-test-pending", ['{"nudge": true}']),
                              Context("req-nudge"))
    assert telemetry.begun == ["req-nudge"]


def test_a_scheduled_run_after_a_request_names_its_own_invocation(telemetry, tenants):
    """Log lines of a scan name the scan's request id, never the last HTTP one."""
    from chalice.test import Client

    with Client(app_module.app) as client:
        assert client.http.get("/v1/jobs", headers=tenants.headers()).status_code == 200
    http_id = telemetry.begun[-1]
    assert http_id  # the HTTP request named its own invocation too
    app_module.scan(scheduled_event("gpujobs-dev-scan"), Context("req-scan-after-http"))
    assert telemetry.begun[-1] == "req-scan-after-http" != http_id
