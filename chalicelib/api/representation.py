"""Domain objects to the JSON of API.md."""
from __future__ import annotations

from datetime import datetime

from ..domain.clock import iso
from ..domain.jobs import Job


def _t(value: datetime | None) -> str | None:
    return None if value is None else iso(value)


def job_json(job: Job) -> dict:
    return {
        "id": job.job_id,
        "name": job.name,
        "state": job.state.value,
        "spec": job.spec,
        "attempt": job.attempt,
        "created_at": _t(job.created_at),
        "updated_at": _t(job.updated_at),
        "started_at": _t(job.started_at),
        "finished_at": _t(job.finished_at),
        "cancel_requested_at": _t(job.cancel_requested_at),
        "cancel_reason": job.cancel_reason,
        "health": job.health,
        "exit": job.exit,
    }


def attempt_json(attempt: dict) -> dict:
    return {**attempt, "created_at": _t(attempt["created_at"]),
            "finished_at": _t(attempt["finished_at"])}
