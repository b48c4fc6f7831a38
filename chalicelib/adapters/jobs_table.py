"""The job's items: the tables a job's writes touch (jobs, idempotency keys,
tenants' counters), how a job is stored, and the one decoder of each shape
read back (a Job from an item; a JobView from an item).

Every request on these tables is built by :mod:`.dynamo` (``Table`` from the
PynamoDB model, which is the schema only).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator

from ..domain import events as ev, feed, idempotency
from ..domain.arrays import COUNTERS
from ..domain.clock import Clock, iso, iso_or_none, parse_iso, utcnow
from ..domain.fleet import Fleet, parked_partition
from ..domain.jobs import (
    COLUMNS,
    COUNTS,
    NUMBER,
    SET,
    SPEC,
    STATE,
    STORED_FIELDS,
    TIME,
    VIEW_FIELDS,
    Job,
    array_values,
)
from ..domain.placement import queue_key
from ..domain.spec import JobSpec
from ..domain.states import Event, JobState, sources
from ..service.ports import IdemRecord
from ..service.views import JobView
from .dynamo import Changes, ConditionFailed, Dynamo, Table
from .items import Codec
from .models import IdempotencyModel, JobModel, TenantModel

JOBS = Table(JobModel, tells=feed.told)
KEYS = Table(IdempotencyModel)
TENANTS = Table(TenantModel)

#: TTL removes finished records this long after they expired
TTL_SLACK = timedelta(days=7)

#: what a Job holds of a job's item (not its index keys, queue key or events)
_JOB = Codec(JobModel, STORED_FIELDS)
#: what a JobView holds: the stored times are the API's text (iso) already,
#: and each JSON value stays the JSON text it is stored as (fastjson.RawJSON:
#: service/views.py's one type of a stored JSON value)
_VIEW = Codec(JobModel, VIEW_FIELDS, raw_json=True)
_EVENTS = Codec(JobModel, ("events",))
_BY_ACTIVE_STATE = JobModel.by_active_state.Meta.index_name
_STATES = {state.value: state for state in JobState}


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


def _counts(values: dict) -> dict[str, int] | None:
    if values.get("array_materialized") is None:
        return None
    return {k: int(values.get(f"array_{k}") or 0) for k in COUNTERS}


def _number(value: Any) -> int | None:
    return None if value is None else int(value)


#: a field's value in a Job from its stored value, by how it is stored
#: (domain/jobs.py Column.kind); absent: the value as the codec reads it
_READ: dict[str, Callable[[Any], Any]] = {
    TIME: _t, NUMBER: _number, STATE: _STATES.__getitem__, SPEC: JobSpec.parse,
    SET: lambda value: frozenset(value or ())}
#: a field's stored value from its value in a Job
_WRITE: dict[str, Callable[[Any], Any]] = {
    TIME: iso_or_none, STATE: lambda state: state.value, SPEC: lambda spec: spec.to_json(),
    SET: lambda value: set(value) or None}
_FIELDS = tuple(COLUMNS.items())


def job_from_item(item: dict) -> Job:
    """The Job of a job's raw item."""
    v = _JOB.values(item)
    values: dict[str, Any] = {}
    for name, column in _FIELDS:
        if column.kind == COUNTS:
            values[name] = _counts(v)
            continue
        value = v[name]
        if value is None:
            continue  # the field's default
        read = _READ.get(column.kind)
        values[name] = value if read is None else read(value)
    return Job(**values)


def view_from_item(item: dict) -> JobView:
    """The JobView of a job's raw item, its JSON values undecoded."""
    return _VIEW.values(item)


def events_from_item(item: dict | None) -> dict:
    """The events map of a (projected) item; {} when there is none."""
    return (_EVENTS.values(item)["events"] or {}) if item else {}


def tenant_state(tenant: str, state: JobState | str) -> str:
    return f"{tenant}#{getattr(state, 'value', state)}"


