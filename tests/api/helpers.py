"""Helpers for service tests: request counting and direct placement."""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Callable

import botocore.client

from chalicelib.domain.clock import utcnow
from chalicelib.domain.principal import Principal

_agent = Principal("agent", "*")


@contextlib.contextmanager
def aws_calls():
    """Record every AWS operation made in the block, as (service, operation)."""
    seen: list[tuple[str, str]] = []
    original = botocore.client.BaseClient._make_api_call

    def recording(self, operation_name, api_params):
        seen.append((self.meta.service_model.service_name, operation_name))
        return original(self, operation_name, api_params)

    botocore.client.BaseClient._make_api_call = recording
    try:
        yield seen
    finally:
        botocore.client.BaseClient._make_api_call = original


def place(services, job_id: str, nodes: list[str], gpus: int = 8) -> dict[str, str]:
    """Place a job on chosen nodes (registered here), one rank after another
    round the nodes, bypassing the placer's choice; returns node -> inbox URL."""
    from chalicelib.domain.intents import launch_intent
    from chalicelib.domain.placement import Plan

    job = services.store.get(job_id)
    inboxes = {n: services.nodes.register(_agent, n, {"gpus": gpus}).inbox_queue_url
               for n in nodes}
    by_node: dict[str, list[int]] = {n: [] for n in nodes}
    for rank in range(job.spec.ranks):
        by_node[nodes[rank % len(nodes)]].append(rank)
    plan = Plan({n: r for n, r in by_node.items() if r}, job.spec.gpus_per_rank)
    intent = launch_intent(job, job.attempt + 1, plan.ranks_by_node,
                           {n: inboxes[n] for n in plan.ranks_by_node}, "127.0.0.1", 29500)
    services.store.place(job, plan, intent, utcnow())
    return {n: inboxes[n] for n in plan.ranks_by_node}


def drain(sqs, queue_url: str, job_id: str | None = None) -> list[dict]:
    """Every message in the queue (about ``job_id`` only, if given: other tests'
    intents share the node inboxes and the reconciler)."""
    out = []
    while True:
        r = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                WaitTimeSeconds=0)
        msgs = r.get("Messages", [])
        if not msgs:
            return [m for m in out if job_id is None or m["job_id"] == job_id]
        for m in msgs:
            out.append(json.loads(m["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


def flood(services, tenant: str, body: dict, n: int) -> list[str]:
    """``n`` PENDING jobs of ``body``, made as JobsService.create makes them and
    written in batches through the adapter's own serialisation. A flood is
    what the placer must cope with; made through the API it would cost a
    transaction and a nudge per job (a minute or more on moto for hundreds),
    and creating is not what such a test checks."""
    from chalicelib.adapters.jobs_table import new_job_values
    from chalicelib.adapters.models import JobModel
    from chalicelib.domain.health import initial_health
    from chalicelib.domain.ids import new_job_id
    from chalicelib.domain.jobs import Job
    from chalicelib.domain.spec import JobSpec
    from chalicelib.domain.states import JobState

    now = services.clock()
    spec = JobSpec.parse(body)
    jobs = [Job(job_id=new_job_id(), tenant=tenant, state=JobState.PENDING, spec=spec,
                created_at=now, updated_at=now, name=body.get("name"),
                health=initial_health(spec, services.config.scans_per_hour))
            for _ in range(n)]
    with JobModel.batch_write() as batch:
        for job in jobs:
            batch.save(JobModel(**new_job_values(job)))
    return [j.job_id for j in jobs]


def race(target: Callable[[], None], threads: int) -> None:
    """Run ``target`` on ``threads`` real threads at once, until all are done
    (each thread reports its own failures: an exception here is lost)."""
    running = [threading.Thread(target=target) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
