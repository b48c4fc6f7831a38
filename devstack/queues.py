"""Drives a Chalice ``@app.on_sqs_message`` function from a queue, as the
Lambda event source mapping does on AWS (chalice local runs none)."""
from __future__ import annotations

import logging
import threading

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

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=self._url, MaxNumberOfMessages=self._batch,
                    WaitTimeSeconds=1).get("Messages", [])
            except Exception:  # noqa: BLE001 - the stack is shutting down, or moto hiccuped
                if not self._halt.wait(0.5):
                    log.exception("receiving from %s failed", self.name)
                continue
            if not messages:
                continue
            event = {"Records": [{
                "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"], "attributes": m.get("Attributes", {}),
                "messageAttributes": {}, "eventSource": "aws:sqs",
                "eventSourceARN": self._arn, "awsRegion": "us-east-1"} for m in messages]}
            try:
                response = self._handler(event, None)
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
