"""The JobStore port on DynamoDB, through PynamoDB.

Every state transition is a conditional write on the state it leaves.
Creating a job under an idempotency key is one TransactWriteItems: the key's
record (condition: absent) and the job go in together or not at all.
"""
from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta, timezone
from typing import Iterator

from pynamodb.attributes import MapAttribute
from pynamodb.connection import Connection
from pynamodb.exceptions import DoesNotExist, TransactWriteError, UpdateError
from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action

from ..domain import events as ev, idempotency
from ..domain.attempts import Attempt
from ..domain.clock import iso, parse_iso, utcnow
from ..domain.errors import ServiceUnavailable
from ..domain.fleet import Fleet, parked_partition
from ..domain.intents import LAUNCH, Intent, intent_id
from ..domain.jobs import VIEW_FIELDS, Job, JobView, clear_incident, frozen_health, view_of
from ..domain.placement import Plan, queue_key
from ..domain.states import ENDS_ATTEMPT, PLACED, Event, JobState, sources
from ..service.ports import (
    CapacityChanged,
    Contended,
    IdemClaim,
    IdempotencyConflict,
    IdemRecord,
    OutboxEntry,
    PendingLimitReached,
    StateChanged,
)
from . import written
from .dynamo_errors import lost_condition, tx_lost
from .fleet import room_bump, room_types
from .items import Codec
from .models import (
    AttemptModel,
    FleetModel,
    IdempotencyModel,
    JobModel,
    NodeModel,
    OutboxModel,
    TenantModel,
)
from .written import Transaction

#: TTL removes finished records this long after they expired
TTL_SLACK = timedelta(days=7)
#: a release that keeps losing to concurrent transactions on the summary: 503
_RELEASE_RETRIES = 5


class _Contended(Exception):
    """A transaction cancelled by a concurrent one, not by a condition."""


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


#: what a Job holds of a job's item (not its index keys, queue key or events)
_JOB = Codec(JobModel, (
    "job_id", "tenant", "state", "spec", "created_at", "updated_at", "name", "attempt",
    "started_at", "finished_at", "cancel_requested_at", "cancel_reason", "health", "exit",
    "idem_id", "inboxes", "pending_reason", "incident_key", "waiting_on"))
_STATES = {state.value: state for state in JobState}
#: what a JobView holds: the stored times are the API's text (iso) already,
#: and the spec, health and exit stay the JSON text they are stored as
_VIEW = Codec(JobModel, VIEW_FIELDS, raw_json=True)


def job_from_values(v: dict) -> Job:
    """The Job of a job item's attribute values (absent ones None)."""
    get = v.get
    return Job(
        job_id=v["job_id"], tenant=v["tenant"], state=_STATES[v["state"]], spec=v["spec"],
        created_at=parse_iso(v["created_at"]), updated_at=parse_iso(v["updated_at"]),
        name=get("name"), attempt=int(get("attempt") or 0), started_at=_t(get("started_at")),
        finished_at=_t(get("finished_at")), cancel_requested_at=_t(get("cancel_requested_at")),
        cancel_reason=get("cancel_reason"), health=get("health") or {}, exit=get("exit"),
        idem_id=get("idem_id"), inboxes=get("inboxes") or {},
        pending_reason=get("pending_reason"), incident_key=get("incident_key"),
        waiting_on=get("waiting_on"),
    )


def job_from_model(m: JobModel) -> Job:
    return job_from_values(m.attribute_values)


def job_from_item(item: dict) -> Job:
    """``job_from_model(JobModel.from_raw_data(item))`` without the model (items.py)."""
    return job_from_values(_JOB.values(item))


def tenant_state(tenant: str, state: JobState | str) -> str:
    return f"{tenant}#{getattr(state, 'value', state)}"


def _set_state(job: Job, state: JobState) -> list:
    """The actions that move a job to ``state``: its state and its list partition."""
    return [JobModel.state.set(state.value),
            JobModel.tenant_state.set(tenant_state(job.tenant, state))]


def _leaves(*events: Event):
    """The condition of a transition: the job is in a state these events leave
    (domain/states.py's table)."""
    states = sorted(s.value for s in sources(*events))
    return JobModel.state == states[0] if len(states) == 1 else JobModel.state.is_in(*states)


def _state_in(states) -> tuple[str, dict]:
    """The condition that the job is in one of ``states``, written out
    (written.py), and its values."""
    names = sorted(s.value for s in states)
    values = {f":in{i}": {"S": state} for i, state in enumerate(names)}
    if len(names) == 1:
        return "#state = :in0", values
    return f"#state IN ({', '.join(values)})", values


