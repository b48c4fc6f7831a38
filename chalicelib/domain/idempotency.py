"""Idempotency keys: canonical request hashes and the retention rule."""
from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta

from .errors import InvalidArgument

#: keys are kept at least this long after the job finished (API.md)
RETENTION = timedelta(hours=24)
_KEY_RE = re.compile(r"^[\x20-\x7e]{1,255}$")


def check_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not _KEY_RE.match(key):
        raise InvalidArgument("Idempotency-Key must be 1 to 255 printable ASCII characters",
                              field="Idempotency-Key")
    return key


#: ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``,
#: without a new encoder per call
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: object) -> str:
    return _CANONICAL.encode(value)


def body_hash(body: object) -> str:
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def record_id(tenant: str, key: str) -> str:
    """The record's key: tenant-scoped, and the raw key never stored."""
    return hashlib.sha256(f"{tenant}\x1f{key}".encode("utf-8")).hexdigest()


def expires_at(finished_at: datetime) -> datetime:
    return finished_at + RETENTION


def is_expired(stored_expires_at: datetime | None, now: datetime) -> bool:
    """Expiry is decided from the stored timestamp, never from TTL deletion.

    A record without ``expires_at`` belongs to a job that has not finished and
    never expires.
    """
    return stored_expires_at is not None and now >= stored_expires_at
