"""The HTTP edge (chalicelib/api/edge.py): one whole-number check for every
integer a request names, in its query or its path, and Chalice's own answers
in the problem shape."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from chalicelib.api.edge import whole_number
from chalicelib.domain.errors import InvalidArgument

#: not 1 to 6 ASCII digits: a superscript ("²".isdigit() is True), digits of
#: other scripts (re's \d and int() take "٣" and "１"), a sign, seven digits,
#: a space, nothing
NOT_WHOLE = ["²", "٣", "１", "-1", "1234567", "1 ", ""]


@pytest.mark.parametrize("raw", NOT_WHOLE)
def test_whole_number_refuses_all_but_1_to_6_ascii_digits_naming_the_field(raw):
    with pytest.raises(InvalidArgument) as refused:
        whole_number(raw, "page_size")
    assert refused.value.field == "page_size"


@pytest.mark.parametrize("raw, value", [("0", 0), ("7", 7), ("000042", 42), ("999999", 999999)])
def test_whole_number_takes_1_to_6_ascii_digits(raw, value):
    assert whole_number(raw, "rank") == value


def _job(client, tenants) -> str:
    body = json.dumps({"command": ["train"], "ranks": 2})
    r = client.http.post("/v1/jobs", body=body, headers=tenants.headers())
    assert r.status_code == 201, r.body
    return r.json_body["id"]


@pytest.mark.parametrize("raw", [v for v in NOT_WHOLE if v])
def test_every_integer_query_parameter_is_checked_the_same_way(client, tenants, raw):
    job_id = _job(client, tenants)
    for path, name in [("/v1/jobs", "page_size"), (f"/v1/jobs/{job_id}/logs", "attempt"),
                       (f"/v1/jobs/{job_id}/logs", "rank"),
                       (f"/v1/jobs/{job_id}/logs", "page_size"),
                       (f"/v1/jobs/{job_id}/ranks", "page_size")]:
        r = client.http.get(f"{path}?{name}={quote(raw)}", headers=tenants.headers())
        assert r.status_code == 400, (path, name, raw, r.body)
        assert r.headers["Content-Type"] == "application/problem+json"
        assert (r.json_body["code"], r.json_body["field"]) == ("invalid_argument", name), path


@pytest.mark.parametrize("raw", [v for v in NOT_WHOLE if v])
def test_the_attempt_in_a_path_is_checked_the_same_way(client, tenants, raw):
    job_id = _job(client, tenants)
    body = json.dumps({"type": "STARTED", "ranks": [0, 1], "node_id": "node-1"})
    r = client.http.post(f"/v1/jobs/{job_id}/attempts/{quote(raw)}/events", body=body,
                         headers=tenants.headers("agents"))
    assert r.status_code == 400, (raw, r.body)
    assert (r.json_body["code"], r.json_body["field"]) == ("invalid_argument", "attempt")
    assert r.json_body["detail"] == "attempt must be a positive integer"


def test_chalices_own_405_is_a_problem_naming_the_allowed_methods(client, tenants):
    r = client.http.request("DELETE", "/v1/jobs", headers=tenants.headers())
    assert r.status_code == 405
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json_body["code"] == "method_not_allowed" and r.json_body["status"] == 405
    assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_health_is_a_service_call_and_answers_ok(client):
    r = client.http.get("/v1/health")
    assert (r.status_code, r.json_body) == (200, {"status": "ok"})