def _leaving(*events: Event) -> tuple[str, dict]:
    """``_leaves`` written out: the condition and its values."""
    return _state_in(sources(*events))


def _first_event(key: str) -> str:
    """Set one event of the item's map, keeping the first of a repeat (the
    written-out ``_event``; its value is ``:<key>``)."""
    return f"#events.#{key} = if_not_exists(#events.#{key}, :{key})"


def job_values(j: Job) -> dict:
    """A job's item as attribute values (the model's, or the codec's): what is
    shown of it (its view, whose fields are stored under their own names) and
    its index keys, queue key and references."""
    return {
        **view_of(j), "tenant_state": tenant_state(j.tenant, j.state),
        "active_state": None if j.state.terminal else j.state.value,
        "idem_id": j.idem_id, "inboxes": j.inboxes or None,
        "queue_key": queue_key(j.spec.get("priority", 0), j.job_id),
    }


def job_to_model(j: Job) -> JobModel:
    return JobModel(**job_values(j))


#: every attribute of a job's item, of an idempotency record, of an intent
_JOB_ITEM = Codec(JobModel)
_IDEM_ITEM = Codec(IdempotencyModel)
_OUTBOX_ITEM = Codec(OutboxModel)


def _event_value(key: str, value: dict) -> dict:
    """One event as the value of an update expression (the events map's own
    serialisation)."""
    return _JOB_ITEM.value("events", {key: value})["M"][key]


def _event(model, key: str, value: dict):
    """Set one event of the item's map, keeping the first of a repeat."""
    path = model.events[key]
    return path.set(path | value)


def _as_dict(value) -> dict:
    return value.as_dict() if isinstance(value, MapAttribute) else dict(value or {})


def attempt_from_model(m: AttemptModel) -> Attempt:
    return Attempt(
        job_id=m.job_id, attempt=int(m.attempt), state=m.state, placement=m.placement,
        node_ranks=m.node_ranks, node_gpus=m.node_gpus, world_size=int(m.world_size),
        created_at=parse_iso(m.created_at), finished_at=_t(m.finished_at), exit=m.exit,
        started=set(map(int, m.started or ())), exited=set(map(int, m.exited or ())),
        stopped=set(map(int, m.stopped or ())),
        exit_codes={int(k): int(v) for k, v in _as_dict(m.exit_codes).items()},
        released=set(m.released or ()), node_types=m.node_types or {},
    )


def _outbox_values(intent: Intent, now: datetime, due_at: datetime) -> dict:
    return dict(
        job_id=intent.job_id, intent_id=intent.intent_id, attempt=intent.attempt,
        kind=intent.kind, message=intent.message, targets=intent.targets,
        node_ranks=intent.node_ranks or None, unacked=set(intent.targets) or None,
        created_at=iso(now), pending="1" if intent.targets else None, due_at=iso(due_at),
        sends=1)


def _outbox_item(intent: Intent, now: datetime, due_at: datetime) -> OutboxModel:
    return OutboxModel(**_outbox_values(intent, now, due_at))


def _record_from_raw(raw: dict) -> IdemRecord:
    v = _IDEM_ITEM.values(raw)
    return IdemRecord(v["idem_id"], v["job_id"], v["body_hash"], _t(v["expires_at"]))


def _count_pending(tx: Transaction, tenant: str, delta: int,
                   limit: int | None = None) -> None:
    """Move the tenant's PENDING count with the transition, in its transaction;
    an increase under ``limit`` is conditioned on the count being below it."""
    condition = None
    values = {":delta": {"N": str(delta)}}
    if limit is not None:
        values[":limit"] = {"N": str(limit)}
        condition = "#pending < :limit"
        if limit > 0:  # no count yet is 0, under any limit but 0
            condition = "attribute_not_exists(#pending) OR " + condition
    tx.update_item(written.update(TenantModel, {"tenant": {"S": tenant}}, "ADD #pending :delta",
                                  condition=condition, values=values))


def new_transaction(connection: Connection) -> Transaction:
    """A transaction with its own ClientRequestToken: when botocore retries it
    after a lost answer, DynamoDB applies it once and answers the retry as it
    answered the first (moto ignores the token: the writers below also
    recognise their own write when its retry fails its condition)."""
    return Transaction(connection=connection, client_request_token=os.urandom(16).hex())


