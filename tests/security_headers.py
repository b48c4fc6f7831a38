"""What every HTTP answer must carry (issue 24, item 5), and the walk of every
route the app declares that checks it: shared by tests/api (Chalice's test
client) and tests/e2e (real HTTP against the local stack).

The expected values are written out here, not imported from the code, so a
header dropped from (or weakened in) chalicelib/api/headers.py fails the
tests. Only the dashboard's own policy is taken from chalicelib/web, whose
tests (tests/api/test_dashboard_assets.py) hold its content.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import app
from chalicelib import web

#: every answer, whoever made it
EVERY_ANSWER = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}
#: an answer that is data (JSON, problem JSON, an empty redirect or 404 of a page):
#: loads nothing, framed by nobody, cached by nobody
DATA_ANSWER = {**EVERY_ANSWER,
               "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
               "cache-control": "no-store"}
#: a dashboard file as served (200, or 304 to a matching ETag)
PAGE_ANSWER = {**EVERY_ANSWER, "content-security-policy": web.CSP, "cache-control": "no-cache"}

#: the methods a client may send; a path declares some of them
METHODS = ("GET", "PUT", "POST", "HEAD", "DELETE", "PATCH")


def is_page(path: str, status: int) -> bool:
    return (path == "/" or path.startswith("/static/")) and status in (200, 304)


def missing(path: str, status: int, headers: Mapping[str, str]) -> dict[str, object]:
    """The expected headers that ``headers`` lacks or has otherwise: name ->
    what it has (None when absent). Empty when the answer is as it must be."""
    have = {k.lower(): v for k, v in headers.items()}
    want = PAGE_ANSWER if is_page(path, status) else DATA_ANSWER
    return {k: have.get(k) for k, v in want.items() if have.get(k) != v}


@dataclass(frozen=True)
class Call:
    method: str
    template: str       # the route as declared, or the path itself when not routed
    path: str
    who: str | None     # a key of the caller's tokens; None: no Authorization
    body: bytes | None
    content_type: str | None = "application/json"

    def __str__(self) -> str:
        size = "" if self.body is None else f" ({len(self.body)} bytes)"
        return f"{self.method} {self.path[:80]} as {self.who or 'nobody'}{size}"


#: a body each body-taking route accepts, by route
VALID_BODIES = {
    "/v1/jobs": b'{"command": ["true"], "ranks": 1, "name": "walls"}',
    "/v1/jobs/{job_id}/cancel": b'{"reason": "walls"}',
    "/v1/jobs/{job_id}/attempts/{attempt}/events": b'{"type": "STARTED", "ranks": [0]}',
    "/v1/jobs/{job_id}/heartbeats": b'{"attempt": 1, "ranks": [{"rank": 0}]}',
    "/v1/nodes/{node_id}": b'{"gpus": 1, "gpu_type": "walls"}',
}
BAD_BODY = b'{"command": '


def routes() -> dict[str, list[str]]:
    """Every path the app declares -> the methods it declares there."""
    return {path: sorted(methods) for path, methods in app.app.routes.items()}


def fill(template: str, params: Mapping[str, str]) -> str:
    path = template
    for name, value in params.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, f"no value for a parameter of {template}"
    return path


def walk(params: Mapping[str, str], callers: tuple[str | None, ...]) -> Iterator[Call]:
    """Every declared route with every method (declared or not), as each caller,
    with a valid body and a bad one where a body goes. ``params`` fills the
    path parameters (``job_id``, ``attempt``, ``node_id``, ``name``)."""
    for template, declared in routes().items():
        assert set(declared) <= set(METHODS), f"{template} declares a method not walked"
        path = fill(template, params)
        for method in METHODS:
            for who in callers:
                if method in ("POST", "PUT", "PATCH"):
                    yield Call(method, template, path, who, VALID_BODIES.get(template, b"{}"))
                    yield Call(method, template, path, who, BAD_BODY)
                else:
                    yield Call(method, template, path, who, None)
