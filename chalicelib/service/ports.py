"""The small interfaces the services need. Adapters implement them; tests may
substitute fakes (for example an inbox whose sends fail)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from ..domain.jobs import Intent, Job


@dataclass(frozen=True)
class IdemClaim:
    idem_id: str
    body_hash: str


@dataclass(frozen=True)
class IdemRecord:
    idem_id: str
    job_id: str
    body_hash: str
    expires_at: datetime | None


class IdempotencyConflict(Exception):
    """The key is taken. ``record`` is what holds it, or None when the holder
    cannot be seen yet (a concurrent transaction on the same key)."""

    def __init__(self, record: IdemRecord | None) -> None:
        super().__init__("idempotency key is taken")
        self.record = record


class StateChanged(Exception):
    """A conditional write lost: the job is no longer in the state it left."""


@dataclass(frozen=True)
class OutboxEntry:
    intent: Intent
    #: nodes that have not acknowledged yet
    unacked: frozenset[str]
    due_at: datetime
    sends: int


class JobStore(Protocol):
    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None) -> None: ...
    def get(self, job_id: str) -> Job | None: ...
    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[Job], str | None]: ...
    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job: ...
    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job: ...
    def place(self, job: Job, placement: list[dict], inboxes: dict[str, str],
              now: datetime) -> Job: ...
    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]: ...
    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None: ...
    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None: ...
    def attempts(self, job_id: str) -> list[dict]: ...
    def ping(self) -> None: ...


class Inbox(Protocol):
    def send(self, queue_url: str, message: dict) -> None: ...
    def ensure(self, node_id: str) -> str: ...
