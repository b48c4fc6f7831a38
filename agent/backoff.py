"""Capped exponential backoff with full jitter, and the Retry-After header.

Full jitter (a uniformly random delay between 0 and the capped exponential
ceiling) spreads the retries of many agents that failed together, e.g. when the
API came back after an outage, instead of having them return in lockstep. The
standard library is enough for this; a retry library would add a dependency to
every GPU host for a dozen lines.
"""
from __future__ import annotations

import email.utils
import random
import time
from datetime import timezone

MAX_RETRY_AFTER_S = 300.0  # a server asking for more than this is not taken literally


def ceiling(attempt: int, base: float, cap: float) -> float:
    """``min(cap, base * 2**(attempt-1))`` for attempt >= 1, without float overflow."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    if base <= 0 or cap <= 0:
        return 0.0
    # past 2**64 the ceiling is the cap whatever base is (base > 2**-64 in practice)
    return cap if attempt > 64 else min(cap, base * 2.0 ** (attempt - 1))


def full_jitter(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """The delay before retry number ``attempt`` (1 = first retry): uniform in [0, ceiling]."""
    return (rng or random).uniform(0.0, ceiling(attempt, base, cap))


def retry_delay(failures: int, base: float, cap: float, rng: random.Random | None = None,
                retry_after: float | None = None) -> float:
    """The wait after ``failures`` consecutive failures: full jitter, with a server's
    Retry-After (already parsed, see below) honoured as a floor."""
    return max(retry_after or 0.0, full_jitter(failures, base, cap, rng))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110).

    None when absent or unparsable; never negative; at most MAX_RETRY_AFTER_S."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        now = time.time() if now is None else now
        seconds = when.timestamp() - now
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)
