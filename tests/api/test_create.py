"""POST /v1/jobs: idempotent create, validation, auth."""
import json
from datetime import timedelta

import pytest
from pynamodb.connection.base import Connection
from pynamodb.exceptions import CancellationReason, TransactWriteError, VerboseClientError

from chalicelib.domain.clock import utcnow

from .helpers import aws_calls

BODY = {"command": ["python", "train.py"], "ranks": 2}


def post(client, tenants, body=BODY, who="a", **headers):
    return client.http.post("/v1/jobs", headers=tenants.headers(who, **headers),
                            body=json.dumps(body))


def test_create_answers_201_with_location_and_the_job(client, tenants):
    r = post(client, tenants)
    assert r.status_code == 201
    job = r.json_body
    assert r.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] == "PENDING" and job["attempt"] == 0
    assert job["spec"]["gpus_per_rank"] == 1 and job["spec"]["heartbeat"]["interval_s"] == 10
    assert job["created_at"].endswith("Z") and job["cancel_requested_at"] is None
    assert job["health"]["status"] == "UNKNOWN" and job["exit"] is None
    assert "Idempotent-Replayed" not in r.headers


def test_same_key_and_body_replays_the_same_job(client, tenants):
    first = post(client, tenants, **{"Idempotency-Key": "k1"})
    again = post(client, tenants, **{"Idempotency-Key": "k1"})
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json_body["id"] == first.json_body["id"]
    assert again.headers["Location"] == first.headers["Location"]


def test_bodies_are_compared_as_canonical_json(client, tenants):
    first = post(client, tenants, {"command": ["x"], "ranks": 2}, **{"Idempotency-Key": "k"})
    raw = '{ "ranks" : 2.0,\n "command": ["x"] }'
    again = client.http.post("/v1/jobs", body=raw,
                             headers=tenants.headers(**{"Idempotency-Key": "k"}))
    assert again.status_code == 201 and again.json_body["id"] == first.json_body["id"]


def test_same_key_with_another_body_is_422(client, tenants):
    post(client, tenants, **{"Idempotency-Key": "k1"})
    r = post(client, tenants, {**BODY, "ranks": 3}, **{"Idempotency-Key": "k1"})
    assert r.status_code == 422
    assert r.json_body["code"] == "idempotency_key_reused"
    assert r.headers["Content-Type"] == "application/problem+json"


def test_keys_are_scoped_per_tenant(client, tenants):
    a = post(client, tenants, who="a", **{"Idempotency-Key": "shared"})
    b = post(client, tenants, who="b", **{"Idempotency-Key": "shared"})
    assert b.status_code == 201 and "Idempotent-Replayed" not in b.headers
    assert a.json_body["id"] != b.json_body["id"]


def test_without_a_key_every_post_is_a_new_job(client, tenants):
    assert post(client, tenants).json_body["id"] != post(client, tenants).json_body["id"]


#: a GPU type no node of these tests has: a job of it can never fit
NOWHERE = {**BODY, "gpu_type": "roundtrip-none"}


def test_create_with_a_key_is_one_write_round_trip(client, tenants, services):
    """A warm function's create (the fleet it is judged on was read by an
    earlier one, within FLEET_TTL_S): the job and its key in one write; a
    job of a type no node has is parked by it, with no nudge (issue 24)."""
    assert post(client, tenants, NOWHERE).status_code == 201
    with aws_calls() as calls:
        assert post(client, tenants, NOWHERE, **{"Idempotency-Key": "one-trip"}).status_code == 201
    assert calls == [("dynamodb", "TransactWriteItems")]


def test_create_without_a_key_is_one_write_round_trip(client, tenants, services):
    """The job and the tenant's PENDING count (its max_pending_jobs) in one
    write; the first create of a type reads its fleet, the next within
    FLEET_TTL_S do not."""
    with aws_calls() as first:
        assert post(client, tenants, NOWHERE).status_code == 201
    with aws_calls() as calls:
        assert post(client, tenants, NOWHERE).status_code == 201
    assert first == [("dynamodb", "GetItem"), ("dynamodb", "TransactWriteItems")]
    assert calls == [("dynamodb", "TransactWriteItems")]


def test_a_failed_placement_nudge_does_not_fail_the_create(client, tenants, make_services):
    from chalicelib.adapters.inbox import SqsNudge

    class DownSqs:
        def send_message(self, **kwargs):
            raise ConnectionError("SQS down")

    services = make_services()
    make_services(nudge=SqsNudge(services.config, DownSqs()))
    r = post(client, tenants)
    assert r.status_code == 201 and r.json_body["state"] == "PENDING"


def test_a_duplicate_that_cannot_see_the_first_gets_409_with_retry_after(
        client, tenants, monkeypatch):
    # DynamoDB cancels a transaction that collides with one in flight on the
    # same item (moto does not simulate that, so the answer is injected here)
    def conflicting(self, *args, **kwargs):
        cause = VerboseClientError(
            {"Error": {"Code": "TransactionCanceledException", "Message": "conflict"}},
            "TransactWriteItems", {},
            cancellation_reasons=[CancellationReason(code="TransactionConflict"), None])
        raise TransactWriteError("Failed to write transaction items", cause)
    monkeypatch.setattr(Connection, "transact_write_items", conflicting)
    r = post(client, tenants, **{"Idempotency-Key": "busy"})
    assert r.status_code == 409
    assert r.json_body["code"] == "request_in_progress"
    assert int(r.headers["Retry-After"]) >= 1


