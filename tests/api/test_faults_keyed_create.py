"""A keyed create (Idempotency-Key) whose database call timed out, or got an
empty answer, is a dependency failure: 503 with Retry-After and problem JSON,
never a 500; and it leaves nothing half-written, so the client's retry with
the same key makes exactly one job (issue 29: a timed-out TransactWriteItems
read ``cause_response_code`` of a ReadTimeoutError, whose ``response`` is None,
and raised AttributeError)."""
import json

import pytest
from botocore.awsrequest import AWSResponse

import tests.faults as faults
from chalicelib.adapters.models import JobModel
from tests.faults import FAULTS, inject

from .test_faults_dependency import assert_unavailable

BODY = {"command": ["x"], "ranks": 1}


def submit(client, tenants, key):
    return client.http.post("/v1/jobs", body=json.dumps(BODY),
                            headers=tenants.headers(**{"Idempotency-Key": key}))


def tenant_jobs(tenant):
    return [m.job_id for m in JobModel.by_tenant.query(tenant)]


def assert_problem_json(r):
    body = json.loads(r.body)
    assert body["status"] == 503 and body["code"] == "unavailable" and body["title"]


def assert_a_retry_makes_exactly_one_job(client, tenants, key):
    assert tenant_jobs(tenants.a) == [], "the failed create left a job behind"
    again = submit(client, tenants, key)
    assert again.status_code == 201, again.body
    assert "Idempotent-Replayed" not in again.headers
    assert tenant_jobs(tenants.a) == [again.json_body["id"]]
    replay = submit(client, tenants, key)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json_body["id"] == again.json_body["id"]
    assert tenant_jobs(tenants.a) == [again.json_body["id"]]
    listed = client.http.get("/v1/jobs", headers=tenants.headers()).json_body["jobs"]
    assert [j["id"] for j in listed] == [again.json_body["id"]]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_keyed_create_whose_transaction_fails_is_503_and_a_retry_makes_one_job(
        fault, client, tenants):
    with inject("TransactWriteItems", fault, when=tenants.a) as injected:
        r = submit(client, tenants, "k-timeout")
    assert injected.hits
    assert_unavailable(r, fault)
    assert_problem_json(r)
    assert_a_retry_makes_exactly_one_job(client, tenants, "k-timeout")


def _cancelled(reasons):
    body = json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
                       "message": "Transaction cancelled", "CancellationReasons": reasons})

    def respond(request):
        return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"},
                           faults._Raw(body.encode()))
    return respond


@pytest.mark.parametrize("reasons", [[], [{"Code": "None"}] * 3],
                         ids=["no reasons", "every reason None"])
def test_a_cancellation_that_says_no_reason_is_503(reasons, client, tenants):
    """A TransactionCanceledException whose reasons name no item's failure
    says nothing the store can act on: retry later, not a 500."""
    with faults.respond_with("TransactWriteItems", _cancelled(reasons)) as injected:
        r = submit(client, tenants, "k-empty")
    assert injected.hits
    assert_unavailable(r, "empty cancellation reasons")
    assert_problem_json(r)
    assert_a_retry_makes_exactly_one_job(client, tenants, "k-empty")


def test_an_empty_answer_from_dynamodb_is_503(services, client, tenants, monkeypatch):
    """PynamoDB's dispatch answering None (an empty answer) to the read the
    keyed create makes after its transaction lost a race is 503, not a 500."""
    first = submit(client, tenants, "k-race")
    assert first.status_code == 201
    connection = services.store._dynamo.connection
    real = connection.dispatch

    def empty(operation, request):
        return None if operation == "GetItem" else real(operation, request)
    monkeypatch.setattr(connection, "dispatch", empty)
    r = submit(client, tenants, "k-race")  # the key is held: the replay reads the job
    assert_unavailable(r, "GetItem answered None")
    assert_problem_json(r)
    monkeypatch.setattr(connection, "dispatch", real)
    replay = submit(client, tenants, "k-race")
    assert replay.status_code == 201 and replay.json_body["id"] == first.json_body["id"]
    assert tenant_jobs(tenants.a) == [first.json_body["id"]]
