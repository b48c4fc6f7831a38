"""Exceptions raised by the SDK.

Every answer of the API that is not a success is an :class:`ApiError` carrying
the RFC 9457 problem JSON the server sent (``status``, ``code``, ``title``,
``detail``, ``field``). The class is chosen by the problem's ``code`` first and
by its HTTP status second, so ``except NotFound`` and
``except ApiError as e: if e.code == "not_found"`` are equivalent.

A request that never got an HTTP answer (connection refused or reset, a
timeout) is a :class:`TransportError`.
"""
from __future__ import annotations

from typing import Any, Mapping


class GpujobsError(Exception):
    """Base class of every exception this package raises."""

    #: advice for the person at the CLI (printed as ``Hint:``); None: none to give
    hint: str | None = None


class TransportError(GpujobsError):
    """No HTTP answer: the connection failed, was dropped, or timed out.

    ``attempts`` is how many times the request was sent before giving up.
    """

    def __init__(self, message: str, *, method: str = "", url: str = "",
                 attempts: int = 1, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.method = method
        self.url = url
        self.attempts = attempts
        self.__cause__ = cause


class ApiError(GpujobsError):
    """The API answered with a problem (4xx or 5xx).

    ``problem`` is the problem JSON exactly as received (or, when the body was
    not problem JSON, e.g. from a proxy, one made from the status line).
    """

    status: int
    code: str
    title: str
    detail: str
    field: str | None
    type: str

    def __init__(self, problem: Mapping[str, Any], *, headers: Mapping[str, str] | None = None,
                 method: str = "", url: str = "", attempts: int = 1) -> None:
        self.problem: dict[str, Any] = dict(problem)
        self.status = int(problem.get("status") or 0)
        self.code = str(problem.get("code") or f"http_{self.status}")
        self.title = str(problem.get("title") or "")
        self.detail = str(problem.get("detail") or "")
        field = problem.get("field")
        self.field = str(field) if field is not None else None
        self.type = str(problem.get("type") or "")
        self.headers: dict[str, str] = dict(headers or {})
        self.method = method
        self.url = url
        self.attempts = attempts
        super().__init__(self.summary())

    def summary(self) -> str:
        """One line for humans: ``404 not_found: Not found: job x not found``."""
        text = f"{self.status} {self.code}"
        if self.title:
            text += f": {self.title}"
        if self.detail:
            text += f": {self.detail}"
        if self.field:
            text += f" (field: {self.field})"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.problem!r})"


# -- by status ----------------------------------------------------------------
class BadRequest(ApiError):
    """400."""


class Unauthenticated(ApiError):
    """401 unauthenticated: missing or unknown token."""


class Forbidden(ApiError):
    """403 forbidden: the token's kind may not do this."""


class NotFound(ApiError):
    """404 not_found: no such job (or not this tenant's), node or path."""


class MethodNotAllowed(ApiError):
    """405 method_not_allowed."""


class Conflict(ApiError):
    """409: the request conflicts with the resource's current state."""


class PayloadTooLarge(ApiError):
    """413 payload_too_large."""


class UnsupportedMediaType(ApiError):
    """415 unsupported_media_type."""


class Unprocessable(ApiError):
    """422."""


class RateLimited(ApiError):
    """429: too many requests (retried by the SDK within its budget)."""


class ServerError(ApiError):
    """5xx: the server is broken or unavailable."""


class InternalError(ServerError):
    """500 internal: a server bug."""


class Unavailable(ServerError):
    """503 unavailable: storage busy or unreachable (retried within the budget)."""


# -- by code --------------------------------------------------------------------
class InvalidArgument(BadRequest):
    """400 invalid_argument; ``field`` names what is wrong."""


class InvalidPageToken(BadRequest):
    """400 invalid_page_token."""


class AlreadyFinished(Conflict):
    """409 already_finished: the job finished before the request."""


class RequestInProgress(Conflict):
    """409 request_in_progress (retried by the SDK within its budget)."""


class StaleAttempt(Conflict):
    """409 stale_attempt: an agent spoke for an attempt that is not current."""


class IdempotencyKeyReused(Unprocessable):
    """422 idempotency_key_reused: the key was used with another body."""


BY_CODE: dict[str, type[ApiError]] = {
    "invalid_argument": InvalidArgument,
    "invalid_page_token": InvalidPageToken,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "already_finished": AlreadyFinished,
    "request_in_progress": RequestInProgress,
    "stale_attempt": StaleAttempt,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "idempotency_key_reused": IdempotencyKeyReused,
    "unavailable": Unavailable,
    "internal": InternalError,
}

BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound,
    405: MethodNotAllowed, 409: Conflict, 413: PayloadTooLarge,
    415: UnsupportedMediaType, 422: Unprocessable, 429: RateLimited,
    500: InternalError, 503: Unavailable,
}


def error_class(status: int, code: str | None) -> type[ApiError]:
    """The exception class for a problem: by ``code``, else by status."""
    cls = BY_CODE.get(code or "")
    if cls is not None and cls_status(cls) in (status, None):
        return cls
    if status in BY_STATUS:
        return BY_STATUS[status]
    return ServerError if status >= 500 else ApiError


def cls_status(cls: type[ApiError]) -> int | None:
    for status, base in BY_STATUS.items():
        if issubclass(cls, base):
            return status
    return None


def error_from_problem(problem: Mapping[str, Any], **kw: Any) -> ApiError:
    status = int(problem.get("status") or 0)
    return error_class(status, problem.get("code"))(problem, **kw)
