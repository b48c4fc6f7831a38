"""Every failing dependency is a 503 with Retry-After, on every route and every
scheduled or queued handler: the fault is injected below botocore's retries
(tests/faults.py), into DynamoDB (through PynamoDB) and SQS alike."""
import json
import uuid

import pytest

import app
from chalicelib.api.problems import answer
from chalicelib.domain.errors import ServiceUnavailable
from chalicelib.domain.principal import Principal
from tests.faults import FAULTS, inject

from .helpers import place

AGENT = Principal("agent", "*")
SCHEDULED = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events",
             "account": "123456789012", "region": "us-east-1", "resources": [],
             "detail": {}, "id": "test", "time": ""}


@pytest.fixture
def world(services, client, tenants):
    """A placed job on a node of its own, so that every route has something to read."""
    body = {"command": ["train"], "ranks": 2}
    job_id = client.http.post("/v1/jobs", body=json.dumps(body),
                              headers=tenants.headers()).json_body["id"]
    node = "n-" + uuid.uuid4().hex[:8]
    place(services, job_id, [node], gpus=8)
    return job_id, node


def routes(world):
    job_id, node = world
    beats = {"attempt": 1, "ranks": [{"rank": 0}]}
    return [
        ("GET", "/v1/health", "a", None),
        ("POST", "/v1/jobs", "a", {"command": ["x"], "ranks": 1}),
        ("GET", "/v1/jobs", "a", None),
        ("GET", "/v1/jobs?state=RUNNING", "a", None),
        ("GET", f"/v1/jobs/{job_id}", "a", None),
        ("GET", f"/v1/jobs/{job_id}/attempts", "a", None),
        ("GET", f"/v1/jobs/{job_id}/ranks", "a", None),
        ("POST", f"/v1/jobs/{job_id}/cancel", "a", {}),
        ("POST", f"/v1/jobs/{job_id}/attempts/1/events", "agents",
         {"type": "STARTED", "ranks": [0, 1], "node_id": "node-1"}),
        ("POST", f"/v1/jobs/{job_id}/heartbeats", "agents", beats),
        ("PUT", f"/v1/nodes/{node}", "agents", {"gpus": 8}),
        ("GET", f"/v1/nodes/{node}", "agents", None),
        ("GET", "/v1/nodes", "agents", None),
    ]


def assert_unavailable(r, what):
    assert r.status_code == 503, (what, r.status_code, r.body)
    assert r.headers.get("Retry-After") == "1", what
    assert r.headers["Content-Type"] == "application/problem+json", what
    assert r.json_body["code"] == "unavailable", what


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_in_dynamodb_is_503_with_retry_after_on_every_route(fault, world, client,
                                                                  tenants):
    for method, path, who, body in routes(world):
        kwargs = {"headers": tenants.headers(who)}
        if body is not None:
            kwargs["body"] = json.dumps(body)
        with inject(None, fault) as injected:
            r = client.http.request(method, path, **kwargs)
        assert injected.hits, f"{method} {path} made no AWS call to fail"
        assert_unavailable(r, f"{fault}: {method} {path}")


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_in_sqs_is_503_with_retry_after(fault, services, client, tenants):
    # a node's first registration creates its inbox queue: SQS must answer
    with inject("CreateQueue", fault) as injected:
        r = client.http.put(f"/v1/nodes/n-{uuid.uuid4().hex[:8]}",
                            body=json.dumps({"gpus": 8}), headers=tenants.headers("agents"))
    assert injected.hits
    assert_unavailable(r, fault)


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_in_a_generator_read_mid_iteration_is_503(fault, world, client, tenants):
    # the placer drains pending() and ready_pages() lazily: the Query that
    # fails runs inside the generator, after the handler called it
    with inject("Query", fault), pytest.raises(ServiceUnavailable):
        app.place(SCHEDULED, None)


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_in_a_scheduled_handler_fails_it_as_unavailable(fault, world):
    for handler in ("place", "scan", "reconcile"):
        with inject(None, fault), pytest.raises(ServiceUnavailable) as raised:
            getattr(app, handler)(SCHEDULED, None)
        assert answer(raised.value)[1]["Retry-After"] == "1", handler


def test_throttled_transaction_item_is_503_not_500(world, client, tenants):
    # TransactWriteItems cancelled with a ThrottlingError reason
    from botocore.awsrequest import AWSResponse

    import tests.faults as faults
    body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                       "message": "Transaction cancelled",
                       "CancellationReasons": [{"Code": "ThrottlingError"}]}).encode()

    def respond(request):
        return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"},
                           faults._Raw(body))
    with faults.respond_with("TransactWriteItems", respond):
        r = client.http.post(f"/v1/jobs/{world[0]}/cancel", body="{}", headers=tenants.headers())
    assert_unavailable(r, "transaction throttled")


def test_a_bug_is_still_a_500_not_a_503(world, client, tenants, monkeypatch):
    def broken(*a, **k):
        raise KeyError("bug")
    monkeypatch.setattr(app.services().jobs, "look", broken)  # what GET /v1/jobs/{id} asks
    r = client.http.get(f"/v1/jobs/{world[0]}", headers=tenants.headers())
    assert r.status_code == 500 and "Retry-After" not in r.headers
