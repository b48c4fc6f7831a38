"""Configuration, read from the environment when first needed (never at import:
Chalice's test client patches the stage's variables in only around a call).

Only the environment: a secret the environment names by its SSM parameter is
read by the composition root (bootstrap.py, through adapters/parameters.py)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Mapping

from .domain.priority import DEFAULT_MIN_RUNTIME_S, NO_CLASSES, PriorityClasses
from .domain.quotas import TenantLimits


class ConfigError(RuntimeError):
    pass


@dataclass(frozen=True)
class Config:
    region: str
    endpoint_url: str | None
    jobs_table: str
    idempotency_table: str
    attempts_table: str
    outbox_table: str
    nodes_table: str
    heartbeats_table: str
    collector_table: str
    fleet_table: str
    pending_queue_url: str | None
    #: the stall scan's shards (scan_fanout); None: every scan judges inline
    scan_queue_url: str | None
    #: what follows jobs' ends (bootstrap.follow_ups); None: done in the
    #: call that ended them
    follow_up_queue_url: str | None
    inbox_dlq_arn: str
    inbox_queue_prefix: str
    #: the key (GPUJOBS_PAGE_TOKEN_KEY), or b"" while it is in SSM
    page_token_key: bytes
    #: SSM parameter holding the key where the environment does not (AWS);
    #: bootstrap reads it into page_token_key
    page_token_key_param: str | None
    tokens_file: str | None
    #: SSM parameter holding the token hashes (AWS); the local stack uses tokens_file
    token_hashes_param: str | None
    scans_per_hour: float
    scan_period_s: float
    cancel_resend_after_s: float
    #: a node that has not called in for this long is DOWN
    node_down_after_s: float
    #: the ranks' log group (infra/ RankLogGroup); None: logs are not shipped
    log_group: str | None = None
    #: per-tenant limits (issue 9); the counters live in tenants_table
    tenants_table: str = "gpujobs-unbound-tenants"
    #: the tenants' event feeds (domain/feed.py), and the bus every event is
    #: put on (None: none, as in tests that do not deploy one)
    events_table: str = "gpujobs-unbound-events"
    event_bus: str | None = None
    #: usage rolled up by hour (domain/rollup.py), and the price book
    #: (GPU type -> price per GPU-hour) that adds cost to its rows
    usage_table: str = "gpujobs-unbound-usage"
    prices: tuple[tuple[str, float], ...] = ()
    tenant_limits: TenantLimits = TenantLimits()
    #: a node where this many attempts end rank_failed within the window is
    #: cordoned (service/cordons.py); 0: never
    auto_cordon_failures: int = 3
    auto_cordon_window_s: float = 3600.0
    #: different tenants whose jobs must have failed on a node (1: any)
    auto_cordon_tenants: int = 2
    #: at most this share of the fleet (at least one node) auto-cordoned at once
    auto_cordon_max_fraction: float = 0.1
    #: the operator's priority classes (domain/priority.py), and how long a job
    #: runs before a higher class may preempt it
    priority_classes: PriorityClasses = NO_CLASSES
    preempt_min_runtime_s: float = DEFAULT_MIN_RUNTIME_S
    #: webhooks and their deliveries log (issue 45), and the deliveries' queue
    #: (None: fan_out has nowhere to send, and refuses)
    webhooks_table: str = "gpujobs-unbound-webhooks"
    webhook_queue_url: str | None = None
    #: the local stack also delivers to http:// and loopback addresses
    webhook_allow_local: bool = False
    #: the delay before each delivery attempt (domain/webhooks.RETRY_SCHEDULE_S)
    webhook_retry_schedule_s: tuple[float, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Config":
        env = os.environ if env is None else env

        def need(name: str) -> str:
            value = env.get(name)
            if not value:
                raise ConfigError(f"environment variable {name} is not set")
            return value

        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint_url = env.get("GPUJOBS_AWS_ENDPOINT_URL") or None
        page_key = env.get("GPUJOBS_PAGE_TOKEN_KEY") or ""
        page_key_param = None if page_key else env.get("GPUJOBS_PAGE_TOKEN_KEY_PARAM") or None
        if not page_key and not page_key_param:
            raise ConfigError("set GPUJOBS_PAGE_TOKEN_KEY (local) or "
                              "GPUJOBS_PAGE_TOKEN_KEY_PARAM (an SSM parameter)")
        return cls(
            region=region,
            endpoint_url=endpoint_url,
            jobs_table=need("GPUJOBS_JOBS_TABLE"),
            idempotency_table=need("GPUJOBS_IDEMPOTENCY_TABLE"),
            attempts_table=need("GPUJOBS_ATTEMPTS_TABLE"),
            outbox_table=need("GPUJOBS_OUTBOX_TABLE"),
            nodes_table=need("GPUJOBS_NODES_TABLE"),
            heartbeats_table=need("GPUJOBS_HEARTBEATS_TABLE"),
            collector_table=need("GPUJOBS_COLLECTOR_TABLE"),
            fleet_table=need("GPUJOBS_FLEET_TABLE"),
            pending_queue_url=env.get("GPUJOBS_PENDING_QUEUE_URL") or None,
            scan_queue_url=env.get("GPUJOBS_SCAN_QUEUE_URL") or None,
            follow_up_queue_url=env.get("GPUJOBS_FOLLOW_UP_QUEUE_URL") or None,
            inbox_dlq_arn=need("GPUJOBS_INBOX_DLQ_ARN"),
            inbox_queue_prefix=need("GPUJOBS_INBOX_QUEUE_PREFIX"),
            page_token_key=page_key.encode("utf-8"),
            page_token_key_param=page_key_param,
            tokens_file=env.get("GPUJOBS_TOKENS_FILE") or None,
            token_hashes_param=env.get("GPUJOBS_TOKEN_HASHES_PARAM") or None,
            scans_per_hour=3600.0 / float(env.get("GPUJOBS_SCAN_PERIOD_S") or 60),
            scan_period_s=float(env.get("GPUJOBS_SCAN_PERIOD_S") or 60),
            cancel_resend_after_s=float(env.get("GPUJOBS_CANCEL_RESEND_AFTER_S") or 30),
            node_down_after_s=float(env.get("GPUJOBS_NODE_DOWN_AFTER_S") or 60),
            log_group=env.get("GPUJOBS_LOG_GROUP") or None,
            tenants_table=need("GPUJOBS_TENANTS_TABLE"),
            events_table=need("GPUJOBS_EVENTS_TABLE"),
            event_bus=env.get("GPUJOBS_EVENT_BUS") or None,
            usage_table=need("GPUJOBS_USAGE_TABLE"),
            prices=_prices(env),
            tenant_limits=_tenant_limits(env),
            auto_cordon_failures=_int(env, "GPUJOBS_AUTO_CORDON_FAILURES", 3),
            auto_cordon_window_s=float(env.get("GPUJOBS_AUTO_CORDON_WINDOW_S") or 3600),
            auto_cordon_tenants=max(1, _int(env, "GPUJOBS_AUTO_CORDON_TENANTS", 2)),
            auto_cordon_max_fraction=float(env.get("GPUJOBS_AUTO_CORDON_MAX_FRACTION") or 0.1),
            priority_classes=_priority_classes(env),
            preempt_min_runtime_s=float(env.get("GPUJOBS_PREEMPT_MIN_RUNTIME_S")
                                        or DEFAULT_MIN_RUNTIME_S),
            webhooks_table=env.get("GPUJOBS_WEBHOOKS_TABLE") or "gpujobs-unbound-webhooks",
            webhook_queue_url=env.get("GPUJOBS_WEBHOOK_QUEUE_URL") or None,
            webhook_allow_local=env.get("GPUJOBS_WEBHOOK_ALLOW_LOCAL") == "1",
            webhook_retry_schedule_s=_seconds_list(env, "GPUJOBS_WEBHOOK_RETRY_SCHEDULE_S"),
        )


def _priority_classes(env: Mapping[str, str]) -> PriorityClasses:
    try:
        return PriorityClasses.parse(env.get("GPUJOBS_PRIORITY_CLASSES"))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    try:
        value = default if not raw else int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be 0 or more, got {value}")
    return value


def _seconds_list(env: Mapping[str, str], name: str) -> tuple[float, ...]:
    """Comma-separated seconds, each 0 or more; empty: the default."""
    raw = env.get(name) or ""
    try:
        out = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{name} must be seconds separated by commas, got {raw!r}") from None
    if any(x < 0 for x in out):
        raise ConfigError(f"{name} must be 0 or more, got {raw!r}")
    return out


def _tenant_limits(env: Mapping[str, str]) -> TenantLimits:
    try:
        return TenantLimits.parse(env.get("GPUJOBS_TENANT_MAX_PENDING_JOBS"),
                                  env.get("GPUJOBS_TENANT_MAX_RUNNING_GPUS"),
                                  env.get("GPUJOBS_TENANT_LIMITS"))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _prices(env: Mapping[str, str]) -> tuple[tuple[str, float], ...]:
    """``GPUJOBS_PRICES``: a JSON object, GPU type -> price per GPU-hour (a
    number, 0 or more); unset or empty: no price book (rows carry no cost)."""
    raw = env.get("GPUJOBS_PRICES") or ""
    if not raw.strip():
        return ()
    try:
        book = json.loads(raw)
    except ValueError:
        raise ConfigError(f"GPUJOBS_PRICES must be a JSON object, got {raw!r}") from None
    if not isinstance(book, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in book.values()):
        raise ConfigError("GPUJOBS_PRICES must map GPU types to prices per GPU-hour (>= 0)")
    return tuple(sorted((str(k), float(v)) for k, v in book.items()))