class DynamoJobStore:
    """Every conditional write that botocore may retry recognises itself: when
    a retry fails the condition its own first try made false, the writer reads
    the item back and finds its own stamp (``now``), and answers as if the
    first answer had arrived."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def _tx(self) -> Transaction:
        return new_transaction(self._conn)

    def _mine(self, job_id: str, check) -> Job | None:
        """The job as it is now, if ``check(job)`` says the lost race was our own
        earlier try; else None."""
        current = self.get(job_id)
        return current if current is not None and check(current) else None

    # -- create and read -------------------------------------------------
    @staticmethod
    def _new_job_values(job: Job) -> dict:
        """A new job's item: the job, and the first event of its story."""
        return {**job_values(job), "events": {"created": ev.event(
            "created", job.created_at, reason="submitted", tenant=job.tenant)}}

    @classmethod
    def _new_job_model(cls, job: Job) -> JobModel:
        return JobModel(**cls._new_job_values(job))

    @classmethod
    def _new_job_item(cls, job: Job, idem_id: str | None = None) -> dict:
        """A new job's item; made under a key, ``idem_id`` names the key's record."""
        values = cls._new_job_values(job)
        if idem_id is not None:
            values["idem_id"] = idem_id
        return _JOB_ITEM.item(values)

    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None, max_pending: int | None = None) -> None:
        """One transaction: the key's record (when there is a key), the job, and
        the tenant's PENDING count, conditioned on being under ``max_pending``
        (None: counted, not limited). A replay writes nothing, so it is not
        counted twice. A retry of this very transaction after a lost answer
        finds its own job and answers as the first try would."""
        record = None
        if claim is not None:
            record = _IDEM_ITEM.item({"idem_id": claim.idem_id, "job_id": job.job_id,
                                      "body_hash": claim.body_hash,
                                      "created_at": iso(job.created_at)})
        condition, values = None, None  # the key is new
        if reclaim is not None:  # take over an expired key, exactly as it was read
            values = {":job_id": {"S": reclaim.job_id}}
            if reclaim.expires_at is None:
                condition = "#job_id = :job_id AND attribute_not_exists(#expires_at)"
            else:
                condition = "#job_id = :job_id AND #expires_at = :expires_at"
                values[":expires_at"] = {"S": iso(reclaim.expires_at)}
        try:
            with self._tx() as tx:
                if record is not None:
                    tx.put_item(written.put_new(IdempotencyModel, record, return_old=True,
                                                condition=condition, values=values))
                tx.put_item(written.put_new(JobModel, self._new_job_item(
                    job, claim.idem_id if claim is not None else None)))
                _count_pending(tx, job.tenant, +1, max_pending)
        except TransactWriteError as e:
            reasons = list(e.cancellation_reasons or [])
            first = reasons[0] if reasons and record is not None else None
            counter = reasons[-1] if len(reasons) == (3 if record is not None else 2) else None
            if first is not None and first.code == "ConditionalCheckFailed":
                if first.raw_item and _record_from_raw(first.raw_item).job_id == job.job_id:
                    return  # the key holds this very job: our retried transaction
                raise IdempotencyConflict(
                    _record_from_raw(first.raw_item) if first.raw_item else None) from None
            if tx_lost(e) and self._mine(job.job_id, lambda j: j.tenant == job.tenant
                                         and j.created_at == job.created_at):
                return  # the job is there: our own transaction, retried after a lost answer
            if counter is not None and counter.code == "ConditionalCheckFailed" \
                    and max_pending is not None:
                raise PendingLimitReached(max_pending) from None
            if counter is not None and counter.code == "TransactionConflict":
                raise Contended(job.tenant) from None
            if record is not None and (
                    tx_lost(e) or e.cause_response_code == "TransactionInProgressException"):
                # another transaction holds the key right now
                raise IdempotencyConflict(None) from None
            raise

    def get(self, job_id: str) -> Job | None:
        item = self._get_item(job_id)
        return job_from_item(item) if item else None

    def view(self, job_id: str) -> JobView | None:
        """The job as it is shown (domain/jobs.py JobView), or None."""
        item = self._get_item(job_id)
        return _VIEW.values(item) if item else None  # type: ignore[return-value]

    def _get_item(self, job_id: str) -> dict | None:
        return self._conn.dispatch(
            "GetItem", written.get(JobModel, {"job_id": {"S": job_id}})).get("Item")

    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[JobView], str | None]:
        """Up to ``page_size`` jobs of ``tenant`` (in ``state``) older than
        ``after``, newest first, as they are shown (JobView), and the key to
        resume after (None when nothing is left).

        One Query, of the tenant's partition or, with a state, of the
        (tenant, state) partition, asking for one item more than the page so it
        also tells whether anything follows: a filtered page reads only jobs
        that match, however many others the tenant has. A Query stops at 1 MB
        of items (about 17 jobs of 57 KB specs): the page then holds what it
        read and resumes right after it.
        """
        if state:
            index, partition, key = JobModel.by_tenant_state.Meta.index_name, "tenant_state", \
                tenant_state(tenant, state)
        else:
            index, partition, key = JobModel.by_tenant.Meta.index_name, "tenant", tenant
        start = {"job_id": {"S": after}, partition: {"S": key}} if after else None
        raw = self._conn.dispatch("Query", written.query(
            JobModel, index, f"#{partition} = :key", {":key": {"S": key}},
            limit=page_size + 1, forward=False, start=start))
        items = raw.get("Items", [])
        if len(items) > page_size:  # the one more only says that more follow
            items = items[:page_size]
            resume_after = items[-1]["job_id"]["S"]
        else:  # DynamoDB stops a Query at 1 MB of items: resume where it stopped
            last = raw.get("LastEvaluatedKey")
            resume_after = last["job_id"]["S"] if last else None
        return [_VIEW.values(i) for i in items], resume_after  # type: ignore[misc]

    # -- transitions ------------------------------------------------------
    def _finish_actions(self, job: Job, now: datetime) -> list:
        return [JobModel.finished_at.set(iso(now)), JobModel.active_state.remove()]

    def _expire_key(self, tx: Transaction, job: Job, now: datetime) -> None:
        """The idempotency key of a finished job expires RETENTION after it."""
        until = idempotency.expires_at(now)
        tx.update_item(written.update(
            IdempotencyModel, {"idem_id": {"S": job.idem_id}},
            "SET #expires_at = :until, #ttl_epoch = :ttl", condition="#job_id = :job_id",
            values={":until": {"S": iso(until)},
                    ":ttl": {"N": str(int((until + TTL_SLACK).timestamp()))},
                    ":job_id": {"S": job.job_id}}))

    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job:
        """Cancel a job never placed: CANCELLED and finished at once, out of
        the PENDING count and the active index, its key set to expire."""
        exit_ = {"reason": "cancelled", "exit_code": None}
        state = JobState.CANCELLED
        condition, values = _leaving(Event.CANCEL_UNPLACED)
        values.update({
            ":state": {"S": state.value}, ":tenant_state": {"S": tenant_state(job.tenant, state)},
            ":now": {"S": iso(now)}, ":exit": _JOB_ITEM.value("exit", exit_),
            ":cancel_requested": _event_value("cancel_requested", ev.event(
                "cancel_requested", now, attempt=job.attempt or None, reason=reason,
                by=job.tenant)),
            ":finished": _event_value("finished", ev.event(
                "finished", now, attempt=job.attempt or None, state=state.value,
                reason="cancelled before it was placed")),
        })
        sets = ("#state = :state, #tenant_state = :tenant_state, #cancel_requested_at = :now, "
                "#updated_at = :now, #exit = :exit, #finished_at = :now, "
                f"{_first_event('cancel_requested')}, {_first_event('finished')}")
        if reason is not None:
            sets += ", #cancel_reason = :reason"
            values[":reason"] = {"S": reason}
        update = written.update(JobModel, {"job_id": {"S": job.job_id}},
                                f"SET {sets} REMOVE #pending_reason, #active_state",
                                condition=condition, values=values)
        try:
            with self._tx() as tx:
                tx.update_item(update)
                _count_pending(tx, job.tenant, -1)
                if job.idem_id is not None:
                    self._expire_key(tx, job, now)
        except TransactWriteError as e:
            if tx_lost(e):
                mine = self._mine(job.job_id, lambda j: j.state is JobState.CANCELLED
                                  and j.cancel_requested_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, state=JobState.CANCELLED, cancel_requested_at=now,
                                   cancel_reason=reason, updated_at=now, finished_at=now,
                                   exit=exit_)

    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job:
        """Record the cancel request of a placed job, with its CANCEL intent in
        the outbox, and stop resending the attempt's LAUNCH: one transaction."""
        placed, values = _state_in(PLACED)
        condition = (f"{placed} AND #attempt = :attempt "
                     "AND attribute_not_exists(#cancel_requested_at)")
        values.update({
            ":attempt": {"N": str(job.attempt)}, ":now": {"S": iso(now)},
            ":cancel_requested": _event_value("cancel_requested", ev.event(
                "cancel_requested", now, attempt=job.attempt, reason=reason,
                by=job.tenant, nodes=sorted(intent.targets)))})
        sets = f"#cancel_requested_at = :now, #updated_at = :now, {_first_event('cancel_requested')}"
        if reason is not None:
            sets += ", #cancel_reason = :reason"
            values[":reason"] = {"S": reason}
        launch = {"job_id": {"S": job.job_id}, "intent_id": {"S": intent_id(LAUNCH, job.attempt)}}
        try:
            # the intent is recorded with the request, before anything is sent;
            # and the attempt's LAUNCH is no longer resent
            with self._tx() as tx:
                tx.update_item(written.update(JobModel, {"job_id": {"S": job.job_id}},
                                              f"SET {sets}", condition=condition,
                                              values=values))
                tx.put_item(written.put_new(
                    OutboxModel, _OUTBOX_ITEM.item(_outbox_values(intent, now, due_at))))
                tx.update_item(written.update(OutboxModel, launch, "REMOVE #pending",
                                              condition="attribute_exists(#job_id)"))
        except TransactWriteError as e:
            if tx_lost(e):
                mine = self._mine(job.job_id,
                                  lambda j: j.cancel_requested_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, cancel_requested_at=now, cancel_reason=reason,
                                   updated_at=now)

    def place(self, job: Job, plan: Plan, intent: Intent, now: datetime,
              resend_at: datetime | None = None,
              node_types: dict[str, str] | None = None) -> Job:
        """Reserve every node's GPUs, move the job to SCHEDULED, write the attempt
        and its LAUNCH intent: one transaction, so all of it happens or none.

        Raises StateChanged when the job is no longer the PENDING job that was
        read (placed by another placer, or cancelled), CapacityChanged naming
        the nodes that no longer have room.
        """
        attempt = job.attempt + 1
        gpus = plan.gpus_by_node()
        key = f"{job.job_id}#{attempt}"
        nodes = sorted(gpus)
        try:
            with self._tx() as tx:
                tx.update(JobModel(job.job_id), actions=[
                    *_set_state(job, JobState.SCHEDULED),
                    JobModel.active_state.set(JobState.SCHEDULED.value),
                    JobModel.attempt.set(attempt),
                    JobModel.inboxes.set(intent.targets),
                    JobModel.pending_reason.remove(),
                    JobModel.waiting_on.remove(),
                    JobModel.health.set(clear_incident(job.health)),
                    JobModel.updated_at.set(iso(now)),
                    _event(JobModel, f"placed#{attempt}", ev.event(
                        "placed", now, attempt=attempt,
                        reason=f"placed on {len(nodes)} node{'s' if len(nodes) != 1 else ''}",
                        nodes={n: sorted(r) for n, r in plan.ranks_by_node.items()})),
                ], condition=_leaves(Event.PLACE) & (JobModel.attempt == job.attempt))
                tx.save(AttemptModel(
                    job.job_id, attempt, state=JobState.SCHEDULED.value,
                    placement=plan.placement(), node_ranks=plan.ranks_by_node,
                    node_gpus=gpus, world_size=job.spec["ranks"], created_at=iso(now),
                    node_types=node_types or None,
                    exit_codes={}), condition=AttemptModel.job_id.does_not_exist())
                tx.save(_outbox_item(intent, now, resend_at or now),
                        condition=OutboxModel.job_id.does_not_exist())
                for node_id in nodes:
                    tx.update(NodeModel(node_id), actions=[
                        NodeModel.gpus_free.add(-gpus[node_id]),
                        NodeModel.attempts.add({key}),
                    ], condition=(NodeModel.gpus_free >= gpus[node_id])
                        & (NodeModel.state == "READY"))
                _count_pending(tx, job.tenant, -1)  # last: node reasons stay at [3:]
        except TransactWriteError as e:
            reasons = list(e.cancellation_reasons or [])
            if not tx_lost(e):
                raise
            if reasons and reasons[0] is not None:
                mine = self._mine(job.job_id, lambda j: j.attempt == attempt
                                  and j.state is JobState.SCHEDULED
                                  and j.updated_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            full = [n for n, r in zip(nodes, reasons[3:3 + len(nodes)]) if r is not None]
            if not full and len(reasons) > 3 + len(nodes) and reasons[-1] is not None:
                raise Contended(job.tenant) from None
            raise CapacityChanged(full or nodes) from None
        return dataclasses.replace(job, state=JobState.SCHEDULED, attempt=attempt,
                                   inboxes=intent.targets, pending_reason=None, updated_at=now)

    def pending(self, limit: int) -> Iterator[Job]:
        """PENDING jobs, highest priority first, then oldest first, read lazily."""
        for m in JobModel.by_active_state.query(JobState.PENDING.value, limit=limit,
                                                page_size=100):
            yield job_from_model(m)

    # -- parked never-fitting jobs (domain/fleet.py) --------------------------
    def parked(self, gpu_type: str | None) -> Iterator[Job]:
        """The parked jobs of a type (None: of jobs that take any type), read lazily."""
        for m in JobModel.by_active_state.query(parked_partition(gpu_type), page_size=100):
            yield job_from_model(m)

    def park(self, job: Job, reason: str, fleet: Fleet) -> bool:
        """Move a PENDING job that can never fit ``fleet`` out of the PENDING
        partition, with its reason, if the fleet is still the generation it was
        judged against (else it stays where it is, to be judged again)."""
        unchanged: Condition = (FleetModel.generation == fleet.generation
                                if fleet.generation else FleetModel.generation.does_not_exist())
        try:
            with self._tx() as tx:
                tx.update(JobModel(job.job_id), actions=[
                    JobModel.active_state.set(parked_partition(job.spec.get("gpu_type"))),
                    JobModel.parked_generation.set(fleet.generation),
                    JobModel.pending_reason.set(reason),
                    # the job's story says why it waits, as for any pending reason
                    _event(JobModel, ev.waiting_key(job.attempt, reason),
                           ev.event("waiting", self._now(), attempt=job.attempt or None,
                                    reason=reason)),
                ], condition=(JobModel.state == JobState.PENDING.value)
                    & (JobModel.attempt == job.attempt))
                tx.condition_check(FleetModel, fleet.key, condition=unchanged)
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    def unpark(self, job: Job) -> bool:
        """Back into the PENDING partition: the fleet changed so that it may fit."""
        try:
            JobModel(job.job_id).update(actions=[
                JobModel.active_state.set(JobState.PENDING.value),
                JobModel.parked_generation.remove(),
            ], condition=(JobModel.state == JobState.PENDING.value)
                & (JobModel.attempt == job.attempt))
        except UpdateError as e:
            if lost_condition(e):
                return False
            raise
        return True

    def active(self, state: JobState, limit: int) -> list[Job]:
        return [job_from_model(m) for m in JobModel.by_active_state.query(state.value,
                                                                          limit=limit)]

    def set_pending_reason(self, job: Job, reason: str | None,
                           waiting_on: str | None = None) -> None:
        actions: list[Action] = [
            JobModel.pending_reason.set(reason) if reason else JobModel.pending_reason.remove(),
            JobModel.waiting_on.set(waiting_on) if waiting_on else JobModel.waiting_on.remove()]
        if reason:
            actions.append(_event(JobModel, ev.waiting_key(job.attempt, reason),
                                  ev.event("waiting", self._now(), attempt=job.attempt or None,
                                           reason=reason)))
        try:
            JobModel(job.job_id).update(actions=actions, condition=(
                JobModel.state == JobState.PENDING.value) & (JobModel.attempt == job.attempt))
        except UpdateError as e:
            if not lost_condition(e):
                raise

    # -- attempts -----------------------------------------------------------
    def attempt(self, job_id: str, attempt: int) -> Attempt | None:
        try:
            return attempt_from_model(AttemptModel.get(job_id, attempt, consistent_read=True))
        except DoesNotExist:
            return None

    def record_ranks(self, job_id: str, attempt: int, kind: str, ranks: list[int],
                     exit_code: int | None = None, node_id: str | None = None) -> Attempt:
        """Add ranks to the attempt's ``started``, ``exited`` or ``stopped`` set;
        adding is idempotent, so a repeated report changes nothing."""
        attr = {"started": AttemptModel.started, "exited": AttemptModel.exited,
                "stopped": AttemptModel.stopped}[kind]
        actions: list[Action] = [attr.add(set(ranks))] if ranks else []
        if kind == "exited":
            actions += [AttemptModel.exit_codes[str(r)].set(exit_code) for r in ranks]
        if ranks:
            code = exit_code if kind == "exited" else None
            actions.append(_event(AttemptModel, ev.ranks_key(kind, ranks, code), ev.rank_event(
                kind, self._now(), attempt, ranks, code, node_id)))
        m = AttemptModel(job_id, attempt)
        if not actions:
            m.refresh(consistent_read=True)
        else:
            m.update(actions=actions, condition=AttemptModel.job_id.exists())
        return attempt_from_model(m)

    def release(self, attempt: Attempt, node_id: str) -> bool:
        """Give a node back the GPUs this attempt reserved there, exactly once,
        and tell the waiting jobs of its type (the capacity summary) in the
        same transaction. A transaction that lost only to a concurrent one (on
        the shared summary item) is tried again."""
        for _ in range(_RELEASE_RETRIES):
            try:
                return self._release(attempt, node_id)
            except _Contended:
                continue
        raise ServiceUnavailable("capacity is being updated concurrently; retry",
                                 headers={"Retry-After": "1"})

    def _release(self, attempt: Attempt, node_id: str) -> bool:
        gpus = int(attempt.node_gpus.get(node_id, 0))
        now = iso(datetime.now(timezone.utc))
        try:
            with self._tx() as tx:
                for t in room_types(attempt.node_types.get(node_id)):
                    tx.update(FleetModel(t), actions=room_bump(now))
                tx.update(AttemptModel(attempt.job_id, attempt.attempt),
                          actions=[AttemptModel.released.add({node_id})],
                          condition=AttemptModel.job_id.exists()
                          & ~AttemptModel.released.contains(node_id))
                tx.update(NodeModel(node_id), actions=[
                    NodeModel.gpus_free.add(gpus),
                    NodeModel.attempts.delete({f"{attempt.job_id}#{attempt.attempt}"}),
                    NodeModel.lost.delete({f"{attempt.job_id}#{attempt.attempt}"}),
                ], condition=NodeModel.node_id.exists())
        except TransactWriteError as e:
            codes = [r.code if r is not None else None for r in e.cancellation_reasons or []]
            if "ConditionalCheckFailed" in codes:
                return False  # released before
            if "TransactionConflict" in codes:
                raise _Contended() from None
            raise
        return True

    # -- job transitions ----------------------------------------------------
    def start(self, job: Job, now: datetime) -> Job:
        """SCHEDULED -> RUNNING when the first ranks of the attempt started."""
        m = JobModel(job.job_id)
        try:
            m.update(actions=[*_set_state(job, JobState.RUNNING),
                              JobModel.active_state.set(JobState.RUNNING.value),
                              JobModel.started_at.set(iso(now)),
                              JobModel.updated_at.set(iso(now)),
                              _event(JobModel, f"started#{job.attempt}", ev.event(
                                  "started", now, attempt=job.attempt,
                                  reason="the first ranks started"))],
                     condition=_leaves(Event.STARTED) & (JobModel.attempt == job.attempt))
        except UpdateError as e:
            if lost_condition(e):
                mine = self._mine(job.job_id, lambda j: j.attempt == job.attempt
                                  and j.started_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            raise
        return job_from_model(m)

    def end_attempt(self, job: Job, attempt: Attempt, to: JobState, exit_: dict,
                    now: datetime, stop: Intent | None = None) -> Job:
        """End the current attempt: the job becomes ``to`` (terminal, or PENDING
        for a new attempt), conditioned on the placed state and attempt it
        leaves; the attempt records its end; ``stop`` (CANCEL to the nodes still
        running ranks) is recorded in the same transaction."""
        actions: list[Action] = [
            *_set_state(job, to), JobModel.updated_at.set(iso(now)),
            # nothing is judged once the attempt ended: no stale health
            JobModel.health.set(frozen_health(job.health, iso(now), to.terminal, exit_))]
        why = (exit_ or {}).get("reason")
        if to.terminal:
            actions += [JobModel.exit.set(exit_), *self._finish_actions(job, now),
                        _event(JobModel, "finished", ev.event(
                            "finished", now, attempt=attempt.attempt, state=to.value,
                            reason=why, exit_code=(exit_ or {}).get("exit_code"),
                            rank=(exit_ or {}).get("rank")))]
        else:
            actions += [JobModel.active_state.set(to.value), JobModel.inboxes.remove(),
                        _event(JobModel, f"retried#{attempt.attempt}", ev.event(
                            "retried", now, attempt=attempt.attempt, reason=why,
                            next_attempt=attempt.attempt + 1,
                            rank=(exit_ or {}).get("rank")))]
        condition = _leaves(*ENDS_ATTEMPT) & (JobModel.attempt == attempt.attempt)
        if not to.terminal:
            # a cancel recorded meanwhile wins: no new attempt for a cancelled job
            condition &= JobModel.cancel_requested_at.does_not_exist()
        try:
            with self._tx() as tx:
                tx.update(JobModel(job.job_id), actions=actions, condition=condition)
                tx.update(AttemptModel(attempt.job_id, attempt.attempt), actions=[
                    AttemptModel.state.set(to.value if to.terminal else JobState.FAILED.value),
                    AttemptModel.finished_at.set(iso(now)),
                    AttemptModel.exit.set(exit_)])
                tx.update(OutboxModel(job.job_id, intent_id(LAUNCH, attempt.attempt)),
                          actions=[OutboxModel.pending.remove()],
                          condition=OutboxModel.job_id.exists())
                if stop is not None and stop.targets:
                    tx.save(_outbox_item(stop, now, now),
                            condition=OutboxModel.job_id.does_not_exist())
                if to.terminal and job.idem_id:
                    self._expire_key(tx, job, now)
                if to is JobState.PENDING:
                    _count_pending(tx, job.tenant, +1)  # a retry is counted, never refused
        except TransactWriteError as e:
            if tx_lost(e):
                done = self.attempt(job.job_id, attempt.attempt)
                mine = self.get(job.job_id) if done is not None and \
                    done.finished_at == parse_iso(iso(now)) and done.exit == exit_ else None
                if mine is not None:
                    return mine  # our own end, retried
                raise StateChanged(job.job_id) from None
            raise
        ended = self.get(job.job_id)
        if ended is None:  # never: jobs are not deleted
            raise StateChanged(job.job_id)
        return ended

    # -- health -------------------------------------------------------------
    def record_health(self, job: Job, health: dict, *, incident_key: str | None = None) -> bool:
        """Store the scan's view of the running attempt. With ``incident_key``,
        record a new incident: conditioned on the key read before, so however
        many scans see the same stall, it is recorded once."""
        actions: list[Action] = [JobModel.health.set(health)]
        condition = ((JobModel.state == JobState.RUNNING.value)
                     & (JobModel.attempt == job.attempt))
        if incident_key is not None:
            actions.append(JobModel.incident_key.set(incident_key))
            actions.append(_event(JobModel, f"stalled#{incident_key}", ev.event(
                "stalled", self._now(), attempt=job.attempt,
                reason=f"rank {health.get('first_stalled_rank')} stalled first",
                rank=health.get("first_stalled_rank"),
                co_first=[c.get("rank") for c in health.get("co_first") or []] or None,
                suspect_node=health.get("suspect_node"))))
            condition &= (JobModel.incident_key.does_not_exist() if job.incident_key is None
                          else JobModel.incident_key == job.incident_key)
        try:
            JobModel(job.job_id).update(actions=actions, condition=condition)
            return True
        except UpdateError as e:
            if lost_condition(e):
                return False
            raise

    # -- outbox -----------------------------------------------------------
    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]:
        out = []
        for m in OutboxModel.by_due.query("1", OutboxModel.due_at <= iso(now), limit=limit):
            intent = Intent(m.job_id, int(m.attempt), m.kind, m.message, m.targets,
                            m.node_ranks or {})
            out.append(OutboxEntry(intent, frozenset(m.unacked or ()), parse_iso(m.due_at),
                                   int(m.sends)))
        return out

    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None:
        try:
            OutboxModel(entry.intent.job_id, entry.intent.intent_id).update(
                actions=[OutboxModel.due_at.set(iso(due_at)), OutboxModel.sends.add(1)],
                condition=OutboxModel.pending.exists())
        except UpdateError as e:
            if not lost_condition(e):
                raise  # acknowledged meanwhile: nothing to reschedule

    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None:
        m = OutboxModel(job_id, intent_id)
        try:
            m.update(actions=[OutboxModel.unacked.delete({node_id})],
                     condition=OutboxModel.job_id.exists())
        except UpdateError as e:
            if lost_condition(e):
                return
            raise
        if not m.unacked:
            m.update(actions=[OutboxModel.pending.remove()])

    @staticmethod
    def _now() -> datetime:
        return utcnow()

    def events(self, job_id: str) -> list[dict]:
        """The job's events and its attempts', oldest first."""
        job = JobModel.get(job_id, consistent_read=True, attributes_to_get=["events"])
        attempts = AttemptModel.query(job_id, consistent_read=True,
                                      attributes_to_get=["events"])
        return ev.timeline(_as_dict(job.events), *(_as_dict(a.events) for a in attempts))

    def attempts(self, job_id: str) -> list[dict]:
        # an attempt whose ranks started is running, though only the job's
        # state records it (the attempt's state is written when it ends)
        return [{"attempt": int(m.attempt), "placement": m.placement,
                 "state": "RUNNING" if m.state == "SCHEDULED" and m.started else m.state,
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
