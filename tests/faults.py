"""Fault injection below botocore's retries, for DynamoDB (through PynamoDB)
and SQS alike: every client, whatever session made it, sends through
``botocore.endpoint.Endpoint._send``; a fault replaces (or follows) that send.

    with inject("PutItem", "read_timeout"):          # every PutItem times out
    with inject("PutItem", "lost_response", times=1):  # written, answer lost

Faults are named for what they do: ``read_timeout``, ``connection_closed``,
``endpoint_connection`` (refused), ``throttling`` (400 ThrottlingException),
``server_error`` (500 InternalServerError), ``lost_response`` (the request is
sent and applied, then the answer is lost as a read timeout, so botocore
retries a write that already happened).
"""
from __future__ import annotations

import contextlib
import json
import threading

import botocore.endpoint
import botocore.retries.quota
import botocore.retries.standard
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

FAULTS = ("read_timeout", "connection_closed", "endpoint_connection", "throttling",
          "server_error")


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_):
        yield self._body


def _operation(request) -> str:
    target = request.headers.get("X-Amz-Target", b"")
    target = target.decode() if isinstance(target, bytes) else target
    if target:
        return target.rsplit(".", 1)[-1]
    body = request.body or b""
    body = body.decode() if isinstance(body, bytes) else str(body)
    for part in body.split("&"):
        if part.startswith("Action="):
            return part[len("Action="):]
    return ""


def _error_response(request, status: int, code: str) -> AWSResponse:
    body = json.dumps({"__type": f"com.amazonaws.dynamodb.v20120810#{code}",
                       "message": f"injected {code}"}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0",
               "x-amzn-query-error": f"{code};Sender", "Content-Length": str(len(body))}
    return AWSResponse(request.url, status, headers, _Raw(body))


class Injection:
    def __init__(self, operations: set[str], fault: str, times: int | None,
                 when: str | None = None) -> None:
        self.operations, self.fault, self.left, self.when = operations, fault, times, when
        self.hits = 0
        self._lock = threading.Lock()

    def take(self, request) -> bool:
        if self.operations and _operation(request) not in self.operations:
            return False
        if self.when is not None:
            body = request.body or b""
            body = body.decode() if isinstance(body, bytes) else str(body)
            if self.when not in body:
                return False
        with self._lock:
            if self.left is not None:
                if self.left <= 0:
                    return False
                self.left -= 1
            self.hits += 1
        return True


@contextlib.contextmanager
def inject(operations: str | tuple[str, ...] | None, fault, *, times: int | None = None,
           when: str | None = None):
    """Apply ``fault`` to the named operations (None: every operation) whose
    request body contains ``when`` (None: any), at most ``times`` times (None:
    always). botocore's own retries run as in production, without their
    back-off sleeps, and without drawing on the client's retry quota: the
    container's clients are shared, and a quota the injected faults of one
    test emptied would leave the next test's writes unretried."""
    ops = {operations} if isinstance(operations, str) else set(operations or ())
    injection = Injection(ops, fault, times, when)
    original = botocore.endpoint.Endpoint._send
    original_delay = botocore.retries.standard.ExponentialBackoff.delay_amount
    original_acquire = botocore.retries.quota.RetryQuota.acquire

    def send(self, request):
        if not injection.take(request):
            return original(self, request)
        url = request.url
        if fault == "read_timeout":
            raise ReadTimeoutError(endpoint_url=url)
        if fault == "connection_closed":
            raise ConnectionClosedError(endpoint_url=url)
        if fault == "endpoint_connection":
            raise EndpointConnectionError(endpoint_url=url)
        if fault == "throttling":
            return _error_response(request, 400, "ThrottlingException")
        if fault == "server_error":
            return _error_response(request, 500, "InternalServerError")
        if callable(fault):
            return fault(request)
        if fault == "lost_response":
            original(self, request)  # applied by the server; its answer never arrives
            raise ReadTimeoutError(endpoint_url=url)
        raise ValueError(f"unknown fault {fault}")

    botocore.endpoint.Endpoint._send = send
    botocore.retries.standard.ExponentialBackoff.delay_amount = lambda self, context: 0
    botocore.retries.quota.RetryQuota.acquire = lambda self, amount: True
    try:
        yield injection
    finally:
        botocore.endpoint.Endpoint._send = original
        botocore.retries.standard.ExponentialBackoff.delay_amount = original_delay
        botocore.retries.quota.RetryQuota.acquire = original_acquire


def respond_with(operations, respond):
    """Answer the named operations with ``respond(request)`` (an AWSResponse)."""
    return inject(operations, respond)
