"""A 401's detail says what was wrong with the Authorization header: missing,
not a bearer token, or a token the API does not know (API.md: the status and
code are the same for all three, `401 unauthenticated`)."""
import pytest

from chalicelib.service.auth import MISSING, NOT_BEARER, UNKNOWN


@pytest.mark.parametrize("auth, detail", [
    (None, MISSING),
    ("", MISSING),
    ("   ", MISSING),
    ("Basic dXNlcjpwYXNz", NOT_BEARER),
    ("Bearer", NOT_BEARER),
    ("Bearer   ", NOT_BEARER),
    ("tok-a", NOT_BEARER),
    ("Bearer nope", UNKNOWN),
    ("bearer nope", UNKNOWN),
])
def test_a_401_says_whether_the_token_was_missing_malformed_or_unknown(client, auth, detail):
    headers = {} if auth is None else {"Authorization": auth}
    r = client.http.get("/v1/jobs", headers=headers)
    assert r.status_code == 401
    body = r.json_body
    assert body["code"] == "unauthenticated" and body["field"] == "Authorization"
    assert body["detail"] == detail


def test_an_unknown_token_is_not_said_to_be_missing(client):
    r = client.http.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert "not recognised" in r.json_body["detail"]
    assert "required" not in r.json_body["detail"]


def test_a_known_token_still_passes(client, tenants):
    assert client.http.get("/v1/jobs", headers=tenants.headers()).status_code == 200


def test_an_agent_endpoint_says_the_same(client):
    r = client.http.put("/v1/nodes/node-1", headers={"Authorization": "Bearer nope",
                                                     "Content-Type": "application/json"},
                        body="{}")
    assert r.status_code == 401 and r.json_body["detail"] == UNKNOWN
