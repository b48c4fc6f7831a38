"""The JobStore port on DynamoDB, through PynamoDB.

Every state transition is a conditional write on the state it leaves.
Creating a job under an idempotency key is one TransactWriteItems: the key's
record (condition: absent) and the job go in together or not at all.
"""
from __future__ import annotations

import dataclasses
import functools
from datetime import datetime, timedelta

from pynamodb.connection import Connection
from pynamodb.constants import ALL_OLD
from pynamodb.exceptions import (DoesNotExist, PynamoDBException, TransactWriteError,
                                 UpdateError)
from pynamodb.transactions import TransactWrite

from ..domain import idempotency
from ..domain.clock import iso, parse_iso
from ..domain.errors import ServiceUnavailable
from ..domain.jobs import Intent, Job
from ..domain.states import PLACED, JobState
from ..service.ports import (IdemClaim, IdempotencyConflict, IdemRecord, OutboxEntry,
                             StateChanged)
from .models import AttemptModel, IdempotencyModel, JobModel, OutboxModel

#: a filtered page reads at most this many DynamoDB pages before it returns
MAX_READS_PER_PAGE = 5
#: TTL removes finished records this long after they expired
TTL_SLACK = timedelta(days=7)
_CONFLICT = "ConditionalCheckFailedException"


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def job_from_model(m: JobModel) -> Job:
    return Job(
        job_id=m.job_id, tenant=m.tenant, state=JobState(m.state), spec=m.spec,
        created_at=parse_iso(m.created_at), updated_at=parse_iso(m.updated_at),
        name=m.name, attempt=int(m.attempt or 0), started_at=_t(m.started_at),
        finished_at=_t(m.finished_at), cancel_requested_at=_t(m.cancel_requested_at),
        cancel_reason=m.cancel_reason, health=m.health or {}, exit=m.exit,
        idem_id=m.idem_id, inboxes=m.inboxes or {},
    )


def job_to_model(j: Job) -> JobModel:
    return JobModel(
        j.job_id, tenant=j.tenant, state=j.state.value,
        active_state=None if j.state.terminal else j.state.value,
        name=j.name, spec=j.spec, attempt=j.attempt, created_at=iso(j.created_at),
        updated_at=iso(j.updated_at), started_at=j.started_at and iso(j.started_at),
        finished_at=j.finished_at and iso(j.finished_at),
        cancel_requested_at=j.cancel_requested_at and iso(j.cancel_requested_at),
        cancel_reason=j.cancel_reason, health=j.health, exit=j.exit, idem_id=j.idem_id,
        inboxes=j.inboxes or None,
    )


def _record_from_raw(raw: dict) -> IdemRecord:
    m = IdempotencyModel.from_raw_data(raw)
    return IdemRecord(m.idem_id, m.job_id, m.body_hash, _t(m.expires_at))


def _lost_condition(e: Exception) -> bool:
    return getattr(e, "cause_response_code", None) == _CONFLICT


def _tx_lost(e: TransactWriteError) -> bool:
    """A transaction lost to a condition or to a concurrent transaction."""
    codes = {r.code for r in (e.cancellation_reasons or []) if r is not None}
    return bool(codes & {"ConditionalCheckFailed", "TransactionConflict"})


_TRANSIENT = {"ProvisionedThroughputExceededException", "ThrottlingException",
              "RequestLimitExceeded", "InternalServerError", "ServiceUnavailable"}


