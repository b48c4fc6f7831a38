"""docs/openapi.yaml is a valid OpenAPI 3.1 document that describes what the
app really serves: the same routes, the same request schemas, the same problem
codes, and response schemas the real representations conform to.

Pure document checks: no AWS, no environment (the app's config is lazy).
"""
from __future__ import annotations

import pathlib
import re
import sys
from datetime import datetime, timedelta, timezone

import jsonschema
import pytest
import yaml
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from chalicelib import fastjson  # noqa: E402
from chalicelib.api import schemas  # noqa: E402
from chalicelib.api.problems import body as problem_body, status_of  # noqa: E402
from chalicelib.api.representation import (  # noqa: E402
    attempt_json,
    job_json,
    job_view_json,
    node_json,
    node_registration_json,
)
from chalicelib.api.validation import MAX_BODY_BYTES  # noqa: E402
from chalicelib.domain import arrays, deadlines, dependencies, idempotency, retry, wire  # noqa: E402
from chalicelib.domain.attempts import LOST, Attempt, exit_info  # noqa: E402
from chalicelib.domain.clock import iso  # noqa: E402
from chalicelib.domain.errors import ApiError  # noqa: E402
from chalicelib.domain.health import initial_health  # noqa: E402
from chalicelib.domain.ids import JOB_ID_RE, new_job_id  # noqa: E402
from chalicelib.domain.intents import cancel_intent, launch_intent  # noqa: E402
from chalicelib.domain.jobs import Job  # noqa: E402
from chalicelib.domain.nodes import NODE_ID_RE, Node, NodeState, cordon_of  # noqa: E402
from chalicelib.domain.principal import Principal  # noqa: E402
from chalicelib.domain.spec import JobSpec  # noqa: E402
from chalicelib.domain.stall import Beat  # noqa: E402
from chalicelib.domain.states import Event, JobState  # noqa: E402
from chalicelib.domain.wire import master_port  # noqa: E402
from chalicelib.service.attempts import AttemptsService  # noqa: E402
from chalicelib.service.dispatch import Dispatcher  # noqa: E402
from chalicelib.service.heartbeats import HeartbeatsService  # noqa: E402
from chalicelib.service.jobs import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE  # noqa: E402
from chalicelib.service.nodes import DEFAULT_GPU_TYPE  # noqa: E402
from chalicelib.service.scan import Scanner  # noqa: E402
from tests.fakes import FakeCollectorStore, NullTelemetry, World  # noqa: E402

DOC_PATH = ROOT / "docs" / "openapi.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
PROBLEM_JSON = "application/problem+json"


def shown_job(job) -> dict:
    """A job's representation as a client reads it: the JSON the edge writes,
    parsed (views hold their stored JSON as text, fastjson.RawJSON)."""
    return fastjson.loads(fastjson.dumps(job_json(job)))


