"""The Chalice app object served over HTTP by Chalice's own local gateway,
with API Gateway's answers for unknown paths given the problem shape."""
from __future__ import annotations

import json
import pathlib

from chalice.config import Config as ChaliceConfig
from chalice.local import (
    ChaliceRequestHandler,
    CustomLocalChalice,
    LocalChalice,
    LocalDevServer,
    LocalGatewayException,
    ThreadedHTTPServer,
)

from chalicelib.api.validation import MAX_ANY_BODY_BYTES
from chalicelib.domain.errors import ApiError, InvalidArgument, NotFound, PayloadTooLarge

ROOT = pathlib.Path(__file__).resolve().parent.parent


class ProblemRequestHandler(ChaliceRequestHandler):
    def _send_problem(self, err: ApiError) -> None:
        self._send_http_response(err.status, {"Content-Type": "application/problem+json"},
                                 json.dumps(err.problem()).encode())

    def _send_error_response(self, error: LocalGatewayException) -> None:
        # API Gateway says 403 "Missing Authentication Token" for a path it does
        # not route; to a client that is simply a path that does not exist
        self._send_problem(NotFound(f"no route for {self.path}"))

    def _generic_handle(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            return self._send_problem(InvalidArgument("Content-Length is not a number",
                                                      field="Content-Length"))
        if length > MAX_ANY_BODY_BYTES:
            self.close_connection = True
            return self._send_problem(PayloadTooLarge(
                f"request body exceeds {MAX_ANY_BODY_BYTES} bytes", field="body"))
        try:
            super()._generic_handle()
        except Exception:  # noqa: BLE001 - malformed at the gateway, e.g. the path
            self.close_connection = True
            self._send_problem(InvalidArgument("the request could not be parsed",
                                               field="request"))

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
