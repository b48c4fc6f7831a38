"""The Webhooks port on DynamoDB (service/ports.WebhookStore): a tenant's
webhooks with their count, and each webhook's deliveries log.

One table, generic keys (models.WebhookModel). A webhook is put in one
transaction with its tenant's counter, conditioned on the count being under
the limit: two racing creates cannot both take the 20th place, and no
webhook is written without its count (none half-written). A delete takes it
back in the same way. The deliveries log is keyed ``<at>#<event>#<attempt>``
under ``D#<webhook id>``: newest first is a backwards Query, and a page
resumes after the last key it returned (keyset: records written while a
client pages sort before it, never into a page already read).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from pynamodb.exceptions import TransactWriteError

from ..domain.clock import iso, parse_iso
from ..domain.webhooks import DISABLED, ENABLED, Delivery, Webhook
from .dynamo import Changes, ConditionFailed, Dynamo, Table
from .dynamo_errors import tx_lost
from .models import WebhookModel

WEBHOOKS = Table(WebhookModel)
_COUNT = "COUNT"
#: a delivery's record is kept this long
DELIVERY_TTL = timedelta(days=30)


def _tenant_pk(tenant: str) -> str:
    return f"T#{tenant}"


def _webhook_sk(webhook_id: str) -> str:
    return f"W#{webhook_id}"


def _log_pk(webhook_id: str) -> str:
    return f"D#{webhook_id}"


def delivery_key(d: Delivery) -> str:
    """The sort key of a delivery's record: time first (newest last)."""
    return f"{iso(d.at)}#{d.event_id}#{d.attempt:04d}#{d.note or ''}"


def _opt_time(s: str | None) -> datetime | None:
    return None if s is None else parse_iso(s)


def webhook_from_item(item: dict) -> Webhook:
    v = WEBHOOKS.values(item)
    return Webhook(webhook_id=v["webhook_id"], tenant=v["tenant"], url=v["url"],
                   types=tuple(v["types"] or ()), description=v["description"],
                   state=v["state"], created_at=parse_iso(v["created_at"]), secret=v["secret"],
                   failing_since=_opt_time(v["failing_since"]),
                   disabled_at=_opt_time(v["disabled_at"]))


def delivery_from_item(item: dict) -> Delivery:
    v = WEBHOOKS.values(item)
    return Delivery(event_id=v["event_id"], attempt=int(v["attempt"]), at=parse_iso(v["at"]),
                    status_code=None if v["status_code"] is None else int(v["status_code"]),
                    error=v["error"], next_retry_at=_opt_time(v["next_retry_at"]),
                    note=v["note"])


