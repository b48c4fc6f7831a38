"""Issue 24, item 5, over real HTTP against the local stack: every answer,
the app's and the ones its gateway (devstack/server.py) makes by itself,
carries the security headers (tests/security_headers.py says which).

The session's shared stack has no agents, and nothing here registers a node
(the agent token is bound to ``node-1``; the walk's node is another), so no
job of another test gets placed by this one.
"""
from __future__ import annotations

import http.client
import json
import socket
import urllib.parse

import pytest

from tests.security_headers import missing, walk

TOKENS = {"a": "e2e-tenant", "b": "e2e-other", "agent": "e2e-agent"}


def address(stack) -> tuple[str, int]:
    u = urllib.parse.urlsplit(stack.api)
    return u.hostname, u.port


def call_http(stack, method: str, path: str, headers: dict[str, str],
              body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(*address(stack), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def raw(stack, data: bytes, *, shut: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Bytes as they are (``shut``: then close our side); the answer."""
    with socket.create_connection(address(stack), timeout=30) as s:
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before reading it all
        r = http.client.HTTPResponse(s)
        r.begin()
        return r.status, dict(r.getheaders()), r.read()


def request_bytes(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers)
            + "\r\n").encode() + body


@pytest.fixture(scope="module")
def walled(stack):
    status, _, body = call_http(stack, "POST", "/v1/jobs", {
        "Authorization": "Bearer e2e-tenant", "Content-Type": "application/json"},
        b'{"command": ["true"], "ranks": 1, "name": "walls"}')
    assert status == 201, body
    return {"job_id": json.loads(body)["id"], "attempt": "1", "node_id": "walls-node",
            "name": "app.js", "webhook_id": "wh_walls"}


def test_every_route_method_and_caller_answers_with_the_security_headers(stack, walled):
    """Over HTTP: every (route, method, caller, body) answer, and OPTIONS,
    TRACE and a lowercase method on every route (the gateway's own 405s),
    carry nosniff, DENY, no-referrer, their Content-Security-Policy and
    Cache-Control."""
    wrong, statuses = [], set()
    for call in walk(walled, (None, "a", "b", "agent")):
        headers = {} if call.who is None else {"Authorization": f"Bearer {TOKENS[call.who]}"}
        if call.body is not None:
            headers["Content-Type"] = "application/json"
        status, got, _ = call_http(stack, call.method, call.path, headers, call.body)
        statuses.add(status)
        if bad := missing(call.path, status, got):
            wrong.append(f"{call} -> {status}: {bad}")
    for path in {call.path for call in walk(walled, (None,))}:
        for method in ("OPTIONS", "TRACE", "get", "BREW"):
            status, got, _ = raw(stack, request_bytes(method, path))
            statuses.add(status)
            if bad := missing(path, status, got):
                wrong.append(f"{method} {path} -> {status}: {bad}")
    assert not wrong, "\n".join(wrong[:40])
    assert {200, 201, 202, 400, 401, 403, 404, 405} <= statuses, sorted(statuses)


EDGE_CASES = [
    ("an unrouted path", request_bytes("GET", "/nope"), False, 404),
    ("an unrouted API path", request_bytes("POST", "/v1/jobs/x/y/z", "Content-Length: 2",
                                           body=b"{}"), False, 404),
    ("an unrouted path with a token", request_bytes("GET", "/v1/nope",
                                                    "Authorization: Bearer e2e-tenant"),
     False, 404),
    ("a path over 8 KiB", request_bytes("GET", "/v1/jobs/" + "j" * 9000), False, 414),
    ("a request line over 64 KiB", request_bytes("GET", "/" + "x" * 70_000), False, 414),
    ("headers over 10 KiB", request_bytes("GET", "/v1/health",
                                          *[f"X-Pad-{i}: {'p' * 1000}" for i in range(12)]),
     False, 431),
    ("a header line over 64 KiB", request_bytes("GET", "/v1/health", "X-Big: " + "b" * 70_000),
     False, 431),
    ("a body over the gateway's limit", request_bytes(
        "POST", "/v1/jobs", "Content-Length: 999999999", "Content-Type: application/json"),
     False, 413),
    ("a Content-Length that is no number", request_bytes(
        "POST", "/v1/jobs", "Content-Length: ten"), False, 400),
    ("two Content-Lengths", request_bytes("POST", "/v1/jobs", "Content-Length: 2",
                                          "Content-Length: 3", body=b"{}"), False, 400),
    ("a chunked body", request_bytes("POST", "/v1/jobs", "Transfer-Encoding: chunked",
                                     body=b"2\r\n{}\r\n0\r\n\r\n"), False, 400),
    ("a body cut short", request_bytes("POST", "/v1/jobs", "Content-Length: 100",
                                       "Content-Type: application/json", body=b'{"ra'),
     True, 408),
    ("a request line that is no HTTP", b"GARBAGE\r\n\r\n", False, 400),
    ("a request line of four words", b"GET /v1/health HTTP/1.1 more\r\n\r\n", False, 400),
    ("an HTTP version it does not speak", b"GET /v1/health HTTP/2.0\r\n\r\n", False, 400),
    ("a bad body", request_bytes("POST", "/v1/jobs", "Authorization: Bearer e2e-tenant",
                                 "Content-Type: application/json", "Content-Length: 11",
                                 body=b'{"command":'), False, 400),
    ("a body that is not JSON", request_bytes("POST", "/v1/jobs",
                                              "Authorization: Bearer e2e-tenant",
                                              "Content-Type: text/plain", "Content-Length: 2",
                                              body=b"{}"), False, 415),
]


@pytest.mark.parametrize("what, data, shut, status", EDGE_CASES,
                         ids=[case[0] for case in EDGE_CASES])
def test_the_gateways_own_answers_carry_the_security_headers(stack, what, data, shut, status):
    """What the local gateway answers by itself (unrouted paths, limits,
    unparseable requests) or the app refuses early is a problem JSON with
    the headers, like every answer."""
    got_status, headers, body = raw(stack, data, shut=shut)
    assert got_status == status, (what, body[:300])
    assert headers.get("Content-Type") == "application/problem+json", what
    assert missing("/v1/x", got_status, headers) == {}, what


def test_a_request_without_a_version_is_answered_with_headers_not_as_http_0_9(stack):
    """``GET /v1/health`` with no HTTP version would be HTTP/0.9, whose answer
    is a bare body with no status line and so no headers at all: the gateway
    answers it as HTTP/1.1, with the headers."""
    status, headers, body = raw(stack, b"GET /v1/health\r\n\r\n")
    assert status == 200, body
    assert missing("/v1/health", status, headers) == {}
