"""The agents' HTTP API of the bundle (infra/package.py ``agent_api``): exactly
the routes the agent calls, each to the API handler with payload format 1.0;
tenants keep the REST API and every route on it.

That the handler answers those 1.0 events as it answers the REST API's is
tests/api/test_agent_http_api.py."""
from __future__ import annotations

import inspect
import re

from agent.api import ApiClient

#: what agent/api.py calls, as route keys of the packaged REST API
AGENT_ROUTE_KEYS = {"PUT /v1/nodes/{node_id}",
                    "POST /v1/jobs/{job_id}/attempts/{attempt}/events",
                    "POST /v1/jobs/{job_id}/heartbeats"}


def _of_type(bundle, kind: str) -> dict:
    return {k: v for k, v in bundle.resources.items() if v["Type"] == kind}


def _rest_routes(bundle) -> set[str]:
    swagger = bundle.resources["RestAPI"]["Properties"]["DefinitionBody"]
    return {f"{method.upper()} {path}" for path, methods in swagger["paths"].items()
            for method in methods if method.lower() != "options"}


def _called_by_the_agent(bundle) -> set[str]:
    """Every request method of agent/api.py's ApiClient, called with a stand-in
    for the network, matched to the packaged REST API's routes."""
    seen: list[tuple[str, str]] = []

    class Recording(ApiClient):
        def _request(self, method, path, body):
            seen.append((method, path))
            return {}

    client = Recording("https://example.invalid", "token")
    samples = {"node_id": "node-1", "job_id": "job_1", "attempt": 1, "gpus": 8,
               "gpu_type": "h100", "labels": {}, "event": {"type": "STARTED"}, "ranks": [],
               "body": {"node_id": "node-1", "gpus": 8}}
    methods = [m for m, _ in inspect.getmembers(ApiClient, inspect.isfunction)
               if not m.startswith("_")]
    assert methods, "ApiClient has no request methods"
    for name in methods:
        params = inspect.signature(getattr(ApiClient, name)).parameters
        getattr(client, name)(**{p: samples[p] for p, v in params.items()
                                 if p != "self" and v.default is inspect.Parameter.empty})
    assert len(seen) == len(methods)
    routes = _rest_routes(bundle)
    keys = set()
    for method, path in seen:
        matching = {r for r in routes if r.split(" ", 1)[0] == method and re.fullmatch(
            re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(r.split(" ", 1)[1])), path)}
        assert len(matching) == 1, (method, path, matching)
        keys |= matching
    return keys


def test_the_agent_routes_are_what_the_agent_calls(bundle):
    assert _called_by_the_agent(bundle) == AGENT_ROUTE_KEYS


def test_the_http_api_routes_only_the_agent_routes_to_the_api_handler(bundle):
    [(api_id, api)] = _of_type(bundle, "AWS::ApiGatewayV2::Api").items()
    assert api["Properties"]["ProtocolType"] == "HTTP"
    assert "Target" not in api["Properties"]   # no quick create: no catch-all route
    assert "Body" not in api["Properties"] and "BodyS3Location" not in api["Properties"]
    [(integration_id, integration)] = _of_type(
        bundle, "AWS::ApiGatewayV2::Integration").items()
    assert integration["Properties"] == {
        "ApiId": {"Ref": api_id}, "IntegrationType": "AWS_PROXY",
        "IntegrationUri": {"Fn::GetAtt": ["APIHandler", "Arn"]},
        "PayloadFormatVersion": "1.0"}
    routes = _of_type(bundle, "AWS::ApiGatewayV2::Route")
    assert {r["Properties"]["RouteKey"] for r in routes.values()} == AGENT_ROUTE_KEYS
    assert len(routes) == len(AGENT_ROUTE_KEYS)
    for route in routes.values():
        assert route["Properties"]["ApiId"] == {"Ref": api_id}
        assert route["Properties"]["Target"] == {
            "Fn::Sub": "integrations/${%s}" % integration_id}
        assert route["Properties"]["AuthorizationType"] == "NONE"  # the handler checks tokens
    [stage] = _of_type(bundle, "AWS::ApiGatewayV2::Stage").values()
    assert stage["Properties"] == {"ApiId": {"Ref": api_id}, "StageName": "$default",
                                   "AutoDeploy": True}
    # nothing else of API Gateway v2: no $default route, no other integration
    assert {v["Type"] for v in bundle.resources.values()
            if v["Type"].startswith("AWS::ApiGatewayV2::")} == {
        "AWS::ApiGatewayV2::Api", "AWS::ApiGatewayV2::Integration",
        "AWS::ApiGatewayV2::Route", "AWS::ApiGatewayV2::Stage"}


def test_the_http_api_may_invoke_the_api_handler_and_nothing_else(bundle):
    [api_id] = _of_type(bundle, "AWS::ApiGatewayV2::Api")
    permissions = [p["Properties"] for p in _of_type(bundle, "AWS::Lambda::Permission").values()
                   if api_id in str(p["Properties"].get("SourceArn"))]
    assert permissions == [{
        "FunctionName": {"Ref": "APIHandler"}, "Action": "lambda:InvokeFunction",
        "Principal": "apigateway.amazonaws.com",
        "SourceArn": {"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:"
                                 "${AWS::AccountId}:${%s}/*" % api_id}}]
    # and no function is wired to an HTTP API another way (SAM events)
    for fn in bundle.functions().values():
        assert all(e["Type"] not in ("HttpApi", "Api")
                   for e in fn["Properties"].get("Events", {}).values())


def test_agents_get_the_http_api_url_and_tenants_keep_the_rest_api(bundle):
    [api_id] = _of_type(bundle, "AWS::ApiGatewayV2::Api")
    assert bundle.sam["Outputs"]["AgentApiUrl"]["Value"] == {
        "Fn::GetAtt": [api_id, "ApiEndpoint"]}
    assert "${RestAPI}" in bundle.sam["Outputs"]["EndpointURL"]["Value"]["Fn::Sub"]
    # the REST API keeps every route, the agents' too (an agent on it still works)
    rest = _rest_routes(bundle)
    assert AGENT_ROUTE_KEYS < rest
    assert {"POST /v1/jobs", "GET /v1/jobs/{job_id}", "GET /v1/nodes"} <= rest
