"""The Inbox port on SQS: one standard queue per node, redriving to a shared DLQ."""
from __future__ import annotations

import hashlib
import json
import logging
import re

from ..config import Config
from . import aws

_NODE_RE = re.compile(r"[^A-Za-z0-9_-]")
log = logging.getLogger(__name__)


class SqsInbox:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._aws = aws.session_for(config.region, config.endpoint_url)

    @property
    def client(self):
        """The container's SQS client, made when first sent through."""
        return self._aws.client("sqs")

    def queue_name(self, node_id: str) -> str:
        """SQS names are at most 80 of [A-Za-z0-9_-]; an id that does not fit
        as it is gets a hash of itself, so two nodes never share an inbox."""
        prefix = self._config.inbox_queue_prefix
        name = prefix + node_id
        # "dlq" would name the inboxes' own dead-letter queue
        if _NODE_RE.search(node_id) or len(name) > 80 or node_id.lower() == "dlq":
            digest = hashlib.sha256(node_id.encode("utf-8")).hexdigest()[:12]
            name = f"{prefix}{_NODE_RE.sub('_', node_id)}"[:80 - 13] + "-" + digest
        return name

    def ensure(self, node_id: str) -> str:
        """Create the node's inbox if missing (CreateQueue is idempotent) and return its URL."""
        redrive = {"deadLetterTargetArn": self._config.inbox_dlq_arn, "maxReceiveCount": "10"}
        return self.client.create_queue(
            QueueName=self.queue_name(node_id),
            Attributes={"RedrivePolicy": json.dumps(redrive),
                        "VisibilityTimeout": "60",
                        "ReceiveMessageWaitTimeSeconds": "20"})["QueueUrl"]

    def is_current(self, node_id: str, url: str) -> bool:
        endpoint = self.client.meta.endpoint_url.rstrip("/")
        return url.startswith(endpoint + "/") and url.rsplit("/", 1)[-1] == \
            self.queue_name(node_id)

    def send(self, queue_url: str, message: dict) -> None:
        self.client.send_message(QueueUrl=queue_url,
                               MessageBody=json.dumps(message, separators=(",", ":")))


class SqsNudge:
    """Asks for a placement run by dropping a message on the pending queue.

    Best effort: the scheduled placement run finds the job anyway.
    """

    def __init__(self, config: Config, sqs=None) -> None:
        """``sqs``: an SQS client, or an object whose ``client`` attribute
        gives one on first use (the inbox), so no client is made before a nudge."""
        self._url = config.pending_queue_url
        self._sqs = sqs

    def __call__(self) -> None:
        if not self._url or self._sqs is None:
            return
        try:
            sqs = self._sqs.client if isinstance(self._sqs, SqsInbox) else self._sqs
            sqs.send_message(QueueUrl=self._url, MessageBody='{"type":"PLACE"}')
        except Exception:  # noqa: BLE001 - the schedule is the fallback
            log.warning("placement nudge failed; the scheduled run will place", exc_info=True)


class SqsFollowUps:
    """What follows jobs' ends, one message a job (app.py ``follow_up`` takes
    them). A send that fails raises: the end stands, and the pipelines'
    sweep follows up."""

    def __init__(self, url: str, inbox: SqsInbox) -> None:
        self._url, self._inbox = url, inbox  # the inbox's client, made on first send

    def send(self, job_id: str) -> None:
        self._inbox.client.send_message(QueueUrl=self._url,
                                        MessageBody=json.dumps({"job_id": job_id}))


class SqsScanQueue:
    """The stall scan's shards (service/scan_fanout.py), ten to a request."""

    def __init__(self, url: str, inbox: SqsInbox) -> None:
        self._url, self._inbox = url, inbox  # the inbox's client, made on first send

    def send(self, bodies: list[str]) -> None:
        for i in range(0, len(bodies), 10):
            entries = [{"Id": str(n), "MessageBody": b} for n, b in enumerate(bodies[i:i + 10])]
            failed = self._inbox.client.send_message_batch(QueueUrl=self._url,
                                                  Entries=entries).get("Failed", [])
            if failed:  # the scan fails, and the next one sends them again
                raise RuntimeError(f"{len(failed)} scan shards not sent: {failed[0]}")
