"""Domain objects to the JSON of API.md."""
from __future__ import annotations

from datetime import datetime

from ..domain.clock import iso
from ..domain.jobs import Job
from ..domain.nodes import Node


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
        "pending_reason": job.pending_reason,
    }


def attempt_json(attempt: dict) -> dict:
    return {**attempt, "created_at": _t(attempt["created_at"]),
            "finished_at": _t(attempt["finished_at"])}


def node_json(node: Node) -> dict:
    return {"node_id": node.node_id, "gpus": node.gpus, "gpus_free": node.gpus_free,
            "gpu_type": node.gpu_type, "state": node.state.value,
            "inbox_queue_url": node.inbox_queue_url, "last_seen_at": _t(node.last_seen_at),
            "labels": node.labels, "address": node.address, "isolation": node.isolation}


def node_registration_json(node: Node) -> dict:
    """The answer to the node's own agent: the node, and the attempts the server
    still waits for there. An attempt the agent runs that is not among them is
    over for the server (lost with the node, or ended): the agent stops its ranks.
    Only for the agent: tenants reading nodes see no job ids."""
    attempts = []
    for key in node.live_attempts:
        job_id, _, n = key.rpartition("#")
        attempts.append({"job_id": job_id, "attempt": int(n)})
    return {**node_json(node), "attempts": attempts}
