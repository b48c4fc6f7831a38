"""An embedded moto server with DynamoDB's isolation.

moto runs each request without isolation from concurrent ones: a
TransactWriteItems snapshots whole tables and restores them when any condition
fails, undoing writes other threads made meanwhile, and a conditional put checks
and writes in two steps. Real DynamoDB serialises conflicting writes. So this
server admits one DynamoDB *write* at a time, alone, which gives the emulator
the atomicity the service relies on; reads (GetItem, Query, Scan, ...) run
together, and never beside a write, so none sees half a transaction. The
application itself takes no lock.

``on_change`` (if given) is called after every request that may have changed
state (any but a read), so that the local stack knows when to snapshot.
With ``owners``, it answers only connections whose socket belongs to one of
those uids (devstack/motoauth.py): the local stack's moto is out of a rank's
reach.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

from devstack.motoauth import PEER_UID, OwnerOnly, socket_owner

#: operations that change nothing worth keeping across a restart
READS = frozenset({
    "GetItem", "BatchGetItem", "Query", "Scan", "DescribeTable", "DescribeTimeToLive",
    "ListTables", "DescribeContinuousBackups", "ListTagsOfResource",
    "ReceiveMessage", "GetQueueAttributes", "GetQueueUrl", "ListQueues",
    "ListQueueTags", "DescribeStacks", "DescribeStackEvents", "DescribeStackResources",
    "GetParameter", "GetParameters",
    "GetLogEvents", "FilterLogEvents", "DescribeLogStreams", "DescribeLogGroups",
})


class ReadWriteLock:
    """Many readers or one writer; a waiting writer holds back new readers."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


def _operation(environ) -> str:
    return environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]


class _IsolatedDynamoDB:
    def __init__(self, app, on_change=None) -> None:
        self._app = app
        self.lock = ReadWriteLock()
        self._on_change = on_change

    def __call__(self, environ, start_response):
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        op = _operation(environ)
        if not target.startswith("DynamoDB_"):
            try:
                return self._app(environ, start_response)
            finally:
                if self._on_change is not None and op not in READS:
                    self._on_change()
        read = op in READS
        (self.lock.acquire_read if read else self.lock.acquire_write)()
        try:
            # materialise the body inside the lock: the work happens here
            return list(self._app(environ, start_response))
        finally:
            (self.lock.release_read if read else self.lock.release_write)()
            if not read and self._on_change is not None:
                self._on_change()


class _PeerRequestHandler(MotoRequestHandler):
    """Says whose socket the connection came from (:data:`PEER_UID`), looked
    up once per connection: its requests all come from that one socket."""

    def make_environ(self):
        environ = super().make_environ()
        if not hasattr(self, "peer_uid"):
            host, port = self.server.server_address[:2]
            self.peer_uid = socket_owner(self.client_address[:2], (str(host), port))
        environ[PEER_UID] = self.peer_uid
        return environ


class MotoServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, on_change=None,
                 owners: frozenset[int] | None = None) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        from devstack import mototx

        mototx.install()  # a transaction's rollback copy: its items, not its tables
        self.app = _IsolatedDynamoDB(DomainDispatcherApplication(create_backend_app),
                                     on_change)
        served: Any
        if owners is None:
            served, handler = self.app, MotoRequestHandler
        else:
            served, handler = OwnerOnly(self.app, owners), _PeerRequestHandler
        self._server = make_server(host, port, served, threaded=True,
                                   request_handler=handler)
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
