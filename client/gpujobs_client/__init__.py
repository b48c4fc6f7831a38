"""gpujobs SDK: a typed client of the gpujobs HTTP API, and the ``gpujobs`` CLI.

    from gpujobs_client import Client, NotFound
    with Client("http://127.0.0.1:8000", token="t1") as c:
        job = c.create_job(command=["python", "train.py"], ranks=2)

Names are imported on first use, so importing the package costs almost nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Client": "client", "DEFAULT_API_URL": "client", "InvalidResponse": "client",
    "WaitTimeout": "client", "new_idempotency_key": "client",
    "RetryPolicy": "retry",
    "Job": "models", "JobPage": "models", "JobHealth": "models", "Exit": "models",
    "Attempt": "models", "Placement": "models", "Node": "models", "Ranks": "models",
    "RankStatus": "models", "HeartbeatAck": "models", "STATES": "models",
    "LogLine": "models", "JobEvent": "models",
    "TERMINAL_STATES": "models", "parse_time": "models",
    "GpujobsError": "errors", "TransportError": "errors", "ApiError": "errors",
    "BadRequest": "errors", "InvalidArgument": "errors", "InvalidPageToken": "errors",
    "Unauthenticated": "errors", "Forbidden": "errors", "NotFound": "errors",
    "MethodNotAllowed": "errors", "Conflict": "errors", "AlreadyFinished": "errors",
    "RequestInProgress": "errors", "StaleAttempt": "errors", "PayloadTooLarge": "errors",
    "UnsupportedMediaType": "errors", "Unprocessable": "errors",
    "IdempotencyKeyReused": "errors", "RateLimited": "errors", "ServerError": "errors",
    "InternalError": "errors", "Unavailable": "errors", "error_class": "errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from .client import DEFAULT_API_URL, Client, InvalidResponse, WaitTimeout, new_idempotency_key
    from .errors import (
        AlreadyFinished,
        ApiError,
        BadRequest,
        Conflict,
        Forbidden,
        GpujobsError,
        IdempotencyKeyReused,
        InternalError,
        InvalidArgument,
        InvalidPageToken,
        MethodNotAllowed,
        NotFound,
        PayloadTooLarge,
        RateLimited,
        RequestInProgress,
        ServerError,
        StaleAttempt,
        TransportError,
        Unauthenticated,
        Unavailable,
        Unprocessable,
        UnsupportedMediaType,
        error_class,
    )
    from .models import (
        STATES,
        TERMINAL_STATES,
        Attempt,
        Exit,
        HeartbeatAck,
        Job,
        JobHealth,
        JobPage,
        Node,
        Placement,
        Ranks,
        RankStatus,
        parse_time,
    )
    from .retry import RetryPolicy
