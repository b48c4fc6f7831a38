"""POST /v1/jobs/{id}/cancel: an intent, recorded before the answer, never lost."""
import json

import boto3
import pytest

from chalicelib.adapters.models import JobModel, OutboxModel
from tests.fakes import FailingInbox

from .helpers import aws_calls, drain, place

BODY = {"command": ["sleep", "600"], "ranks": 2}


@pytest.fixture
def sqs(aws_env):
    return boto3.client("sqs", endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")


def create(client, tenants, **headers):
    return client.http.post("/v1/jobs", body=json.dumps(BODY),
                            headers=tenants.headers(**headers)).json_body["id"]


def cancel(client, tenants, job_id, body=None, who="a"):
    return client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers(who),
                            body=json.dumps(body) if body is not None else None)


def test_a_pending_job_is_cancelled_by_the_control_plane(client, tenants):
    job_id = create(client, tenants)
    r = cancel(client, tenants, job_id, {"reason": "wrong data"})
    assert r.status_code == 202
    job = r.json_body
    assert job["state"] == "CANCELLED" and job["cancel_reason"] == "wrong data"
    assert job["cancel_requested_at"] and job["finished_at"]
    stored = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert stored["state"] == "CANCELLED"
    assert stored["cancel_requested_at"] == job["cancel_requested_at"]


def test_repeating_a_cancel_records_nothing_new(client, tenants):
    job_id = create(client, tenants)
    first = cancel(client, tenants, job_id, {"reason": "one"}).json_body
    with aws_calls() as calls:
        again = cancel(client, tenants, job_id, {"reason": "two"})
    assert again.status_code == 202 and again.json_body == first
    assert [op for _, op in calls] == ["GetItem"], "a repeat only reads"


def test_a_job_that_finished_before_any_cancel_is_409(client, tenants, services):
    job_id = create(client, tenants)
    JobModel(job_id).update(actions=[JobModel.state.set("SUCCEEDED"),
                                     JobModel.active_state.remove()])
    r = cancel(client, tenants, job_id)
    assert r.status_code == 409 and r.json_body["code"] == "already_finished"


def test_another_tenants_job_cannot_be_cancelled_or_seen(client, tenants):
    job_id = create(client, tenants)
    r = cancel(client, tenants, job_id, who="b")
    assert r.status_code == 404
    job = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "PENDING" and job["cancel_requested_at"] is None


@pytest.mark.parametrize("body, status", [('{"reason": 5}', 400), ("[]", 400),
                                          ('{"reason": "x", "force": true}', 400),
                                          ("nope", 400)])
def test_a_bad_cancel_body_is_400_and_records_nothing(client, tenants, body, status):
    job_id = create(client, tenants)
    r = client.http.post(f"/v1/jobs/{job_id}/cancel", body=body, headers=tenants.headers())
    assert r.status_code == status
    job = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["cancel_requested_at"] is None


def test_a_placed_job_gets_one_cancel_per_node_and_stays_placed(client, tenants, services,
                                                                sqs):
    job_id = create(client, tenants)
    inboxes = place(services, job_id, ["node-a", "node-b"])
    r = cancel(client, tenants, job_id, {"reason": "stop"})
    assert r.status_code == 202
    job = r.json_body
    assert job["state"] == "SCHEDULED", "CANCELLED only once agents confirm"
    assert job["cancel_requested_at"] is not None
    for node, url in inboxes.items():
        assert drain(sqs, url, job_id) == [{"type": "CANCEL", "job_id": job_id, "attempt": 1,
                                    "reason": "stop"}], node
    # a repeat sends nothing new
    cancel(client, tenants, job_id)
    assert all(drain(sqs, url, job_id) == [] for url in inboxes.values())


def test_the_intent_is_recorded_even_when_sqs_fails(client, tenants, make_services, sqs,
                                                    clock):
    services = make_services()
    job_id = create(client, tenants)
    inboxes = place(services, job_id, ["node-a", "node-b"])
    failing = FailingInbox(services.nodes.inbox)
    make_services(inbox=failing)
    r = cancel(client, tenants, job_id)
    assert r.status_code == 202 and r.json_body["cancel_requested_at"]
    assert failing.attempts == 2
    assert all(drain(sqs, url, job_id) == [] for url in inboxes.values())
    entry = OutboxModel.get(job_id, "CANCEL#1", consistent_read=True)
    assert entry.pending == "1" and entry.unacked == {"node-a", "node-b"}

    # the reconciler, once SQS is back, delivers the intent to every node
    healthy = make_services()
    clock.advance(healthy.config.cancel_resend_after_s + 1)
    assert healthy.reconciler.resend_due_intents() >= 2
    for url in inboxes.values():
        assert [m["type"] for m in drain(sqs, url, job_id)] == ["CANCEL"]


def test_the_reconciler_resends_only_to_nodes_that_have_not_acknowledged(
        client, tenants, services, sqs, clock):
    job_id = create(client, tenants)
    inboxes = place(services, job_id, ["node-a", "node-b"])
    cancel(client, tenants, job_id)
    for url in inboxes.values():
        drain(sqs, url, job_id)
    services.store.ack_intent(job_id, "CANCEL#1", "node-a")
    clock.advance(3600)
    services.reconciler.resend_due_intents()
    assert drain(sqs, inboxes["node-a"], job_id) == []
    assert [m["job_id"] for m in drain(sqs, inboxes["node-b"], job_id)] == [job_id]
    services.store.ack_intent(job_id, "CANCEL#1", "node-b")
    assert OutboxModel.get(job_id, "CANCEL#1").pending is None
    services.reconciler.resend_due_intents()
    assert drain(sqs, inboxes["node-b"], job_id) == []


def test_an_intent_is_not_resent_before_its_timeout(client, tenants, services, sqs):
    job_id = create(client, tenants)
    inboxes = place(services, job_id, ["node-a"])
    cancel(client, tenants, job_id)
    drain(sqs, inboxes["node-a"], job_id)
    services.reconciler.resend_due_intents()
    assert drain(sqs, inboxes["node-a"], job_id) == []


def test_a_cancel_racing_placement_becomes_an_intent(client, tenants, services, sqs):
    """The PENDING -> CANCELLED write is conditional: if the placer wins in
    between, the cancel must not overwrite SCHEDULED but send the intent."""
    job_id = create(client, tenants)
    store = services.store
    real_cancel_unplaced = store.cancel_unplaced
    placed = {}

    def placer_wins_first(job, now, reason):
        placed.update(place(services, job_id, ["node-a"]))
        return real_cancel_unplaced(job, now, reason)

    store.cancel_unplaced = placer_wins_first
    try:
        r = cancel(client, tenants, job_id)
    finally:
        del store.cancel_unplaced
    assert r.status_code == 202
    assert r.json_body["state"] == "SCHEDULED" and r.json_body["cancel_requested_at"]
    assert [m["type"] for m in drain(sqs, placed["node-a"], job_id)] == ["CANCEL"]


def test_cancel_of_a_keyed_job_expires_its_key_in_the_same_transaction(client, tenants):
    job_id = create(client, tenants, **{"Idempotency-Key": "k"})
    with aws_calls() as calls:
        cancel(client, tenants, job_id)
    assert [op for _, op in calls] == ["GetItem", "TransactWriteItems"]
