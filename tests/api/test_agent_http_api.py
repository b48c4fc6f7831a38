"""The agents' HTTP API (infra/package.py, ``agent_api``) calls the same
handler as the REST API with payload format 1.0: the one function must answer
each agent route's HTTP API event exactly as it answers the REST API's.

The events are built as AWS documents them: the REST API's Lambda proxy event
(stage ``api``, ``requestContext.path`` with the stage, ``resourceId``,
``identity.apiKey``) and the HTTP API's payload 1.0 (``version`` "1.0", stage
``$default``, no stage in any path, ``resourceId`` null, lower-case header
names, ``authorizer`` with null claims and scopes). Chalice reads
``requestContext.resourcePath`` and ``httpMethod``, ``pathParameters``,
``headers``, ``multiValueQueryStringParameters``, ``stageVariables``, ``body``
and ``isBase64Encoded``; 1.0 carries each with the REST API's meaning. Time
is frozen, so a repeated request (all three are harmless to repeat) answers
byte for byte the same.
"""
from __future__ import annotations

import base64
import json
import uuid

import pytest

import app as app_module

from ..clock import FakeClock
from .helpers import place

AGENT_ROUTES = {  # infra/package.py AGENT_ROUTES, the view each one is
    ("PUT", "/v1/nodes/{node_id}"): "put_node",
    ("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events"): "report_attempt_event",
    ("POST", "/v1/jobs/{job_id}/heartbeats"): "post_heartbeats",
}


class Context:
    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self.function_name = "gpujobs-dev"
        self.memory_limit_in_mb = 512
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:gpujobs-dev"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def _path(resource: str, params: dict[str, str]) -> str:
    for name, value in params.items():
        resource = resource.replace("{%s}" % name, value)
    return resource


def rest_event(method: str, resource: str, params: dict[str, str], headers: dict[str, str],
               body: str | None) -> dict:
    """What the REST API (Chalice's RestAPI, stage ``api``) sends."""
    path = _path(resource, params)
    headers = {"Host": "abc123.execute-api.us-east-1.amazonaws.com",
               "User-Agent": "Python-urllib/3.11", "X-Forwarded-Proto": "https", **headers}
    return {
        "resource": resource, "path": path, "httpMethod": method,
        "headers": headers, "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "pathParameters": params or None, "stageVariables": None,
        "requestContext": {
            "resourceId": "r3s0urc3", "resourcePath": resource, "httpMethod": method,
            "extendedRequestId": "Ext-Req=", "requestTime": "02/Dec/2026:15:00:00 +0000",
            "path": f"/api{path}", "accountId": "123456789012", "protocol": "HTTP/1.1",
            "stage": "api", "domainPrefix": "abc123", "requestTimeEpoch": 1796223600000,
            "requestId": str(uuid.uuid4()),
            "identity": {"cognitoIdentityPoolId": None, "accountId": None,
                         "cognitoIdentityId": None, "caller": None, "apiKey": None,
                         "sourceIp": "192.0.2.10", "principalOrgId": None, "accessKey": None,
                         "cognitoAuthenticationType": None,
                         "cognitoAuthenticationProvider": None, "userArn": None,
                         "userAgent": "Python-urllib/3.11", "user": None},
            "domainName": "abc123.execute-api.us-east-1.amazonaws.com", "apiId": "abc123"},
        "body": body, "isBase64Encoded": False,
    }


def http_api_event(method: str, resource: str, params: dict[str, str], headers: dict[str, str],
                   body: str | None, *, base64_body: bool = False) -> dict:
    """What the agents' HTTP API sends with PayloadFormatVersion 1.0, for the
    route ``{method} {resource}`` (its $default stage)."""
    path = _path(resource, params)
    headers = {"host": "agt456.execute-api.us-east-1.amazonaws.com",
               "user-agent": "Python-urllib/3.11", "x-forwarded-proto": "https",
               "x-forwarded-for": "192.0.2.10", "x-forwarded-port": "443",
               "x-amzn-trace-id": "Root=1-6764f1a0-0123456789abcdef01234567",
               "content-length": str(len(body or "")),
               **{k.lower(): v for k, v in headers.items()}}
    if base64_body and body is not None:
        body = base64.b64encode(body.encode()).decode()
    return {
        "version": "1.0", "resource": resource, "path": path, "httpMethod": method,
        "headers": headers, "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": None, "multiValueQueryStringParameters": None,
        "requestContext": {
            "accountId": "123456789012", "apiId": "agt456",
            "authorizer": {"claims": None, "scopes": None},
            "domainName": "agt456.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "agt456", "extendedRequestId": "Ext-Req=",
            "httpMethod": method,
            "identity": {"accessKey": None, "accountId": None, "caller": None,
                         "cognitoAuthenticationProvider": None,
                         "cognitoAuthenticationType": None, "cognitoIdentityId": None,
                         "cognitoIdentityPoolId": None, "principalOrgId": None,
                         "sourceIp": "192.0.2.10", "user": None,
                         "userAgent": "Python-urllib/3.11", "userArn": None},
            "path": path, "protocol": "HTTP/1.1", "requestId": "Req-Id=",
            "requestTime": "02/Dec/2026:15:00:00 +0000", "requestTimeEpoch": 1796223600000,
            "resourceId": None, "resourcePath": resource, "stage": "$default"},
        "pathParameters": params or None, "stageVariables": None,
        "body": body, "isBase64Encoded": base64_body,
    }


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def placed(services, tenants, clock):
    """A 2-rank job of tenant a, placed on a node of its own (SCHEDULED)."""
    node = f"hapi-{uuid.uuid4().hex[:8]}"
    created = invoke(rest_event("POST", "/v1/jobs", {}, tenants.headers(
        "a", **{"Idempotency-Key": uuid.uuid4().hex}), json.dumps(
            {"command": ["python", "train.py"], "ranks": 2})))
    assert created["statusCode"] == 201, created
    job_id = json.loads(created["body"])["id"]
    place(services, job_id, [node], gpus=2)
    return job_id, node