class DynamoWebhookStore:
    """``DynamoWebhookStore(Dynamo(connection))``."""

    def __init__(self, dynamo: Dynamo) -> None:
        self._dynamo = dynamo

    # -- webhooks ---------------------------------------------------------------
    def create(self, webhook: Webhook, limit: int) -> bool:
        """Put ``webhook`` and count it, in one transaction; False (nothing
        written) when its tenant has ``limit`` webhooks already."""
        item = WEBHOOKS.item(dict(
            pk=_tenant_pk(webhook.tenant), sk=_webhook_sk(webhook.webhook_id),
            webhook_id=webhook.webhook_id, tenant=webhook.tenant, url=webhook.url,
            types=list(webhook.types), description=webhook.description, state=webhook.state,
            created_at=iso(webhook.created_at), secret=webhook.secret))
        count = Changes(WEBHOOKS).add("held", 1).update(
            WEBHOOKS.key(_tenant_pk(webhook.tenant), _COUNT),
            condition="attribute_not_exists(#held) OR #held < :limit",
            values={":limit": {"N": str(limit)}})
        try:
            with self._dynamo.transaction() as tx:
                tx.update(count)
                tx.put(WEBHOOKS.put_new(item))
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    def get(self, tenant: str, webhook_id: str) -> Webhook | None:
        item = self._dynamo.get(WEBHOOKS.get(WEBHOOKS.key(_tenant_pk(tenant),
                                                          _webhook_sk(webhook_id))))
        return webhook_from_item(item) if item else None

    def webhooks_of(self, tenant: str) -> list[Webhook]:
        """The tenant's webhooks, oldest first (at most the limit: one page)."""
        request = WEBHOOKS.query(None, "#pk = :pk AND begins_with(#sk, :w)",
                                 {":pk": {"S": _tenant_pk(tenant)}, ":w": {"S": "W#"}},
                                 consistent=True)
        found = [webhook_from_item(i) for page in self._dynamo.pages(request) for i in page]
        return sorted(found, key=lambda w: (w.created_at, w.webhook_id))

    def delete(self, tenant: str, webhook_id: str) -> bool:
        """Delete it and count it out, in one transaction; False: no such webhook."""
        key = WEBHOOKS.key(_tenant_pk(tenant), _webhook_sk(webhook_id))
        delete = WEBHOOKS.check(key, "attribute_exists(#pk)")
        try:
            with self._dynamo.transaction() as tx:
                tx.delete(delete)
                tx.update(Changes(WEBHOOKS).add("held", -1).update(
                    WEBHOOKS.key(_tenant_pk(tenant), _COUNT)))
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    # -- what deliveries learn of the endpoint -------------------------------------
    def failed(self, tenant: str, webhook_id: str, at: datetime) -> datetime | None:
        """Record a failure: the endpoint's first failure since its last
        success, kept (returned); None: the webhook is gone."""
        try:
            answer = self._dynamo.update(WEBHOOKS.update(
                WEBHOOKS.key(_tenant_pk(tenant), _webhook_sk(webhook_id)),
                "SET #failing_since = if_not_exists(#failing_since, :at)",
                condition="attribute_exists(#pk)", values={":at": {"S": iso(at)}},
                return_new=True))
        except ConditionFailed:
            return None
        return _opt_time(WEBHOOKS.values(answer["Attributes"])["failing_since"])

    def succeeded(self, tenant: str, webhook_id: str) -> None:
        """A success: the endpoint is no longer failing."""
        try:
            self._dynamo.update(WEBHOOKS.update(
                WEBHOOKS.key(_tenant_pk(tenant), _webhook_sk(webhook_id)),
                "REMOVE #failing_since",
                condition="attribute_exists(#pk) AND attribute_exists(#failing_since)"))
        except ConditionFailed:
            pass  # gone, or not failing: nothing to clear

    def disable(self, tenant: str, webhook_id: str, at: datetime) -> bool:
        """enabled -> disabled; False: it was not enabled (or is gone)."""
        changes = Changes(WEBHOOKS).set("state", DISABLED).set("disabled_at", iso(at))
        try:
            self._dynamo.update(changes.update(
                WEBHOOKS.key(_tenant_pk(tenant), _webhook_sk(webhook_id)),
                condition="#state = :enabled", values={":enabled": {"S": ENABLED}}))
        except ConditionFailed:
            return False
        return True

    # -- the deliveries log ---------------------------------------------------------
    def record(self, webhook_id: str, delivery: Delivery) -> None:
        """Add one record to the webhook's deliveries log (kept 30 days)."""
        self._dynamo.put(WEBHOOKS.put(WEBHOOKS.item(dict(
            pk=_log_pk(webhook_id), sk=delivery_key(delivery), event_id=delivery.event_id,
            attempt=delivery.attempt, at=iso(delivery.at), status_code=delivery.status_code,
            error=delivery.error, next_retry_at=None if delivery.next_retry_at is None
            else iso(delivery.next_retry_at), note=delivery.note,
            ttl_epoch=int((delivery.at + DELIVERY_TTL).timestamp())))))

    def deliveries(self, webhook_id: str, page_size: int,
                   after: str | None) -> tuple[list[Delivery], str | None]:
        """Up to ``page_size`` records, newest first, after the key ``after``;
        and the key to resume after (None: no more)."""
        values = {":pk": {"S": _log_pk(webhook_id)}}
        condition = "#pk = :pk"
        if after is not None:
            condition += " AND #sk < :after"
            values[":after"] = {"S": after}
        answer = self._dynamo.query(WEBHOOKS.query(None, condition, values,
                                                   limit=page_size + 1, forward=False,
                                                   consistent=True))
        items = answer.get("Items", [])
        more = len(items) > page_size
        items = items[:page_size]
        last = items[-1]["sk"]["S"] if more and items else None
        return [delivery_from_item(i) for i in items], last
