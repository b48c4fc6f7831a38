"""Time as the API writes it: RFC 3339 UTC, millisecond precision, ``Z``."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Callable

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """Now, to the millisecond: the precision times are stored and shown with,
    so a time read back equals the time written and compares exactly."""
    t = datetime.now(timezone.utc)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def iso(t: datetime) -> str:
    # isoformat, not strftime: the same text, cheaper (docs/benchmarks.md);
    # it runs up to five times per job of a list page
    if t.tzinfo is not timezone.utc:
        t = t.astimezone(timezone.utc)
    return t.isoformat(timespec="milliseconds")[:-6] + "Z"


def iso_or_none(t: datetime | None) -> str | None:
    return None if t is None else iso(t)


def parse_iso(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(timezone.utc)


def plus(t: datetime, seconds: float) -> datetime:
    return t + timedelta(seconds=seconds)
