"""Domain objects to the JSON of API.md."""
from __future__ import annotations

from ..domain.arrays import COUNTERS, Counts
from ..domain.clock import iso, iso_or_none
from ..domain.jobs import API_NAMES, Job
from ..domain.nodes import Node
from ..domain.webhooks import Delivery, Webhook
from ..service.views import JobView, view_of


def job_json(job: Job) -> dict:
    return job_view_json(view_of(job))


#: what the API shows for a value the job never had
_EMPTY = {"health": {}, "uncounted_retries": 0}
#: (stored name, API name) of each field the API's job shows as it is
_SHOWN = tuple((name, api) for name, api in API_NAMES.items())


def job_view_json(v: JobView) -> dict:
    """The job of API.md, from its view (service/views.py): the one mapping of
    a job to its JSON, whether the view came from a Job or straight from the
    store. Its members are the fields domain/jobs.py declares shown, the
    array's progress, and its usage and a PENDING job's place in line when
    the view has them (``JobsService.look``; null otherwise, as on list
    pages)."""
    out = {api: v[name] for name, api in _SHOWN}
    for name, empty in _EMPTY.items():
        if out[name] is None:
            out[name] = empty
    out["array"] = array_json(v)
    # where a PENDING job stands (domain/queue.py), on a single job's read only
    out["queue"] = v.get("queue")
    # what its GPU time bought (domain/usage.py), on a single job's read only
    out["usage"] = v.get("usage")
    return out


def array_json(v: JobView) -> dict | None:
    """An array's progress: how many indexes were made, and how many are in
    each state (RUNNING: SCHEDULED or RUNNING). None for any other job."""
    if v["array_materialized"] is None:
        return None
    counts = Counts.of({k: v[f"array_{k}"] for k in COUNTERS})
    size = int(v["spec"].value()["array"]["size"])
    return {"size": size, "materialized": counts.materialized, "counts": counts.by_state(size)}


def attempt_json(attempt: dict) -> dict:
    return {**attempt, "created_at": iso_or_none(attempt["created_at"]),
            "finished_at": iso_or_none(attempt["finished_at"])}


def node_json(node: Node) -> dict:
    return {"node_id": node.node_id, "gpus": node.gpus, "gpus_free": node.gpus_free,
            "gpu_type": node.gpu_type, "state": node.state.value,
            "inbox_queue_url": node.inbox_queue_url, "last_seen_at": iso_or_none(node.last_seen_at),
            "labels": node.labels, "address": node.address, "isolation": node.isolation,
            "cordon": node.cordon}


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


def webhook_json(w: Webhook, *, with_secret: bool = False) -> dict:
    """A webhook as the API shows it: the secret only in the create's answer."""
    out = {"id": w.webhook_id, "url": w.url, "types": list(w.types),
           "description": w.description, "state": w.state, "created_at": iso(w.created_at)}
    if with_secret:
        out["secret"] = w.secret
    return out


def delivery_json(d: Delivery) -> dict:
    return {"event_id": d.event_id, "attempt": d.attempt, "at": iso(d.at),
            "status_code": d.status_code, "error": d.error,
            "next_retry_at": iso_or_none(d.next_retry_at)}