def invoke(event: dict) -> dict:
    return app_module.app(event, Context())


def both(method, resource, params, headers, body, *, base64_body=False) -> tuple[dict, dict]:
    """The REST API's answer, then the HTTP API's to the same request."""
    raw = body if body is None or isinstance(body, str) else json.dumps(body)
    rest = invoke(rest_event(method, resource, params, headers, raw))
    http = invoke(http_api_event(method, resource, params, headers, raw,
                                 base64_body=base64_body))
    return rest, http


def test_the_routes_here_are_the_apps_agent_routes():
    for (method, path), view in AGENT_ROUTES.items():
        assert app_module.app.routes[path][method].view_name == view


def test_each_agent_route_answers_the_http_api_as_the_rest_api(placed, tenants):
    job_id, node = placed
    agent = tenants.headers("agents")
    answers = {
        "put_node": both("PUT", "/v1/nodes/{node_id}", {"node_id": node}, agent,
                         {"gpus": 2, "gpu_type": "h100", "labels": {}}),
        "started": both("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events",
                        {"job_id": job_id, "attempt": "1"}, agent,
                        {"type": "STARTED", "ranks": [0, 1], "node_id": node}),
        "heartbeats": both("POST", "/v1/jobs/{job_id}/heartbeats", {"job_id": job_id}, agent,
                           {"attempt": 1, "ranks": [{"rank": 0, "step": 7},
                                                    {"rank": 1, "step": 7}]}),
    }
    statuses = {name: (rest["statusCode"], http["statusCode"])
                for name, (rest, http) in answers.items()}
    assert statuses == {"put_node": (200, 200), "started": (200, 200),
                        "heartbeats": (202, 202)}
    for name, (rest, http) in answers.items():
        assert http == rest, name   # status, headers and body
    assert json.loads(answers["started"][1]["body"])["state"] == "RUNNING"
    assert json.loads(answers["put_node"][1]["body"])["node_id"] == node


def test_a_base64_body_from_the_http_api_is_read_as_the_rest_apis(placed, tenants):
    """An HTTP API may hand the body base64-encoded (isBase64Encoded: true)."""
    job_id, node = placed
    rest, http = both("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events",
                      {"job_id": job_id, "attempt": "1"}, tenants.headers("agents"),
                      {"type": "STARTED", "ranks": [1], "node_id": node}, base64_body=True)
    assert rest["statusCode"] == 200, rest
    assert http == rest


@pytest.mark.parametrize("who, expected", [("a", 403), (None, 401), ("agent", 403)])
def test_the_token_rules_hold_alike_on_both(placed, tenants, who, expected):
    """A tenant's token, no token, and an agent token bound to another node
    (node-1) are refused alike: the same checks, in the same handler."""
    job_id, node = placed
    headers = tenants.headers(who) if who else {"Content-Type": "application/json"}
    cases = [
        ("PUT", "/v1/nodes/{node_id}", {"node_id": node}, {"gpus": 2}),
        ("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events",
         {"job_id": job_id, "attempt": "1"}, {"type": "STARTED", "ranks": [0], "node_id": node}),
        ("POST", "/v1/jobs/{job_id}/heartbeats", {"job_id": job_id},
         {"attempt": 1, "ranks": [{"rank": 0}]}),
    ]
    for method, resource, params, body in cases:
        rest, http = both(method, resource, params, headers, body)
        assert rest["statusCode"] == expected, (resource, rest)
        assert http == rest, resource


def test_bad_requests_are_the_same_problems_on_both(placed, tenants):
    job_id, node = placed
    agent = tenants.headers("agents")
    cases = [
        ("POST", "/v1/jobs/{job_id}/heartbeats", {"job_id": job_id}, agent, "{not json", 400),
        ("POST", "/v1/jobs/{job_id}/heartbeats", {"job_id": job_id}, agent,
         {"attempt": 1, "ranks": [{"rank": 99}]}, 400),
        ("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events",
         {"job_id": job_id, "attempt": "x"}, agent, {"type": "STARTED", "ranks": [0]}, 400),
        ("PUT", "/v1/nodes/{node_id}", {"node_id": node},
         {**agent, "Content-Type": "text/csv"}, "gpus,2", 415),
    ]
    for method, resource, params, headers, body, expected in cases:
        rest, http = both(method, resource, params, headers, body)
        assert rest["statusCode"] == expected, (resource, body, rest)
        assert rest["headers"]["Content-Type"] == "application/problem+json"
        assert http == rest, (resource, body)
