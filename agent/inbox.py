"""The node's SQS inbox: receive, delete after acting, and put back for later.

The queue URL comes from ``PUT /v1/nodes/{id}``; the client's endpoint is that
URL's ``scheme://host:port``, which is right both for AWS
(``https://sqs.<region>.amazonaws.com``) and for the local stack's moto server.
Region: AWS_REGION or AWS_DEFAULT_REGION, else us-east-1; credentials: boto3's
usual chain (environment, profile, instance role).
"""
from __future__ import annotations

import logging
import os
import queue
import random
import threading
import urllib.parse
from dataclasses import dataclass

from .backoff import retry_delay

log = logging.getLogger("gpujobs.agent.inbox")

#: what SQS answers a receive from a queue that does not exist (JSON and query protocols)
_NO_QUEUE = {"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"}


@dataclass(frozen=True)
class InboxMessage:
    body: str
    receipt_handle: str
    message_id: str = ""
    receive_count: int = 1


def endpoint_from_queue_url(queue_url: str) -> str:
    parts = urllib.parse.urlsplit(queue_url)
    if not parts.scheme or not parts.netloc:
        raise ValueError(f"not a queue URL: {queue_url!r}")
    return f"{parts.scheme}://{parts.netloc}"


class SqsInbox:
    def __init__(self, queue_url: str, *, wait_s: int = 20, region: str | None = None,
                 client=None) -> None:
        self.queue_url = queue_url
        self._wait_s = max(0, min(20, int(wait_s)))  # SQS allows 0..20
        if client is None:
            import boto3  # here, not at import: the shim and the tests of the core need no boto3
            from botocore.config import Config

            client = boto3.session.Session().client(
                "sqs", endpoint_url=endpoint_from_queue_url(queue_url),
                region_name=region or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                # the read timeout must outlast the long poll
                config=Config(connect_timeout=5, read_timeout=self._wait_s + 10,
                              retries={"max_attempts": 3, "mode": "standard"}))
        self._sqs = client
        #: the last receive was told the queue does not exist (deleted by hand):
        #: the next call-in says so (``inbox_missing``) and the server makes it again
        self.missing = False

    def receive(self, max_messages: int = 10) -> list[InboxMessage]:
        """Long-poll for up to ``wait_s`` seconds; [] when nothing arrived."""
        try:
            response = self._sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=max_messages,
                WaitTimeSeconds=self._wait_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount"])
        except Exception as e:
            code = getattr(e, "response", {}).get("Error", {}).get("Code")
            if code in _NO_QUEUE:
                self.missing = True
            raise
        self.missing = False
        return [InboxMessage(body=m.get("Body", ""), receipt_handle=m["ReceiptHandle"],
                             message_id=m.get("MessageId", ""),
                             receive_count=int(m.get("Attributes", {})
                                               .get("ApproximateReceiveCount", 1)))
                for m in response.get("Messages", [])]

    def delete(self, message: InboxMessage) -> None:
        self._sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message.receipt_handle)

    def defer(self, message: InboxMessage, seconds: int) -> None:
        """Make the message visible again in ``seconds`` (it was not acted on)."""
        self._sqs.change_message_visibility(QueueUrl=self.queue_url,
                                            ReceiptHandle=message.receipt_handle,
                                            VisibilityTimeout=max(0, min(43200, int(seconds))))


class Poller(threading.Thread):
    """Long-polls the inbox on its own thread, handing messages to the main loop.

    Why a thread: a receive holds for up to 20 s, and meanwhile the main loop must
    keep noticing rank exits and enforcing cancel grace periods. Only one batch
    is in flight: the next receive starts once the main loop has handled every
    message of the previous one (``done``), so no message waits in memory while
    its visibility timeout runs out. Receive errors are logged and retried with
    backoff; the thread ends when ``stop`` is set.

    On the way out it hands back (visibility 0) what it received but the main
    loop did not take, including what a receive still open at the stop brings,
    so the next agent gets those messages at once rather than after the
    visibility timeout. (A SIGKILLed agent cannot: its messages come back when
    their visibility timeout ends, as at-least-once delivery promises.)
    """

    def __init__(self, inbox, stop: threading.Event, *, rng: random.Random | None = None,
                 backoff_base: float = 0.5, backoff_cap: float = 30.0) -> None:
        super().__init__(name="inbox-poller", daemon=True)
        self._inbox, self._stopping = inbox, stop
        self._rng = rng or random.Random()
        self._base, self._cap = backoff_base, backoff_cap
        self._queue: "queue.Queue[InboxMessage]" = queue.Queue()

    def run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                batch = self._inbox.receive()
            except Exception as e:  # noqa: BLE001 - keep polling, say why it failed
                failures += 1
                delay = retry_delay(failures, self._base, self._cap, self._rng)
                log.warning("inbox receive failed (%s); retrying in %.1fs", e, delay)
                self._stopping.wait(delay)
                continue
            failures = 0
            for message in batch:
                self._queue.put(message)
            self._wait_until_handled()
        self._release_unhandled()

    def _release_unhandled(self) -> None:
        while True:
            try:
                message = self._queue.get_nowait()
            except queue.Empty:
                return
            try:
                self._inbox.defer(message, 0)
            except Exception as e:  # noqa: BLE001 - it comes back after its timeout anyway
                log.warning("could not hand back message %s: %s", message.message_id, e)
            self._queue.task_done()

    def _wait_until_handled(self) -> None:
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks and not self._stopping.is_set():
                self._queue.all_tasks_done.wait(0.5)

    def get(self, timeout: float) -> InboxMessage | None:
        """The next received message, or None after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def done(self) -> None:
        """The main loop finished with the message that ``get`` returned."""
        self._queue.task_done()