#: the active-state partitions of jobs out of the placement queue: waiting
#: for their dependencies, and arrays (which never run themselves)
WAITING, ARRAY = "WAITING", "ARRAY"


def active_partition(j: Job, state: JobState | None = None, *,
                     parked: bool = False) -> str | None:
    """Where a job sits in the active-state index, in its state or in
    ``state``: nowhere once terminal; WAITING while dependencies are left;
    ARRAY for an array; its type's parked partition when ``parked`` (a
    PENDING job that can never fit, domain/fleet.py); else its state
    (PENDING is the placement queue). The one decision of it."""
    state = j.state if state is None else state
    if state.terminal:
        return None
    if j.waiting_for:
        return WAITING
    if j.is_array:
        return ARRAY
    return parked_partition(j.spec.gpu_type) if parked else state.value


def in_index(changes: Changes, partition: str | None) -> Changes:
    """The one writer of a job's place in the active-state index
    (:func:`active_partition` decides it): set, or removed for none."""
    if partition is None:
        return changes.remove("active_state")
    return changes.set("active_state", partition)


def moved(changes: Changes, job: Job, state: JobState) -> Changes:
    """A job moves to ``state``: its state, its list partition and its place
    in the active-state index."""
    changes.set("state", state.value).set("tenant_state", tenant_state(job.tenant, state))
    return in_index(changes, active_partition(job, state))


def pending_weight(j: Job) -> int:
    return j.pending_weight  # (domain/jobs.py)


def parent_counts(parent_id: str, **deltas: int) -> dict:
    """The update moving an array's counters (``placed=+1``, ``failed=+1``,
    ...) in the transaction of its child's transition."""
    changes = Changes(JOBS)
    for name, delta in deltas.items():
        if delta:
            changes.add(f"array_{name}", delta)
    return changes.update(JOBS.key(parent_id))


def job_values(j: Job) -> dict:
    """A job's item as attribute values: every field of the Job (domain/jobs.py
    declares how each is stored), its index keys and queue key."""
    values: dict[str, Any] = {}
    for name, column in _FIELDS:
        value = getattr(j, name)
        if column.kind == COUNTS:
            values.update(array_values(value))
            continue
        if column.empty_is_none and not value:
            value = None
        write = _WRITE.get(column.kind)
        values[name] = value if write is None or value is None else write(value)
    values.update(tenant_state=tenant_state(j.tenant, j.state), active_state=active_partition(j),
                  queue_key=queue_key(j.spec.priority, j.job_id))
    return values


def new_job_values(job: Job, idem_id: str | None = None,
                   parked: Fleet | None = None) -> dict:
    """A new job's attribute values, with the first event of its story; made
    under a key, ``idem_id`` names the key's record. A job that can never fit
    ``parked`` (its type's fleet) is made parked, as ``park`` leaves one: in
    its type's parked partition, with the generation and its waiting event."""
    values = {**job_values(job), "events": {"created": ev.event(
        "created", job.created_at, reason="submitted", tenant=job.tenant)},
              "unfed": job.tenant, "unfed_keys": {"created"}}  # (domain/feed.py)
    if idem_id is not None:
        values["idem_id"] = idem_id
    if parked is not None:
        values["active_state"] = active_partition(job, parked=True)
        values["parked_generation"] = parked.generation
        reason = job.pending_reason or "can never fit"
        values["events"][ev.waiting_key(job.attempt, reason)] = ev.event(
            "waiting", job.created_at, reason=reason)
    return values


def new_job_item(job: Job, idem_id: str | None = None, parked: Fleet | None = None) -> dict:
    """A new job's raw item (:func:`new_job_values`), as ``create`` puts it."""
    return JOBS.item(new_job_values(job, idem_id, parked))


def record_from_item(item: dict) -> IdemRecord:
    v = KEYS.values(item)
    return IdemRecord(v["idem_id"], v["job_id"], v["body_hash"], _t(v["expires_at"]))


