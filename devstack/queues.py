"""Drives a Chalice ``@app.on_sqs_message`` function from a queue, as the
Lambda event source mapping does on AWS (chalice local runs none)."""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import boto3

log = logging.getLogger("devstack")


class QueueConsumer(threading.Thread):
    def __init__(self, name: str, queue_url: str, handler, stop: threading.Event, *,
                 endpoint_url: str, region: str = "us-east-1", batch_size: int = 10) -> None:
        super().__init__(name=f"sqs-{name}", daemon=True)
        self._url, self._handler, self._halt, self._batch = queue_url, handler, stop, batch_size
        self._sqs = boto3.session.Session().client("sqs", endpoint_url=endpoint_url,
                                                   region_name=region)
        self._arn = self._sqs.get_queue_attributes(
            QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    def _receive(self) -> list[dict]:
        return self._sqs.receive_message(QueueUrl=self._url, MaxNumberOfMessages=self._batch,
                                         WaitTimeSeconds=1).get("Messages", [])

    def _event(self, messages: list[dict]) -> dict:
        return {"Records": [{
            "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
            "body": m["Body"], "attributes": m.get("Attributes", {}),
            "messageAttributes": {}, "eventSource": "aws:sqs",
            "eventSourceARN": self._arn, "awsRegion": "us-east-1"} for m in messages]}

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                messages = self._receive()
            except Exception:  # noqa: BLE001 - the stack is shutting down, or moto hiccuped
                if not self._halt.wait(0.5):
                    log.exception("receiving from %s failed", self.name)
                continue
            if not messages:
                continue
            try:
                response = self._handler(self._event(messages), None)
            except Exception:  # noqa: BLE001 - like Lambda: the batch becomes visible again
                log.exception("%s failed; the messages will be retried", self.name)
                continue
            # ReportBatchItemFailures: the messages it names are received again
            failed = {f["itemIdentifier"] for f in (response or {}).get("batchItemFailures", [])}
            done = [m for m in messages if m["MessageId"] not in failed]
            if done:
                self._sqs.delete_message_batch(QueueUrl=self._url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(done)])


class ConcurrentQueueConsumer(QueueConsumer):
    """One message an invocation, up to ``workers`` at once, as Lambda runs a
    batch-size-1 function concurrently: a message whose handling hangs (a
    webhook endpoint that never answers, until its 10 s timeout) holds one
    worker, never the others' messages."""

    def __init__(self, name: str, queue_url: str, handler, stop: threading.Event, *,
                 endpoint_url: str, region: str = "us-east-1", workers: int = 8) -> None:
        super().__init__(name, queue_url, handler, stop, endpoint_url=endpoint_url,
                         region=region, batch_size=1)
        self._free = threading.Semaphore(workers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"sqs-{name}")

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                if not self._free.acquire(timeout=0.5):
                    continue
                try:
                    messages = self._receive()
                except Exception:  # noqa: BLE001 - shutting down, or moto hiccuped
                    self._free.release()
                    if not self._halt.wait(0.5):
                        log.exception("receiving from %s failed", self.name)
                    continue
                if not messages:
                    self._free.release()
                    continue
                self._pool.submit(self._one, messages[0])
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, message: dict) -> None:
        try:
            response = self._handler(self._event([message]), None)
            failed = (response or {}).get("batchItemFailures", [])
            if not failed:
                self._sqs.delete_message(QueueUrl=self._url,
                                         ReceiptHandle=message["ReceiptHandle"])
        except Exception:  # noqa: BLE001 - like Lambda: the message becomes visible again
            log.exception("%s failed; the message will be retried", self.name)
        finally:
            self._free.release()