def test_a_key_expires_24_hours_after_its_job_finished_by_stored_time(
        client, tenants, services, monkeypatch):
    first = post(client, tenants, **{"Idempotency-Key": "old"}).json_body
    client.http.post(f"/v1/jobs/{first['id']}/cancel", headers=tenants.headers())
    finished = utcnow()
    monkeypatch.setattr(services.jobs, "_clock", lambda: finished + timedelta(hours=23))
    r = post(client, tenants, {**BODY, "ranks": 5}, **{"Idempotency-Key": "old"})
    assert r.status_code == 422, "kept for 24 hours after the job finished"
    replay = post(client, tenants, **{"Idempotency-Key": "old"})
    assert replay.json_body["id"] == first["id"]
    monkeypatch.setattr(services.jobs, "_clock", lambda: finished + timedelta(hours=25))
    fresh = post(client, tenants, {**BODY, "ranks": 5}, **{"Idempotency-Key": "old"})
    assert fresh.status_code == 201 and "Idempotent-Replayed" not in fresh.headers
    assert fresh.json_body["id"] != first["id"]
    again = post(client, tenants, {**BODY, "ranks": 5}, **{"Idempotency-Key": "old"})
    assert again.json_body["id"] == fresh.json_body["id"], "the key now names the new job"


def test_a_running_jobs_key_never_expires(client, tenants, services, monkeypatch):
    first = post(client, tenants, **{"Idempotency-Key": "live"}).json_body
    monkeypatch.setattr(services.jobs, "_clock", lambda: utcnow() + timedelta(days=400))
    r = post(client, tenants, **{"Idempotency-Key": "live"})
    assert r.json_body["id"] == first["id"]


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve"])
def test_a_bad_idempotency_key_is_400_naming_the_header(client, tenants, key):
    r = client.http.post("/v1/jobs", body=json.dumps(BODY),
                         headers={**tenants.headers(), "Idempotency-Key": key})
    assert r.status_code == 400
    assert r.json_body["field"] == "Idempotency-Key"


@pytest.mark.parametrize("body, field", [
    ("{}", "command"), ('{"command": ["x"], "ranks": 0}', "ranks"),
    ('{"command": "x", "ranks": 1}', "command"), ("not json", "body"), ("", "body"),
    ('{"command": ["x"], "ranks": 1, "heartbeat": {"miss_probability": 2}}',
     "heartbeat.miss_probability"),
    # issue 9: these pinned a server thread for minutes, or answered 500
    ('{"command": ["x"], "ranks": 1, "heartbeat": {"miss_probability": 0.9999999999999999,'
     ' "false_positive_budget_per_hour": 1e-320}}',
     "heartbeat.false_positive_budget_per_hour"),
    ('{"command": ["x"], "ranks": 1, "heartbeat": {"false_positive_budget_per_hour": 5e-324}}',
     "heartbeat.false_positive_budget_per_hour"),
    ('{"command": ["x"], "ranks": 1, "heartbeat": {"interval_s": 1e-300}}',
     "heartbeat.interval_s"),
    ('{"command": ["x"], "ranks": 1, "heartbeat": {"miss_probability": 0.9999999999999999}}',
     "heartbeat.miss_probability"),
])
def test_a_bad_body_is_400_naming_the_field_and_writes_nothing(client, tenants, body, field):
    with aws_calls() as calls:
        r = client.http.post("/v1/jobs", body=body, headers=tenants.headers())
    assert r.status_code == 400
    assert r.json_body["code"] == "invalid_argument" and r.json_body["field"] == field
    assert r.json_body["status"] == 400 and r.json_body["title"] and r.json_body["detail"]
    assert calls == [], "nothing half-written"


def test_a_body_over_the_limit_is_413(client, tenants):
    body = json.dumps({**BODY, "name": "x" * 70000})
    r = client.http.post("/v1/jobs", body=body, headers=tenants.headers())
    assert r.status_code == 413 and r.json_body["code"] == "payload_too_large"


def test_a_non_json_content_type_is_415(client, tenants):
    r = client.http.post("/v1/jobs", body=json.dumps(BODY),
                         headers={**tenants.headers(), "Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json_body["code"] == "unsupported_media_type"


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic dXNlcjpwYXNz", "Bearer"])
def test_a_missing_or_unknown_token_is_401(client, auth):
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    r = client.http.post("/v1/jobs", body=json.dumps(BODY), headers=headers)
    assert r.status_code == 401 and r.json_body["code"] == "unauthenticated"


def test_an_agent_token_cannot_create_jobs(client, tenants):
    r = post(client, tenants, who="agent")
    assert r.status_code == 403 and r.json_body["code"] == "forbidden"


@pytest.mark.parametrize("body", ["null", "[]", '"job"', "42", "true"])
def test_a_body_that_is_not_an_object_is_400(client, tenants, body):
    r = client.http.post("/v1/jobs", body=body, headers=tenants.headers())
    assert r.status_code == 400 and r.json_body["field"] == "body"


def test_a_null_cancel_body_is_400(client, tenants):
    job_id = post(client, tenants).json_body["id"]
    r = client.http.post(f"/v1/jobs/{job_id}/cancel", body="null", headers=tenants.headers())
    assert r.status_code == 400


@pytest.mark.parametrize("raw", ['{"command": ["x"], "ranks": 1, "name": "\\ud800"}',
                                 '{"command": ["x"], "ranks": 1, "\\udfff": 1}'],
                         ids=["value", "field name"])
def test_a_lone_surrogate_is_a_400_whose_problem_still_encodes(client, tenants, raw):
    """A problem may echo what the client sent: its body is compact JSON in
    ASCII, so even a lone surrogate leaves as an escape, never a 500."""
    r = client.http.post("/v1/jobs", body=raw, headers=tenants.headers())
    assert r.status_code == 400, r.body
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.body.isascii() and b", " not in r.body and b'": ' not in r.body
    assert json.loads(r.body)["code"]
