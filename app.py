"""gpujobs HTTP API (see ../shared/API.md and docs/openapi.yaml).

Thin on purpose: each route parses, authorises, calls one service function and
shapes the response. Storage and queues live behind chalicelib/service/ports.py.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re

from chalice import Rate, Response
from chalice.app import Request

from chalicelib import fastjson, web
from chalicelib.adapters.dynamo_errors import as_unavailable
from chalicelib.api import validation
from chalicelib.api.representation import (
    attempt_json,
    job_json,
    job_view_json,
    node_json,
    node_registration_json,
)
from chalicelib.api.rest import RestApp
from chalicelib.bootstrap import services
from chalicelib.domain import idempotency
from chalicelib.domain.clock import iso
from chalicelib.domain.errors import (
    ApiError,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    UnsupportedMediaType,
)
from chalicelib.service import health

app = RestApp(app_name="gpujobs")  # Chalice, one pass per request (chalicelib/api/rest.py)
#: the API takes and gives only text (JSON, the dashboard's HTML, JS, CSS and
#: SVG): no binary media types, so no request or response is checked against
#: Chalice's default list of sixteen (about 10 us a request)
app.api.binary_types = []
log = logging.getLogger("gpujobs")
PROBLEM_JSON = "application/problem+json"
_DIGITS = re.compile(r"^[0-9]{1,6}$")  # ASCII only: "²".isdigit() is True


def problem(err: ApiError) -> Response:
    # compact like every body, and ASCII (json's escapes): a problem may echo
    # what a client sent, lone surrogates included, and must still encode
    return Response(body=json.dumps(err.problem(), separators=(",", ":")),
                    status_code=err.status,
                    headers={"Content-Type": PROBLEM_JSON, **err.headers})


def ok(body: dict, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # orjson (chalicelib/fastjson.py): a list page is about 50 KB of JSON
    return Response(body=fastjson.dumps(body), status_code=status,
                    headers={"Content-Type": "application/json", **(headers or {})})


def endpoint(path: str, method: str, **route_kwargs):
    """A route whose domain errors become problem JSON, and nothing else a 5xx
    with a stack trace."""
    def decorate(view):
        @functools.wraps(view)
        def handler(**params):
            try:
                return view(**params)
            except ApiError as e:
                return problem(e)
            except Exception as e:  # noqa: BLE001 - a failing dependency, or a bug
                unavailable = as_unavailable(e)
                if unavailable is not None:
                    log.warning("%s %s: %s", method, path, unavailable.detail)
                    return problem(unavailable)
                log.exception("unhandled error on %s %s", method, path)
                return problem(ApiError("internal error; it has been logged"))
        return app.route(path, methods=[method], **route_kwargs)(handler)
    return decorate


def _lambda_context(event):
    """This invocation's LambdaContext, from its own event: a request carries
    it as ``lambda_context`` (``context`` is API Gateway's requestContext), a
    scheduled or SQS event as ``context``. Never ``app.lambda_context``: Chalice
    sets that only when it serves HTTP, and a scheduled or queue function is a
    Lambda of its own that never does."""
    if isinstance(event, Request):
        return event.lambda_context
    return getattr(event, "context", None)


def handler(fn):
    """A scheduled or queued function: a failing dependency fails the
    invocation as ServiceUnavailable (the schedule or the queue retries it),
    told apart from a bug, which keeps its trace."""
    @functools.wraps(fn)
    def run(event, *args):
        try:
            return fn(event, *args)
        except Exception as e:
            unavailable = as_unavailable(e)
            if unavailable is None or unavailable is e:
                raise
            log.warning("%s: %s", fn.__name__, unavailable.detail)
            raise unavailable from e
    return run


@app.middleware("all")
def observed(event, get_response):
    """Every log line names the invocation; its metrics leave as one EMF record;
    an HTTP answer Chalice made itself gets the problem shape. One middleware,
    not two: each layer costs every request (docs/benchmarks.md)."""
    telemetry = services().telemetry
    telemetry.begin(getattr(_lambda_context(event), "aws_request_id", None))
    try:
        response = get_response(event)
        return _framework_problem(response) if isinstance(event, Request) else response
    finally:
        telemetry.flush()


def _framework_problem(response: Response) -> Response:
    """Chalice answers 405 and 415 itself; give those the problem shape too."""
    if response.status_code == 405:
        return problem(MethodNotAllowed("method not allowed on this path",
                                        headers={"Allow": str(response.headers.get("Allow", ""))}))
    if response.status_code == 415:
        return problem(UnsupportedMediaType("request body must be application/json",
                                            field="Content-Type"))
    if response.status_code >= 500 and not str(
            response.headers.get("Content-Type", "")).startswith(PROBLEM_JSON):
        return problem(ApiError("internal error; it has been logged"))
    return response


def _request():
    return app.current_request


def _authorization():
    return _request().headers.get("authorization")


def _tenant():
    return services().auth.tenant(_authorization()).name


def _body(schema: str, *, required: bool, max_bytes: int = validation.MAX_BODY_BYTES):
    """The validated body; None only when an optional body is absent (a JSON
    ``null`` is present, and refused by the schema like any other non-object)."""
    req = _request()
    if not req.raw_body and not required:
        return None
    value = validation.parse_json(req.raw_body, required=True, max_bytes=max_bytes,
                                  content_type=req.headers.get("content-type"))
    return validation.validate(schema, value)


def _query_int(name: str, default: int) -> int:
    raw = (_request().query_params or {}).get(name)
    if raw is None:
        return default
    if not _DIGITS.match(raw):
        raise InvalidArgument(f"{name} must be an integer", field=name)
    return int(raw)


# -- health -------------------------------------------------------------------
@endpoint("/v1/health", "GET")
def get_health():
    return ok(health.check(services().store))


# -- jobs ---------------------------------------------------------------------
@endpoint("/v1/jobs", "POST")
def create_job():
    tenant = _tenant()
    key = idempotency.check_key(_request().headers.get("idempotency-key"))
    body = _body("JOB_CREATE", required=True)
    job, replayed = services().jobs.submit(tenant, body, key)
    headers = {"Location": f"/v1/jobs/{job['job_id']}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return ok(job_view_json(job), 201, headers)


@endpoint("/v1/jobs", "GET")
def list_jobs():
    tenant = _tenant()
    params = _request().query_params or {}
    jobs, token = services().jobs.list(
        tenant, state=params.get("state"), page_size=_query_int("page_size", 50),
        page_token=params.get("page_token"))
    return ok({"jobs": [job_view_json(j) for j in jobs], "next_page_token": token})


@endpoint("/v1/jobs/{job_id}", "GET")
def get_job(job_id: str):
    return ok(job_view_json(services().jobs.read(_tenant(), job_id)))


@endpoint("/v1/jobs/{job_id}/cancel", "POST")
def cancel_job(job_id: str):
    tenant = _tenant()
    body = _body("CANCEL", required=False) or {}
    return ok(job_json(services().jobs.cancel(tenant, job_id, body.get("reason"))), 202)


@endpoint("/v1/jobs/{job_id}/attempts", "GET")
def list_attempts(job_id: str):
    attempts = services().jobs.attempts(_tenant(), job_id)
    return ok({"attempts": [attempt_json(a) for a in attempts]})


@endpoint("/v1/jobs/{job_id}/events", "GET")
def list_job_events(job_id: str):
    return ok({"events": services().jobs.events(_tenant(), job_id)})


@endpoint("/v1/jobs/{job_id}/logs", "GET")
def get_job_logs(job_id: str):
    tenant = _tenant()
    params = _request().query_params or {}
    attempt = _query_int("attempt", 0) if "attempt" in params else None
    rank = _query_int("rank", 0) if "rank" in params else None
    return ok(services().logs.read(
        tenant, job_id, attempt=attempt, rank=rank, since=params.get("since"),
        page_token=params.get("page_token"), page_size=_query_int("page_size", 1000)))


@endpoint("/v1/jobs/{job_id}/attempts/{attempt}/events", "POST")
def report_attempt_event(job_id: str, attempt: str):
    principal = services().auth.agent(_authorization())
    body = _body("ATTEMPT_EVENT", required=True)
    if not _DIGITS.match(attempt):
        raise InvalidArgument("attempt must be a positive integer", field="attempt")
    return ok(job_json(services().attempts.report(principal, job_id, int(attempt), body)))


@endpoint("/v1/jobs/{job_id}/heartbeats", "POST")
def post_heartbeats(job_id: str):
    principal = services().auth.agent(_authorization())
    body = _body("HEARTBEATS", required=True, max_bytes=validation.MAX_HEARTBEATS_BYTES)
    received_at = services().heartbeats.ingest(principal, job_id, body)
    return ok({"received_at": iso(received_at)}, 202)


@endpoint("/v1/jobs/{job_id}/ranks", "GET")
def get_ranks(job_id: str):
    job = services().jobs.get(_tenant(), job_id)
    params = _request().query_params or {}
    page_size = _query_int("page_size", 0) if "page_size" in params else None
    return ok(services().heartbeats.ranks_page(job, page_size=page_size,
                                               page_token=params.get("page_token")))


# -- nodes ----------------------------------------------------------------------
@endpoint("/v1/nodes/{node_id}", "PUT")
def put_node(node_id: str):
    principal = services().auth.authenticate(_authorization())
    services().nodes.authorize(principal, node_id)
    body = _body("NODE_PUT", required=True)
    node = node_registration_json(services().nodes.register(principal, node_id, body))
    # where the node's agent ships its ranks' output (agent/logship.py)
    return ok({**node, "log_group": services().config.log_group})


@endpoint("/v1/nodes/{node_id}", "GET")
def get_node(node_id: str):
    services().auth.authenticate(_authorization())
    return ok(node_json(services().nodes.get(node_id)))


@endpoint("/v1/nodes", "GET")
def list_nodes():
    services().auth.authenticate(_authorization())
    return ok({"nodes": [node_json(n) for n in services().nodes.list()]})


# -- the dashboard: static files (chalicelib/web) that call the JSON API above ------
def _asset(name: str) -> Response:
    found = web.asset(name)
    if found is None:
        raise NotFound(f"no file {name}", field="name")
    if found.fresh_for(_request().headers.get("if-none-match")):
        return Response(body="", status_code=304, headers=found.headers())
    return Response(body=found.body, status_code=200, headers=found.headers())


@endpoint("/", "GET", content_types=["*/*"])
def dashboard():
    # "/api" (a stage without its slash) would resolve the page's relative
    # links against "/"; send the browser to "/api/"
    path = (_request().context or {}).get("path") or "/"
    if not path.endswith("/"):
        return Response(body="", status_code=301,
                        headers={"Location": path.rsplit("/", 1)[-1] + "/"})
    return _asset(web.INDEX)


@endpoint("/static/{name}", "GET", content_types=["*/*"])
def static_file(name: str):
    return _asset(name)


# -- scheduled and queued ------------------------------------------------------------
@app.schedule(Rate(1, unit=Rate.MINUTES), name="place")
@handler
def place(event):
    """Place PENDING jobs (also run right after a create, through the pending queue)."""
    report = services().placer.run()
    return {"placed": len(report.placed), "waiting": len(report.waiting),
            "never": len(report.never)}


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_PENDING_QUEUE_NAME", "gpujobs-dev-pending"),
                    batch_size=10, name="place_on_nudge")
@handler
def place_on_nudge(event):
    """A create or freed GPUs asked for a run: one run serves the whole batch.
    A message that is no nudge is reported failed (``batchItemFailures``): the
    queue's redrive policy moves it to the dead-letter queue, for a human."""
    services().placer.run()
    return _batch_failures([r for r in event if not _is_nudge(r.body)])


def _is_nudge(body: str) -> bool:
    try:
        return json.loads(body) == {"type": "PLACE"}
    except ValueError:
        return False


def _batch_failures(records) -> dict:
    """The SQS partial batch response (the event source reports
    ReportBatchItemFailures): only these messages are received again."""
    return {"batchItemFailures": [{"itemIdentifier": r.to_dict()["messageId"]}
                                  for r in records]}


@app.schedule(Rate(1, unit=Rate.MINUTES), name="scan")
@handler
def scan(event):
    """Judge every RUNNING job's ranks; record each stall once."""
    return services().scanner.run()


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_SCAN_QUEUE_NAME", "gpujobs-dev-scan"),
                    batch_size=1, name="scan_shard")
def scan_shard(event):
    """One shard of a fanned-out stall scan (chalicelib/service/scan_fanout.py);
    a shard that fails is received again, then dead-lettered."""
    failed = []
    for record in event:
        try:
            fanout = services().scan_fanout
            if fanout is None:  # only deployed with its queue (GPUJOBS_SCAN_QUEUE_URL)
                raise RuntimeError("a scan shard arrived but no scan queue is configured")
            fanout.judge(record.body, services().scanner.scan_job)
        except Exception:  # noqa: BLE001 - this message only; the others stand
            log.exception("scan shard %s failed", record.to_dict().get("messageId"))
            failed.append(record)
    return _batch_failures(failed)


@app.schedule(Rate(1, unit=Rate.MINUTES), name="reconcile")
@handler
def reconcile(event):
    """Resend unacknowledged intents; mark silent nodes DOWN and fail their attempts."""
    return services().reconciler.run()
