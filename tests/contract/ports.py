"""The ports the contract suite drives: one implementation of every port
(:class:`Ports`), the in-memory fakes (:func:`fake_ports`) or the real
adapters on moto (:func:`real_ports`), by :data:`IMPLEMENTATIONS`."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import pytest

from chalicelib.domain.clock import utcnow
from chalicelib.domain.health import initial_health
from chalicelib.domain.ids import new_job_id
from chalicelib.domain.intents import launch_intent
from chalicelib.domain.jobs import Job
from chalicelib.domain.placement import Plan
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.states import JobState


@dataclass
class Ports:
    """One implementation of every port, and what a test needs to drive it."""
    kind: str
    store: Any
    nodes: Any
    beats: Any
    collector: Any
    inbox: Any
    #: every message waiting in a queue, removed as read
    drain: Callable[[str], list[dict]]
    #: the tenants' event feeds (FeedLog) over the same job stories
    feeds: Any = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    # -- fresh names: tests on the shared stack see only their own -------------
    def tenant(self, n: int = 0) -> str:
        return f"t{n}-{self.tag}"

    def gpu_type(self, n: int = 0) -> str:
        return f"gpu{n}-{self.tag}"

    def node_id(self, n: int = 0) -> str:
        return f"n{n}-{self.tag}"

    # -- building blocks -----------------------------------------------------
    def job(self, tenant: str | None = None, *, ranks: int = 2, gpus_per_rank: int = 1,
            gpu_type: str | None = None, priority: int = 0, **spec) -> Job:
        now = utcnow()
        body = {"command": ["python", "train.py"], "ranks": ranks,
                "gpus_per_rank": gpus_per_rank, "priority": priority,
                "gpu_type": gpu_type or self.gpu_type(), **spec}
        parsed = JobSpec.parse(body)
        return Job(job_id=new_job_id(), tenant=tenant or self.tenant(), state=JobState.PENDING,
                   spec=parsed, created_at=now, updated_at=now, name="contract",
                   health=initial_health(parsed, 60.0))

    def created(self, **kw) -> Job:
        job = self.job(**kw)
        self.store.create(job, None)
        return job

    def node(self, n: int = 0, *, gpus: int = 8, gpu_type: str | None = None,
             now=None):
        node_id = self.node_id(n)
        url = self.inbox.ensure(node_id)
        return self.nodes.register(node_id, gpus=gpus, gpu_type=gpu_type or self.gpu_type(),
                                   labels={"zone": "a"}, address=f"10.0.0.{n}",
                                   inbox_queue_url=url, now=now or utcnow(),
                                   current=self.nodes.get(node_id))

    def place(self, job: Job, by_node: dict[str, list[int]], *, now=None, resend_at=None):
        """Place ``job`` on these (registered) nodes; returns (job, intent)."""
        now = now or utcnow()
        plan = Plan(by_node, job.spec.gpus_per_rank)
        inboxes = {n: self.nodes.get(n).inbox_queue_url for n in by_node}
        intent = launch_intent(job, job.attempt + 1, by_node, inboxes, "10.0.0.1", 29500)
        placed = self.store.place(job, plan, intent, now, resend_at or now + timedelta(
            seconds=30), {n: self.nodes.get(n).gpu_type for n in by_node})
        return placed, intent

    def running(self, ranks: int = 2, **kw) -> tuple[Job, Any]:
        """A RUNNING job on one fresh node; returns (job, attempt)."""
        self.node(0)
        job = self.created(ranks=ranks, **kw)
        job, _ = self.place(job, {self.node_id(0): list(range(ranks))})
        job = self.store.start(job, utcnow())
        return job, self.store.attempt(job.job_id, job.attempt)


def fake_ports() -> Ports:
    from tests.fakes import World

    w = World()
    from tests.fakes import FakeFeeds

    return Ports("fake", w.store, w.nodes, w.beats, w.collector, w.inbox, w.inbox.drain,
                 FakeFeeds(w.tables))


def real_ports(env: dict) -> Ports:
    import boto3

    from chalicelib.adapters import models
    from chalicelib.adapters.dynamo import Dynamo
    from chalicelib.adapters.heartbeat_store import DynamoCollectorStore, DynamoHeartbeatStore
    from chalicelib.adapters.inbox import SqsInbox
    from chalicelib.adapters.node_store import DynamoNodeStore
    from chalicelib.adapters.store import DynamoStore
    from chalicelib.config import Config

    config = Config.from_env(env)
    connection = models.bind(config)
    sqs = boto3.client("sqs", endpoint_url=env["GPUJOBS_AWS_ENDPOINT_URL"],
                       region_name="us-east-1")

    def drain(url: str) -> list[dict]:
        out = []
        while msgs := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                          WaitTimeSeconds=0).get("Messages"):
            for m in msgs:
                out.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return out

    from chalicelib.adapters.feed_store import DynamoFeeds

    return Ports("dynamo", DynamoStore(Dynamo(connection)), DynamoNodeStore(connection),
                 DynamoHeartbeatStore(connection), DynamoCollectorStore(connection), SqsInbox(config),
                 drain, DynamoFeeds(Dynamo(connection)))


IMPLEMENTATIONS = ["fake", pytest.param("dynamo", marks=pytest.mark.moto)]
