"""Issue 24, item 5, through Chalice's test client: every answer the app
makes carries the security headers (tests/security_headers.py says which),
whatever the route, method, caller, body or outcome.

Not walked here: an unrouted path and ``OPTIONS``, which Chalice's local
gateway answers itself without calling the app (as API Gateway does);
tests/e2e/test_security_headers.py walks those over real HTTP.
"""
from __future__ import annotations

import json
import uuid

import pytest

import app
from chalicelib.domain.errors import ServiceUnavailable
from tests.security_headers import missing, walk


@pytest.fixture
def walled(client, tenants):
    """A job and a node of this test's tenant and agent, for the walk's paths."""
    created = client.http.post("/v1/jobs", headers=tenants.headers(),
                               body=json.dumps({"command": ["true"], "ranks": 1}))
    assert created.status_code == 201, created.body
    node = f"walls-{uuid.uuid4().hex[:8]}"
    return {"job_id": created.json_body["id"], "attempt": "1", "node_id": node,
            "name": "app.js", "webhook_id": "wh_walls"}


def send(client, tenants, call, extra=None):
    headers = dict(extra or {})
    if call.who is not None:
        headers["Authorization"] = tenants.headers(call.who)["Authorization"]
    if call.body is not None and call.content_type:
        headers["Content-Type"] = call.content_type
    return client.http.request(call.method, call.path, headers=headers,
                               body=call.body if call.body is not None else b"")


def test_every_route_method_and_caller_answers_with_the_security_headers(
        client, tenants, walled):
    """Every (route, method, caller, body) answer, successes and every kind of
    error the app or Chalice makes (401, 403, 404, 405, 409, 400), carries
    nosniff, DENY, no-referrer, its Content-Security-Policy and Cache-Control."""
    wrong, statuses = [], set()
    for call in walk(walled, (None, "a", "b", "agents")):
        r = send(client, tenants, call)
        statuses.add(r.status_code)
        bad = missing(call.path, r.status_code, r.headers)
        if bad:
            wrong.append(f"{call} -> {r.status_code}: {bad}")
    assert not wrong, "\n".join(wrong[:40])
    # the walk met successes and each kind of refusal, not one answer many times
    assert {200, 201, 202, 400, 401, 403, 404, 405} <= statuses, sorted(statuses)


@pytest.mark.parametrize("path", ["/", "/static/app.js"])
def test_a_dashboard_file_keeps_its_own_policy_also_when_not_modified(client, path):
    """The page's stricter-for-HTML policy and no-cache survive the edge, on a
    200 and on the 304 to its ETag; a missing file is data (no-store)."""
    r = client.http.get(path)
    assert (r.status_code, missing(path, 200, r.headers)) == (200, {})
    again = client.http.get(path, headers={"If-None-Match": r.headers["ETag"]})
    assert (again.status_code, missing(path, 304, again.headers)) == (304, {})
    gone = client.http.get("/static/nope.js")
    assert (gone.status_code, missing("/static/nope.js", 404, gone.headers)) == (404, {})


@pytest.mark.parametrize("body, content_type, status", [
    (b'{"ranks": ', "application/json", 400),        # not JSON
    (b'{"ranks": 1}', "application/json", 400),      # no command
    (b"x" * 70_000, "application/json", 413),        # over 64 KiB
    (b'{"command": ["true"], "ranks": 1}', "text/plain", 415),
])
def test_a_refused_body_answers_with_the_security_headers(client, tenants, body,
                                                          content_type, status):
    """A body the app refuses (syntax, schema, size, media type) is a problem
    JSON that carries the headers like any answer."""
    r = client.http.post("/v1/jobs", headers={**tenants.headers(), "Content-Type": content_type},
                         body=body)
    assert r.status_code == status and r.headers["Content-Type"] == "application/problem+json"
    assert missing("/v1/jobs", status, r.headers) == {}


@pytest.mark.parametrize("fault, status", [(RuntimeError("a bug"), 500),
                                           (ServiceUnavailable("storage is busy"), 503)])
def test_a_server_side_failure_answers_with_the_security_headers(
        client, tenants, monkeypatch, fault, status):
    """A bug (500) and a failing dependency (503) are answers like any other."""
    def broken(*args, **kwargs):
        raise fault
    monkeypatch.setattr(app.services().jobs, "look", broken)  # what GET /v1/jobs/{id} asks
    r = client.http.get("/v1/jobs/job_01JJ5D4Z7T3W9XKQ2M8N6P4R5S", headers=tenants.headers())
    assert r.status_code == status
    assert missing("/v1/jobs/x", status, r.headers) == {}
