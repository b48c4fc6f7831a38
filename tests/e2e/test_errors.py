"""Every error of the jobs section, over real HTTP, as problem JSON."""
from __future__ import annotations

import boto3
import pytest

pytestmark = pytest.mark.e2e
BODY = {"command": ["python", "train.py"], "ranks": 2}


def problem(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    p = r.json()
    assert p["code"] == code and p["status"] == status
    assert p["type"] and p["title"] and p["detail"]
    assert "Traceback" not in r.text
    return p


def test_invalid_argument_names_the_field(api):
    p = problem(api.post("/v1/jobs", json={**BODY, "ranks": 0}), 400, "invalid_argument")
    assert p["field"] == "ranks"


def test_invalid_json_is_invalid_argument(api):
    r = api.post("/v1/jobs", data=b"{nope", headers={"Content-Type": "application/json"})
    assert problem(r, 400, "invalid_argument")["field"] == "body"


def test_invalid_page_token(api, other):
    api.post("/v1/jobs", json=BODY)
    api.post("/v1/jobs", json=BODY)
    token = api.get("/v1/jobs", params={"page_size": 1}).json()["next_page_token"]
    problem(other.get("/v1/jobs", params={"page_token": token}), 400, "invalid_page_token")
    problem(api.get("/v1/jobs", params={"page_token": token[:-2] + "xx"}), 400,
            "invalid_page_token")


def test_unauthenticated(stack):
    import requests
    problem(requests.get(stack.api + "/v1/jobs", timeout=10), 401, "unauthenticated")
    problem(requests.get(stack.api + "/v1/jobs", timeout=10,
                         headers={"Authorization": "Bearer wrong"}), 401, "unauthenticated")


def test_forbidden_for_an_agent_on_tenant_endpoints(agent):
    problem(agent.post("/v1/jobs", json=BODY), 403, "forbidden")


def test_not_found_for_another_tenants_job_and_unknown_paths(api, other):
    job_id = api.post("/v1/jobs", json=BODY).json()["id"]
    problem(other.get(f"/v1/jobs/{job_id}"), 404, "not_found")
    problem(other.post(f"/v1/jobs/{job_id}/cancel"), 404, "not_found")
    problem(api.get("/v1/nothing-here"), 404, "not_found")


def test_method_not_allowed(api):
    problem(api.delete("/v1/jobs"), 405, "method_not_allowed")


def test_already_finished(api, stack):
    job_id = api.post("/v1/jobs", json=BODY).json()["id"]
    # no agents run in this stack: finish the job in the table directly
    ddb = boto3.client("dynamodb", endpoint_url=stack.aws, region_name="us-east-1",
                       aws_access_key_id="local", aws_secret_access_key="local")
    ddb.update_item(TableName="gpujobs-local-jobs", Key={"job_id": {"S": job_id}},
                    UpdateExpression="SET #s = :s REMOVE active_state",
                    ExpressionAttributeNames={"#s": "state"},
                    ExpressionAttributeValues={":s": {"S": "FAILED"}})
    problem(api.post(f"/v1/jobs/{job_id}/cancel"), 409, "already_finished")


def test_cancel_is_202_and_repeats_record_nothing(api):
    job_id = api.post("/v1/jobs", json=BODY).json()["id"]
    first = api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "oops"})
    again = api.post(f"/v1/jobs/{job_id}/cancel")
    assert first.status_code == again.status_code == 202
    assert first.json()["state"] == "CANCELLED"
    assert again.json() == first.json()


def test_idempotency_key_reused(api):
    api.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": "e2e-reuse"})
    r = api.post("/v1/jobs", json={**BODY, "ranks": 3}, headers={"Idempotency-Key": "e2e-reuse"})
    problem(r, 422, "idempotency_key_reused")


def test_replay_is_201_with_the_replayed_header(api):
    first = api.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": "e2e-replay"})
    again = api.post("/v1/jobs", json=BODY, headers={"Idempotency-Key": "e2e-replay"})
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert first.headers["Location"] == f"/v1/jobs/{first.json()['id']}"


def test_payload_too_large(api):
    r = api.post("/v1/jobs", data=b"x" * 70000, headers={"Content-Type": "application/json"})
    problem(r, 413, "payload_too_large")


def test_unsupported_media_type(api):
    r = api.post("/v1/jobs", data=b"ranks=2", headers={"Content-Type": "text/plain"})
    problem(r, 415, "unsupported_media_type")


@pytest.mark.parametrize("path", ["/v1/jobs/%ff%fe", "/v1/jobs/job_" + "A" * 5000,
                                  "/v1/jobs?page_size=%00", "/v1/jobs?state=%ff"])
def test_odd_urls_are_4xx_never_5xx(api, path):
    r = api.get(path)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
