"""One botocore session per container, and its clients, each made on first use.

A botocore session loads the endpoint rules and service models it needs once;
every client made from it afterwards reuses them. A fresh session pays for all
of that again (docs/benchmarks.md, "First request"), so PynamoDB's default of one
session and one client per model class, plus boto3's own session for SQS,
made the first request of a cold Lambda container pay for two to five sessions.

Here every PynamoDB model and the transaction connection share one
:class:`SharedConnection` (one DynamoDB client), and SQS, CloudWatch Logs and
any other client come from the same session. Nothing is made until a handler
first uses it, so a handler pays only for the clients it calls. botocore
clients are thread-safe once made; making them is not, hence the lock.
"""
from __future__ import annotations

import threading
from typing import Any

from pynamodb.connection import Connection

#: the timeouts and retries every client gets (a Lambda answers in seconds)
CONNECT_TIMEOUT_S = 2
READ_TIMEOUT_S = 5
MAX_RETRY_ATTEMPTS = 3


class AwsSession:
    """The container's botocore session for one (region, endpoint)."""

    def __init__(self, region: str, endpoint_url: str | None) -> None:
        self.region, self.endpoint_url = region, endpoint_url
        self._lock = threading.RLock()
        self._session = None
        self._clients: dict[str, Any] = {}
        self._dynamodb: SharedConnection | None = None

    @property
    def session(self):
        if self._session is None:
            with self._lock:
                if self._session is None:
                    import botocore.session  # imported with the first client, not the app
                    self._session = botocore.session.get_session()
        return self._session

    def client(self, service: str):
        """A botocore client for ``service``, made once, on first use."""
        c = self._clients.get(service)
        if c is None:
            with self._lock:
                c = self._clients.get(service)
                if c is None:
                    c = self._clients[service] = self._make(service)
        return c

    def _make(self, service: str):
        from botocore.config import Config as BotoConfig

        return self.session.create_client(
            service, region_name=self.region, endpoint_url=self.endpoint_url,
            config=BotoConfig(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                              retries={"max_attempts": MAX_RETRY_ATTEMPTS, "mode": "standard"}))

    @property
    def dynamodb(self) -> "SharedConnection":
        """The PynamoDB connection every model and transaction uses (no client yet)."""
        if self._dynamodb is None:
            with self._lock:
                if self._dynamodb is None:
                    self._dynamodb = SharedConnection(self)
        return self._dynamodb

    def made(self) -> list[str]:
        """The services a client has been made for (for tests and benchmarks)."""
        made = sorted(self._clients)
        if self._dynamodb is not None and self._dynamodb.client_made:
            made.append("dynamodb (pynamodb)")
        return made


class SharedConnection(Connection):
    """A PynamoDB connection whose client comes from the container's session.

    PynamoDB's own ``Connection.session`` makes a new botocore session per
    connection and per thread; this one takes the shared session, and makes
    its single client under the session's lock.
    """

    def __init__(self, aws: AwsSession) -> None:
        super().__init__(region=aws.region, host=aws.endpoint_url,
                         connect_timeout_seconds=CONNECT_TIMEOUT_S,
                         read_timeout_seconds=READ_TIMEOUT_S,
                         max_retry_attempts=MAX_RETRY_ATTEMPTS)
        self._aws = aws
        #: whether the client has been made (tests and benchmarks ask)
        self.client_made = False

    @property
    def session(self):
        return self._aws.session

    @property
    def client(self):
        # PynamoDB's property makes the client once (and again if it lost its
        # credentials); making one is not thread-safe, so under the session's lock
        with self._aws._lock:
            client = super().client
        self.client_made = True
        return client


_sessions: dict[tuple[str, str | None], AwsSession] = {}
_sessions_lock = threading.Lock()


def session_for(region: str, endpoint_url: str | None) -> AwsSession:
    """The one session of this container (process) for ``region`` and endpoint."""
    key = (region, endpoint_url)
    s = _sessions.get(key)
    if s is None:
        with _sessions_lock:
            s = _sessions.setdefault(key, AwsSession(region, endpoint_url))
    return s


def reset() -> None:
    """Forget every session (benchmarks simulating a fresh container; tests)."""
    with _sessions_lock:
        _sessions.clear()
