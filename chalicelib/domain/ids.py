"""Job ids that sort by creation time (ULID layout, Crockford base32).

48 bits of milliseconds then 80 random bits. Within one process, ids made in
the same millisecond increase monotonically, so ``id`` order is creation order.
"""
from __future__ import annotations

import os
import re
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80

JOB_ID_RE = re.compile(r"^job_[0-9A-HJKMNP-TV-Z]{26}$")


def _b32(n: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


class UlidGenerator:
    """Monotonic within this generator: same-millisecond ids still increase."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = (0, 0)

    def __call__(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            last_ms, last_rand = self._last
            if ms <= last_ms:
                ms, rand = last_ms, last_rand + 1
            else:
                rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom to increment
            self._last = (ms, rand)
        return _b32(ms, 10) + _b32(rand, 16)


new_ulid = UlidGenerator()


def new_job_id() -> str:
    return "job_" + new_ulid()


def is_job_id(s: str) -> bool:
    return bool(JOB_ID_RE.match(s))
