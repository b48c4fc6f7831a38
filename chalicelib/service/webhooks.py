"""Webhooks (issue 45; ../shared/API.md "Webhooks"): a tenant's webhooks, and
the delivery of its events to them, off the request path.

``fan_out`` (called by the event feed with sequenced events) only enqueues:
one message a (webhook, event) on the deliveries' queue, and raises when a
send fails (its caller retries: at least once). ``deliver`` is the queue's
consumer (app.py ``deliver_webhook``, one message at a time): it checks the
URL again (a host may resolve elsewhere now), POSTs to the address it
checked, records the attempt, and on failure sends the message back with its
``not_before`` (in hops of at most 900 s: SQS's longest delay) until the
schedule is exhausted. An endpoint failing for days (no success since) is
disabled, with a ``webhook.disabled`` record in its deliveries log.
"""
from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Sequence

from ..domain import cursor, webhooks as wh
from ..domain.clock import Clock, iso, parse_iso, plus, utcnow
from ..domain.errors import InvalidArgument, NotFound
from ..domain.ids import new_ulid
from ..domain.webhooks import Delivery, Webhook
from .ports import Poster, WebhookQueue, WebhookStore

log = logging.getLogger(__name__)
MAX_PAGE_SIZE = 100


@dataclass(frozen=True)
class Message:
    """One delivery attempt on the queue."""
    tenant: str
    webhook_id: str
    event: dict
    attempt: int = 1
    not_before: str | None = None

    def json(self) -> dict:
        return {"tenant": self.tenant, "webhook_id": self.webhook_id, "event": self.event,
                "attempt": self.attempt, "not_before": self.not_before}

    @classmethod
    def parse(cls, body: str) -> "Message":
        m = json.loads(body)
        if not (isinstance(m, dict) and isinstance(m.get("tenant"), str)
                and isinstance(m.get("webhook_id"), str) and isinstance(m.get("event"), dict)
                and isinstance(m["event"].get("id"), str)
                and isinstance(m.get("attempt"), int) and m["attempt"] >= 1):
            raise ValueError("not a webhook delivery message")
        return cls(m["tenant"], m["webhook_id"], m["event"], m["attempt"], m.get("not_before"))


