"""Webhooks: Standard Webhooks 1.0 signing, the URL rule (no SSRF), the retry
schedule, and when an endpoint that keeps failing is disabled.

Pure: time, randomness and name resolution are passed in, so each rule is
tested with a clock and a resolver of the test's own (tests/unit/test_webhooks.py).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import random
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Iterable, Sequence
from urllib.parse import urlsplit

from .errors import InvalidArgument
from .feed import TYPES  # the event types a webhook may ask for: the feed's

__all__ = ["TYPES"]
#: the extension type ``POST /v1/webhooks/{id}/test`` sends (never asked for)
TEST_TYPE = "webhook.test"
#: the note recorded in an endpoint's deliveries when it is disabled
DISABLED_NOTE = "webhook.disabled"
MAX_WEBHOOKS = 20
MAX_URL_CHARS = 2048
MAX_DESCRIPTION_CHARS = 256
SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
#: a 2xx within this many seconds is delivered
TIMEOUT_S = 10.0
#: Standard Webhooks' schedule: the delay before attempt 1, 2, ... (about 27.6 h
#: in all, past the contract's 24 h)
RETRY_SCHEDULE_S: tuple[float, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
JITTER = 0.2
#: an endpoint that has failed this long with no success since is disabled
DISABLE_AFTER_S = 5 * 86400.0
#: SQS holds a message back at most this long (DelaySeconds)
MAX_QUEUE_DELAY_S = 900


# -- signing ----------------------------------------------------------------------
def new_secret(randbytes: Callable[[int], bytes] = os.urandom) -> str:
    """``whsec_`` and the base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(randbytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret: its base64-decoded bytes."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    return base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)


def signature(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """``v1,<base64 HMAC-SHA256 over "<id>.<timestamp>.<body>">``."""
    signed = f"{msg_id}.{timestamp}.{body}".encode("utf-8")
    mac = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signed_headers(secret: str, msg_id: str, now: datetime, body: str) -> dict[str, str]:
    """The headers of one delivery attempt of ``body`` (the event JSON)."""
    timestamp = int(now.timestamp())
    return {"content-type": "application/json", "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, msg_id, timestamp, body)}


# -- the URL rule -------------------------------------------------------------------
Resolver = Callable[[str, int], Sequence[str]]

_METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system's resolver)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refused_address(address: str, *, allow_loopback: bool = False) -> str | None:
    """Why a delivery may not go to ``address`` (None: it may): private,
    loopback, link-local, metadata, unspecified, multicast, reserved, and the
    IPv4-mapped (or 6to4 / NAT64-less) IPv6 spelling of each."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
        address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in _METADATA:
        return "a cloud metadata address"
    if ip.is_loopback:
        return None if allow_loopback else "a loopback address"
    for what, test in (("an unspecified address", ip.is_unspecified),
                       ("a link-local address", ip.is_link_local),
                       ("a multicast address", ip.is_multicast),
                       ("a private address", ip.is_private),
                       ("a reserved address", ip.is_reserved),
                       ("a non-public address", not ip.is_global)):
        if test:
            return what
    return None


@dataclass(frozen=True)
class Target:
    """Where one delivery goes: the URL, its host and port, and the checked
    addresses (the delivery connects to the first, never resolves again)."""
    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def UrlRefused(detail: str) -> Exception:
    """The 400 naming ``url``."""
    return InvalidArgument(detail, field="url")


def check_url(url: str, *, allow_local: bool = False,
              resolver: Resolver = resolve) -> Target:
    """The target of ``url``, or UrlRefused naming why: it must be ``https``
    (``http`` too when ``allow_local``), have a host and no credentials, and
    every address its host is or resolves to must be public (loopback too
    when ``allow_local``: the local stack)."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise UrlRefused(f"url must be an https URL of at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UrlRefused("url is not a valid URL") from None
    schemes = ("https", "http") if allow_local else ("https",)
    if parts.scheme not in schemes:
        raise UrlRefused(f"url must use {' or '.join(schemes)}, not {parts.scheme or 'none'!r}")
    host = parts.hostname
    if not host:
        raise UrlRefused("url has no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("url may not carry credentials")
    if any(c.isspace() for c in url):
        raise UrlRefused("url may not contain whitespace")
    port = port or (443 if parts.scheme == "https" else 80)
    addresses: tuple[str, ...]
    try:
        addresses = (str(ipaddress.ip_address(host)),)
    except ValueError:
        try:
            addresses = tuple(resolver(host, port))
        except (OSError, UnicodeError):
            raise UrlRefused(f"url's host {host!r} does not resolve") from None
    if not addresses:
        raise UrlRefused(f"url's host {host!r} does not resolve")
    for address in addresses:
        why = refused_address(address, allow_loopback=allow_local)
        if why is not None:
            raise UrlRefused(f"url's host {host!r} is or resolves to {why} ({address}): "
                             "webhooks go to public addresses only")
    return Target(url, parts.scheme, host, port, addresses)


def check_types(types: Iterable[str] | None) -> tuple[str, ...]:
    """The event types asked for (None: all of them), each known."""
    if types is None:
        return TYPES
    out = tuple(dict.fromkeys(types))
    for t in out:
        if t not in TYPES:
            raise InvalidArgument(f"types has an unknown event type {t!r}; known: "
                                  f"{', '.join(TYPES)}", field="types")
    if not out:
        raise InvalidArgument("types must name at least one event type", field="types")
    return out


# -- retries, and disabling ----------------------------------------------------------
def retry_delay(attempt: int, *, schedule: Sequence[float] = RETRY_SCHEDULE_S,
                rand: Callable[[], float] = random.random) -> float | None:
    """Seconds to wait after attempt ``attempt`` (1-based) failed before the
    next, with ±20 % jitter; None: the schedule is exhausted (failed)."""
    if attempt >= len(schedule):
        return None
    base = float(schedule[attempt])
    return max(0.0, base * (1 + JITTER * (2 * rand() - 1)))


def queue_delay(now: datetime, not_before: datetime) -> int:
    """The DelaySeconds of a message due at ``not_before``: SQS holds one at
    most 900 s, so a longer wait is several hops, each re-sent when it arrives."""
    wait = (not_before - now).total_seconds()
    return max(0, min(MAX_QUEUE_DELAY_S, int(wait + 0.999)))


def should_disable(failing_since: datetime | None, now: datetime, *,
                   after_s: float = DISABLE_AFTER_S) -> bool:
    """True when the endpoint has failed since ``failing_since`` (its first
    failure after its last success) for ``after_s`` or longer."""
    return failing_since is not None and now - failing_since >= timedelta(seconds=after_s)


def matches(types: Iterable[str], event_type: str) -> bool:
    return event_type in types


def delivered(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


# -- records ------------------------------------------------------------------------
ENABLED, DISABLED = "enabled", "disabled"


@dataclass(frozen=True)
class Webhook:
    webhook_id: str
    tenant: str
    url: str
    types: tuple[str, ...]
    description: str | None
    state: str
    created_at: datetime
    secret: str
    #: the first failure since the last success (None: not failing)
    failing_since: datetime | None = None
    disabled_at: datetime | None = None


@dataclass(frozen=True)
class Delivery:
    """One delivery attempt as the deliveries log shows it; ``note`` marks a
    record that is no attempt (``webhook.disabled``)."""
    event_id: str
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    next_retry_at: datetime | None
    note: str | None = None


def too_many() -> Exception:
    return InvalidArgument(f"a tenant has at most {MAX_WEBHOOKS} webhooks: delete one first",
                           field="url")
