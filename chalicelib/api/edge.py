"""The HTTP edge: the one error boundary, and what routes read of a request.

Every request and every scheduled or queued invocation enters through here:

- a route declared with :meth:`Edge.endpoint` answers a domain error
  (:class:`ApiError`) as its problem (chalicelib/api/problems.py), a failing
  dependency as 503 ``unavailable`` with Retry-After, and anything else (a
  bug) as a logged 500, never a stack trace;
- a scheduled or queued function wrapped in :func:`handler` fails, when a
  dependency fails, as :class:`ServiceUnavailable` (the schedule or the queue
  retries it), told apart from a bug, which keeps its trace;
- Chalice's own 405, 415 and 5xx answers get the problem shape too, in the
  one middleware (:func:`observed`), which also names every log line after
  its invocation, flushes its metrics and gives every HTTP answer the
  security headers (chalicelib/api/headers.py).

Which exceptions are a failing dependency is the adapters' knowledge; the
composition root (chalicelib/bootstrap.py) answers it, so this module
imports no adapter.
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any, Callable, cast

from chalice import Chalice, Response
from chalice.app import Request

from .. import fastjson, web
from ..bootstrap import dependency_failure, services
from ..domain.errors import (
    ApiError,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from . import validation
from .headers import secured
from .problems import PROBLEM_JSON, problem

log = logging.getLogger("gpujobs")
INTERNAL = "internal error; it has been logged"
_DIGITS = re.compile(r"^[0-9]{1,6}$")  # ASCII only: "²".isdigit() is True


def whole_number(raw: str, name: str, detail: str | None = None) -> int:
    """``raw`` (a query or path parameter) as an int of 1 to 6 ASCII digits;
    otherwise 400 invalid_argument naming ``name``."""
    if not _DIGITS.match(raw):
        raise InvalidArgument(detail or f"{name} must be an integer", field=name)
    return int(raw)


def ok(body: dict, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # orjson (chalicelib/fastjson.py): a list page is about 50 KB of JSON
    return Response(body=fastjson.dumps(body), status_code=status,
                    headers={"Content-Type": "application/json", **(headers or {})})


def no_content() -> Response:
    """A 204: done, nothing to say (a DELETE)."""
    return Response(body="", status_code=204, headers={})


def unavailable(e: BaseException) -> ServiceUnavailable | None:
    """The 503 a failing dependency answers as; None when ``e`` is not one."""
    if isinstance(e, ServiceUnavailable):
        return e
    if not dependency_failure(e):
        return None
    cause = getattr(e, "cause", None) or e
    return ServiceUnavailable(
        f"a dependency is busy or unreachable ({type(cause).__name__}); retry")


def handler(fn: Callable) -> Callable:
    """A scheduled or queued function: a failing dependency fails the
    invocation as ServiceUnavailable, a bug as itself."""
    @functools.wraps(fn)
    def run(event, *args):
        try:
            return fn(event, *args)
        except Exception as e:
            failed = unavailable(e)
            if failed is None or failed is e:
                raise
            log.warning("%s: %s", fn.__name__, failed.detail)
            raise failed from e
    return run


def _lambda_context(event: Any) -> Any:
    """This invocation's LambdaContext, from its own event: a request carries
    it as ``lambda_context`` (``context`` is API Gateway's requestContext), a
    scheduled or SQS event as ``context``. Never ``app.lambda_context``: Chalice
    sets that only when it serves HTTP, and a scheduled or queue function is a
    Lambda of its own that never does."""
    if isinstance(event, Request):
        return event.lambda_context
    return getattr(event, "context", None)


def observed(event: Any, get_response: Callable[[Any], Any]) -> Any:
    """Every log line names the invocation; its metrics leave as one EMF record;
    an HTTP answer Chalice made itself gets the problem shape, and every HTTP
    answer the security headers. One middleware, not two: each layer costs
    every request (docs/benchmarks.md)."""
    telemetry = services().telemetry
    telemetry.begin(getattr(_lambda_context(event), "aws_request_id", None))
    try:
        response = get_response(event)
        if not isinstance(event, Request):
            return response
        response = framework_problem(response)
        secured(response.headers)
        return response
    finally:
        telemetry.flush()


def framework_problem(response: Response) -> Response:
    """Chalice answers 405 and 415 itself, and 500 for what escaped a route;
    give those the problem shape too."""
    if response.status_code == 405:
        return problem(MethodNotAllowed("method not allowed on this path",
                                        allow=str(response.headers.get("Allow", ""))))
    if response.status_code == 415:
        return problem(UnsupportedMediaType("request body must be application/json",
                                            field="Content-Type"))
    if response.status_code >= 500 and not str(
            response.headers.get("Content-Type", "")).startswith(PROBLEM_JSON):
        return problem(ApiError(INTERNAL))
    return response


def headers_only(response: Response) -> Response:
    """A HEAD's answer: the GET's status and headers, ``Content-Length`` the
    length of the body it leaves out."""
    body = response.body
    size = len(body if isinstance(body, bytes) else str(body or "").encode("utf-8"))
    headers = {**(response.headers or {}), "Content-Length": str(size)}
    return Response(body="", status_code=response.status_code, headers=headers)


class Edge:
    """The routes' side of one Chalice app: the :meth:`endpoint` decorator and
    what a route reads of the current request. Takes over the app's HTTP
    settings: no binary media types (the API takes and gives only text:
    JSON, the dashboard's HTML, JS, CSS and SVG; no request or response is
    checked against Chalice's default list of sixteen, a cost on every
    request: docs/benchmarks.md) and the one middleware, :func:`observed`."""

    def __init__(self, app: Chalice) -> None:
        self._app = app
        app.api.binary_types = []
        app.register_middleware(observed, "all")

    def endpoint(self, path: str, method: str | tuple[str, ...], **route_kwargs: Any) -> Callable:
        """A route whose domain errors become problem JSON, and nothing else a
        5xx with a stack trace. ``method`` is one method, or several served
        by the one view (the dashboard's pages: ``("GET", "HEAD")``); a HEAD
        gets what the view answers, without its body (:func:`headers_only`)."""
        methods = [method] if isinstance(method, str) else list(method)
        method = "/".join(methods)

        def decorate(view: Callable) -> Callable:
            @functools.wraps(view)
            def answer(**params):
                response = respond(**params)
                if "HEAD" in methods and self.request().method == "HEAD":
                    return headers_only(response)
                return response

            def respond(**params):
                try:
                    return view(**params)
                except ApiError as e:
                    return problem(e)
                except Exception as e:  # noqa: BLE001 - a failing dependency, or a bug
                    failed = unavailable(e)
                    if failed is not None:
                        log.warning("%s %s: %s", method, path, failed.detail)
                        return problem(failed)
                    log.exception("unhandled error on %s %s", method, path)
                    return problem(ApiError(INTERNAL))
            return self._app.route(path, methods=methods, **route_kwargs)(answer)
        return decorate

    # -- the current request ---------------------------------------------------
    def request(self) -> Request:
        """The request being served (the helpers below are only called while one is)."""
        req = self._app.current_request
        assert req is not None, "no request is being served"
        return req

    def header(self, name: str) -> str | None:
        """A request header; ``name`` lower case."""
        return self.request().headers.get(name)

    def authorization(self) -> str | None:
        return self.request().headers.get("authorization")

    def tenant(self) -> str:
        """The calling tenant's name (401 or 403 otherwise)."""
        return services().auth.tenant(self.authorization()).name

    def query(self) -> Mapping[str, str]:
        return self.request().query_params or {}

    def query_int(self, name: str, default: int) -> int:
        """The query parameter ``name`` as a whole number; ``default`` when absent."""
        raw = self.query().get(name)
        return default if raw is None else whole_number(raw, name)

    def optional_query_int(self, name: str) -> int | None:
        """The query parameter ``name`` as a whole number; None when absent."""
        raw = self.query().get(name)
        return None if raw is None else whole_number(raw, name)

    def body(self, schema: str, *, required: bool,
             max_bytes: int = validation.MAX_BODY_BYTES) -> Any:
        """The validated body; None only when an optional body is absent (a JSON
        ``null`` is present, and refused by the schema like any other non-object)."""
        req = self.request()
        if not req.raw_body and not required:
            return None
        # bytes: Chalice encodes a text body (its annotation says str too)
        value = validation.parse_json(cast(bytes, req.raw_body), required=True,
                                      max_bytes=max_bytes,
                                      content_type=req.headers.get("content-type"))
        return validation.validate(schema, value)

    # -- the dashboard: static files (chalicelib/web) that call the JSON API ------
    def asset(self, name: str) -> Response:
        found = web.asset(name)
        if found is None:
            raise NotFound(f"no file {name}", field="name")
        if found.fresh_for(self.header("if-none-match")):
            return Response(body="", status_code=304, headers=found.headers())
        return Response(body=found.body, status_code=200, headers=found.headers())

    def dashboard(self) -> Response:
        # "/api" (a stage without its slash) would resolve the page's relative
        # links against "/"; send the browser to "/api/"
        path = (self.request().context or {}).get("path") or "/"
        if not path.endswith("/"):
            return Response(body="", status_code=301,
                            headers={"Location": path.rsplit("/", 1)[-1] + "/"})
        return self.asset(web.INDEX)
