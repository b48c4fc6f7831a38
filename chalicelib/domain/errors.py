"""Errors the API reports, each with a stable ``code`` (the RFC 9457 problem's).

These are domain facts ("this key was reused with another body"), not HTTP
plumbing: an error carries its code, a title, a detail and the ``field`` it is
about, and data a client acts on (how long to wait, which methods a path
serves). The HTTP edge (chalicelib/api/problems.py) has the one table that
maps each code to a status and headers, and builds the problem body.
"""
from __future__ import annotations


class ApiError(Exception):
    code = "internal"
    title = "Internal error"
    #: seconds a client should wait before it retries; None: the edge's
    #: default for the code (chalicelib/api/problems.py)
    retry_after_s: int | None = None

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


def _error(name: str, code: str, title: str) -> type[ApiError]:
    return type(name, (ApiError,), {"code": code, "title": title})


InvalidArgument = _error("InvalidArgument", "invalid_argument", "Invalid argument")
InvalidPageToken = _error("InvalidPageToken", "invalid_page_token", "Invalid page token")
Unauthenticated = _error("Unauthenticated", "unauthenticated", "Unauthenticated")
Forbidden = _error("Forbidden", "forbidden", "Forbidden")
NotFound = _error("NotFound", "not_found", "Not found")
AlreadyFinished = _error("AlreadyFinished", "already_finished", "Job already finished")
StaleAttempt = _error("StaleAttempt", "stale_attempt", "Stale attempt")
RequestTimeout = _error("RequestTimeout", "request_timeout", "Request timeout")
PayloadTooLarge = _error("PayloadTooLarge", "payload_too_large", "Payload too large")
UriTooLong = _error("UriTooLong", "uri_too_long", "URI too long")
HeadersTooLarge = _error("HeadersTooLarge", "request_header_fields_too_large",
                         "Request header fields too large")
UnsupportedMediaType = _error("UnsupportedMediaType", "unsupported_media_type",
                              "Unsupported media type")
IdempotencyKeyReused = _error("IdempotencyKeyReused", "idempotency_key_reused",
                              "Idempotency key reused")
#: a per-tenant limit (docs/security.md): never a silent queue
QuotaExceeded = _error("QuotaExceeded", "quota_exceeded", "Quota exceeded")


class MethodNotAllowed(ApiError):
    """A method the path does not serve; ``allow`` names those it does."""
    code = "method_not_allowed"
    title = "Method not allowed"

    def __init__(self, detail: str, *, allow: str = "") -> None:
        super().__init__(detail)
        self.allow = allow


class ServiceUnavailable(ApiError):
    """A dependency is busy or unreachable: safe to retry."""
    code = "unavailable"
    title = "Service unavailable"


class RequestInProgress(ApiError):
    """A duplicate that cannot yet see the first request's outcome; safe to retry."""
    code = "request_in_progress"
    title = "Request in progress"

    def __init__(self, detail: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class RecordTooLarge(Exception):
    """A write would make a stored record bigger than its store holds
    (DynamoDB: 400 KB an item); nothing was written. Not the caller's fault
    and no outage: the writer must store less (the stall scan records a
    compact health, domain/health.py ``compacted``)."""
