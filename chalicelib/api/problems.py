"""Domain errors as HTTP answers: RFC 9457 problem JSON (../shared/API.md).

:data:`ANSWERS` is the one table from a problem ``code`` to its HTTP status and
the headers every answer with that code carries; docs/openapi.yaml lists the
same codes (``x-problem-codes``, checked by tests/test_openapi.py). A code not
in the table is a bug of the server: 500.
"""
from __future__ import annotations

import json

from chalice import Response

from ..domain.errors import ApiError, MethodNotAllowed

PROBLEM_JSON = "application/problem+json"

#: code -> (HTTP status, headers). Retry-After: a busy dependency or a request
#: still in flight clears within a second; a pending-jobs quota, within a minute
ANSWERS: dict[str, tuple[int, dict[str, str]]] = {
    "invalid_argument": (400, {}),
    "invalid_page_token": (400, {}),
    "unauthenticated": (401, {}),
    "forbidden": (403, {}),
    "not_found": (404, {}),
    "method_not_allowed": (405, {}),
    "request_timeout": (408, {}),
    "already_finished": (409, {}),
    "stale_attempt": (409, {}),
    "request_in_progress": (409, {"Retry-After": "1"}),
    "payload_too_large": (413, {}),
    "uri_too_long": (414, {}),
    "unsupported_media_type": (415, {}),
    "idempotency_key_reused": (422, {}),
    "quota_exceeded": (429, {"Retry-After": "60"}),
    "request_header_fields_too_large": (431, {}),
    "internal": (500, {}),
    "unavailable": (503, {"Retry-After": "1"}),
}
_UNKNOWN: tuple[int, dict[str, str]] = (500, {})


def status_of(code: str) -> int:
    return ANSWERS.get(code, _UNKNOWN)[0]


def body(err: ApiError) -> dict:
    """The problem document of ``err``."""
    out = {
        "type": f"urn:gpujobs:problem:{err.code}",
        "title": err.title,
        "status": status_of(err.code),
        "detail": err.detail,
        "code": err.code,
    }
    if err.field is not None:
        out["field"] = err.field
    return out


def answer(err: ApiError) -> tuple[int, dict[str, str | list[str]], str]:
    """(status, headers, body text) of ``err``'s answer. The body is compact
    like every body, and ASCII (json's escapes): a problem may echo what a
    client sent, lone surrogates included, and must still encode."""
    status, extra = ANSWERS.get(err.code, _UNKNOWN)
    headers: dict[str, str | list[str]] = {"Content-Type": PROBLEM_JSON, **extra}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(err.retry_after_s)
    if isinstance(err, MethodNotAllowed):
        headers["Allow"] = err.allow
    return status, headers, json.dumps(body(err), separators=(",", ":"))


def problem(err: ApiError) -> Response:
    status, headers, text = answer(err)
    return Response(body=text, status_code=status, headers=headers)
