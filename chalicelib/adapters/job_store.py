"""The Jobs port on DynamoDB: jobs created under an idempotency key, read,
listed, queued, their health, and the transitions that concern the job alone.

Every state transition is a conditional write on the state it leaves
(domain/states.py's table). Creating a job under an idempotency key is one
TransactWriteItems: the key's record (condition: absent) and the job go in
together or not at all, with the tenant's PENDING count. Every conditional
write that botocore may retry recognises itself: when a retry fails the
condition its own first try made false, the writer reads the item back and
finds its own stamp (``now``), and answers as if the first answer had arrived.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Callable, Iterator, Sequence

from pynamodb.exceptions import TransactWriteError

from ..domain import events as ev
from ..domain.arrays import ENDED_COUNTER
from ..domain.clock import iso, parse_iso
from ..domain.errors import RecordTooLarge
from ..domain.fleet import Fleet, parked_partition
from ..domain.health import incident
from ..domain.jobs import Job
from ..domain.states import Event, JobState, next_state
from ..service.ports import (
    Contended,
    FleetChanged,
    IdemClaim,
    IdempotencyConflict,
    IdemRecord,
    PendingLimitReached,
    StateChanged,
)
from ..service.views import JobView
from .attempt_store import ATTEMPTS
from .dynamo import Changes, ConditionFailed, ItemTooLarge
from .dynamo_errors import response_code, tx_lost
from .fleet import FLEET
from .jobs_table import (
    JOBS,
    KEYS,
    WAITING,
    OnDynamo,
    active_partition,
    count_pending,
    events_from_item,
    expire_key,
    in_index,
    job_from_item,
    leaving,
    moved,
    new_job_item,
    parent_counts,
    pending_weight,
    record_from_item,
    state_in,
    tenant_state,
    view_from_item,
)
from .models import JobModel
from .outbox_store import OUTBOX

#: jobs read per Query page of the queue and of the parked jobs
_QUEUE_PAGE = 100
#: how a job cancelled before it was placed ended
CANCELLED_EXIT = {"reason": "cancelled", "exit_code": None}


# -- the requests of the operations (sent below; bench/ sends them bare) -------
def create_writes(job: Job, claim: IdemClaim | None, *, reclaim: IdemRecord | None = None,
                  max_pending: int | None = None, parked: Fleet | None = None) -> list[dict]:
    """The transaction of ``create``: [the key's record (with a key),] the
    job, the tenant's PENDING count under ``max_pending`` [and, for a job
    made parked, the check that its fleet is still the generation it was
    judged against, as ``park``'s]."""
    items = []
    if claim is not None:
        record = KEYS.item({"idem_id": claim.idem_id, "job_id": job.job_id,
                            "body_hash": claim.body_hash, "created_at": iso(job.created_at)})
        if reclaim is None:  # the key is new
            items.append({"Put": KEYS.put_new(record, return_old=True)})
        else:  # take over an expired key, exactly as it was read
            values = {":job_id": {"S": reclaim.job_id}}
            if reclaim.expires_at is None:
                condition = "#job_id = :job_id AND attribute_not_exists(#expires_at)"
            else:
                condition = "#job_id = :job_id AND #expires_at = :expires_at"
                values[":expires_at"] = {"S": iso(reclaim.expires_at)}
            items.append({"Put": KEYS.put(record, condition=condition, values=values,
                                          return_old=True)})
    items.append({"Put": JOBS.put_new(new_job_item(
        job, claim.idem_id if claim is not None else None, parked))})
    items.append({"Update": count_pending(job.tenant, pending_weight(job), max_pending)})
    if parked is not None:  # (sent first: a transaction's checks go before its writes)
        items.append({"ConditionCheck": fleet_unchanged(parked)})
    return items


def fleet_unchanged(fleet: Fleet) -> dict:
    """The check that ``fleet`` is still the generation a job was judged against."""
    if fleet.generation:
        return FLEET.check(FLEET.key(fleet.key), "#generation = :generation",
                           {":generation": FLEET.value("generation", fleet.generation)})
    return FLEET.check(FLEET.key(fleet.key), "attribute_not_exists(#generation)")


def page_request(tenant: str, state: str | None, page_size: int, after: str | None) -> dict:
    """The Query of ``page``: the tenant's (or the tenant and state's)
    partition, newest first, one job more than the page."""
    if state:
        index, partition, key = JobModel.by_tenant_state.Meta.index_name, "tenant_state", \
            tenant_state(tenant, state)
    else:
        index, partition, key = JobModel.by_tenant.Meta.index_name, "tenant", tenant
    start = {**JOBS.key(after), partition: {"S": key}} if after else None
    return JOBS.query(index, f"#{partition} = :key", {":key": {"S": key}},
                      limit=page_size + 1, forward=False, start=start)


def _unplaced_end(job: Job, changes: Changes, event: Event, now: datetime) -> list[dict]:
    """The transaction ending a job never placed (or waiting for its next
    attempt), ``changes`` made: the job, conditioned on the states ``event``
    leaves, the tenant's PENDING count, [the expiry of its idempotency key]."""
    state = next_state(JobState.PENDING, event)
    condition, values = leaving(event)
    if job.is_array:  # still waiting: none of its children made
        condition += " AND #active_state = :waiting"
        values = {**values, ":waiting": {"S": WAITING}}
    # its dependents as read (a set only grows: the same size is the same set),
    # so what follows its end needs no read after it (PipelinesService.ended)
    if job.dependents:
        condition += " AND size(#dependents) = :dependents"
        values = {**values, ":dependents": {"N": str(len(job.dependents))}}
    else:
        condition += " AND attribute_not_exists(#dependents)"
    moved(changes, job, state).set("updated_at", iso(now)).set("finished_at", iso(now))
    items = [{"Update": changes.update(JOBS.key(job.job_id), condition=condition,
                                       values=values)},
             {"Update": count_pending(job.tenant, -pending_weight(job))}]
    if job.parent_id is not None:  # an index ended: its array counts it
        items.append({"Update": parent_counts(job.parent_id, **{ENDED_COUNTER[state]: 1})})
    if job.idem_id is not None:
        items.append({"Update": expire_key(job, now)})
    return items


def fail_dependency_writes(job: Job, now: datetime, exit_: dict) -> list[dict]:
    """The transaction of ``fail_dependency``: FAILED, naming the dependency."""
    changes = Changes(JOBS).set("exit", exit_).remove("pending_reason").event(
        "finished", ev.event("finished", now, state=JobState.FAILED.value,
                             reason=exit_["reason"], detail=exit_["detail"],
                             from_=job.state.value))
    return _unplaced_end(job, changes, Event.DEPENDENCY_FAILED, now)


def expire_pending_writes(job: Job, now: datetime, exit_: dict) -> list[dict]:
    """The transaction of ``expire_pending``: FAILED, its last pending reason kept."""
    changes = Changes(JOBS).set("exit", exit_).event("finished", ev.event(
        "finished", now, attempt=job.attempt or None, state=JobState.FAILED.value,
        reason=exit_["reason"], decision=exit_.get("decision"), from_=job.state.value))
    return _unplaced_end(job, changes, Event.PENDING_TIMEOUT, now)


def cancel_unplaced_writes(job: Job, now: datetime, reason: str | None) -> list[dict]:
    """The transaction of ``cancel_unplaced``: the job (conditioned on the
    states CANCEL_UNPLACED leaves), the tenant's PENDING count, [the expiry
    of its idempotency key]."""
    changes = Changes(JOBS).set("cancel_requested_at", iso(now)).set("exit", CANCELLED_EXIT) \
        .event("cancel_requested", ev.event(
            "cancel_requested", now, attempt=job.attempt or None, reason=reason,
            by=job.tenant)) \
        .event("finished", ev.event(
            "finished", now, attempt=job.attempt or None, state=JobState.CANCELLED.value,
            reason="cancelled before it was placed", from_=job.state.value))
    if reason is not None:
        changes.set("cancel_reason", reason)
    changes.remove("pending_reason")
    return _unplaced_end(job, changes, Event.CANCEL_UNPLACED, now)


class DynamoJobs(OnDynamo):
    # -- create and read -------------------------------------------------
    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None, max_pending: int | None = None,
               parked: Fleet | None = None) -> None:
        """One transaction: the key's record (when there is a key), the job, and
        the tenant's PENDING count, conditioned on being under ``max_pending``
        (None: counted, not limited). A replay writes nothing, so it is not
        counted twice. A retry of this very transaction after a lost answer
        finds its own job and answers as the first try would. With ``parked``
        the job is made parked (it can never fit that fleet), conditioned on
        the fleet's generation: FleetChanged when it moved (nothing written)."""
        try:
            with self._dynamo.transaction() as tx:
                tx.add(create_writes(job, claim, reclaim=reclaim, max_pending=max_pending,
                                     parked=parked))
        except TransactWriteError as e:
            reasons = list(e.cancellation_reasons or [])
            # in the order sent: [the fleet's check,] [the key's record,] the job, the count
            checked = int(parked is not None)
            size = (3 if claim is not None else 2) + checked
            whole = len(reasons) == size
            first = reasons[checked] if len(reasons) > checked and claim is not None else None
            counter = reasons[-1] if whole else None
            check = reasons[0] if whole and checked else None
            if first is not None and first.code == "ConditionalCheckFailed":
                if first.raw_item and record_from_item(first.raw_item).job_id == job.job_id:
                    return  # the key holds this very job: our retried transaction
                raise IdempotencyConflict(
                    record_from_item(first.raw_item) if first.raw_item else None) from None
            if tx_lost(e) and self._mine(job.job_id, lambda j: j.tenant == job.tenant
                                         and j.created_at == job.created_at):
                return  # the job is there: our own transaction, retried after a lost answer
            if counter is not None and counter.code == "ConditionalCheckFailed" \
                    and max_pending is not None:
                raise PendingLimitReached(max_pending) from None
            if counter is not None and counter.code == "TransactionConflict":
                raise Contended(job.tenant) from None
            if check is not None and check.code == "ConditionalCheckFailed":
                raise FleetChanged(parked.key if parked is not None else "") from None
            if claim is not None and (
                    tx_lost(e) or response_code(e) == "TransactionInProgressException"):
                # another transaction holds the key right now
                raise IdempotencyConflict(None) from None
            raise

    def get(self, job_id: str, *, consistent: bool = True) -> Job | None:
        return self._read_job(job_id, consistent)

    def view(self, job_id: str) -> JobView | None:
        """The job as it is shown (domain/jobs.py JobView), or None."""
        item = self._dynamo.get(JOBS.get(JOBS.key(job_id)))
        return view_from_item(item) if item else None

    def view_with_story(self, job_id: str) -> tuple[JobView, list[dict]] | None:
        """The job as it is shown and its own story (the events on its
        item, oldest first, as served), what its ``usage`` is worked out from
        (domain/usage.py), or None: ``view``'s one read, nothing more."""
        item = self._dynamo.get(JOBS.get(JOBS.key(job_id)))
        if item is None:
            return None
        return view_from_item(item), ev.timeline(events_from_item(item))

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
        raw = self._dynamo.query(page_request(tenant, state, page_size, after))
        items = raw.get("Items", [])
        if len(items) > page_size:  # the one more only says that more follow
            items = items[:page_size]
            resume_after = items[-1]["job_id"]["S"]
        else:  # DynamoDB stops a Query at 1 MB of items: resume where it stopped
            last = raw.get("LastEvaluatedKey")
            resume_after = last["job_id"]["S"] if last else None
        return [view_from_item(i) for i in items], resume_after

    def pending(self, limit: int) -> Iterator[Job]:
        """PENDING jobs, highest priority first, then oldest first, read lazily."""
        return self._partition(JobState.PENDING.value, limit, _QUEUE_PAGE)

    def active(self, state: JobState, limit: int) -> list[Job]:
        return list(self._partition(state.value, limit, limit))

    # -- parked never-fitting jobs (domain/fleet.py) --------------------------
    def parked(self, gpu_type: str | None) -> Iterator[Job]:
        """The parked jobs of a type (None: of jobs that take any type), read lazily."""
        return self._partition(parked_partition(gpu_type), None, _QUEUE_PAGE)

    def _waiting(self, changes: Changes, job: Job, reason: str) -> Changes:
        """The job's story says why it waits, as for any pending reason."""
        return changes.event(ev.waiting_key(job.attempt, reason), ev.event(
            "waiting", self._now(), attempt=job.attempt or None, reason=reason))

    def park(self, job: Job, reason: str, fleet: Fleet) -> bool:
        """Move a PENDING job that can never fit ``fleet`` out of the PENDING
        partition, with its reason, if the fleet is still the generation it was
        judged against (else it stays where it is, to be judged again)."""
        changes = in_index(Changes(JOBS), active_partition(job, parked=True)) \
            .set("parked_generation", fleet.generation).set("pending_reason", reason)
        self._waiting(changes, job, reason)
        condition, values = state_in([JobState.PENDING], attempt=job.attempt)
        try:
            with self._dynamo.transaction() as tx:
                tx.update(changes.update(JOBS.key(job.job_id), condition=condition,
                                         values=values))
                tx.check(fleet_unchanged(fleet))
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    def unpark(self, job: Job) -> bool:
        """Back into the PENDING partition: the fleet changed so that it may fit."""
        condition, values = state_in([JobState.PENDING], attempt=job.attempt)
        changes = in_index(Changes(JOBS), active_partition(job)).remove("parked_generation")
        return self._update_if(job.job_id, changes, condition, values)

    def set_pending_reason(self, job: Job, reason: str | None,
                           waiting_on: str | None = None) -> None:
        changes = Changes(JOBS).set("pending_reason", reason).set("waiting_on", waiting_on)
        if reason:
            self._waiting(changes, job, reason)
        condition, values = state_in([JobState.PENDING], attempt=job.attempt)
        try:
            self._dynamo.update(changes.update(JOBS.key(job.job_id), condition=condition,
                                               values=values))
        except ConditionFailed:
            pass  # no longer the PENDING job that was judged: nothing to say

    def mark_preempting(self, job: Job, preempting: dict, reason: str, stale_before: str,
                        now: datetime) -> bool:
        """Record that ``job`` (PENDING, at the attempt read) preempts
        ``preempting["jobs"]`` to make room, with its pending reason and an
        event naming them; conditioned on no preemption of its own newer than
        ``stale_before``, so of two placers racing for one job only one
        preempts. False: another did, or the job moved on."""
        changes = Changes(JOBS).set("preempting", preempting).set("pending_reason", reason) \
            .set("updated_at", iso(now)).event(
                f"preempting#{job.attempt + 1}", ev.event(
                    "preempting", now, attempt=job.attempt or None, reason=reason,
                    jobs=list(preempting["jobs"])))
        condition, values = state_in([JobState.PENDING], attempt=job.attempt)
        condition += " AND (attribute_not_exists(#preempting) OR #preempting.#at < :stale)"
        values = {**values, ":stale": {"S": stale_before}}
        try:
            self._dynamo.update(changes.update(JOBS.key(job.job_id), condition=condition,
                                               values=values))
            return True
        except ConditionFailed:
            return False

    # -- transitions of the job alone -------------------------------------------
    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job:
        """Cancel a job never placed: CANCELLED and finished at once, out of
        the PENDING count and the active index, its key set to expire."""
        self._end_unplaced(job, cancel_unplaced_writes(job, now, reason),
                           lambda j: j.state is JobState.CANCELLED
                           and j.cancel_requested_at == parse_iso(iso(now)))
        return dataclasses.replace(job, state=JobState.CANCELLED, cancel_requested_at=now,
                                   cancel_reason=reason, updated_at=now, finished_at=now,
                                   exit=dict(CANCELLED_EXIT), pending_reason=None)

    def expire_pending(self, job: Job, now: datetime, exit_: dict) -> Job:
        """End a job that waited past its max_pending_s: FAILED and finished at
        once, out of the PENDING count and the active index, its key set to
        expire, its last pending_reason kept."""
        self._end_unplaced(job, expire_pending_writes(job, now, exit_),
                           lambda j: j.state is JobState.FAILED
                           and j.finished_at == parse_iso(iso(now)))
        return dataclasses.replace(job, state=JobState.FAILED, updated_at=now,
                                   finished_at=now, exit=dict(exit_))

    def fail_dependency(self, job: Job, now: datetime, exit_: dict) -> Job:
        """End a waiting job whose dependency can no longer be met: FAILED,
        out of the PENDING count and the active index, naming it."""
        self._end_unplaced(job, fail_dependency_writes(job, now, exit_),
                           lambda j: j.state is JobState.FAILED
                           and j.finished_at == parse_iso(iso(now)))
        return dataclasses.replace(job, state=JobState.FAILED, updated_at=now,
                                   finished_at=now, exit=dict(exit_), pending_reason=None)

    def _end_unplaced(self, job: Job, writes: list[dict], mine: Callable[[Job], bool]) -> None:
        """Run the transaction ending a job that holds no attempt; a lost race
        is StateChanged, unless ``mine`` finds it our own earlier try."""
        try:
            with self._dynamo.transaction() as tx:
                tx.add(writes)
        except TransactWriteError as e:
            if tx_lost(e):
                if self._mine(job.job_id, mine) is not None:
                    return
                raise StateChanged(job.job_id) from None
            raise

    def start(self, job: Job, now: datetime) -> Job:
        """SCHEDULED -> RUNNING when the first ranks of the attempt started."""
        running = JobState.RUNNING
        changes = moved(Changes(JOBS), job, running).set("started_at", iso(now)) \
            .set("updated_at", iso(now)) \
            .event(f"started#{job.attempt}", ev.event(
                "started", now, attempt=job.attempt, reason="the first ranks started"))
        condition, values = leaving(Event.STARTED, attempt=job.attempt)
        try:
            answer = self._dynamo.update(changes.update(
                JOBS.key(job.job_id), condition=condition, values=values, return_new=True))
        except ConditionFailed:
            mine = self._mine(job.job_id, lambda j: j.attempt == job.attempt
                              and j.started_at == parse_iso(iso(now)))
            if mine is not None:
                return mine
            raise StateChanged(job.job_id) from None
        return job_from_item(answer["Attributes"])

    # -- health -------------------------------------------------------------
    def record_health(self, job: Job, health: dict, *, incident_key: str | None = None,
                      recovered: bool = False,
                      events: Sequence[tuple[str, dict]] = ()) -> bool:
        """Store the scan's view of the running attempt. With ``incident_key``,
        record a new incident: conditioned on the key read before, so however
        many scans see the same stall, it is recorded once. With
        ``recovered``, the open incident ``job.incident_key`` (``job.health``
        as read while it was open) ended with its culprit beating again: its
        ``recovered`` event is written with the health, conditioned on the
        incident still being that one. ``events``: story events (key, event)
        written with it, such as the ``rank_slow`` of a slow episode this
        health opens (a key set again keeps its first event)."""
        changes = Changes(JOBS).set("health", health)
        for key, told in events:
            changes.event(key, told)
        condition, values = state_in([JobState.RUNNING], attempt=job.attempt)
        if recovered and job.incident_key is not None and incident_key is None:
            key, told = ev.recovered(self._now(), job.attempt, job.incident_key, job.health)
            changes.event(key, told)
            condition += " AND #incident_key = :read_incident"
            values[":read_incident"] = {"S": job.incident_key}
        if incident_key is not None:
            changes.set("incident_key", incident_key).event(f"stalled#{incident_key}", ev.event(
                "stalled", self._now(), attempt=job.attempt, **incident(health)))
            if job.incident_key is None:
                condition += " AND attribute_not_exists(#incident_key)"
            else:
                condition += " AND #incident_key = :read_incident"
                values[":read_incident"] = {"S": job.incident_key}
        try:
            self._dynamo.update(changes.update(JOBS.key(job.job_id), condition=condition,
                                               values=values))
        except ConditionFailed:
            return False
        except ItemTooLarge as e:
            raise RecordTooLarge(str(e)) from None
        return True

    # -- the story, and readiness ----------------------------------------------
    def events(self, job_id: str) -> list[dict]:
        """The job's events and its attempts', oldest first; KeyError when
        there is no such job."""
        item = self._dynamo.get(JOBS.get(JOBS.key(job_id), attributes=["events"]))
        if item is None:
            raise KeyError(job_id)
        request = ATTEMPTS.query(None, "#job_id = :job", {":job": {"S": job_id}},
                                 consistent=True, attributes=["events"])
        attempts = [events_from_item(i) for page in self._dynamo.pages(request) for i in page]
        return ev.timeline(events_from_item(item), *attempts)

    def ping(self) -> None:
        """One cheap read of each table: any failure means not ready."""
        for table, key in ((JOBS, JOBS.key("job_health_probe")),
                           (KEYS, KEYS.key("health_probe")),
                           (ATTEMPTS, ATTEMPTS.key("job_health_probe", 0)),
                           (OUTBOX, OUTBOX.key("job_health_probe", "health_probe"))):
            self._dynamo.get(table.get(key))
