"""Helpers for service tests: request counting and direct placement."""
from __future__ import annotations

import contextlib
import json

import botocore.client

from chalicelib.domain.clock import utcnow


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


def place(services, job_id: str, nodes: list[str]) -> dict[str, str]:
    """Write an attempt directly, as the placer of the next issue will."""
    job = services.store.get(job_id)
    inboxes = {n: services.jobs.inbox.ensure(n) for n in nodes}
    placement = [{"rank": i, "node_id": n} for i, n in enumerate(nodes)]
    services.store.place(job, placement, inboxes, utcnow())
    return inboxes


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
