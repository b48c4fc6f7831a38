"""When and how long to wait before sending a request again.

What is retried (decided in :mod:`gpujobs_client.client`):

- no answer (connection refused, reset or dropped, a timeout) on an
  idempotent request; every SDK method is idempotent (``create_job`` always
  sends an ``Idempotency-Key`` and reuses it for its own retries);
- ``409 request_in_progress``, ``429`` and ``503`` on any request: the server
  says the request was not carried out and may be repeated;
- ``502`` and ``504`` (a gateway that lost the answer, which is a timeout seen
  from the outside) on idempotent requests.

Nothing else: a ``4xx`` other than those, or a ``500``, is raised at once.

How long: capped exponential backoff with full jitter
(``uniform(0, min(max_delay_s, base_delay_s * 2**n))`` before retry ``n+1``),
or exactly the server's ``Retry-After`` when it sent one. The budget is both
``max_attempts`` (sends in all, the first included) and ``max_elapsed_s``
(from the first send): a retry whose wait would end after the budget is not
made, and the last error is raised.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Callable

RETRY_STATUSES_ANY = frozenset({429, 503})
RETRY_STATUSES_IDEMPOTENT = frozenset({502, 504})
RETRY_CODES = frozenset({"request_in_progress"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    """Sends in all, the first included; 1 disables retries."""
    max_elapsed_s: float = 30.0
    """No retry starts later than this after the first send."""
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0
    max_retry_after_s: float = 60.0
    """A larger ``Retry-After`` is treated as this (still within the budget)."""
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    rng: Callable[[float, float], float] = field(default=random.uniform, repr=False,
                                                 compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.max_elapsed_s, self.base_delay_s, self.max_delay_s) < 0:
            raise ValueError("delays must not be negative")

    @classmethod
    def none(cls) -> "RetryPolicy":
        return cls(max_attempts=1)

    def backoff(self, retry: int) -> float:
        """Full-jitter delay before retry number ``retry`` (1 for the first)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** min(retry - 1, 62)))
        return self.rng(0.0, cap)

    def delay(self, retry: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after_s)
        return self.backoff(retry)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)