def _transient_as_unavailable(fn):
    """Throttling and unreachable storage become 503 + Retry-After: retry, not a bug."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PynamoDBException as e:
            code = e.cause_response_code
            if code in _TRANSIENT or (code is None and not isinstance(e, DoesNotExist)):
                raise ServiceUnavailable("storage is busy or unreachable; retry",
                                         headers={"Retry-After": "1"}) from e
            raise
    return wrapper


class _Translating(type):
    def __new__(mcs, name, bases, ns):
        for k, v in list(ns.items()):
            if callable(v) and not k.startswith("_"):
                ns[k] = _transient_as_unavailable(v)
        return super().__new__(mcs, name, bases, ns)


class DynamoJobStore(metaclass=_Translating):
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    # -- create and read -------------------------------------------------
    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None) -> None:
        if claim is None:
            # one conditional put; a ULID collision is not a case to handle
            job_to_model(job).save(condition=JobModel.job_id.does_not_exist())
            return
        job = dataclasses.replace(job, idem_id=claim.idem_id)
        record = IdempotencyModel(claim.idem_id, job_id=job.job_id,
                                  body_hash=claim.body_hash, created_at=iso(job.created_at))
        if reclaim is None:
            condition = IdempotencyModel.idem_id.does_not_exist()
        else:  # take over an expired key, exactly as it was read
            condition = ((IdempotencyModel.job_id == reclaim.job_id)
                         & (IdempotencyModel.expires_at == iso(reclaim.expires_at)))
        try:
            with TransactWrite(connection=self._conn) as tx:
                tx.save(record, condition=condition, return_values=ALL_OLD)
                tx.save(job_to_model(job), condition=JobModel.job_id.does_not_exist())
        except TransactWriteError as e:
            reasons = e.cancellation_reasons or []
            first = reasons[0] if reasons else None
            if first is not None and first.code == "ConditionalCheckFailed":
                raise IdempotencyConflict(
                    _record_from_raw(first.raw_item) if first.raw_item else None) from None
            if _tx_lost(e) or e.cause_response_code == "TransactionInProgressException":
                # another transaction holds the key right now
                raise IdempotencyConflict(None) from None
            raise

    def get(self, job_id: str) -> Job | None:
        try:
            return job_from_model(JobModel.get(job_id, consistent_read=True))
        except DoesNotExist:
            return None

    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[Job], str | None]:
        """Up to ``page_size`` jobs of ``tenant`` older than ``after``, newest
        first, and the key to resume after (None when nothing is left).

        Each read asks for one item more than still needed, so an unfiltered
        page is one Query that also tells whether anything follows. With a
        filter, DynamoDB applies Limit before filtering; the page keeps reading
        up to MAX_READS_PER_PAGE times, then returns what it has and resumes
        where DynamoDB stopped.
        """
        jobs: list[Job] = []
        start = {"job_id": {"S": after}, "tenant": {"S": tenant}} if after else None
        condition = (JobModel.state == state) if state else None
        for _ in range(MAX_READS_PER_PAGE):
            pages = JobModel.by_tenant.query(
                tenant, filter_condition=condition, scan_index_forward=False,
                page_size=page_size + 1 - len(jobs), last_evaluated_key=start).page_iter
            raw = next(pages)
            jobs.extend(job_from_model(JobModel.from_raw_data(i)) for i in raw["Items"])
            start = pages.last_evaluated_key
            if len(jobs) > page_size:
                jobs = jobs[:page_size]
                return jobs, jobs[-1].job_id
            if start is None:
                return jobs, None
        return jobs, start["job_id"]["S"]

    # -- transitions ------------------------------------------------------
    def _finish_actions(self, job: Job, now: datetime) -> list:
        return [JobModel.finished_at.set(iso(now)), JobModel.active_state.remove()]

    def _expire_key(self, tx: TransactWrite, job: Job, now: datetime) -> None:
        """The idempotency key of a finished job expires RETENTION after it."""
        until = idempotency.expires_at(now)
        tx.update(IdempotencyModel(job.idem_id), actions=[
            IdempotencyModel.expires_at.set(iso(until)),
            IdempotencyModel.ttl_epoch.set(int((until + TTL_SLACK).timestamp())),
        ], condition=IdempotencyModel.job_id == job.job_id)

    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job:
        exit_ = {"reason": "cancelled", "exit_code": None}
        actions = [
            JobModel.state.set(JobState.CANCELLED.value),
            JobModel.cancel_requested_at.set(iso(now)),
            JobModel.updated_at.set(iso(now)),
            JobModel.exit.set(exit_),
            *self._finish_actions(job, now),
        ]
        if reason is not None:
            actions.append(JobModel.cancel_reason.set(reason))
        condition = JobModel.state == JobState.PENDING.value
        try:
            if job.idem_id is None:
                m = JobModel(job.job_id)
                m.update(actions=actions, condition=condition)
                return job_from_model(m)
            with TransactWrite(connection=self._conn) as tx:
                tx.update(JobModel(job.job_id), actions=actions, condition=condition)
                self._expire_key(tx, job, now)
        except UpdateError as e:
            if _lost_condition(e):
                raise StateChanged(job.job_id) from None
            raise
        except TransactWriteError as e:
            if _tx_lost(e):
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, state=JobState.CANCELLED, cancel_requested_at=now,
                                   cancel_reason=reason, updated_at=now, finished_at=now,
                                   exit=exit_)

    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job:
        actions = [JobModel.cancel_requested_at.set(iso(now)), JobModel.updated_at.set(iso(now))]
        if reason is not None:
            actions.append(JobModel.cancel_reason.set(reason))
        condition = (JobModel.state.is_in(*(s.value for s in PLACED))
                     & (JobModel.attempt == job.attempt)
                     & JobModel.cancel_requested_at.does_not_exist())
        entry = OutboxModel(
            intent.job_id, intent.intent_id, attempt=intent.attempt, kind=intent.kind,
            message=intent.message, targets=intent.targets,
            unacked=set(intent.targets) or None, created_at=iso(now),
            pending="1", due_at=iso(due_at), sends=1)
        try:
            # the intent is recorded with the request, before anything is sent
            with TransactWrite(connection=self._conn) as tx:
                tx.update(JobModel(job.job_id), actions=actions, condition=condition)
                tx.save(entry, condition=OutboxModel.job_id.does_not_exist())
        except TransactWriteError as e:
            if _tx_lost(e):
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, cancel_requested_at=now, cancel_reason=reason,
                                   updated_at=now)

    def place(self, job: Job, placement: list[dict], inboxes: dict[str, str],
              now: datetime) -> Job:
        attempt = job.attempt + 1
        try:
            with TransactWrite(connection=self._conn) as tx:
                tx.update(JobModel(job.job_id), actions=[
                    JobModel.state.set(JobState.SCHEDULED.value),
                    JobModel.active_state.set(JobState.SCHEDULED.value),
                    JobModel.attempt.set(attempt),
                    JobModel.inboxes.set(inboxes),
                    JobModel.updated_at.set(iso(now)),
                ], condition=(JobModel.state == JobState.PENDING.value)
                    & (JobModel.attempt == job.attempt))
                tx.save(AttemptModel(job.job_id, attempt, state=JobState.SCHEDULED.value,
                                     placement=placement, created_at=iso(now)),
                        condition=AttemptModel.job_id.does_not_exist())
        except TransactWriteError as e:
            if _tx_lost(e):
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, state=JobState.SCHEDULED, attempt=attempt,
                                   inboxes=inboxes, updated_at=now)

    # -- outbox -----------------------------------------------------------
    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]:
        out = []
        for m in OutboxModel.by_due.query("1", OutboxModel.due_at <= iso(now), limit=limit):
            intent = Intent(m.job_id, int(m.attempt), m.kind, m.message, m.targets)
            out.append(OutboxEntry(intent, frozenset(m.unacked or ()), parse_iso(m.due_at),
                                   int(m.sends)))
        return out

    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None:
        try:
            OutboxModel(entry.intent.job_id, entry.intent.intent_id).update(
                actions=[OutboxModel.due_at.set(iso(due_at)), OutboxModel.sends.add(1)],
                condition=OutboxModel.pending.exists())
        except UpdateError as e:
            if not _lost_condition(e):
                raise  # acknowledged meanwhile: nothing to reschedule

    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None:
        m = OutboxModel(job_id, intent_id)
        try:
            m.update(actions=[OutboxModel.unacked.delete({node_id})],
                     condition=OutboxModel.job_id.exists())
        except UpdateError as e:
            if _lost_condition(e):
                return
            raise
        if not m.unacked:
            m.update(actions=[OutboxModel.pending.remove()])

    def attempts(self, job_id: str) -> list[dict]:
        return [{"attempt": int(m.attempt), "state": m.state, "placement": m.placement,
                 "created_at": parse_iso(m.created_at), "finished_at": _t(m.finished_at),
                 "exit": m.exit}
                for m in AttemptModel.query(job_id, consistent_read=True)]

    def ping(self) -> None:
        """One cheap read of each table: any failure means not ready."""
        for model, key in ((JobModel, ("job_health_probe",)),
                           (IdempotencyModel, ("health_probe",)),
                           (AttemptModel, ("job_health_probe", 0)),
                           (OutboxModel, ("job_health_probe", "health_probe"))):
            try:
                model.get(*key)
            except DoesNotExist:
                pass