def state_in(states: Iterable[JobState], *, attempt: int | None = None) -> tuple[str, dict]:
    """The condition that the job is in one of ``states`` (and at ``attempt``
    when given), and its values."""
    names = sorted(s.value for s in states)
    values = {f":in{i}": {"S": state} for i, state in enumerate(names)}
    condition = "#state = :in0" if len(names) == 1 else f"#state IN ({', '.join(values)})"
    if attempt is not None:
        condition += " AND #attempt = :at"
        values[":at"] = {"N": str(attempt)}
    return condition, values


def leaving(*events: Event, attempt: int | None = None) -> tuple[str, dict]:
    """The condition of a transition: the job is in a state these events
    leave (domain/states.py's table), at ``attempt`` when given."""
    return state_in(sources(*events), attempt=attempt)


def count_pending(tenant: str, delta: int, limit: int | None = None) -> dict:
    """The update that moves the tenant's PENDING count with a transition, in
    its transaction; an increase under ``limit`` is conditioned on the count
    being below it."""
    condition = None
    values = {":delta": {"N": str(delta)}}
    if limit is not None:  # after the increase, at most the limit
        values[":room"] = {"N": str(limit - delta)}
        condition = "#pending <= :room"
        if limit - delta >= 0:  # no count yet is 0
            condition = "attribute_not_exists(#pending) OR " + condition
    return TENANTS.update(TENANTS.key(tenant), "ADD #pending :delta", condition=condition,
                          values=values)


def expire_key(job: Job, now: datetime) -> dict:
    """The update that makes a finished job's idempotency key expire
    RETENTION after it (domain/idempotency.py)."""
    until = idempotency.expires_at(now)
    return KEYS.update(
        KEYS.key(job.idem_id), "SET #expires_at = :until, #ttl_epoch = :ttl",
        condition="#job_id = :job_id",
        values={":until": {"S": iso(until)},
                ":ttl": {"N": str(int((until + TTL_SLACK).timestamp()))},
                ":job_id": {"S": job.job_id}})


class OnDynamo:
    """What every store of these tables holds: the sender and the clock (the
    injected one: bootstrap.build(clock=...))."""

    def __init__(self, dynamo: Dynamo, clock: Clock = utcnow) -> None:
        self._dynamo = dynamo
        self._clock = clock

    def _now(self) -> datetime:
        return self._clock()

    def _read_job(self, job_id: str, consistent: bool = True) -> Job | None:
        item = self._dynamo.get(JOBS.get(JOBS.key(job_id), consistent=consistent))
        return job_from_item(item) if item else None

    def _update_if(self, job_id: str, changes: Changes, condition: str,
                   values: dict | None = None) -> bool:
        """Update the job by ``changes`` on ``condition``; False when it does not hold."""
        try:
            self._dynamo.update(changes.update(JOBS.key(job_id), condition=condition,
                                               values=values))
        except ConditionFailed:
            return False
        return True

    def _mine(self, job_id: str, check: Callable[[Job], bool]) -> Job | None:
        """The job as it is now, if ``check(job)`` says the lost race was our
        own earlier try (botocore retried a write whose answer was lost); else
        None."""
        current = self._read_job(job_id)
        return current if current is not None and check(current) else None

    def _partition(self, partition: str, limit: int | None, page_size: int) -> Iterator[Job]:
        """The jobs of one partition of the active-state index, in queue
        order, read lazily, at most ``limit`` (None: all)."""
        left = limit
        if left == 0:
            return
        request = JOBS.query(_BY_ACTIVE_STATE, "#active_state = :partition",
                             {":partition": {"S": partition}},
                             limit=page_size if left is None else min(page_size, left))
        for page in self._dynamo.pages(request):
            for item in page:
                yield job_from_item(item)
                if left is not None:
                    left -= 1
                    if left == 0:
                        return