@pytest.fixture(scope="module")
def doc() -> dict:
    with DOC_PATH.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def _resolve(doc: dict, node: dict) -> dict:
    """Follow a local ``$ref`` (``#/components/...``) to what it names."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), f"only local refs are expected, got {ref}"
        node = doc
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _operations(doc: dict):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                yield path, method, op


def _documented_problem_codes(doc: dict) -> dict:
    return doc["x-problem-codes"]


def _api_error_classes() -> list[type[ApiError]]:
    return [ApiError, *ApiError.__subclasses__()]


def _schema_validator(doc: dict, name: str) -> jsonschema.Draft202012Validator:
    """A JSON Schema 2020-12 validator for one component schema, with the
    document's other components reachable through their ``#/components`` refs."""
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def _assert_valid(doc: dict, name: str, instance) -> None:
    problems = sorted(_schema_validator(doc, name).iter_errors(instance), key=str)
    assert not problems, f"{name} does not accept {instance!r}:\n" + "\n".join(
        f"- {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in problems)


# -- 1. the document is valid OpenAPI 3.1 --------------------------------------
def test_document_is_valid_openapi_3_1(doc):
    assert doc["openapi"] == "3.1.0"
    validate(doc, cls=OpenAPIV31SpecValidator)


def test_bearer_auth_is_global_and_health_needs_no_token(doc):
    scheme = doc["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["paths"]["/v1/health"]["get"].get("security") == [], (
        "GET /v1/health must override the global security with `security: []`")
    unauthenticated = [(p, m) for p, m, op in _operations(doc) if op.get("security") == []]
    assert unauthenticated == [("/v1/health", "get"), ("/", "get"), ("/", "head"),
                               ("/static/{name}", "get"), ("/static/{name}", "head")], (
        "only GET /v1/health and the dashboard's static files may skip the token, "
        f"but these do: {unauthenticated}")


# -- 2. the document's operations are exactly the app's routes ----------------
def _app_routes() -> set[tuple[str, str]]:
    return {(path, method.lower())
            for path, methods in app.app.routes.items() for method in methods}


def _doc_routes(doc: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, method, _ in _operations(doc)}


def test_every_app_route_is_documented(doc):
    missing = sorted(_app_routes() - _doc_routes(doc))
    assert not missing, (
        "routes the Chalice app serves but docs/openapi.yaml does not describe: "
        + ", ".join(f"{m.upper()} {p}" for p, m in missing))


def test_every_documented_operation_is_an_app_route(doc):
    extra = sorted(_doc_routes(doc) - _app_routes())
    assert not extra, (
        "operations docs/openapi.yaml describes but the Chalice app does not serve: "
        + ", ".join(f"{m.upper()} {p}" for p, m in extra))


def test_every_path_parameter_is_declared_for_its_operation(doc):
    for path, method, op in _operations(doc):
        params = [_resolve(doc, p) for p in
                  doc["paths"][path].get("parameters", []) + op.get("parameters", [])]
        declared = {p["name"] for p in params if p["in"] == "path"}
        assert declared == set(re.findall(r"{(\w+)}", path)), (
            f"{method.upper()} {path} declares path parameters {sorted(declared)}")


# -- 3. request schemas are the ones the server validates with ----------------
def test_job_create_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["JobCreate"] == schemas.JOB_CREATE


def test_cancel_request_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["CancelRequest"] == schemas.CANCEL


def test_node_put_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["NodePut"] == schemas.NODE_PUT


def test_cordon_and_drain_schemas_equal_server_validation_schemas(doc):
    assert doc["components"]["schemas"]["Cordon"] == schemas.CORDON
    assert doc["components"]["schemas"]["Drain"] == schemas.DRAIN


def test_attempt_event_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["AttemptEvent"] == schemas.ATTEMPT_EVENT


def test_heartbeats_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["Heartbeats"] == schemas.HEARTBEATS


def test_webhook_create_schema_equals_server_validation_schema(doc):
    assert doc["components"]["schemas"]["WebhookCreate"] == schemas.WEBHOOK_CREATE


def test_webhooks_and_deliveries_conform_to_their_schemas(doc):
    from chalicelib.api.representation import delivery_json, webhook_json
    from chalicelib.domain import webhooks as wh
    from chalicelib.service.webhooks import WebhooksService

    made = wh.Webhook("wh_01JJ5D4Z7T3W9XKQ2M8N6P4R5S", "acme", "https://h.example.com/",
                      wh.TYPES, None, wh.ENABLED, _t("2025-01-31T12:00:00.123456"),
                      wh.new_secret())
    _assert_valid(doc, "WebhookCreated", webhook_json(made, with_secret=True))
    _assert_valid(doc, "Webhook", webhook_json(made))
    _assert_valid(doc, "WebhookList", {"webhooks": [webhook_json(made)]})
    at = _t("2025-01-31T12:00:00.123456")
    for d in (wh.Delivery("evt_1", 1, at, 500, "answered 500", at),
              wh.Delivery("evt_1", 2, at, None, "TimeoutError: timed out", None),
              wh.Delivery("evt_1", 3, at, 204, None, None)):
        _assert_valid(doc, "Delivery", delivery_json(d))
    assert set(doc["components"]["schemas"]["Webhook"]["properties"]["types"]["items"][
        "enum"]) == set(wh.TYPES)
    assert doc["components"]["schemas"]["WebhookCreate"]["properties"]["url"][
        "maxLength"] == wh.MAX_URL_CHARS
    service = WebhooksService(None, None, None, page_token_key=b"k")  # type: ignore[arg-type]
    assert service._schedule == wh.RETRY_SCHEDULE_S


def test_request_bodies_use_the_server_validation_schemas(doc):
    bodies = {(p, m): op["requestBody"]["content"]["application/json"]["schema"]
              for p, m, op in _operations(doc) if "requestBody" in op}
    assert bodies == {
        ("/v1/jobs", "post"): {"$ref": "#/components/schemas/JobCreate"},
        ("/v1/jobs/{job_id}/cancel", "post"): {"$ref": "#/components/schemas/CancelRequest"},
        ("/v1/nodes/{node_id}", "put"): {"$ref": "#/components/schemas/NodePut"},
        ("/v1/jobs/{job_id}/attempts/{attempt}/events", "post"): {
            "$ref": "#/components/schemas/AttemptEvent"},
        ("/v1/jobs/{job_id}/heartbeats", "post"): {"$ref": "#/components/schemas/Heartbeats"},
        ("/v1/nodes/{node_id}/cordon", "post"): {"$ref": "#/components/schemas/Cordon"},
        ("/v1/nodes/{node_id}/drain", "post"): {"$ref": "#/components/schemas/Drain"},
        ("/v1/webhooks", "post"): {"$ref": "#/components/schemas/WebhookCreate"},
    }


# -- 4. problem codes are exactly the server's ---------------------------------
def test_documented_problem_codes_equal_api_error_codes(doc):
    documented = set(_documented_problem_codes(doc))
    served = {cls.code for cls in _api_error_classes()}
    assert documented == served, (
        f"codes documented but not raised: {sorted(documented - served)}; "
        f"codes raised but not documented: {sorted(served - documented)}")


def test_documented_problem_status_and_title_match_api_errors(doc):
    documented = _documented_problem_codes(doc)
    for cls in _api_error_classes():
        entry = documented.get(cls.code)
        assert entry is not None, f"{cls.__name__} ({cls.code}) is not documented"
        status = status_of(cls.code)
        assert (entry["status"], entry["title"]) == (status, cls.title), (
            f"{cls.code}: documented {entry}, served status {status} title {cls.title!r}")


def test_api_description_lists_every_problem_code(doc):
    description = doc["info"]["description"]
    unlisted = [c for c in _documented_problem_codes(doc) if f"`{c}`" not in description]
    assert not unlisted, f"info.description does not list the problem codes {unlisted}"


def _problem_examples(doc: dict):
    """(where, status, example value) of every problem example of every response."""
    for path, method, op in _operations(doc):
        for status, response in op["responses"].items():
            media = _resolve(doc, response).get("content", {}).get(PROBLEM_JSON)
            for name, example in (media or {}).get("examples", {}).items():
                yield f"{method.upper()} {path} {status} {name}", int(status), \
                    _resolve(doc, example)["value"]


def test_problem_examples_use_documented_codes_with_their_status(doc):
    documented = _documented_problem_codes(doc)
    seen = 0
    for where, status, value in _problem_examples(doc):
        seen += 1
        assert value["code"] in documented, f"{where}: unknown code {value['code']}"
        assert value["status"] == status == documented[value["code"]]["status"], where
        assert value["type"] == f"urn:gpujobs:problem:{value['code']}", where
        assert value["title"] == documented[value["code"]]["title"], where
    assert seen, "no problem examples found"


def test_every_error_response_is_problem_json(doc):
    for path, method, op in _operations(doc):
        for status, response in op["responses"].items():
            if int(status) >= 400:
                content = _resolve(doc, response).get("content", {})
                assert set(content) == {PROBLEM_JSON}, f"{method.upper()} {path} {status}"
                assert content[PROBLEM_JSON]["schema"] == {
                    "$ref": "#/components/schemas/Problem"}, f"{method.upper()} {path} {status}"


def test_every_api_error_problem_conforms_to_problem_schema(doc):
    for cls in _api_error_classes():
        err = cls("detail")
        _assert_valid(doc, "Problem", problem_body(err))
        err.field = "heartbeat.interval_s"
        _assert_valid(doc, "Problem", problem_body(err))


# -- responses each operation must declare -------------------------------------
EXPECTED_STATUSES = {
    ("/v1/health", "get"): {"200", "415", "500", "503"},
    ("/v1/jobs", "post"): {"201", "400", "401", "403", "409", "413", "415", "422",
                           "429", "500", "503"},
    # 404 and 400 name `parent`: an array's children (issue 27)
    ("/v1/jobs", "get"): {"200", "400", "401", "403", "404", "415", "500", "503"},
    ("/v1/jobs/{job_id}", "get"): {"200", "401", "403", "404", "415", "500", "503"},
    ("/v1/jobs/{job_id}/cancel", "post"): {"202", "400", "401", "403", "404", "409", "413",
                                           "415", "500", "503"},
    ("/v1/jobs/{job_id}/attempts", "get"): {"200", "401", "403", "404", "415", "500",
                                            "503"},
    # agent endpoints: no 404, an agent token cannot tell whether a job exists
    ("/v1/jobs/{job_id}/attempts/{attempt}/events", "post"): {
        "200", "400", "401", "403", "409", "413", "415", "500", "503"},
    ("/v1/jobs/{job_id}/heartbeats", "post"): {"202", "400", "401", "403", "409",
                                               "413", "415", "500", "503"},
    ("/v1/jobs/{job_id}/ranks", "get"): {"200", "401", "403", "404", "415", "500", "503"},
    ("/v1/jobs/{job_id}/events", "get"): {"200", "401", "403", "404", "415", "500", "503"},
    ("/v1/jobs/{job_id}/logs", "get"): {"200", "400", "401", "403", "404", "415", "500",
                                        "503"},
    # the tenant's feed (issue 45): 400 names type, page_size, wait_s or after
    ("/v1/events", "get"): {"200", "400", "401", "403", "415", "500", "503"},
    # nodes: any token reads them, so no 403 on the reads
    ("/v1/nodes", "get"): {"200", "401", "415", "500", "503"},
    ("/v1/nodes/{node_id}", "get"): {"200", "401", "404", "415", "500", "503"},
    ("/v1/nodes/{node_id}", "put"): {"200", "400", "401", "403", "413", "415", "500",
                                     "503"},
    # an operator's: cordon and drain read a body, uncordon none
    ("/v1/nodes/{node_id}/cordon", "post"): {"200", "400", "401", "403", "404", "413", "415",
                                             "500", "503"},
    ("/v1/nodes/{node_id}/drain", "post"): {"202", "400", "401", "403", "404", "413", "415",
                                            "500", "503"},
    ("/v1/nodes/{node_id}/uncordon", "post"): {"200", "401", "403", "404", "415", "500",
                                               "503"},
    # webhooks (issue 45): a tenant's; only the create reads a body
    ("/v1/webhooks", "post"): {"201", "400", "401", "403", "413", "415", "500", "503"},
    ("/v1/webhooks", "get"): {"200", "401", "403", "415", "500", "503"},
    ("/v1/webhooks/{webhook_id}", "get"): {"200", "401", "403", "404", "415", "500", "503"},
    ("/v1/webhooks/{webhook_id}", "delete"): {"204", "401", "403", "404", "415", "500",
                                              "503"},
    ("/v1/webhooks/{webhook_id}/deliveries", "get"): {"200", "400", "401", "403", "404",
                                                      "415", "500", "503"},
    ("/v1/webhooks/{webhook_id}/test", "post"): {"202", "401", "403", "404", "415", "500",
                                                 "503"},
    # usage (issue 46): 400 names start, end, granularity or group_by; 403 another tenant
    ("/v1/usage", "get"): {"200", "400", "401", "403", "415", "500", "503"},
    # the dashboard's static files: no token, no storage, any Content-Type
    ("/", "get"): {"200", "301", "304", "500"},
    ("/", "head"): {"200", "301", "304", "500"},
    ("/static/{name}", "get"): {"200", "304", "404", "500"},
    ("/static/{name}", "head"): {"200", "304", "404", "500"},
}


def test_each_operation_declares_every_status_the_code_can_produce(doc):
    declared = {(p, m): set(op["responses"]) for p, m, op in _operations(doc)}
    differences = {
        f"{m.upper()} {p}": {"undocumented": sorted(want - declared.get((p, m), set())),
                             "unexpected": sorted(declared.get((p, m), set()) - want)}
        for (p, m), want in EXPECTED_STATUSES.items() if declared.get((p, m)) != want}
    assert not differences, f"responses differ from what the code produces: {differences}"
    unlisted = sorted(set(declared) - set(EXPECTED_STATUSES))
    assert not unlisted, f"add the statuses of these operations to EXPECTED_STATUSES: {unlisted}"


def _example_codes(doc: dict, response: dict) -> set[str]:
    examples = response["content"][PROBLEM_JSON].get("examples", {})
    return {_resolve(doc, e)["value"]["code"] for e in examples.values()}


def test_retryable_responses_declare_retry_after(doc):
    """Every 503, and every 409 that may be ``request_in_progress``, says when to
    retry; a 409 that is only ``stale_attempt`` or ``already_finished`` does not."""
    for path, method, op in _operations(doc):
        for status in ("409", "503"):
            if status in op["responses"]:
                response = _resolve(doc, op["responses"][status])
                codes = _example_codes(doc, response)
                assert codes, f"{method.upper()} {path} {status} has no examples"
                retryable = status == "503" or "request_in_progress" in codes
                assert ("Retry-After" in response.get("headers", {})) == retryable, (
                    f"{method.upper()} {path} {status} ({sorted(codes)}): Retry-After "
                    f"should {'' if retryable else 'not '}be declared")
    created = doc["paths"]["/v1/jobs"]["post"]["responses"]["201"]["headers"]
    assert {"Location", "Idempotent-Replayed"} <= set(created)


def test_the_documented_headers_of_every_answer_are_the_ones_it_carries(doc):
    """``x-response-headers`` (and the dashboard files' own responses) state
    exactly the security headers the edge gives every answer
    (chalicelib/api/headers.py) and the dashboard's files (chalicelib/web)."""
    from chalicelib import web
    from chalicelib.api.headers import SECURITY_HEADERS

    documented = doc["x-response-headers"]

    def consts(kind: str) -> dict[str, str]:
        return {name: _resolve(doc, ref)["schema"]["const"]
                for name, ref in documented[kind].items()}

    every, page, data = consts("every-answer"), consts("page"), consts("data")
    assert {**every, **data} == SECURITY_HEADERS
    assert {**every, **page} == {**SECURITY_HEADERS, **web.PAGE_HEADERS}
    for path in ("/", "/static/{name}"):
        served = doc["paths"][path]["get"]["responses"]["200"]["headers"]
        assert {n: _resolve(doc, served[n])["schema"]["const"] for n in page} == page, path


# -- parameters agree with the code that parses them --------------------------
def test_parameters_match_server_limits(doc):
    params = doc["components"]["parameters"]
    key = params["IdempotencyKey"]
    assert (key["in"], key["name"]) == ("header", "Idempotency-Key")
    assert key["schema"]["pattern"] == idempotency._KEY_RE.pattern == r"^[\x20-\x7e]{1,255}$"
    page_size = params["PageSize"]["schema"]
    assert (page_size["minimum"], page_size["maximum"], page_size["default"]) == (
        1, MAX_PAGE_SIZE, DEFAULT_PAGE_SIZE)
    assert params["PageToken"]["schema"] == {"type": "string"}
    assert _resolve(doc, params["State"]["schema"])["enum"] == [s.value for s in JobState]
    assert (params["JobId"]["in"], params["JobId"]["required"]) == ("path", True)
    assert f"{MAX_BODY_BYTES} bytes" in doc["info"]["description"]
    node_id = params["NodeId"]
    assert (node_id["in"], node_id["name"], node_id["required"]) == ("path", "node_id", True)
    assert node_id["schema"]["pattern"] == NODE_ID_RE.pattern
    assert doc["components"]["schemas"]["Node"]["properties"]["node_id"]["pattern"] == \
        NODE_ID_RE.pattern
    attempt = params["Attempt"]
    assert (attempt["in"], attempt["name"], attempt["required"]) == ("path", "attempt", True)
    # the edge takes 1 to 6 digits (chalicelib/api/edge.py, whole_number)
    assert (attempt["schema"]["type"], attempt["schema"]["maximum"]) == ("integer", 999999)


# -- response schemas accept what the app really returns ----------------------
def _t(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc)


def _job(**changes) -> Job:
    spec = JobSpec.parse({"command": ["python", "train.py"], "ranks": 4,
                          "heartbeat": {"interval_s": 2}})
    job = Job(job_id=new_job_id(), tenant="acme", state=JobState.PENDING, spec=spec,
              created_at=_t("2025-01-31T12:00:00.123456"),
              updated_at=_t("2025-01-31T12:00:00.123456"),
              health=initial_health(spec, 60.0))
    for k, v in changes.items():
        setattr(job, k, v)
    return job


def test_job_representation_conforms_to_job_schema(doc):
    fresh = shown_job(_job())
    assert set(fresh) == set(doc["components"]["schemas"]["Job"]["properties"]), (
        "the Job schema's members differ from the representation's")
    _assert_valid(doc, "Job", fresh)
    assert JOB_ID_RE.pattern == doc["components"]["schemas"]["Job"]["properties"]["id"][
        "pattern"]
    stalled = {"status": "STALLED", "threshold_s": 6.0, "first_stalled_rank": 2,
               "last_heard_at": "2025-01-31T12:05:00.000Z",
               "detected_at": "2025-01-31T12:05:10.000Z", "stalled_ranks": [2, 3],
               "co_first": [{"rank": 3, "last_heard_at": "2025-01-31T12:05:00.001Z",
                             "step": 17}],
               "suspect_node": "node-2", "detection_s": 10.0, "false_alarms": 1,
               "suppressed": None}
    cancelled = _job(name="x", state=JobState.CANCELLED, attempt=1,
                     started_at=_t("2025-01-31T12:01:00"),
                     finished_at=_t("2025-01-31T12:06:00"),
                     cancel_requested_at=_t("2025-01-31T12:06:00"), cancel_reason="stop",
                     health=stalled, exit={"reason": "cancelled", "exit_code": None})
    _assert_valid(doc, "Job", shown_job(cancelled))
    _assert_valid(doc, "JobList", {"jobs": [fresh, shown_job(cancelled)],
                                   "next_page_token": "abc.def"})
    _assert_valid(doc, "JobList", {"jobs": [], "next_page_token": None})


def test_a_jobs_usage_conforms_and_the_document_defines_every_cause(doc):
    """``usage`` as GET /v1/jobs/{id} shows it (domain/usage.py): each cause
    the domain counts is one the document defines, and no other."""
    from chalicelib.domain.usage import CAUSES, PHASES, Span, usage
    schema = doc["components"]["schemas"]["Job"]["properties"]["usage"]
    assert set(schema["properties"]["lost_gpu_seconds"]["propertyNames"]["enum"]) == \
        set(CAUSES.values()) | set(PHASES)
    for cause in set(CAUSES.values()) | set(PHASES):
        assert f"`{cause}`" in schema["description"], cause
    t0 = _t("2025-01-31T12:00:00")
    spans = [Span(1, 8, t0, t0 + timedelta(minutes=10), "rank_failed",
                  started_at=t0 + timedelta(seconds=30),
                  stalls=((t0 + timedelta(minutes=5), None),)),
             Span(2, 8, t0 + timedelta(minutes=11), None, None,
                  started_at=t0 + timedelta(minutes=12))]
    for shown in (usage(spans, t0 + timedelta(hours=1)), usage([], t0)):
        view = {**job_json(_job(attempt=2)), "usage": shown}
        _assert_valid(doc, "Job", fastjson.loads(fastjson.dumps(view)))


def test_job_schema_rejects_what_the_representation_never_returns(doc):
    fresh = shown_job(_job())
    for broken in ({**fresh, "state": "DONE"}, {**fresh, "exit": {"exit_code": 1}},
                   {**fresh, "created_at": "2025-01-31 12:00:00"},
                   {k: v for k, v in fresh.items() if k != "health"}):
        assert not _schema_validator(doc, "Job").is_valid(broken), broken


def _attempt(**changes) -> Attempt:
    attempt = Attempt(job_id=new_job_id(), attempt=1, state="SCHEDULED",
                      placement=[{"rank": r, "node_id": n}
                                 for r, n in enumerate(["node-1", "node-1", "node-2"])],
                      node_ranks={"node-1": [0, 1], "node-2": [2]},
                      node_gpus={"node-1": 2, "node-2": 1}, world_size=3,
                      created_at=_t("2025-01-31T12:00:01"))
    for k, v in changes.items():
        setattr(attempt, k, v)
    return attempt


def _exits() -> dict[str, dict]:
    """Every shape of ``exit`` the domain produces, by reason."""
    everyone = {0, 1, 2}
    spec = JobSpec.parse({"command": ["x"], "ranks": 3, "max_pending_s": 60})

    def decided(exit_: dict, attempt: int = 1) -> dict:
        return {**exit_, "decision": retry.decide(spec, exit_, attempt=attempt,
                                                  uncounted=0).text}
    failed = exit_info(_attempt(exited={1, 2}, exit_codes={1: 0, 2: 7}), Event.RANK_FAILED)
    return {
        "succeeded": exit_info(_attempt(exited=everyone, exit_codes={0: 0, 1: 0, 2: 0}),
                               Event.ALL_EXITED_OK),
        "rank_failed": failed,
        "decided": decided(failed),
        "retry": exit_info(_attempt(exited={2}, exit_codes={2: -255}), Event.RETRY),
        "node_lost": decided(exit_info(_attempt(exited={2}, exit_codes={2: LOST}),
                                       Event.RANK_FAILED)),
        "cancelled": exit_info(_attempt(stopped=everyone), Event.STOPPED),
        "timeout": decided(dict(deadlines.TIMEOUT_EXIT)),
        "pending_timeout": deadlines.pending_exit(spec, "waiting for 3 x 1 free GPUs"),
        "preempted": decided({"reason": "preempted", "exit_code": None, "node_id": "node-2",
                              "detail": "node node-2 drained: bad ECC"}),
        # issue 27: a dependency that can no longer be met, an array's ends
        "dependency_failed": dependencies.failed_exit(
            dependencies.Dependency(new_job_id()), JobState.FAILED),
        **{name: arrays.final(arrays.ArraySpec(100, 8, 2), arrays.Counts(**counts),
                              cancelled)[1]
           for name, counts, cancelled in (
               ("array_failed", {"materialized": 100, "succeeded": 99, "cancelled": 1}, False),
               ("max_failed_indexes", {"materialized": 50, "succeeded": 40, "failed": 3,
                                       "cancelled": 7}, False),
               ("array_cancelled", {"materialized": 10, "succeeded": 4, "cancelled": 6},
                True))},
    }


def test_exit_schema_accepts_every_exit_the_domain_produces(doc):
    exits = _exits()
    reasons = doc["components"]["schemas"]["Exit"]["properties"]["reason"]["enum"]
    assert {e["reason"] for e in exits.values()} <= set(reasons)
    for name, value in exits.items():
        _assert_valid(doc, "Exit", value)
        assert ("rank" in value) == (value["reason"] in ("rank_failed", "node_lost")), name
    assert exits["rank_failed"] == {"reason": "rank_failed", "exit_code": 7, "rank": 2,
                                    "node_id": "node-2"}
    assert exits["node_lost"] == {
        "reason": "node_lost", "exit_code": None, "rank": 2, "node_id": "node-2",
        "decision": "node_lost (rank 2): retried, not counted (uncounted retry 1 of 10)"}
    _assert_valid(doc, "Exit", None)
    assert not _schema_validator(doc, "Exit").is_valid({"reason": "exploded", "exit_code": 1})
    assert {e["reason"] for e in exits.values()} >= {"dependency_failed", "array_failed",
                                                       "max_failed_indexes"}
    assert exits["max_failed_indexes"]["detail"] == (
        "3 indexes failed, more than max_failed_indexes 2; 40 of 100 indexes succeeded, "
        "3 failed, 57 cancelled (50 never started)")


def test_attempt_representation_conforms_to_attempt_list_schema(doc):
    attempt = attempt_json({"attempt": 1, "state": "SCHEDULED",
                            "placement": [{"rank": 0, "node_id": "node-1"}],
                            "created_at": _t("2025-01-31T12:00:01"), "finished_at": None,
                            "exit": None})
    assert set(attempt) == set(doc["components"]["schemas"]["Attempt"]["properties"])
    ended = [attempt_json({"attempt": n, "state": state,
                           "placement": [{"rank": 0, "node_id": "node-2"}],
                           "created_at": _t("2025-01-31T12:00:01"),
                           "finished_at": _t("2025-01-31T12:10:00"), "exit": exit_})
             for n, (state, exit_) in enumerate(
                 [("FAILED", _exits()["retry"]), ("FAILED", _exits()["node_lost"]),
                  ("SUCCEEDED", _exits()["succeeded"]),
                  ("CANCELLED", _exits()["cancelled"])], start=2)]
    _assert_valid(doc, "AttemptList", {"attempts": [attempt, *ended]})
    _assert_valid(doc, "AttemptList", {"attempts": []})
    # the store writes SCHEDULED, then a terminal state (FAILED for a retry)
    states = doc["components"]["schemas"]["Attempt"]["properties"]["state"]["enum"]
    assert set(states) == {JobState.SCHEDULED.value} | {
        s.value for s in JobState if s.terminal}


def test_finished_and_waiting_jobs_conform_to_job_schema(doc):
    exits = _exits()
    for state, exit_ in ((JobState.SUCCEEDED, exits["succeeded"]),
                         (JobState.FAILED, exits["rank_failed"]),
                         (JobState.FAILED, exits["node_lost"])):
        _assert_valid(doc, "Job", shown_job(_job(state=state, attempt=1, exit=exit_,
                                                started_at=_t("2025-01-31T12:01:00"),
                                                finished_at=_t("2025-01-31T12:09:00"))))
    for reason in ("waiting for 4 x 1 free GPUs on READY nodes",
                   "can never fit: needs 64 h100 GPUs; the fleet has 16"):
        _assert_valid(doc, "Job", shown_job(_job(pending_reason=reason)))


def test_pipeline_and_array_jobs_and_their_events_conform_to_the_schemas(doc):
    """Issue 27 through the services on the fakes: a waiting job, one ended by
    its dependency, a released one, an array parent (PENDING, RUNNING,
    FAILED), its children and their listing, and each one's events."""
    world = World()
    svc = world.services()
    agents = Principal("agent", "*")
    svc.nodes.register(agents, "n1", {"gpus": 2, "gpu_type": "a100"})

    def submit(**body) -> str:
        view, _ = svc.jobs.submit("acme", {"command": ["python", "x.py"], "ranks": 1, **body},
                                  None)
        return view["job_id"]

    def shown(job_id: str) -> dict:
        return fastjson.loads(fastjson.dumps(job_view_json(svc.jobs.read("acme", job_id))))

    def run(job_id: str, code: int) -> None:
        attempt = svc.store.get(job_id).attempt
        for report in ({"type": "STARTED", "ranks": [0]},
                       {"type": "EXITED", "ranks": [0], "exit_code": code}):
            svc.attempts.report(agents, job_id, attempt, {"node_id": "n1", **report})

    first = submit(name="prepare")
    waits = [submit(depends_on=[{"job_id": first}]),
             submit(depends_on=[{"job_id": first, "condition": "failed"}])]
    after = submit(depends_on=[{"job_id": waits[0], "condition": "ended"}])
    # prepare is placed before the sweep exists: a child's id carries its
    # parent's millisecond, so in the same millisecond it may sort (queue)
    # ahead of prepare and the two children would take both GPUs
    svc.placer.run()
    assert svc.store.get(first).state is JobState.SCHEDULED
    sweep = submit(name="sweep", max_attempts=1,
                   array={"size": 5, "max_parallel": 2, "max_failed_indexes": 0,
                          "env": {"LR": ["1", "2", "3", "4", "5"]}})
    pending = shown(sweep)
    assert pending["array"] == {"size": 5, "materialized": 2, "counts": {  # made by its create
        "PENDING": 5, "RUNNING": 0, "SUCCEEDED": 0, "FAILED": 0, "CANCELLED": 0}}
    views = [pending, *(shown(j) for j in waits)]
    assert views[1]["waiting_for"] == [first]
    assert views[1]["pending_reason"] == f"waiting for {first} to succeed"
    svc.placer.run()  # the sweep's first index, on the GPU prepare left
    running = shown(sweep)
    assert running["state"] == "RUNNING" and running["array"]["materialized"] == 2
    children, _ = svc.jobs.list("acme", state=None, page_size=50, page_token=None,
                                parent=sweep)
    shown_children = [fastjson.loads(fastjson.dumps(job_view_json(c))) for c in children]
    assert [c["array_index"] for c in shown_children] == [0, 1]
    assert {c["parent_id"] for c in shown_children} == {sweep}
    _assert_valid(doc, "JobList", {"jobs": shown_children, "next_page_token": None})
    run(first, 3)  # fails: waits[0] ends dependency_failed, waits[1] is released
    ended, released = shown(waits[0]), shown(waits[1])
    assert (ended["state"], ended["exit"]["reason"], ended["exit"]["dependency"]) == (
        "FAILED", "dependency_failed", first)
    assert (released["waiting_for"], released["pending_reason"]) == (None, None)
    [child] = [c["id"] for c in shown_children if c["state"] == "SCHEDULED"]
    run(child, 1)  # more than max_failed_indexes 0: the array fails fast
    for job_id in (c["id"] for c in shown_children if c["id"] != child):
        job = svc.store.get(job_id)
        if job.state is JobState.SCHEDULED:
            svc.attempts.report(agents, job_id, job.attempt, {"type": "STOPPED",
                                                              "node_id": "n1"})
    failed = shown(sweep)
    assert (failed["state"], failed["exit"]["reason"]) == ("FAILED", "max_failed_indexes")
    assert failed["array"]["counts"]["FAILED"] == 1
    views += [running, ended, released, failed, shown(after), *shown_children]
    for view in views:
        _assert_valid(doc, "Job", view)
    for job_id in (first, *waits, after, sweep, child):
        _assert_valid(doc, "JobEventList", {"events": svc.jobs.events("acme", job_id)})
    types = {e["type"] for j in (waits[1], sweep) for e in svc.jobs.events("acme", j)}
    assert {"dependencies_met", "started", "finished"} <= types


# -- nodes ---------------------------------------------------------------------
def _node(**changes) -> Node:
    node = Node(node_id="node-1", gpus=8, gpus_free=6, gpu_type=DEFAULT_GPU_TYPE,
                state=NodeState.READY,
                inbox_queue_url="http://127.0.0.1:5000/123456789012/gpujobs-dev-inbox-node-1",
                last_seen_at=_t("2025-01-31T12:00:05.123456"),
                registered_at=_t("2025-01-31T11:00:00"), labels={}, address="node-1")
    for k, v in changes.items():
        setattr(node, k, v)
    return node


def test_node_representation_conforms_to_node_schema(doc):
    node = node_json(_node())
    assert set(node) == set(doc["components"]["schemas"]["Node"]["properties"]), (
        "the Node schema's members differ from the representation's")
    assert set(doc["components"]["schemas"]["Node"]["required"]) == set(node)
    _assert_valid(doc, "Node", node)
    assert doc["components"]["schemas"]["NodeState"]["enum"] == [s.value for s in NodeState]
    others = [node_json(_node(node_id=f"n.{s.value.lower()}", state=s, gpu_type="h100",
                              labels={"rack": "r1"}, address="10.0.0.7", gpus_free=-2))
              for s in NodeState]
    others.append(node_json(_node(node_id="n.cordoned", state=NodeState.DRAINING,
                                  cordon=cordon_of("bad ECC", "ops", iso(_t(
                                      "2025-01-31T12:00:01")), "stop"))))
    for other in others:
        _assert_valid(doc, "Node", other)
    _assert_valid(doc, "NodeList", {"nodes": [node, *others]})
    _assert_valid(doc, "NodeList", {"nodes": []})
    for broken in ({**node, "state": "GONE"}, {**node, "last_seen_at": None},
                   {k: v for k, v in node.items() if k != "inbox_queue_url"}):
        assert not _schema_validator(doc, "Node").is_valid(broken), broken


def test_node_registration_answer_conforms_to_its_schema(doc):
    node = _node(attempts=frozenset({"job_a#1", "job_b#2"}), lost=frozenset({"job_b#2"}))
    answer = node_registration_json(node)
    assert answer["attempts"] == [{"job_id": "job_a", "attempt": 1}], "lost ones are not live"
    _assert_valid(doc, "NodeRegistration", answer)
    _assert_valid(doc, "NodeRegistration", node_registration_json(_node()))
    assert not _schema_validator(doc, "NodeRegistration").is_valid(node_json(node))


def test_node_registration_defaults_are_documented(doc):
    put = doc["paths"]["/v1/nodes/{node_id}"]["put"]
    assert f'`"{DEFAULT_GPU_TYPE}"`' in put["description"]
    assert f'`"{DEFAULT_GPU_TYPE}"`' in put["requestBody"]["description"]
    assert "`address`" in put["description"] and "`node_id`" in put["requestBody"][
        "description"]


# -- inbox messages --------------------------------------------------------------
def test_inbox_messages_are_documented_components(doc):
    assert {k: v for k, v in doc["x-inbox-messages"].items() if k != "description"} == {
        "LAUNCH": {"$ref": "#/components/schemas/LaunchMessage"},
        "CANCEL": {"$ref": "#/components/schemas/CancelMessage"},
    }
    for kind, name in (("LAUNCH", "LaunchMessage"), ("CANCEL", "CancelMessage")):
        assert doc["components"]["schemas"][name]["properties"]["type"] == {"const": kind}


def test_launch_messages_conform_to_launch_message_schema(doc):
    """Every member a LAUNCH can carry is documented, the optional ones too."""
    job = _job(spec=JobSpec.parse({"command": ["python", "train.py"], "ranks": 3,
                                   "gpus_per_rank": 2, "env": {"A": "1"},
                                   "working_dir": "/data/run", "max_runtime_s": 3600,
                                   "warn_before_s": 300, "checkpoint_dir": "/shared/ckpt"}))
    intent = launch_intent(job, 1, {"node-1": [0, 1], "node-2": [2]},
                           {"node-1": "http://q/1", "node-2": "http://q/2"},
                           master_addr="10.0.0.7", master_port=master_port(job.job_id, 1))
    launch_schema = doc["components"]["schemas"]["LaunchMessage"]
    properties = launch_schema["properties"]
    for node_id, ranks in (("node-1", [0, 1]), ("node-2", [2])):
        message = intent.message_for(node_id)
        assert set(message) == set(properties), "LaunchMessage members differ"
        assert message["ranks"] == ranks
        _assert_valid(doc, "LaunchMessage", message)
        optional = {k: v for k, v in message.items() if k not in launch_schema["required"]}
        assert optional == {"working_dir": "/data/run", "max_runtime_s": 3600,
                            "warn_before_s": 300, "warn_signal": "SIGUSR1",
                            "checkpoint_dir": f"/shared/ckpt/{job.job_id}"}
        _assert_valid(doc, "LaunchMessage", {k: v for k, v in message.items()
                                             if k not in optional})
    assert properties["working_dir"]["pattern"] == wire.WORKING_DIR_PATTERN
    # the documented range is the wire schema's (domain/wire.py), which every port lies in
    assert (properties["master_port"]["minimum"], properties["master_port"]["maximum"]) == (
        wire.MASTER_PORT_MIN, wire.MASTER_PORT_MIN + wire.MASTER_PORT_SPAN - 1)
    for attempt in range(1, 200):
        port = master_port(job.job_id, attempt)
        assert properties["master_port"]["minimum"] <= port <= properties["master_port"][
            "maximum"]


def test_cancel_messages_conform_to_cancel_message_schema(doc):
    job = _job(state=JobState.RUNNING, attempt=2,
               inboxes={"node-1": "http://q/1", "node-2": "http://q/2"})
    properties = doc["components"]["schemas"]["CancelMessage"]["properties"]
    for reason in (None, "superseded by run 42"):
        intent = cancel_intent(job, reason)
        for node_id in intent.targets:
            message = intent.message_for(node_id)
            assert set(message) == set(properties), "CancelMessage members differ"
            _assert_valid(doc, "CancelMessage", message)


def test_health_schema_accepts_the_health_body(doc):
    _assert_valid(doc, "Health", {"status": "ok"})


def test_every_example_conforms_to_its_schema(doc):
    checked = 0
    for path, method, op in _operations(doc):
        media_types = []
        if "requestBody" in op:
            media_types += list(op["requestBody"]["content"].values())
        for response in op["responses"].values():
            media_types += list(_resolve(doc, response).get("content", {}).values())
        for media in media_types:
            schema = media["schema"]
            validator = jsonschema.Draft202012Validator(
                {**schema, "components": doc["components"]})
            for name, example in media.get("examples", {}).items():
                value = _resolve(doc, example)["value"]
                problems = [e.message for e in validator.iter_errors(value)]
                assert not problems, f"{method.upper()} {path} example {name}: {problems}"
                checked += 1
    assert checked >= 10


# -- heartbeats, the ranks view and the stall scan -------------------------------
T0 = _t("2025-01-31T12:00:00")


def _running(**spec) -> tuple[Job, Attempt]:
    """A RUNNING 4-rank job, ranks 0-1 on node-1 and 2-3 on node-2, attempt 1."""
    spec = JobSpec.parse({"command": ["python", "train.py"], "ranks": 4,
                          "heartbeat": {"interval_s": 5, "startup_grace_s": 30}, **spec})
    job = _job(spec=spec, health=initial_health(spec, 60.0), state=JobState.RUNNING,
               attempt=1, started_at=T0,
               inboxes={"node-1": "fake://inbox/node-1", "node-2": "fake://inbox/node-2"})
    attempt = _attempt(job_id=job.job_id, world_size=4,
                       placement=[{"rank": r, "node_id": n} for r, n in
                                  enumerate(["node-1", "node-1", "node-2", "node-2"])],
                       node_ranks={"node-1": [0, 1], "node-2": [2, 3]},
                       node_gpus={"node-1": 2, "node-2": 2}, created_at=T0)
    return job, attempt


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _world(job: Job, attempt: Attempt, beats: dict[int, Beat] | None = None,
           previous_scan=None, latest_ingest=None) -> World:
    """The fakes of tests/fakes.py holding ``job`` running ``attempt``."""
    world = World()
    world.store.put(job, attempt)
    world.beats.seed(job.job_id, attempt.attempt, beats or {})
    world.collector = FakeCollectorStore(previous_scan, latest_ingest)
    for node_id in attempt.node_ranks:
        world.inbox.ensure(node_id)
    return world


def _heartbeats(world: World, now: datetime) -> HeartbeatsService:
    return HeartbeatsService(world.store, world.beats, FakeCollectorStore(),
                             scans_per_hour=60.0, telemetry=NullTelemetry(), clock=lambda: now)


def test_initial_health_members_are_the_job_health_schema_properties(doc):
    health = initial_health(JobSpec.parse({"command": ["x"], "ranks": 2}), 60.0)
    assert set(health) == set(doc["components"]["schemas"]["JobHealth"]["properties"])
    _assert_valid(doc, "JobHealth", health)
    for broken in ({**health, "status": "DEAD"}, {**health, "false_alarms": -1},
                   {**health, "co_first": [{"rank": 1}]}):
        assert not _schema_validator(doc, "JobHealth").is_valid(broken), broken


def test_heartbeats_acceptance_conforms_to_its_schema(doc):
    job, attempt = _running()
    world = _world(job, attempt)
    service = _heartbeats(world, _at(10.5))
    body = {"attempt": 1, "ranks": [
        {"rank": 0, "step": 3, "sent_at": "2025-01-31T12:00:10.400Z"},
        {"rank": 1, "pause": {"reason": "checkpoint", "remaining_s": 600}},
        {"rank": 2, "step": 3, "pause": {"remaining_s": 60}}]}
    assert _schema_validator(doc, "Heartbeats").is_valid(body)
    received_at = service.ingest(Principal("agent", "*"), job.job_id, body)
    _assert_valid(doc, "HeartbeatsAccepted", {"received_at": iso(received_at)})
    # a pause without a step is not a beat; with a step it is both
    read = world.beats.read(job.job_id, 1, service.node_of(job.job_id, 1))
    assert [b.rank for b in read if b.heard_at] == [0, 2]
    assert [b.rank for b in read if b.paused_until] == [1, 2]


def test_heartbeats_problems_name_the_documented_fields(doc):
    job, attempt = _running()
    service = _heartbeats(_world(job, attempt), _at(1))
    cases = [
        ({"attempt": 1, "ranks": [{"rank": 0, "step": 1}, {"rank": 4, "step": 1}]},
         Principal("agent", "*"), "invalid_argument", "ranks.1.rank"),
        ({"attempt": 1, "ranks": [{"rank": 0, "step": 1, "sent_at": "yesterday"}]},
         Principal("agent", "*"), "invalid_argument", "ranks.0.sent_at"),
        ({"attempt": 1, "ranks": [{"rank": 2, "step": 1}]},
         Principal("agent", "node-1"), "forbidden", "ranks.0.rank"),
        ({"attempt": 2, "ranks": [{"rank": 0, "step": 1}]},
         Principal("agent", "*"), "stale_attempt", "attempt"),
    ]
    problems = doc["paths"]["/v1/jobs/{job_id}/heartbeats"]["post"]["responses"]
    for body, principal, code, field in cases:
        with pytest.raises(ApiError) as caught:
            service.ingest(principal, job.job_id, body)
        problem = problem_body(caught.value)
        assert (problem["code"], problem.get("field")) == (code, field), body
        _assert_valid(doc, "Problem", problem)
        described = _resolve(doc, problems[str(problem["status"])])["description"]
        assert f"field: {re.sub(r'[.][0-9]+[.]', '.<i>.', field)}`" in described, field


def test_ranks_view_conforms_to_rank_list_schema(doc):
    job, attempt = _running()
    beats = {0: Beat(0, "node-1", heard_at=_at(100), step=20),
             1: Beat(1, "node-1", heard_at=_at(100), step=20),
             # silent, and its stack says it waits for nobody (not in a collective)
             2: Beat(2, "node-2", heard_at=_at(60), step=12, sampled_at=_at(100),
                     proc={"cpu": 0.0, "state": "S", "stack": {
                         "frames": ["hang (train.py:7)"], "code": "time.sleep(60)",
                         "age_s": 1.0}}),
             3: Beat(3, "node-2", paused_until=_at(500))}
    service = _heartbeats(_world(job, attempt, beats), _at(101))
    view = service.ranks_page(job)  # what GET /ranks returns
    schema = doc["components"]["schemas"]
    assert set(view) == set(schema["RankList"]["properties"])
    assert set(view["threshold_inputs"]) == set(schema["ThresholdInputs"]["properties"])
    assert all(set(r) == set(schema["RankLiveness"]["properties"]) for r in view["ranks"])
    _assert_valid(doc, "RankList", view)
    # silent longest first, ties by rank; a never-heard rank counts from the start
    assert [r["rank"] for r in view["ranks"]] == [3, 2, 0, 1]
    assert view["ranks"][0]["last_heard_at"] is None and view["ranks"][0]["paused"]
    assert view["ranks"][1]["stalled"] and not view["ranks"][0]["stalled"]
    assert view["threshold_s"] == view["threshold_inputs"]["k"] * 5
    unplaced = _job()
    empty = service.ranks(unplaced)
    assert (empty["attempt"], empty["ranks"]) == (0, [])
    _assert_valid(doc, "RankList", empty)


def test_scan_health_exit_and_cancel_conform_to_their_schemas(doc):
    """A stall of node-2 with ``on_stall: restart`` and no attempts left."""
    job, attempt = _running(on_stall="restart")
    beats = {0: Beat(0, "node-1", heard_at=_at(200), step=40),
             1: Beat(1, "node-1", heard_at=_at(200), step=40),
             2: Beat(2, "node-2", heard_at=_at(100), step=20),
             3: Beat(3, "node-2", heard_at=_at(100), step=19)}
    world = _world(job, attempt, beats, previous_scan=_at(141), latest_ingest=_at(200))
    clock = lambda: _at(201)  # noqa: E731
    heartbeats = _heartbeats(world, _at(201))
    attempts = AttemptsService(world.store, Dispatcher(world.inbox), lambda: None, clock=clock)
    scanner = Scanner(world.store, heartbeats, world.collector, attempts,
                      period_s=60.0, telemetry=NullTelemetry(), clock=clock)
    assert scanner.run() == {"jobs": 1, "incidents": 1, "suppressed": None}
    ended = world.store.get(job.job_id)
    health, to, exit_ = ended.health, ended.state, ended.exit
    assert set(health) == set(doc["components"]["schemas"]["JobHealth"]["properties"])
    _assert_valid(doc, "JobHealth", health)
    assert (health["status"], health["first_stalled_rank"], health["suspect_node"]) == (
        "STALLED", 2, "node-2")
    # rank 2 is silent longest by receive time, but rank 3 went quiet in the
    # same moment a step behind it: the verdict, and so the exit, name rank 3
    assert health["verdict"]["text"] == "rank 3 on node-2 went quiet a step behind rank 2"
    assert to is JobState.FAILED and exit_ == {
        "reason": "stalled", "exit_code": None, "rank": 3, "node_id": "node-2",
        "decision": "stalled (rank 3): not retried (counted attempt 1 of 1, none left)"}
    _assert_valid(doc, "Exit", exit_)
    _assert_valid(doc, "Job", shown_job(ended))
    _assert_valid(doc, "AttemptList", {"attempts": [
        attempt_json(a) for a in world.store.attempts(job.job_id)]})
    assert [a["state"] for a in world.store.attempts(job.job_id)] == ["FAILED"]
    cancels = world.inbox.sent
    assert sorted(m["type"] for m in cancels) == ["CANCEL", "CANCEL"], "one to each node"
    for message in cancels:
        _assert_valid(doc, "CancelMessage", message)
        assert message["reason"] in doc["components"]["schemas"]["CancelMessage"][
            "properties"]["reason"]["description"]


def test_suppressed_scan_health_conforms_to_job_health_schema(doc):
    job, attempt = _running()
    beats = {r: Beat(r, n, heard_at=_at(10), step=1)
             for r, n in enumerate(["node-1", "node-1", "node-2", "node-2"])}
    world = _world(job, attempt, beats, previous_scan=_at(340), latest_ingest=_at(10))
    scanner = Scanner(world.store, _heartbeats(world, _at(400)), world.collector, attempts=None,
                      period_s=60.0, telemetry=NullTelemetry(), clock=lambda: _at(400))
    report = scanner.run()
    assert report["incidents"] == 0 and report["suppressed"]
    health = world.store.get(job.job_id).health
    _assert_valid(doc, "JobHealth", health)
    assert health["status"] == "OK" and health["suppressed"] and health["stalled_ranks"]


def test_the_documented_rank_statuses_are_the_ones_the_verdict_gives(doc):
    """domain/stall.py STATUSES is what a rank can be; the document lists the same."""
    from chalicelib.domain.stall import STATUSES
    documented = doc["components"]["schemas"]["RankLiveness"]["properties"]["status"]["enum"]
    assert documented == list(STATUSES)


def test_usage_rows_conform_to_their_schema_with_and_without_cost(doc):
    """GET /v1/usage's rows (service/usage_rollup.py) as the document says,
    over the fake rollup: grouped by a label (and its null row), with cost."""
    from chalicelib.domain import rollup
    from chalicelib.domain.usage import CAUSES, PHASES, Span
    from chalicelib.service.usage_rollup import Query, UsageService
    from tests.fakes import FakeUsage

    schema = doc["components"]["schemas"]["UsageRow"]
    assert set(schema["properties"]["lost_gpu_seconds"]["propertyNames"]["enum"]) == \
        set(CAUSES.values()) | set(PHASES)

    class NoOpenJobs:
        def view_with_story(self, job_id):
            return None

        def page(self, tenant, state, page_size, after):
            return [], None

        def active(self, state, limit):
            return []

    t0 = _t("2025-01-31T12:30:00")
    spans = [Span(1, 8, t0, t0 + timedelta(hours=2), "rank_failed",
                  started_at=t0 + timedelta(seconds=30))]
    store = FakeUsage()
    for job, labels in (("job_1", {"team": "nlp"}), ("job_2", {})):
        store.add("acme", job, 1, rollup.increments(rollup.added(spans, 1),
                                                    rollup.groups(job, "h100", labels)))
    for prices in ((), (("h100", 2.0),), (("a100", 1.0),)):
        service = UsageService(store, NoOpenJobs(), prices=prices, clock=lambda: t0)
        for group_by in (None, "label:team", "job", "gpu_type"):
            answer = service.read(Query(t0 - timedelta(days=1), t0 + timedelta(days=1), "hour",
                                        group_by, "acme"))
            _assert_valid(doc, "UsageRows", fastjson.loads(fastjson.dumps(answer)))
            assert sum(r["gpu_seconds"] for r in answer["rows"]) == 2 * 8 * 7200
            assert all(("cost" in r) == bool(prices) for r in answer["rows"])
