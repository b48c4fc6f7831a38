"""What fits in one response.

A Lambda behind API Gateway answers with at most 6 MB (6,291,456 bytes) of
*proxy payload*: the response body travels as a JSON string inside it, so
every quote and backslash of the body takes two bytes there, and every
non-ASCII character six (twelve outside the BMP). Pages are cut so that what
they hold, measured that way, stays under PAGE_BUDGET_BYTES, leaving room for
the envelope, the headers and the page's other fields.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from ..fastjson import dumpb

#: what the items of one page may take, in proxy-payload bytes (of Lambda's 6 MB)
PAGE_BUDGET_BYTES = 5_000_000

T = TypeVar("T")


#: the bytes of UTF-8 that are not ASCII
_NON_ASCII = bytes(range(0x80, 0x100))


def proxy_bytes(value) -> int:
    """Bytes ``value`` takes in the proxy payload once the app has encoded it
    and the runtime has encoded that as a string: an upper bound, counting
    three for every byte of a non-ASCII character's UTF-8 (a character of
    two or four bytes takes six or twelve, of three bytes six), and six for
    DEL, which the runtime escapes and the app does not."""
    text = dumpb(value)
    size = len(text) + text.count(b'"') + text.count(b"\\") + 5 * text.count(b"\x7f") + 2
    if not text.isascii():
        size += 2 * (len(text) - len(text.translate(None, _NON_ASCII)))
    return size


def fit(items: Sequence[T], size: Callable[[T], int], budget: int | None = None,
        whole: Callable[[Sequence[T]], int] | None = None) -> int:
    """How many of ``items``, from the first, fit in ``budget`` (default
    PAGE_BUDGET_BYTES), at least one: a single item always fits, since a job's
    spec is the body of its create, at most MAX_BODY_BYTES (64 KiB,
    chalicelib.api.validation), which the proxy payload holds in at most 3x
    that (every byte escaped, or 4-byte characters as 12). ``whole``, an upper
    bound of the items' sizes together, answers at once when they all fit."""
    budget = PAGE_BUDGET_BYTES if budget is None else budget
    if whole is not None and whole(items) <= budget:
        return len(items)
    used = 0
    for n, item in enumerate(items):
        used += size(item)
        if used > budget and n > 0:
            return n
    return len(items)
