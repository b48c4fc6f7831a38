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
    "WaitTimeout": "client", "NodeWaitTimeout": "client", "new_idempotency_key": "client",
    "RetryPolicy": "retry",
    "parse_duration": "lifecycle", "parse_retry_on": "lifecycle",
    "LifecycleError": "lifecycle",
    "parse_array": "pipelines", "parse_array_env": "pipelines", "depends_on": "pipelines",
    "PipelineError": "pipelines",
    "Job": "models", "JobPage": "models", "JobHealth": "models", "Exit": "models",
    "Attempt": "models", "Placement": "models", "Node": "models", "Ranks": "models",
    "RankStatus": "models", "HeartbeatAck": "models", "STATES": "models", "Cordon": "models",
    "LogLine": "models", "JobEvent": "models", "Verdict": "models", "Preempting": "models",
    "DEFAULT_PRIORITY_CLASS": "models", "Dependency": "models", "ArrayProgress": "models",
    "QueueStanding": "models", "FeedEvent": "models", "FeedPage": "models",
    "Usage": "models",
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
    # `X as X`: an explicit re-export (the names are served lazily by __getattr__ above)
    from .client import (
        DEFAULT_API_URL as DEFAULT_API_URL,
        Client as Client,
        InvalidResponse as InvalidResponse,
        NodeWaitTimeout as NodeWaitTimeout,
        WaitTimeout as WaitTimeout,
        new_idempotency_key as new_idempotency_key,
    )
    from .errors import (
        AlreadyFinished as AlreadyFinished,
        ApiError as ApiError,
        BadRequest as BadRequest,
        Conflict as Conflict,
        Forbidden as Forbidden,
        GpujobsError as GpujobsError,
        IdempotencyKeyReused as IdempotencyKeyReused,
        InternalError as InternalError,
        InvalidArgument as InvalidArgument,
        InvalidPageToken as InvalidPageToken,
        MethodNotAllowed as MethodNotAllowed,
        NotFound as NotFound,
        PayloadTooLarge as PayloadTooLarge,
        RateLimited as RateLimited,
        RequestInProgress as RequestInProgress,
        ServerError as ServerError,
        StaleAttempt as StaleAttempt,
        TransportError as TransportError,
        Unauthenticated as Unauthenticated,
        Unavailable as Unavailable,
        Unprocessable as Unprocessable,
        UnsupportedMediaType as UnsupportedMediaType,
        error_class as error_class,
    )
    from .lifecycle import (
        LifecycleError as LifecycleError,
        parse_duration as parse_duration,
        parse_retry_on as parse_retry_on,
    )
    from .models import (
        DEFAULT_PRIORITY_CLASS as DEFAULT_PRIORITY_CLASS,
        STATES as STATES,
        TERMINAL_STATES as TERMINAL_STATES,
        ArrayProgress as ArrayProgress,
        Attempt as Attempt,
        Cordon as Cordon,
        Dependency as Dependency,
        Exit as Exit,
        FeedEvent as FeedEvent,
        FeedPage as FeedPage,
        HeartbeatAck as HeartbeatAck,
        Job as Job,
        JobEvent as JobEvent,
        JobHealth as JobHealth,
        JobPage as JobPage,
        LogLine as LogLine,
        Node as Node,
        Placement as Placement,
        Preempting as Preempting,
        QueueStanding as QueueStanding,
        Ranks as Ranks,
        RankStatus as RankStatus,
        Usage as Usage,
        Verdict as Verdict,
        parse_time as parse_time,
    )
    from .pipelines import (
        PipelineError as PipelineError,
        depends_on as depends_on,
        parse_array as parse_array,
        parse_array_env as parse_array_env,
    )
    from .retry import (
        RetryPolicy as RetryPolicy,
    )