def event_body(event: dict) -> str:
    """The body POSTed: the event as compact JSON (the same on every attempt)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


class WebhooksService:
    def __init__(self, store: WebhookStore, queue: WebhookQueue | None, poster: Poster, *,
                 page_token_key: bytes, allow_local: bool = False,
                 schedule: Sequence[float] = wh.RETRY_SCHEDULE_S,
                 disable_after_s: float = wh.DISABLE_AFTER_S,
                 resolver: wh.Resolver = wh.resolve, rand: Callable[[], float] = random.random,
                 clock: Clock = utcnow,
                 on_disabled: Callable[[Webhook, datetime], None] | None = None) -> None:
        """``on_disabled(webhook, at)``: told when an endpoint is disabled
        (for the event feed to record it; a failure of it is logged only)."""
        self._store, self._queue, self._poster = store, queue, poster
        self._key = page_token_key
        self._allow_local = allow_local
        self._schedule = tuple(schedule) or wh.RETRY_SCHEDULE_S
        self._disable_after_s = disable_after_s
        self._resolver, self._rand, self._clock = resolver, rand, clock
        self.on_disabled = on_disabled

    # -- the API -----------------------------------------------------------------
    def create(self, tenant: str, body: dict) -> Webhook:
        """A new webhook (its secret in the answer only); a bad URL or type,
        or a 21st webhook, is invalid_argument naming the field."""
        target = wh.check_url(body["url"], allow_local=self._allow_local,
                              resolver=self._resolver)
        types = wh.check_types(body.get("types"))
        webhook = Webhook(webhook_id="wh_" + new_ulid(), tenant=tenant, url=target.url,
                          types=types, description=body.get("description"), state=wh.ENABLED,
                          created_at=self._clock(), secret=wh.new_secret())
        if not self._store.create(webhook, wh.MAX_WEBHOOKS):
            raise wh.too_many()
        return webhook

    def webhooks_of(self, tenant: str) -> list[Webhook]:
        return self._store.webhooks_of(tenant)

    def get(self, tenant: str, webhook_id: str) -> Webhook:
        """The tenant's webhook; another tenant's is not found, like none."""
        found = self._store.get(tenant, webhook_id) if webhook_id.startswith("wh_") else None
        if found is None:
            raise NotFound(f"no webhook {webhook_id}", field="webhook_id")
        return found

    def delete(self, tenant: str, webhook_id: str) -> None:
        if not webhook_id.startswith("wh_") or not self._store.delete(tenant, webhook_id):
            raise NotFound(f"no webhook {webhook_id}", field="webhook_id")

    def deliveries(self, tenant: str, webhook_id: str, *, page_size: int = 50,
                   page_token: str | None = None) -> tuple[list[Delivery], str | None]:
        """The webhook's deliveries log, newest first, a page at a time."""
        self.get(tenant, webhook_id)
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be 1 to {MAX_PAGE_SIZE}", field="page_size")
        filter_key = f"webhook:{webhook_id}"
        after = None if page_token is None else cursor.decode(
            page_token, tenant=tenant, filter_key=filter_key, secret=self._key)
        found, last = self._store.deliveries(webhook_id, page_size, after)
        token = None if last is None else cursor.encode(
            last, tenant=tenant, filter_key=filter_key, secret=self._key)
        return found, token

    def test(self, tenant: str, webhook_id: str) -> dict:
        """Send a signed ``webhook.test`` event to this webhook (whatever
        types it asked for); the event as it will be delivered."""
        webhook = self.get(tenant, webhook_id)
        now = self._clock()
        event = {"id": "evt_" + new_ulid(), "type": wh.TEST_TYPE, "time": iso(now),
                 "job_id": None, "data": {"webhook_id": webhook.webhook_id,
                                          "text": "a test event sent on request"}}
        self._send(Message(tenant, webhook.webhook_id, event))
        return event

    # -- the feed's side -------------------------------------------------------------
    def fan_out(self, tenant: str, events: Sequence[dict]) -> None:
        """Enqueue one delivery a (enabled webhook of ``tenant`` that asked
        for the event's type, event); raises when a send fails (the caller
        retries). Never POSTs: deliveries are off the request path."""
        if not events:
            return
        hooks = [w for w in self._store.webhooks_of(tenant) if w.state == wh.ENABLED]
        messages = [Message(tenant, w.webhook_id, event).json() for event in events
                    for w in hooks if wh.matches(w.types, event.get("type", ""))]
        if not messages:
            return
        if self._queue is None:
            raise RuntimeError("no webhook queue is configured (GPUJOBS_WEBHOOK_QUEUE_URL)")
        self._queue.send_many(messages)

    def _send(self, message: Message, delay_s: int = 0) -> None:
        if self._queue is None:
            raise RuntimeError("no webhook queue is configured (GPUJOBS_WEBHOOK_QUEUE_URL)")
        self._queue.send(message.json(), delay_s)

    # -- the queue's consumer -----------------------------------------------------------
    def deliver(self, body: str) -> None:
        """One delivery attempt (or one hop of its wait). Raises only when
        recording or re-sending fails: the message is then received again."""
        m = Message.parse(body)
        now = self._clock()
        if m.not_before is not None:
            due = parse_iso(m.not_before)
            if due > now:  # a wait longer than SQS holds a message: one more hop
                self._send(m, wh.queue_delay(now, due))
                return
        webhook = self._store.get(m.tenant, m.webhook_id)
        if webhook is None or webhook.state != wh.ENABLED:
            log.info("webhook %s is gone or disabled: event %s dropped", m.webhook_id,
                     m.event.get("id"))
            return
        status, error = self._post(webhook, m.event, now)
        if wh.delivered(status):
            self._store.succeeded(m.tenant, m.webhook_id)
            self._store.record(m.webhook_id, Delivery(m.event["id"], m.attempt, now, status,
                                                      None, None))
            return
        self._failed(webhook, m, now, status, error or f"answered {status}")

    def _post(self, webhook: Webhook, event: dict, now: datetime) -> tuple[int | None, str | None]:
        try:  # the URL again, at each delivery: its host may resolve elsewhere now
            target = wh.check_url(webhook.url, allow_local=self._allow_local,
                                  resolver=self._resolver)
        except InvalidArgument as e:
            return None, f"refused: {e.detail}"
        body = event_body(event)
        headers = wh.signed_headers(webhook.secret, event["id"], now, body)
        try:
            return self._poster.post(target, headers, body.encode("utf-8"), wh.TIMEOUT_S), None
        except Exception as e:  # noqa: BLE001 - any failure to deliver is the endpoint's
            return None, f"{type(e).__name__}: {e}"[:500]

    def _failed(self, webhook: Webhook, m: Message, now: datetime, status: int | None,
                error: str) -> None:
        failing_since = self._store.failed(m.tenant, m.webhook_id, now)
        if wh.should_disable(failing_since, now, after_s=self._disable_after_s):
            self._store.record(m.webhook_id, Delivery(m.event["id"], m.attempt, now, status,
                                                      error, None))
            if self._store.disable(m.tenant, m.webhook_id, now):
                assert failing_since is not None
                self._store.record(m.webhook_id, Delivery(
                    m.event["id"], m.attempt, now, None,
                    f"{wh.DISABLED_NOTE}: failing since {iso(failing_since)} with no "
                    "success; no more deliveries until it is created again", None,
                    note=wh.DISABLED_NOTE))
                if self.on_disabled is not None:
                    try:
                        self.on_disabled(webhook, now)
                    except Exception:  # noqa: BLE001 - the disabling stands; it is logged
                        log.exception("telling of webhook %s disabled failed", m.webhook_id)
            return
        delay = wh.retry_delay(m.attempt, schedule=self._schedule, rand=self._rand)
        if delay is None:
            self._store.record(m.webhook_id, Delivery(
                m.event["id"], m.attempt, now, status,
                f"{error}; failed: no retry after {m.attempt} attempts", None))
            return
        due = plus(now, delay)
        self._store.record(m.webhook_id, Delivery(m.event["id"], m.attempt, now, status,
                                                  error, due))
        self._send(Message(m.tenant, m.webhook_id, m.event, m.attempt + 1, iso(due)),
                   wh.queue_delay(now, due))
