"""An embedded moto server with DynamoDB's isolation.

moto runs each request without isolation from concurrent ones: a
TransactWriteItems snapshots whole tables and restores them when any condition
fails, undoing writes other threads made meanwhile, and a conditional put checks
and writes in two steps. Real DynamoDB serialises conflicting writes. So this
server admits one DynamoDB request at a time, which gives the emulator the
atomicity the service relies on; the application itself takes no lock.
"""
from __future__ import annotations

import logging
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


class _SerialDynamoDB:
    def __init__(self, app) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            with self._lock:
                # materialise the body inside the lock: the work happens here
                return list(self._app(environ, start_response))
        return self._app(environ, start_response)


class MotoServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        app = _SerialDynamoDB(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(host, port, app, threaded=True,
                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="moto-server", daemon=True)

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self) -> "MotoServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
