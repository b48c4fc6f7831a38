"""Opaque, signed page tokens.

A token carries the key of the last job a page returned. It is signed with
HMAC-SHA256 over the tenant and the filter as well, so a token that was
tampered with, belongs to another tenant, or is replayed with another filter
fails verification. Keyset pagination on the job id (creation order) means
jobs created while a client pages sort before the cursor: no skips, no repeats.
"""
from __future__ import annotations

import base64
import binascii
import hmac
import json
import re

from .errors import InvalidPageToken

_VERSION = "1"
_MAC_BYTES = 16
MAX_TOKEN_CHARS = 1024


def _b64e(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode("ascii").rstrip("=")


_B64URL = re.compile(r"[A-Za-z0-9_-]+")


def _b64d(s: str) -> bytes:
    """Strict: only the base64url alphabet, no padding, and the one canonical
    spelling of the bytes (unused trailing bits zero), so any change is a change."""
    if not _B64URL.fullmatch(s) or len(s) % 4 == 1:
        raise ValueError("not canonical base64url")
    raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if _b64e(raw) != s:
        raise ValueError("not canonical base64url")
    return raw


def _mac(secret: bytes, tenant: str, filter_key: str, payload: str) -> bytes:
    msg = "\x1f".join((_VERSION, tenant, filter_key, payload)).encode("utf-8")
    return hmac.digest(secret, msg, "sha256")[:_MAC_BYTES]  # one call, no HMAC object


def encode(last_key: str, *, tenant: str, filter_key: str, secret: bytes) -> str:
    payload = _b64e(json.dumps({"k": last_key}, separators=(",", ":")).encode("utf-8"))
    return f"{payload}.{_b64e(_mac(secret, tenant, filter_key, payload))}"


def decode(token: str, *, tenant: str, filter_key: str, secret: bytes) -> str:
    bad = InvalidPageToken("page_token is malformed, was tampered with, or belongs "
                           "to another tenant or filter", field="page_token")
    if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise bad
    payload, mac = token.split(".")
    try:
        given = _b64d(mac)
        if len(given) != _MAC_BYTES or not hmac.compare_digest(given, _mac(secret, tenant, filter_key, payload)):
            raise bad
        key = json.loads(_b64d(payload))["k"]
    except (ValueError, binascii.Error, KeyError, TypeError, UnicodeError):
        raise bad from None
    if not isinstance(key, str):
        raise bad
    return key
