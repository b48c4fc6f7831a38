"""Job ids that sort by creation time (ULID layout, Crockford base32).

48 bits of milliseconds then 80 random bits. Within one process, ids made in
the same millisecond increase monotonically, so ``id`` order is creation order.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80

JOB_ID_RE = re.compile(r"^job_[0-9A-HJKMNP-TV-Z]{26}$")


#: RFC 4648's base32 alphabet, spelled in Crockford's
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode("ascii"))


def _ulid_text(ms: int, rand: int) -> str:
    """The 26 characters of ``ms`` (48 bits, 10 characters) then ``rand`` (80
    bits, 16): the 130-bit number in the low bits of 160, base32-encoded in
    one call (32 characters, whole 5-byte groups: no padding), the first 6
    dropped."""
    raw = ((ms << _RANDOM_BITS) | rand).to_bytes(20, "big")
    return base64.b32encode(raw).translate(_CROCKFORD)[6:].decode("ascii")


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
        return _ulid_text(ms, rand)


new_ulid = UlidGenerator()


def new_job_id() -> str:
    return "job_" + new_ulid()


def is_job_id(s: str) -> bool:
    return bool(JOB_ID_RE.match(s))


#: bits of a child's random part that hold its index (arrays.MAX_SIZE < 2**14)
_INDEX_BITS = 14


def _ulid_value(job_id: str) -> int:
    """The 130-bit number of a job id's 26 characters."""
    n = 0
    for ch in job_id[4:]:
        n = (n << 5) | _ALPHABET.index(ch)
    return n


def child_job_id(parent_id: str, index: int) -> str:
    """The id of index ``index`` of the array ``parent_id``: its parent's
    time, then 66 bits of a hash of the parent's id, then the index. The same
    every time (so a child is made once, by a conditional put), and the
    children of one parent sort by index."""
    ms = _ulid_value(parent_id) >> _RANDOM_BITS
    digest = int.from_bytes(hashlib.sha256(parent_id.encode()).digest()[:9], "big")
    rand = ((digest >> (72 - (_RANDOM_BITS - _INDEX_BITS))) << _INDEX_BITS) | index
    return "job_" + _ulid_text(ms, rand)
