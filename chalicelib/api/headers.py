"""The headers every HTTP answer carries, whoever makes it (issue 24, item 5).

One table, applied in two places only: the edge's one middleware
(chalicelib/api/edge.py, :func:`observed`) for every answer the app makes, its
routes' JSON, problem JSON, Chalice's own 405 and 415 and the dashboard's
files alike; and the local gateway (devstack/server.py) for the answers it
makes itself (404 of an unrouted path, 405, 408, 413, 414, 431, 400).

Values a response already set win (names compared case-insensitively): the
dashboard's files carry their own, stricter-for-HTML policy and revalidate
(chalicelib/web). Everything else is data for programs, never a page, so its
policy loads nothing, runs nothing and may be framed by nobody, and no cache
keeps it: a job, a node, an error (``no-store``; an answer may hold a tenant's
data, and there is no answer worth caching).
"""
from __future__ import annotations

from typing import MutableMapping, TypeVar

#: a JSON answer loads nothing and may be framed by nobody
API_CSP = "default-src 'none'; frame-ancestors 'none'"

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": API_CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

H = TypeVar("H", bound=MutableMapping)


def secured(headers: H) -> H:
    """``headers`` with every header of :data:`SECURITY_HEADERS` it lacks
    (changed in place, and returned)."""
    present = {name.lower() for name in headers}
    for name, value in SECURITY_HEADERS.items():
        if name.lower() not in present:
            headers[name] = value
    return headers
