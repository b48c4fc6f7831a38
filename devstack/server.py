"""The Chalice app object served over HTTP by Chalice's own local gateway,
with API Gateway's answers for unknown paths given the problem shape."""
from __future__ import annotations

import json
import pathlib

from chalice.config import Config as ChaliceConfig
from chalice.local import (ChaliceRequestHandler, CustomLocalChalice, LocalChalice,
                           LocalDevServer, LocalGatewayException, ThreadedHTTPServer)

from chalicelib.api.validation import MAX_ANY_BODY_BYTES

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _problem(status: int, code: str, title: str, detail: str) -> bytes:
    return json.dumps({"type": f"urn:gpujobs:problem:{code}", "title": title,
                       "status": status, "detail": detail, "code": code}).encode()


class ProblemRequestHandler(ChaliceRequestHandler):
    def _send_problem(self, status: int, code: str, title: str, detail: str) -> None:
        self._send_http_response(status, {"Content-Type": "application/problem+json"},
                                 _problem(status, code, title, detail))

    def _send_error_response(self, error: LocalGatewayException) -> None:
        # API Gateway says 403 "Missing Authentication Token" for a path it does
        # not route; to a client that is simply a path that does not exist
        self._send_problem(404, "not_found", "Not found", f"no route for {self.path}")

    def _generic_handle(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            return self._send_problem(400, "invalid_argument", "Invalid argument",
                                      "Content-Length is not a number")
        if length > MAX_ANY_BODY_BYTES:
            self.close_connection = True
            return self._send_problem(413, "payload_too_large", "Payload too large",
                                      f"request body exceeds {MAX_ANY_BODY_BYTES} bytes")
        try:
            super()._generic_handle()
        except Exception:  # noqa: BLE001 - malformed at the gateway, e.g. the path
            self.close_connection = True
            self._send_problem(400, "invalid_argument", "Invalid argument",
                               "the request could not be parsed")

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # the access log of 32 racing threads is noise


class _Server(ThreadedHTTPServer):
    # the default backlog of 5 resets clients when dozens connect at once
    request_queue_size = 128


def make_server(app, host: str, port: int, stage: str = "dev") -> LocalDevServer:
    # as chalice.local.create_local_server does: a thread-local current_request,
    # since this server handles requests on many threads at once
    if not isinstance(app, LocalChalice):
        CustomLocalChalice.__bases__ = (LocalChalice, app.__class__)
        app.__class__ = CustomLocalChalice
    config = ChaliceConfig.create(
        chalice_stage=stage, app_name=app.app_name, project_dir=str(ROOT),
        config_from_disk=json.loads((ROOT / ".chalice" / "config.json").read_text()))
    return LocalDevServer(app, config, host, port, handler_cls=ProblemRequestHandler,
                          server_cls=_Server)
