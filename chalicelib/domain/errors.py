"""Errors the API reports, as RFC 9457 problems with a stable ``code``.

These are domain facts ("this key was reused with another body"), not HTTP
plumbing; the entrypoint turns them into problem JSON.
"""
from __future__ import annotations


class ApiError(Exception):
    status = 500
    code = "internal"
    title = "Internal error"

    def __init__(self, detail: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        self.headers = dict(headers or {})

    def problem(self) -> dict:
        body = {
            "type": f"urn:gpujobs:problem:{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if self.field is not None:
            body["field"] = self.field
        return body


def _error(name: str, status: int, code: str, title: str) -> type[ApiError]:
    return type(name, (ApiError,), {"status": status, "code": code, "title": title})


InvalidArgument = _error("InvalidArgument", 400, "invalid_argument", "Invalid argument")
InvalidPageToken = _error("InvalidPageToken", 400, "invalid_page_token", "Invalid page token")
Unauthenticated = _error("Unauthenticated", 401, "unauthenticated", "Unauthenticated")
Forbidden = _error("Forbidden", 403, "forbidden", "Forbidden")
NotFound = _error("NotFound", 404, "not_found", "Not found")
MethodNotAllowed = _error("MethodNotAllowed", 405, "method_not_allowed", "Method not allowed")
AlreadyFinished = _error("AlreadyFinished", 409, "already_finished", "Job already finished")
StaleAttempt = _error("StaleAttempt", 409, "stale_attempt", "Stale attempt")
RequestTimeout = _error("RequestTimeout", 408, "request_timeout", "Request timeout")
PayloadTooLarge = _error("PayloadTooLarge", 413, "payload_too_large", "Payload too large")
UriTooLong = _error("UriTooLong", 414, "uri_too_long", "URI too long")
HeadersTooLarge = _error("HeadersTooLarge", 431, "request_header_fields_too_large",
                         "Request header fields too large")
UnsupportedMediaType = _error("UnsupportedMediaType", 415, "unsupported_media_type",
                              "Unsupported media type")
IdempotencyKeyReused = _error("IdempotencyKeyReused", 422, "idempotency_key_reused",
                              "Idempotency key reused")
#: a per-tenant limit (docs/security.md): never a silent queue
QuotaExceeded = _error("QuotaExceeded", 429, "quota_exceeded", "Quota exceeded")
ServiceUnavailable = _error("ServiceUnavailable", 503, "unavailable", "Service unavailable")


class RequestInProgress(ApiError):
    """A duplicate that cannot yet see the first request's outcome; safe to retry."""
    status = 409
    code = "request_in_progress"
    title = "Request in progress"

    def __init__(self, detail: str, *, retry_after_s: int = 1) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)})
