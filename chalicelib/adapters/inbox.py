"""The Inbox port on SQS: one standard queue per node, redriving to a shared DLQ."""
from __future__ import annotations

import json
import re

import boto3
from botocore.config import Config as BotoConfig

from ..config import Config

_NODE_RE = re.compile(r"[^A-Za-z0-9_-]")


class SqsInbox:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._sqs = boto3.session.Session().client(
            "sqs", region_name=config.region, endpoint_url=config.endpoint_url,
            config=BotoConfig(connect_timeout=2, read_timeout=5,
                              retries={"max_attempts": 3, "mode": "standard"}))

    def queue_name(self, node_id: str) -> str:
        # SQS names: 80 characters of [A-Za-z0-9_-]
        return (self._config.inbox_queue_prefix + _NODE_RE.sub("_", node_id))[:80]

    def ensure(self, node_id: str) -> str:
        """Create the node's inbox if missing (CreateQueue is idempotent) and return its URL."""
        redrive = {"deadLetterTargetArn": self._config.inbox_dlq_arn, "maxReceiveCount": "10"}
        return self._sqs.create_queue(
            QueueName=self.queue_name(node_id),
            Attributes={"RedrivePolicy": json.dumps(redrive),
                        "VisibilityTimeout": "60",
                        "ReceiveMessageWaitTimeSeconds": "20"})["QueueUrl"]

    def send(self, queue_url: str, message: dict) -> None:
        self._sqs.send_message(QueueUrl=queue_url,
                               MessageBody=json.dumps(message, separators=(",", ":")))
