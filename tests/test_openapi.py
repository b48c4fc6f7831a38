"""docs/openapi.yaml is a valid OpenAPI 3.1 document that describes what the
app really serves: the same routes, the same request schemas, the same problem
codes, and response schemas the real representations conform to.

Pure document checks: no AWS, no environment (the app's config is lazy).
"""
from __future__ import annotations

import pathlib
import re
import sys
from datetime import datetime, timezone

import jsonschema
import pytest
import yaml
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import app  # noqa: E402
from chalicelib.api import schemas  # noqa: E402
from chalicelib.api.representation import attempt_json, job_json  # noqa: E402
from chalicelib.api.validation import MAX_BODY_BYTES  # noqa: E402
from chalicelib.domain import idempotency  # noqa: E402
from chalicelib.domain.errors import ApiError  # noqa: E402
from chalicelib.domain.ids import JOB_ID_RE, new_job_id  # noqa: E402
from chalicelib.domain.jobs import Job, initial_health, with_defaults  # noqa: E402
from chalicelib.domain.states import JobState  # noqa: E402
from chalicelib.service.jobs import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE  # noqa: E402

DOC_PATH = ROOT / "docs" / "openapi.yaml"
HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
PROBLEM_JSON = "application/problem+json"


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
    assert unauthenticated == [("/v1/health", "get")], (
        f"only GET /v1/health may skip the token, but these do: {unauthenticated}")


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


def test_request_bodies_use_the_server_validation_schemas(doc):
    bodies = {(p, m): op["requestBody"]["content"]["application/json"]["schema"]
              for p, m, op in _operations(doc) if "requestBody" in op}
    assert bodies == {
        ("/v1/jobs", "post"): {"$ref": "#/components/schemas/JobCreate"},
        ("/v1/jobs/{job_id}/cancel", "post"): {"$ref": "#/components/schemas/CancelRequest"},
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
        assert (entry["status"], entry["title"]) == (cls.status, cls.title), (
            f"{cls.code}: documented {entry}, served status {cls.status} title {cls.title!r}")


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
        _assert_valid(doc, "Problem", err.problem())
        err.field = "heartbeat.interval_s"
        _assert_valid(doc, "Problem", err.problem())


# -- responses each operation must declare -------------------------------------
EXPECTED_STATUSES = {
    ("/v1/health", "get"): {"200", "415", "500", "503"},
    ("/v1/jobs", "post"): {"201", "400", "401", "403", "409", "413", "415", "422",
                           "500", "503"},
    ("/v1/jobs", "get"): {"200", "400", "401", "403", "415", "500", "503"},
    ("/v1/jobs/{job_id}", "get"): {"200", "401", "403", "404", "415", "500", "503"},
    ("/v1/jobs/{job_id}/cancel", "post"): {"202", "400", "401", "403", "404", "409", "413",
                                           "415", "500", "503"},
    ("/v1/jobs/{job_id}/attempts", "get"): {"200", "401", "403", "404", "415", "500",
                                            "503"},
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


def test_retryable_responses_declare_retry_after(doc):
    for path, method, op in _operations(doc):
        for status in ("409", "503"):
            if status in op["responses"]:
                response = _resolve(doc, op["responses"][status])
                assert "Retry-After" in response.get("headers", {}), (
                    f"{method.upper()} {path} {status} lacks Retry-After")
    created = doc["paths"]["/v1/jobs"]["post"]["responses"]["201"]["headers"]
    assert {"Location", "Idempotent-Replayed"} <= set(created)


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


# -- response schemas accept what the app really returns ----------------------
def _t(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc)


def _job(**changes) -> Job:
    spec = with_defaults({"command": ["python", "train.py"], "ranks": 4,
                          "heartbeat": {"interval_s": 2}})
    job = Job(job_id=new_job_id(), tenant="acme", state=JobState.PENDING, spec=spec,
              created_at=_t("2025-01-31T12:00:00.123456"),
              updated_at=_t("2025-01-31T12:00:00.123456"),
              health=initial_health(spec, 60.0))
    for k, v in changes.items():
        setattr(job, k, v)
    return job


def test_job_representation_conforms_to_job_schema(doc):
    fresh = job_json(_job())
    assert set(fresh) == set(doc["components"]["schemas"]["Job"]["properties"]), (
        "the Job schema's members differ from the representation's")
    _assert_valid(doc, "Job", fresh)
    assert JOB_ID_RE.pattern == doc["components"]["schemas"]["Job"]["properties"]["id"][
        "pattern"]
    stalled = {"status": "STALLED", "threshold_s": 6.0, "first_stalled_rank": 2,
               "last_heard_at": "2025-01-31T12:05:00.000Z",
               "detected_at": "2025-01-31T12:05:10.000Z", "stalled_ranks": [2, 3]}
    cancelled = _job(name="x", state=JobState.CANCELLED, attempt=1,
                     started_at=_t("2025-01-31T12:01:00"),
                     finished_at=_t("2025-01-31T12:06:00"),
                     cancel_requested_at=_t("2025-01-31T12:06:00"), cancel_reason="stop",
                     health=stalled, exit={"reason": "cancelled", "exit_code": None})
    _assert_valid(doc, "Job", job_json(cancelled))
    _assert_valid(doc, "JobList", {"jobs": [fresh, job_json(cancelled)],
                                   "next_page_token": "abc.def"})
    _assert_valid(doc, "JobList", {"jobs": [], "next_page_token": None})


def test_job_schema_rejects_what_the_representation_never_returns(doc):
    fresh = job_json(_job())
    for broken in ({**fresh, "state": "DONE"}, {**fresh, "exit": {"exit_code": 1}},
                   {**fresh, "created_at": "2025-01-31 12:00:00"},
                   {k: v for k, v in fresh.items() if k != "health"}):
        assert not _schema_validator(doc, "Job").is_valid(broken), broken


def test_attempt_representation_conforms_to_attempt_list_schema(doc):
    attempt = attempt_json({"attempt": 1, "state": "SCHEDULED",
                            "placement": [{"rank": 0, "node_id": "node-1"}],
                            "created_at": _t("2025-01-31T12:00:01"), "finished_at": None,
                            "exit": None})
    done = attempt_json({"attempt": 2, "state": "FAILED",
                         "placement": [{"rank": 0, "node_id": "node-2"}],
                         "created_at": _t("2025-01-31T12:00:01"),
                         "finished_at": _t("2025-01-31T12:10:00"),
                         "exit": {"reason": "rank 0 exited 3", "exit_code": 3}})
    _assert_valid(doc, "AttemptList", {"attempts": [attempt, done]})
    _assert_valid(doc, "AttemptList", {"attempts": []})


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
