"""The Outbox port on DynamoDB: intents for agents, recorded before they are
sent and resent until every target node acknowledged (at least once, never
lost)."""
from __future__ import annotations

from datetime import datetime

from ..domain.attempts import from_runs, rank_runs
from ..domain.clock import iso, parse_iso
from ..domain.intents import Intent
from ..service.ports import OutboxEntry
from .dynamo import Changes, ConditionFailed, Table
from .jobs_table import OnDynamo
from .models import OutboxModel

OUTBOX = Table(OutboxModel)
#: the sparse index's partition of the intents not acknowledged yet
_PENDING = "1"


def outbox_item(intent: Intent, now: datetime, due_at: datetime) -> dict:
    """A new intent's item, due at ``due_at`` (its first send counted)."""
    return OUTBOX.item(dict(
        job_id=intent.job_id, intent_id=intent.intent_id, attempt=intent.attempt,
        kind=intent.kind, message=intent.message, targets=intent.targets,
        node_ranks={n: rank_runs(r) for n, r in intent.node_ranks.items()} or None,
        unacked=set(intent.targets) or None,
        created_at=iso(now), pending=_PENDING if intent.targets else None,
        due_at=iso(due_at), sends=1))


def retire(job_id: str, intent_id: str) -> dict:
    """The update that stops resending an intent (it leaves the due index)."""
    return OUTBOX.update(OUTBOX.key(job_id, intent_id), "REMOVE #pending",
                         condition="attribute_exists(#job_id)")


class DynamoOutbox(OnDynamo):
    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]:
        request = OUTBOX.query(OutboxModel.by_due.Meta.index_name,
                               "#pending = :pending AND #due_at <= :now",
                               {":pending": {"S": _PENDING}, ":now": {"S": iso(now)}},
                               limit=limit)
        out: list[OutboxEntry] = []
        for page in self._dynamo.pages(request):
            for item in page:
                v = OUTBOX.values(item)
                intent = Intent(v["job_id"], int(v["attempt"]), v["kind"], v["message"],
                                v["targets"], {n: from_runs(r) for n, r in
                                               (v["node_ranks"] or {}).items()})
                out.append(OutboxEntry(intent, frozenset(v["unacked"] or ()),
                                       parse_iso(v["due_at"]), int(v["sends"])))
                if len(out) == limit:
                    return out
        return out

    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None:
        changes = Changes(OUTBOX).set("due_at", iso(due_at)).add("sends", 1)
        try:
            self._dynamo.update(changes.update(
                OUTBOX.key(entry.intent.job_id, entry.intent.intent_id),
                condition="attribute_exists(#pending)"))
        except ConditionFailed:
            pass  # acknowledged meanwhile: nothing to reschedule

    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None:
        key = OUTBOX.key(job_id, intent_id)
        try:
            answer = self._dynamo.update(Changes(OUTBOX).delete("unacked", {node_id}).update(
                key, condition="attribute_exists(#job_id)", return_new=True))
        except ConditionFailed:
            return
        if not OUTBOX.values(answer["Attributes"])["unacked"]:
            self._dynamo.update(OUTBOX.update(key, "REMOVE #pending"))
