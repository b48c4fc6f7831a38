"""The Chalice app object served over HTTP by Chalice's own local gateway,
answering at the edges as API Gateway does, in the problem shape:

- the body size is checked from ``Content-Length`` before anything is read or
  authenticated (413); a ``Content-Length`` that is not a number, or twice with
  different values, is 400; a body that does not arrive in full within
  ``BODY_TIMEOUT_S`` (slow, stalled, or shorter than announced) is 408;
- a method no route serves (``TRACE``, ``CONNECT``, lowercase ``get``) is 405
  with ``Allow``, a path longer than ``MAX_PATH_BYTES`` 414, headers larger than
  ``MAX_HEADER_BYTES`` 431; HEAD answers the headers and no body;
- a path no route serves is 404;
- every answer it makes itself carries the security headers every answer of
  the app carries (chalicelib/api/headers.py).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import time

from chalice.config import Config as ChaliceConfig
from chalice.local import (
    ChaliceRequestHandler,
    CustomLocalChalice,
    LocalChalice,
    LocalDevServer,
    LocalGatewayException,
    ThreadedHTTPServer,
)

from chalicelib.api.headers import secured
from chalicelib.api.problems import answer
from chalicelib.api.validation import MAX_ANY_BODY_BYTES
from chalicelib.domain.errors import (
    ApiError,
    HeadersTooLarge,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    UriTooLong,
)
from devstack.settings import PATH as SETTINGS_PATH, Settings, SettingsError

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: API Gateway's limits: 8 KiB of URL, 10 KiB of headers; 29 s integration
MAX_PATH_BYTES = 8192
MAX_HEADER_BYTES = 10240
BODY_TIMEOUT_S = float(os.environ.get("GPUJOBS_GATEWAY_BODY_TIMEOUT_S", "10"))
_DIGITS = re.compile(r"^[0-9]{1,19}$")
METHODS = ("GET", "PUT", "POST", "HEAD", "DELETE", "PATCH", "OPTIONS")


class ProblemRequestHandler(ChaliceRequestHandler):
    #: an idle keep-alive connection is closed after this long
    timeout = 60
    #: no HTTP/0.9: an answer to a request line without a version (``GET /``,
    #: or garbage) still has a status line and headers
    default_request_version = "HTTP/1.1"

    def _send_problem(self, err: ApiError, *, close: bool = True) -> None:
        if close:
            self.close_connection = True
        status, headers, body = answer(err)
        secured(headers)
        if close:
            headers["Connection"] = "close"
        self._send_http_response(status, headers, body.encode())

    def _allowed(self) -> str | None:
        """The methods the request's path is routed for; None: not routed."""
        path = (self.path or "").split("?", 1)[0]
        try:
            route = self.local_gateway.event_converter._route_matcher.match_route(path).route
        except (ValueError, AttributeError):
            return None
        return ", ".join(self.local_gateway._app_object.routes[route])

    # BaseHTTPRequestHandler's own answers: an unparseable request line or
    # header block, a request line over 64 KiB, an unknown method
    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        if code == 414:
            return self._send_problem(UriTooLong("the request line is too long"))
        if code == 431:
            return self._send_problem(HeadersTooLarge("a request header is too long"))
        if code == 501:
            allowed = self._allowed() or ""
            return self._send_problem(MethodNotAllowed(
                f"method {self.command!r} is not served here", allow=allowed))
        return self._send_problem(InvalidArgument(f"the request could not be parsed: "
                                                  f"{message or code}", field="request"))

    def _send_error_response(self, error: LocalGatewayException) -> None:
        # API Gateway says 403 "Missing Authentication Token" for a path it does
        # not route; to a client that is simply a path that does not exist
        self._send_problem(NotFound(f"no route for {self.path}"), close=False)

    def _send_http_response_with_body(self, code, headers, body) -> None:
        if self.command != "HEAD":
            return super()._send_http_response_with_body(code, headers, body)
        # HEAD: the headers GET would send (Content-Length included), no body
        self.send_response(code)
        if not isinstance(body, bytes):
            body = body.encode("utf-8")
        # a route that answers HEAD itself (the dashboard's) says GET's length
        self.send_header("Content-Length", str(headers.pop("Content-Length", None) or len(body)))
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        self._send_headers(headers)

    def _checked_length(self) -> int | ApiError:
        values = self.headers.get_all("content-length") or []
        if len(set(v.strip() for v in values)) > 1:
            return InvalidArgument("conflicting Content-Length headers", field="Content-Length")
        if self.headers.get("transfer-encoding"):
            return InvalidArgument("chunked bodies are not accepted; send Content-Length",
                                   field="Transfer-Encoding")
        if not values:
            return 0
        raw = values[0].strip()
        if not _DIGITS.match(raw):
            return InvalidArgument("Content-Length is not a number", field="Content-Length")
        return int(raw)

    def _read_body(self, length: int) -> bytes | None:
        """The announced body, or None if it did not arrive within the deadline."""
        deadline = time.monotonic() + BODY_TIMEOUT_S
        chunks, left = [], length
        try:
            while left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.connection.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 65536))
                if not chunk:
                    return None  # the client closed before sending it all
                chunks.append(chunk)
                left -= len(chunk)
        except (socket.timeout, TimeoutError):
            return None
        finally:
            self.connection.settimeout(self.timeout)
        return b"".join(chunks)

    def _local_settings(self, settings: Settings) -> None:
        """``PUT /_local/settings`` (devstack/settings.py): only with the
        stack's settings token, else it is a path like any unrouted one."""
        # the body is not read: the connection closes with the answer
        if not settings.allows(self.headers.get("Authorization")):
            return self._send_problem(NotFound(f"no route for {self.path}"))
        if self.command != "PUT":
            return self._send_problem(MethodNotAllowed(
                f"{self.command} is not served here", allow="PUT"))
        length = self._checked_length()
        if isinstance(length, ApiError):
            return self._send_problem(length)
        body = self._read_body(length) if 0 < length <= MAX_ANY_BODY_BYTES else None
        try:
            changes = json.loads(body or b"")
            if not isinstance(changes, dict):
                raise SettingsError("the body is a JSON object of settings")
            now = settings.apply(changes)
        except (ValueError, SettingsError) as e:  # JSONDecodeError is a ValueError
            return self._send_problem(InvalidArgument(str(e), field="body"), close=False)
        self._send_http_response(200, {"Content-Type": "application/json"},
                                 json.dumps(now).encode())

    def _edge(self) -> None:
        settings = getattr(self.server, "local_settings", None)
        if settings is not None and self.path == SETTINGS_PATH:
            return self._local_settings(settings)
        if len(self.path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            return self._send_problem(UriTooLong(f"the path exceeds {MAX_PATH_BYTES} bytes"))
        size = sum(len(k) + len(v) + 4 for k, v in self.headers.items())
        if size > MAX_HEADER_BYTES:
            return self._send_problem(HeadersTooLarge(
                f"the headers exceed {MAX_HEADER_BYTES} bytes"))
        length = self._checked_length()
        if isinstance(length, ApiError):
            return self._send_problem(length)
        if length > MAX_ANY_BODY_BYTES:
            return self._send_problem(PayloadTooLarge(
                f"request body exceeds {MAX_ANY_BODY_BYTES} bytes", field="body"))
        if self.command == "OPTIONS":
            # the OpenAPI document defines no OPTIONS operation (and no CORS)
            allowed = self._allowed()
            if allowed is None:
                return self._send_problem(NotFound(f"no route for {self.path}"), close=False)
            return self._send_problem(MethodNotAllowed(
                "OPTIONS is not served here", allow=allowed), close=False)
        body = self._read_body(length) if length else None
        if length and body is None:
            return self._send_problem(RequestTimeout(
                f"the body did not arrive within {BODY_TIMEOUT_S:g} s", field="body"))
        try:
            response = self.local_gateway.handle_request(
                method=self.command, path=self.path, headers=dict(self.headers), body=body)
        except LocalGatewayException as e:
            return self._send_error_response(e)
        except Exception:  # noqa: BLE001 - malformed at the gateway, e.g. the path
            return self._send_problem(InvalidArgument("the request could not be parsed",
                                                      field="request"))
        headers = response["headers"].copy()
        headers.update(response["multiValueHeaders"])
        response = self._handle_binary(response)
        self._send_http_response(response["statusCode"], headers, response["body"])

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = do_OPTIONS = _edge

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # the access log of 32 racing threads is noise


class _Server(ThreadedHTTPServer):
    # the default backlog of 5 resets clients when dozens connect at once
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        """A client that hung up first (the readiness probe's timeout, a Ctrl-C'd
        curl) is no error of ours: no traceback for it."""
        import sys
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def make_server(app, host: str, port: int, stage: str = "dev",
                settings: Settings | None = None) -> LocalDevServer:
    # as chalice.local.create_local_server does: a thread-local current_request,
    # since this server handles requests on many threads at once
    if not isinstance(app, LocalChalice):
        CustomLocalChalice.__bases__ = (LocalChalice, app.__class__)
        app.__class__ = CustomLocalChalice
    config = ChaliceConfig.create(
        chalice_stage=stage, app_name=app.app_name, project_dir=str(ROOT),
        config_from_disk=json.loads((ROOT / ".chalice" / "config.json").read_text()))
    server = LocalDevServer(app, config, host, port, handler_cls=ProblemRequestHandler,
                            server_cls=_Server)
    server.server.local_settings = settings
    return server
