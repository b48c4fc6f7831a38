"""The dashboard's static files (chalicelib/web/static/), as the app serves them.

Only text types are served (HTML, CSS, JavaScript modules, SVG), returned as
``str`` bodies: none is in Chalice's ``binary_types``, so API Gateway passes
them through untouched, with no base64 round trip and no ``Accept`` check.
Files are read once, on the first request (not at import: Lambda's cold start
does not pay for them), and looked up by exact name, so a request can never
name a path outside the folder.
"""
from __future__ import annotations

import functools
import hashlib
import pathlib
import re
from dataclasses import dataclass

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
INDEX = "index.html"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\.(html|css|js|svg)$")
CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "css": "text/css; charset=utf-8",
    "js": "text/javascript; charset=utf-8",
    "svg": "image/svg+xml; charset=utf-8",
}
# No inline script or style anywhere, nothing from another origin; the page
# talks only to the API it was served by.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: what a page's answer says in its own way; the headers every answer carries
#: (nosniff, no framing, no referrer) the edge adds (chalicelib/api/headers.py)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    # revalidate every time (cheap: a 304 on a matching ETag), so a new
    # deployment is picked up at once and modules never mix versions
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    name: str
    body: str
    content_type: str
    etag: str

    def headers(self) -> dict[str, str | list[str]]:  # the type chalice.Response takes
        return {"Content-Type": self.content_type, "ETag": self.etag, **PAGE_HEADERS}

    def fresh_for(self, if_none_match: str | None) -> bool:
        """True when the client's cached copy (its ``If-None-Match``) is this one."""
        if not if_none_match:
            return False
        tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
        return "*" in tags or self.etag in tags


@functools.cache
def _assets() -> dict[str, Asset]:
    out = {}
    for path in sorted(STATIC_DIR.iterdir()):
        m = NAME.match(path.name)
        if m and path.is_file():
            body = path.read_text(encoding="utf-8")
            etag = '"' + hashlib.sha256(body.encode()).hexdigest()[:20] + '"'
            out[path.name] = Asset(path.name, body, CONTENT_TYPES[m.group(1)], etag)
    return out


def asset(name: str) -> Asset | None:
    """The static file called ``name``, or None when there is no such file."""
    return _assets().get(name) if NAME.match(name) else None


def names() -> list[str]:
    return sorted(_assets())
