"""Webhook deliveries' adapters: the SQS queue (service/ports.WebhookQueue)
and the POST itself (service/ports.Poster) through urllib3 (in the Lambda
bundle through botocore).

The POST connects to the address the URL rule checked, never resolving the
host again (DNS rebinding cannot move it to a private address between check
and connection), sends the host's name in ``Host`` and, for https, in SNI and
the certificate check; it follows no redirect and gives up after 10 s.
"""
from __future__ import annotations

import json
from typing import Mapping
from urllib.parse import urlsplit

import urllib3

from ..domain.webhooks import Target
from .inbox import SqsInbox

#: the most of an answer's body read (and thrown away)
_READ_BYTES = 64 * 1024


class SqsWebhookQueue:
    def __init__(self, url: str, inbox: SqsInbox) -> None:
        self._url, self._inbox = url, inbox  # the inbox's client, made on first send

    def send(self, message: dict, delay_s: int = 0) -> None:
        self._inbox.client.send_message(
            QueueUrl=self._url, MessageBody=json.dumps(message, separators=(",", ":")),
            DelaySeconds=max(0, min(900, int(delay_s))))

    def send_many(self, messages: list[dict]) -> None:
        """Each message, ten to a request; raises when any was not taken
        (the caller sends them all again: at least once)."""
        client = self._inbox.client
        for at in range(0, len(messages), 10):
            answer = client.send_message_batch(QueueUrl=self._url, Entries=[
                {"Id": str(i), "MessageBody": json.dumps(m, separators=(",", ":"))}
                for i, m in enumerate(messages[at:at + 10])])
            if answer.get("Failed"):
                raise RuntimeError(f"{len(answer['Failed'])} webhook deliveries were not "
                                   f"queued: {answer['Failed'][0]}")


class Urllib3Poster:
    def __init__(self, ca_certs: str | None = None) -> None:
        """``ca_certs``: a CA bundle to trust instead of the system's (tests)."""
        self._ca_certs = ca_certs

    def post(self, target: Target, headers: Mapping[str, str], body: bytes,
             timeout_s: float) -> int:
        parts = urlsplit(target.url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if target.scheme == "https" else 80
        host = f"[{target.host}]" if ":" in target.host else target.host
        sent = {**headers, "host": host if target.port == default else f"{host}:{target.port}",
                "user-agent": "gpujobs-webhooks/1"}
        timeout = urllib3.Timeout(total=timeout_s)
        pool: urllib3.HTTPConnectionPool
        if target.scheme == "https":
            pool = urllib3.HTTPSConnectionPool(
                target.addresses[0], target.port, timeout=timeout, retries=False, maxsize=1,
                server_hostname=target.host, assert_hostname=target.host,
                cert_reqs="CERT_REQUIRED", ca_certs=self._ca_certs)
        else:
            pool = urllib3.HTTPConnectionPool(target.addresses[0], target.port,
                                              timeout=timeout, retries=False, maxsize=1)
        try:
            response = pool.urlopen("POST", path, body=body, headers=sent, redirect=False,
                                    retries=False, preload_content=False, assert_same_host=False)
            try:
                response.read(_READ_BYTES)
            finally:
                response.release_conn()
            return response.status
        finally:
            pool.close()
