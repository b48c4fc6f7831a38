"""Readiness: the API can reach its tables."""
from __future__ import annotations

from ..domain.errors import ServiceUnavailable
from .ports import JobReads


def check(store: JobReads) -> dict:
    try:
        store.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "not ready"
        raise ServiceUnavailable(f"tables unreachable: {type(e).__name__}") from e
    return {"status": "ok"}
