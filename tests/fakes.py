"""In-memory fakes of the ports (chalicelib/service/ports.py), for service logic
that needs no DynamoDB semantics.

They keep the adapters' contract, not just their signatures: transitions are
conditional on the states domain/states.py's table says they leave and raise
StateChanged when they lose, a taken idempotency key raises
IdempotencyConflict with its holder, a reservation on nodes without room raises
CapacityChanged naming them, pages resume after their token, intents stay due
until every target acknowledged, a retried write recognises itself. Times are
kept to the millisecond, as the adapters store them. tests/contract/ runs the
same tests against these fakes and the real adapters (on moto), so the two
cannot drift apart.

The fleet is one :class:`~chalicelib.domain.fleet.Fleet` per GPU type and one
for every type (``*``), as the adapters keep it: its generation moves with
every change of its registered GPUs or largest node, its room version whenever
room may have appeared. Each tenant's count of PENDING jobs moves with the
transitions that enter or leave PENDING, and a create under ``max_pending``
is refused at it; parked jobs (domain/fleet.py) leave the PENDING queue until
unparked.

One :class:`World` holds every table, since the job store's transactions reach
the nodes (a placement reserves GPUs, a release gives them back)::

    world = World(clock)
    world.store, world.nodes, world.beats, world.collector, world.inbox
    services = world.services()   # the services of bootstrap.build, over fakes
"""
from __future__ import annotations

import dataclasses
import json
import pickle
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Collection, Iterator, Mapping, Sequence

from pynamodb.exceptions import TransactWriteError

from chalicelib.adapters.dynamo import ConditionFailed
from chalicelib.adapters.jobs_table import ARRAY, WAITING, active_partition
from chalicelib.adapters.log_reader import MAX_STREAM_NAMES
from chalicelib.domain import events as ev, feed, idempotency, quotas
from chalicelib.domain.arrays import ENDED_COUNTER, Counts
from chalicelib.domain.attempts import Attempt, reported
from chalicelib.domain.clock import Clock, iso, parse_iso, utcnow
from chalicelib.domain.errors import RecordTooLarge
from chalicelib.domain.fleet import ALL_TYPES, SETTLE_S, Fleet, fleet_key, parked_partition
from chalicelib.domain.health import clear_incident, frozen_health, incident
from chalicelib.domain.intents import Intent
from chalicelib.domain.jobs import COLUMNS, TIME, Job
from chalicelib.domain.nodes import Node, NodeState, failures_since, fresh_call_in
from chalicelib.domain.placement import Plan, queue_key
from chalicelib.domain.priority import DEFAULT_MIN_RUNTIME_S, NO_CLASSES, PriorityClasses
from chalicelib.domain.queue import Line
from chalicelib.domain.rollup import DAY_MS, Key
from chalicelib.domain.stall import Beat
from chalicelib.domain.states import (
    ARRAY_ENDS,
    ENDS_ATTEMPT,
    PLACED,
    Event,
    JobState,
    next_state,
    sources,
)
from chalicelib.service.ports import (
    AlreadyFed,
    CapacityChanged,
    Contended,
    FeedHead,
    FleetChanged,
    IdemClaim,
    IdempotencyConflict,
    IdemRecord,
    LogPage,
    OutboxEntry,
    PendingLimitReached,
    StateChanged,
    UsageCell,
)
from chalicelib.service.views import JobView, view_of

#: nodes a ready_pages page holds (adapters/node_store.CANDIDATE_PAGE)
CANDIDATE_PAGE = 50
#: DynamoDB's item limit, which a health record over it would break
ITEM_LIMIT_BYTES = 400 * 1024


def ms(t: datetime) -> datetime:
    """``t`` as the adapters store it: UTC, to the millisecond."""
    return parse_iso(iso(t))


def _ms(t: datetime | None) -> datetime | None:
    return None if t is None else ms(t)


def room_types(gpu_type: str | None) -> list[str]:
    """The fleets that room on a node of ``gpu_type`` concerns (adapters/fleet.py)."""
    return [gpu_type, ALL_TYPES] if gpu_type and gpu_type != ALL_TYPES else [ALL_TYPES]



#: a Job's times (domain/jobs.py declares each field's kind)
_TIMES = tuple(name for name, column in COLUMNS.items() if column.kind == TIME)


def clone(value: Any) -> Any:
    """A deep copy of what a fake hands out, as an adapter builds its answer
    afresh from the items it reads: pickle's, which copies an attempt's sets
    of 65,536 ranks many times faster than ``copy.deepcopy``."""
    return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))

@dataclass
class _Outbox:
    intent: Intent
    unacked: set[str]
    due_at: datetime
    sends: int = 1
    pending: bool = True


@dataclass
class Tables:
    """Every table, shared by the fakes of one world; one lock makes each
    method one atomic step, as a transaction is."""
    jobs: dict[str, Job] = field(default_factory=dict)
    job_events: dict[str, dict] = field(default_factory=dict)
    idem: dict[str, IdemRecord] = field(default_factory=dict)
    attempts: dict[tuple[str, int], Attempt] = field(default_factory=dict)
    attempt_events: dict[tuple[str, int], dict] = field(default_factory=dict)
    outbox: dict[tuple[str, str], _Outbox] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    #: each fleet item (adapters/models.FleetModel) as the domain's Fleet, replaced
    #: by every write; a key not here is the unwritten, empty Fleet(key)
    fleet: dict[str, Fleet] = field(default_factory=dict)
    #: the placer's line as stored: its JSON (domain/queue.py)
    line: dict | None = None
    #: each tenant's number of PENDING jobs (adapters/models.TenantModel)
    tenants: dict[str, int] = field(default_factory=dict)
    #: parked jobs: job id -> the fleet generation it was parked against
    parked: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def fleet_of(self, key: str) -> Fleet:
        return self.fleet.get(key) or Fleet(key)

    def bump_room(self, gpu_type: str | None, now: datetime) -> None:
        for t in room_types(gpu_type):
            f = self.fleet_of(t)
            self.fleet[t] = replace(f, room_version=f.room_version + 1, room_at=ms(now))

    def reshape(self, key: str, now: datetime) -> None:
        """A change of the fleet's registered GPUs or largest node: a new generation."""
        f = self.fleet_of(key)
        self.fleet[key] = replace(f, generation=f.generation + 1, changed_at=ms(now))

    def count_pending(self, tenant: str, delta: int, limit: int | None = None) -> None:
        """Move the tenant's PENDING count; an increase under ``limit`` is refused
        at it (before anything is written)."""
        n = self.tenants.get(tenant, 0)
        if limit is not None and delta > 0 and n + delta > limit:
            raise PendingLimitReached(limit)
        self.tenants[tenant] = n + delta


def _state_in(job: Job | None, *events: Event) -> bool:
    return job is not None and job.state in sources(*events)


class FakeJobStore:
    """chalicelib.service.ports.JobTables in memory (adapters/store.DynamoStore).
    Its views are made by service/views.view_of, whose JSON values are the
    stored text (fastjson.RawJSON), as the real store's are."""

    def __init__(self, tables: Tables | None = None, clock: Clock = utcnow) -> None:
        self.t = tables or Tables()
        self._clock = clock
        #: set to an exception to make ping fail (readiness tests)
        self.ping_error: Exception | None = None

    # -- seeding, for tests that start from a given state ------------------
    def put(self, job: Job, attempt: Attempt | None = None) -> None:
        """Store ``job`` (and ``attempt``) as they are, no conditions. A placed
        attempt comes with its LAUNCH, acknowledged, as placing it leaves it."""
        with self.t.lock:
            before = self.t.jobs.get(job.job_id)
            was = before is not None and before.state is JobState.PENDING
            now_pending = job.state is JobState.PENDING
            if was != now_pending:
                self.t.count_pending(job.tenant, +1 if now_pending else -1)
            if not now_pending:
                self.t.parked.pop(job.job_id, None)
            self.t.jobs[job.job_id] = self._norm(job)
            self.t.job_events.setdefault(job.job_id, {})
            if attempt is not None:
                self.t.attempts[(attempt.job_id, attempt.attempt)] = clone(attempt)
                self.t.attempt_events.setdefault((attempt.job_id, attempt.attempt), {})
                launch = Intent(job.job_id, attempt.attempt, "LAUNCH", {"type": "LAUNCH"},
                                {n: job.inboxes.get(n, "") for n in attempt.node_ranks},
                                clone(attempt.node_ranks))
                self.t.outbox.setdefault((job.job_id, launch.intent_id), _Outbox(
                    launch, set(), attempt.created_at, pending=False))

    @staticmethod
    def _norm(job: Job) -> Job:
        job = clone(job)
        for f in _TIMES:  # stored at milliseconds, as the store keeps them
            setattr(job, f, _ms(getattr(job, f)))
        return job

    def _job(self, job_id: str) -> Job | None:
        return self.t.jobs.get(job_id)

    def _event(self, job_id: str, key: str, value: dict) -> None:
        self.t.job_events.setdefault(job_id, {}).setdefault(key, value)

    # -- create and read ---------------------------------------------------
    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None, max_pending: int | None = None,
               parked: Fleet | None = None) -> None:
        """The key's record, the job and the tenant's PENDING count, all or
        nothing; PendingLimitReached at ``max_pending`` (None: counted only);
        with ``parked``, made parked if that fleet is still the generation
        read (FleetChanged if not)."""
        with self.t.lock:
            current = self._job(job.job_id)
            if claim is None:
                if current is not None:
                    if current.tenant == job.tenant and current.created_at == ms(job.created_at):
                        return  # this very put, retried
                    # the adapter's transaction is cancelled and nothing reads it as ours
                    raise TransactWriteError(f"job {job.job_id} exists")
                self._check_fleet(parked)
                self.t.count_pending(job.tenant, job.pending_weight, max_pending)
                self._insert(job, parked)
                return
            job = replace(job, idem_id=claim.idem_id)
            held = self.t.idem.get(claim.idem_id)
            if reclaim is None:
                free = held is None
            else:  # take over an expired key, exactly as it was read
                free = (held is not None and held.job_id == reclaim.job_id
                        and held.expires_at == reclaim.expires_at)
            if not free:
                if held is not None and held.job_id == job.job_id:
                    return  # the key holds this very job: our retried create
                raise IdempotencyConflict(held)
            if current is not None:
                raise IdempotencyConflict(None)
            self._check_fleet(parked)
            self.t.count_pending(job.tenant, job.pending_weight, max_pending)
            self.t.idem[claim.idem_id] = IdemRecord(claim.idem_id, job.job_id,
                                                     claim.body_hash, None)
            self._insert(job, parked)

    def _check_fleet(self, parked: Fleet | None) -> None:
        """The create's check of the fleet a job made parked was judged against."""
        if parked is not None and self.t.fleet_of(parked.key).generation != parked.generation:
            raise FleetChanged(parked.key)

    def _insert(self, job: Job, parked: Fleet | None = None) -> None:
        self.t.jobs[job.job_id] = self._norm(job)
        self.t.job_events[job.job_id] = {"created": ev.event(
            "created", job.created_at, reason="submitted", tenant=job.tenant)}
        if parked is not None:
            reason = job.pending_reason or "can never fit"
            self.t.parked[job.job_id] = parked.generation
            self.t.job_events[job.job_id][ev.waiting_key(job.attempt, reason)] = ev.event(
                "waiting", job.created_at, reason=reason)

    def get(self, job_id: str, *, consistent: bool = True) -> Job | None:
        # always the latest: what an eventually consistent read returns too,
        # once the write is a second old
        with self.t.lock:
            job = self._job(job_id)
            return clone(job)

    def view(self, job_id: str) -> JobView | None:
        job = self.get(job_id)
        return None if job is None else view_of(job)

    def view_with_story(self, job_id: str) -> tuple[JobView, list[dict]] | None:
        with self.t.lock:
            job = self._job(job_id)
            if job is None:
                return None
            return view_of(clone(job)), clone(ev.timeline(self.t.job_events.get(job_id)))

    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[JobView], str | None]:
        """Newest first (job ids sort by creation), after the ``after`` id."""
        with self.t.lock:
            jobs = sorted((j for j in self.t.jobs.values() if j.tenant == tenant
                           and (state is None or j.state.value == state)
                           and (after is None or j.job_id < after)),
                          key=lambda j: j.job_id, reverse=True)
            page = [view_of(clone(j)) for j in jobs[:page_size]]
            return page, (page[-1]["job_id"] if len(jobs) > page_size else None)

    def _queue(self, state: JobState, limit: int) -> list[Job]:
        with self.t.lock:
            jobs = sorted((j for j in self.t.jobs.values()
                           if active_partition(j) == state.value
                           and j.job_id not in self.t.parked),
                          key=lambda j: queue_key(j.spec.priority, j.job_id))
            return [clone(j) for j in jobs[:limit]]

    def pending(self, limit: int) -> Iterator[Job]:
        """PENDING jobs, highest priority first, then oldest first."""
        yield from self._queue(JobState.PENDING, limit)

    def active(self, state: JobState, limit: int) -> list[Job]:
        return self._queue(state, limit) if not state.terminal else []

    # -- parked never-fitting jobs (domain/fleet.py) --------------------------
    def parked(self, gpu_type: str | None) -> Iterator[Job]:
        """The parked jobs of a type (None: of jobs that take any type), in queue order."""
        partition = parked_partition(gpu_type)
        with self.t.lock:
            jobs = sorted((j for j in self.t.jobs.values() if j.job_id in self.t.parked
                           and parked_partition(j.spec.gpu_type) == partition),
                          key=lambda j: queue_key(j.spec.priority, j.job_id))
            out = [clone(j) for j in jobs]
        yield from out

    def park(self, job: Job, reason: str, fleet: Fleet) -> bool:
        """Out of the PENDING queue with its reason, if the job is still the
        PENDING job read and ``fleet`` still the generation it was judged against."""
        with self.t.lock:
            current = self._job(job.job_id)
            stored = self.t.fleet_of(fleet.key)
            if current is None or current.state is not JobState.PENDING \
                    or current.attempt != job.attempt or stored.generation != fleet.generation:
                return False
            self.t.parked[job.job_id] = fleet.generation
            current.pending_reason = reason
            self._event(job.job_id, ev.waiting_key(job.attempt, reason), ev.event(
                "waiting", self._clock(), attempt=job.attempt or None, reason=reason))
            return True

    def unpark(self, job: Job) -> bool:
        """Back into the PENDING queue, if it is still the PENDING job read."""
        with self.t.lock:
            current = self._job(job.job_id)
            if current is None or current.state is not JobState.PENDING \
                    or current.attempt != job.attempt:
                return False
            self.t.parked.pop(job.job_id, None)
            return True

    def set_pending_reason(self, job: Job, reason: str | None,
                           waiting_on: str | None = None) -> None:
        with self.t.lock:
            current = self._job(job.job_id)
            if current is None or current.state is not JobState.PENDING \
                    or current.attempt != job.attempt:
                return
            current.pending_reason, current.waiting_on = reason or None, waiting_on or None
            if reason:
                self._event(job.job_id, ev.waiting_key(job.attempt, reason), ev.event(
                    "waiting", self._clock(), attempt=job.attempt or None, reason=reason))

    def mark_preempting(self, job: Job, preempting: dict, reason: str, stale_before: str,
                        now: datetime) -> bool:
        with self.t.lock:
            current = self._job(job.job_id)
            if current is None or current.state is not JobState.PENDING \
                    or current.attempt != job.attempt \
                    or (current.preempting and current.preempting["at"] >= stale_before):
                return False
            now = ms(now)
            current.preempting, current.pending_reason = clone(preempting), reason
            current.updated_at = now
            self._event(job.job_id, f"preempting#{job.attempt + 1}", ev.event(
                "preempting", now, attempt=job.attempt or None, reason=reason,
                jobs=list(preempting["jobs"])))
            return True

    # -- transitions --------------------------------------------------------
    def _expire_key_ok(self, job: Job) -> bool:
        held = self.t.idem.get(job.idem_id) if job.idem_id else None
        return job.idem_id is None or (held is not None and held.job_id == job.job_id)

    def _expire_key(self, job: Job, now: datetime) -> None:
        if job.idem_id:
            held = self.t.idem[job.idem_id]
            self.t.idem[job.idem_id] = replace(held, expires_at=idempotency.expires_at(ms(now)))

    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job:
        with self.t.lock:
            current = self._job(job.job_id)
            if not _state_in(current, Event.CANCEL_UNPLACED) or not self._expire_key_ok(job) \
                    or not self._unplaced_as_read(current, job):
                if current is not None and current.state is JobState.CANCELLED \
                        and current.cancel_requested_at == ms(now):
                    return clone(current)  # our own cancel, retried
                raise StateChanged(job.job_id)
            assert current is not None
            now = ms(now)
            current.state, current.cancel_requested_at, current.updated_at = (
                JobState.CANCELLED, now, now)
            current.exit, current.pending_reason, current.finished_at = (
                {"reason": "cancelled", "exit_code": None}, None, now)
            if reason is not None:
                current.cancel_reason = reason
            self._ended_unplaced(current)
            self._event(job.job_id, "cancel_requested", ev.event(
                "cancel_requested", now, attempt=job.attempt or None, reason=reason,
                by=job.tenant))
            self._event(job.job_id, "finished", ev.event(
                "finished", now, attempt=job.attempt or None, state="CANCELLED",
                reason="cancelled before it was placed"))
            self._expire_key(job, now)
            return clone(current)

    def expire_pending(self, job: Job, now: datetime, exit_: dict) -> Job:
        return self._fail_unplaced(job, now, exit_, Event.PENDING_TIMEOUT,
                                   attempt=job.attempt or None, decision=exit_.get("decision"))

    def fail_dependency(self, job: Job, now: datetime, exit_: dict) -> Job:
        return self._fail_unplaced(job, now, exit_, Event.DEPENDENCY_FAILED,
                                   detail=exit_["detail"])

    def _fail_unplaced(self, job: Job, now: datetime, exit_: dict, event: Event,
                       **finished) -> Job:
        """A job that holds no attempt ends FAILED by ``event`` (its
        ``finished`` event's details given)."""
        with self.t.lock:
            current = self._job(job.job_id)
            if not _state_in(current, event) or not self._expire_key_ok(job) \
                    or not self._unplaced_as_read(current, job):
                if current is not None and current.state is JobState.FAILED \
                        and current.finished_at == ms(now):
                    return clone(current)  # our own end, retried
                raise StateChanged(job.job_id)
            assert current is not None
            now = ms(now)
            current.state, current.updated_at, current.finished_at = JobState.FAILED, now, now
            current.exit = clone(exit_)
            if event is Event.DEPENDENCY_FAILED:
                current.pending_reason = None
            self._ended_unplaced(current)
            self._event(job.job_id, "finished", ev.event(
                "finished", now, state="FAILED", reason=exit_["reason"], **finished))
            self._expire_key(job, now)
            return clone(current)

    @staticmethod
    def _unplaced_as_read(current: Job | None, job: Job) -> bool:
        """An unplaced end's conditions beyond the state: an array still
        waiting, and the dependents as read."""
        return current is not None and current.dependents == job.dependents \
            and not (current.is_array and active_partition(current) != WAITING)

    def _ended_unplaced(self, job: Job) -> None:
        """A job that holds no attempt ended (``job`` as it ends): out of the
        parked jobs and the PENDING count, counted by its array."""
        self.t.parked.pop(job.job_id, None)
        self.t.count_pending(job.tenant, -job.pending_weight)
        if job.parent_id is not None:
            self._parent_add(job.parent_id, **{ENDED_COUNTER[job.state]: 1})

    def _parent_add(self, parent_id: str, **deltas: int) -> None:
        parent = self._job(parent_id)
        if parent is not None and parent.array_counts is not None:
            for k, d in deltas.items():
                parent.array_counts[k] = parent.array_counts.get(k, 0) + d

    def _save_intent(self, intent: Intent, due_at: datetime) -> None:
        self.t.outbox[(intent.job_id, intent.intent_id)] = _Outbox(
            clone(intent), set(intent.targets), ms(due_at),
            pending=bool(intent.targets))

    def _retire_launch(self, job_id: str, attempt: int) -> None:
        self.t.outbox[(job_id, f"LAUNCH#{attempt}")].pending = False

    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job:
        with self.t.lock:
            current = self._job(job.job_id)
            if (current is None or current.state not in PLACED
                    or current.attempt != job.attempt or current.cancel_requested_at is not None
                    or (job.job_id, intent.intent_id) in self.t.outbox
                    or (job.job_id, f"LAUNCH#{job.attempt}") not in self.t.outbox):
                if current is not None and current.cancel_requested_at == ms(now):
                    return clone(current)
                raise StateChanged(job.job_id)
            now = ms(now)
            current.cancel_requested_at, current.updated_at = now, now
            if reason is not None:
                current.cancel_reason = reason
            self._event(job.job_id, "cancel_requested", ev.event(
                "cancel_requested", now, attempt=job.attempt, reason=reason, by=job.tenant,
                nodes=sorted(intent.targets)))
            self._save_intent(intent, due_at)
            self._retire_launch(job.job_id, job.attempt)
            return replace(job, cancel_requested_at=now, cancel_reason=reason, updated_at=now)

    def place(self, job: Job, plan: Plan, intent: Intent, now: datetime,
              resend_at: datetime | None = None,
              node_types: dict[str, str] | None = None) -> Job:
        attempt = job.attempt + 1
        gpus = plan.gpus_by_node()
        key = f"{job.job_id}#{attempt}"
        with self.t.lock:
            current = self._job(job.job_id)
            if not _state_in(current, Event.PLACE) or current is None \
                    or current.attempt != job.attempt:
                if current is not None and current.attempt == attempt \
                        and current.state is JobState.SCHEDULED \
                        and current.updated_at == ms(now):
                    return clone(current)  # our own placement, retried
                raise StateChanged(job.job_id)
            full = [n for n in sorted(gpus) if (node := self.t.nodes.get(n)) is None
                    or node.gpus_free < gpus[n] or node.state is not NodeState.READY]
            if full or (job.job_id, attempt) in self.t.attempts \
                    or (job.job_id, intent.intent_id) in self.t.outbox:
                raise CapacityChanged(full or sorted(gpus))
            now = ms(now)
            current.state, current.attempt, current.inboxes = (
                JobState.SCHEDULED, attempt, dict(intent.targets))
            current.pending_reason = current.waiting_on = current.pending_since = None
            current.preempting = None
            current.health, current.updated_at = clear_incident(job.health), now
            self.t.parked.pop(job.job_id, None)
            self.t.count_pending(job.tenant, -1)
            if job.parent_id is not None:
                self._parent_add(job.parent_id, placed=+1)
            self._event(job.job_id, f"placed#{attempt}", ev.placed(now, attempt, plan.ranks_by_node))
            self.t.attempts[(job.job_id, attempt)] = Attempt(
                job_id=job.job_id, attempt=attempt, state=JobState.SCHEDULED.value,
                placement=plan.placement(), node_ranks=clone(plan.ranks_by_node),
                node_gpus=gpus, world_size=job.spec.ranks, created_at=now,
                node_types=dict(node_types or {}))
            self.t.attempt_events[(job.job_id, attempt)] = {}
            self._save_intent(intent, resend_at or now)
            for node_id, g in gpus.items():
                node = self.t.nodes[node_id]
                node.gpus_free -= g
                node.attempts = node.attempts | {key}
            return replace(job, state=JobState.SCHEDULED, attempt=attempt,
                           inboxes=dict(intent.targets), pending_reason=None, pending_since=None,
                           preempting=None, updated_at=now)

    def start(self, job: Job, now: datetime) -> Job:
        """SCHEDULED -> RUNNING when the first ranks of the attempt started."""
        with self.t.lock:
            current = self._job(job.job_id)
            if not _state_in(current, Event.STARTED) or current is None \
                    or current.attempt != job.attempt:
                if current is not None and current.attempt == job.attempt \
                        and current.started_at == ms(now):
                    return clone(current)
                raise StateChanged(job.job_id)
            now = ms(now)
            current.state, current.started_at, current.updated_at = JobState.RUNNING, now, now
            self._event(job.job_id, f"started#{job.attempt}", ev.event(
                "started", now, attempt=job.attempt, reason="the first ranks started"))
            return clone(current)

    def end_attempt(self, job: Job, attempt: Attempt, to: JobState, exit_: dict,
                    now: datetime, stop: Intent | None = None, *,
                    uncounted: bool = False) -> Job:
        with self.t.lock:
            current = self._job(job.job_id)
            lost = (not _state_in(current, *ENDS_ATTEMPT) or current is None
                    or current.attempt != attempt.attempt
                    or (not to.terminal and current.cancel_requested_at is not None)
                    or (job.job_id, f"LAUNCH#{attempt.attempt}") not in self.t.outbox
                    or (stop is not None and stop.targets
                        and (job.job_id, stop.intent_id) in self.t.outbox)
                    or (to.terminal and not self._expire_key_ok(job)))
            if lost:
                ended = self.t.attempts.get((job.job_id, attempt.attempt))
                if ended is not None and ended.finished_at == ms(now) and ended.exit == exit_:
                    return clone(current)  # type: ignore[return-value]
                raise StateChanged(job.job_id)
            assert current is not None
            now = ms(now)
            current.state, current.updated_at = to, now
            current.health = frozen_health(job.health, iso(now), to.terminal, exit_)
            self._event(job.job_id, *ev.attempt_end(now, attempt.attempt, to.value, exit_))
            if to.terminal:
                current.exit, current.finished_at = clone(exit_), now
                self._expire_key(job, now)
            else:
                current.inboxes = {}
                if to is JobState.PENDING:
                    self.t.count_pending(job.tenant, +1)  # a retry is counted, never refused
                    current.pending_since = now
                    current.uncounted_retries += int(uncounted)
            if job.parent_id is not None:
                self._parent_add(job.parent_id, placed=-1,
                                 **({ENDED_COUNTER[to]: 1} if to.terminal else {}))
            stored = self.t.attempts[(job.job_id, attempt.attempt)]
            stored.state = to.value if to.terminal else JobState.FAILED.value
            stored.finished_at, stored.exit = now, clone(exit_)
            self._retire_launch(job.job_id, attempt.attempt)
            if stop is not None and stop.targets:
                self._save_intent(stop, now)
            return clone(current)

    # -- dependencies and arrays (service.ports.Pipelines) ------------------
    def add_dependent(self, job_id: str, dependent_id: str) -> None:
        with self.t.lock:
            current = self._job(job_id)
            if current is None:
                raise ConditionFailed()  # the job is not there
            current.dependents = current.dependents | {dependent_id}

    def states(self, job_ids: Sequence[str], *,
               count_dependents: bool = False) -> dict[str, tuple[str, JobState, int]]:
        with self.t.lock:
            return {i: (j.tenant, j.state, len(j.dependents) if count_dependents else 0)
                    for i in job_ids if (j := self._job(i)) is not None}

    def _partition_of(self, partition: str, limit: int) -> list[Job]:
        with self.t.lock:
            jobs = sorted((j for j in self.t.jobs.values() if active_partition(j) == partition),
                          key=lambda j: queue_key(j.spec.priority, j.job_id))
            return [clone(j) for j in jobs[:limit]]

    def waiting(self, limit: int) -> list[Job]:
        return self._partition_of(WAITING, limit)

    def wait_for(self, job: Job, waiting_for: Sequence[str], reason: str | None,
                 now: datetime) -> bool:
        with self.t.lock:
            current = self._job(job.job_id)
            if current is None or current.state is not JobState.PENDING \
                    or not current.waiting_for or current.waiting_for != job.waiting_for:
                return False
            now = ms(now)
            current.updated_at = now
            if waiting_for:
                current.waiting_for, current.pending_reason = list(waiting_for), reason
            else:
                current.waiting_for = current.pending_reason = None
                if not current.is_array:
                    current.pending_since = now
                self._event(job.job_id, "dependencies_met", ev.event(
                    "dependencies_met", now, reason="every dependency was met"))
            return True

    def arrays(self, limit: int) -> list[Job]:
        return self._partition_of(ARRAY, limit)

    def make_children(self, parent: Job, children: Sequence[Job], now: datetime) -> bool:
        with self.t.lock:
            current = self._job(parent.job_id)
            made = Counts.of(parent.array_counts or {}).materialized
            if current is None or active_partition(current) != ARRAY \
                    or current.cancel_requested_at is not None \
                    or Counts.of(current.array_counts or {}).materialized != made \
                    or any(c.job_id in self.t.jobs for c in children):
                return False
            assert current.array_counts is not None
            current.array_counts["materialized"] = made + len(children)
            current.updated_at = ms(now)
            for child in children:
                self._insert(child)
            return True

    def mark_array_running(self, parent_id: str, tenant: str, now: datetime) -> bool:
        with self.t.lock:
            current = self._job(parent_id)
            if not _state_in(current, Event.INDEX_PLACED) or current is None \
                    or active_partition(current) != ARRAY:
                return False
            now = ms(now)
            current.state = next_state(current.state, Event.INDEX_PLACED)
            current.started_at = current.updated_at = now
            self._event(parent_id, "started", ev.event(
                "started", now, reason="its first index was placed"))
            return True

    def request_array_cancel(self, parent: Job, now: datetime, reason: str | None) -> bool:
        with self.t.lock:
            current = self._job(parent.job_id)
            if current is None or active_partition(current) != ARRAY \
                    or current.cancel_requested_at is not None:
                return False
            now = ms(now)
            current.cancel_requested_at = current.updated_at = now
            current.cancel_reason = reason
            self._event(parent.job_id, "cancel_requested", ev.event(
                "cancel_requested", now, reason=reason, by=parent.tenant))
            return True

    def finish_array(self, parent: Job, to: JobState, exit_: dict | None,
                     now: datetime) -> bool:
        with self.t.lock:
            current = self._job(parent.job_id)
            made = Counts.of(parent.array_counts or {}).materialized
            if not _state_in(current, ARRAY_ENDS[to]) or current is None \
                    or active_partition(current) != ARRAY \
                    or Counts.of(current.array_counts or {}).materialized != made \
                    or not self._expire_key_ok(parent):
                return False
            a = current.spec.array
            assert a is not None and current.array_counts is not None
            never = a.size - made
            now = ms(now)
            current.state, current.exit = to, clone(exit_)
            current.finished_at = current.updated_at = now
            current.pending_reason = None
            if never:
                current.array_counts["cancelled"] = current.array_counts.get("cancelled", 0) \
                    + never
                self.t.count_pending(parent.tenant, -never)
            self._event(parent.job_id, "finished", ev.event(
                "finished", now, state=to.value,
                reason=(exit_ or {}).get("reason") or "succeeded",
                detail=(exit_ or {}).get("detail")))
            self._expire_key(parent, now)
            return True

    def children(self, parent_id: str, state: str | None, page_size: int,
                 after: str | None) -> tuple[list[JobView], str | None]:
        """In index order (their ids sort so), after the ``after`` id."""
        with self.t.lock:
            jobs = sorted((j for j in self.t.jobs.values() if j.parent_id == parent_id
                           and (state is None or j.state.value == state)
                           and (after is None or j.job_id > after)),
                          key=lambda j: j.job_id)
            page = [view_of(clone(j)) for j in jobs[:page_size]]
            return page, (page[-1]["job_id"] if len(jobs) > page_size else None)

    def open_children(self, parent_id: str, limit: int | None = None) -> list[Job]:
        with self.t.lock:
            return [clone(j) for j in sorted(self.t.jobs.values(), key=lambda j: j.job_id)
                    if j.parent_id == parent_id and not j.state.terminal][:limit]

    # -- health ------------------------------------------------------------
    def record_health(self, job: Job, health: dict, *, incident_key: str | None = None,
                      recovered: bool = False,
                      events: Sequence[tuple[str, dict]] = ()) -> bool:
        with self.t.lock:
            current = self._job(job.job_id)
            if current is None or current.state is not JobState.RUNNING \
                    or current.attempt != job.attempt:
                return False
            if len(json.dumps(health)) > ITEM_LIMIT_BYTES:  # DynamoDB's item limit
                raise RecordTooLarge(f"{job.job_id}: the health record is over 400 KB")
            if recovered and job.incident_key is not None and incident_key is None:
                if current.incident_key != job.incident_key:
                    return False
                self._event(job.job_id, *ev.recovered(self._clock(), job.attempt,
                                                       job.incident_key, job.health))
            if incident_key is not None:
                if current.incident_key != job.incident_key:
                    return False
                current.incident_key = incident_key
                self._event(job.job_id, f"stalled#{incident_key}", ev.event(
                    "stalled", self._clock(), attempt=job.attempt, **incident(health)))
            for key, told in events:
                self._event(job.job_id, key, clone(told))
            current.health = clone(health)
            return True

    # -- attempts -------------------------------------------------------------
    def attempt(self, job_id: str, attempt: int) -> Attempt | None:
        with self.t.lock:
            return clone(self.t.attempts.get((job_id, attempt)))

    def record_ranks(self, job_id: str, attempt: int, kind: str, ranks: list[int],
                     exit_code: int | None = None, node_id: str | None = None,
                     stacks: list[dict] | None = None) -> Attempt:
        with self.t.lock:
            stored = self.t.attempts.get((job_id, attempt))
            if stored is None:
                raise ConditionFailed()  # the adapter's: its update's condition was false
            if ranks:  # the report's event, once; the progress is worked out from them all
                code = exit_code if kind == "exited" else None
                events = self.t.attempt_events[(job_id, attempt)]
                events.setdefault(ev.ranks_key(kind, ranks, code),
                                  ev.rank_event(kind, self._clock(), attempt, ranks, code,
                                                node_id, stacks))
                for key, value in reported(events.values()).items():
                    setattr(stored, key, value)
            return clone(stored)

    def release(self, attempt: Attempt, node_id: str,
                heard_at: datetime | None = None) -> bool:
        """A node's GPUs back from the attempt, exactly once (``heard_at``: its
        last_seen_at too)."""
        with self.t.lock:
            stored = self.t.attempts.get((attempt.job_id, attempt.attempt))
            node = self.t.nodes.get(node_id)
            if stored is None or node_id in stored.released or node is None:
                return False
            key = f"{attempt.job_id}#{attempt.attempt}"
            stored.released.add(node_id)
            node.gpus_free += int(attempt.node_gpus.get(node_id, 0))
            node.attempts, node.lost = node.attempts - {key}, node.lost - {key}
            if heard_at is not None:
                node.last_seen_at = heard_at
            self.t.bump_room(attempt.node_types.get(node_id), self._clock())
            return True

    def attempts(self, job_id: str) -> list[dict]:
        with self.t.lock:
            return [{"attempt": a.attempt, "placement": clone(a.placement),
                     "state": "RUNNING" if a.state == "SCHEDULED" and a.started else a.state,
                     "created_at": a.created_at, "finished_at": a.finished_at,
                     "exit": clone(a.exit)}
                    for (j, _), a in sorted(self.t.attempts.items()) if j == job_id]

    def events(self, job_id: str) -> list[dict]:
        with self.t.lock:
            if job_id not in self.t.jobs:
                raise KeyError(job_id)
            return clone(ev.timeline(
                self.t.job_events.get(job_id), *(e for (j, _), e in sorted(
                    self.t.attempt_events.items()) if j == job_id)))

    def ping(self) -> None:
        if self.ping_error is not None:
            raise self.ping_error

    # -- outbox --------------------------------------------------------------
    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]:
        with self.t.lock:
            due = sorted((o for o in self.t.outbox.values()
                          if o.pending and o.due_at <= ms(now)), key=lambda o: o.due_at)
            return [OutboxEntry(clone(o.intent), frozenset(o.unacked), o.due_at, o.sends)
                    for o in due[:limit]]

    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None:
        with self.t.lock:
            o = self.t.outbox.get((entry.intent.job_id, entry.intent.intent_id))
            if o is not None and o.pending:  # acknowledged meanwhile: nothing to do
                o.due_at, o.sends = ms(due_at), o.sends + 1

    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None:
        with self.t.lock:
            o = self.t.outbox.get((job_id, intent_id))
            if o is None:
                return
            o.unacked.discard(node_id)
            if not o.unacked:
                o.pending = False


class FakeNodeStore:
    """chalicelib.service.ports.NodeStore in memory (adapters/node_store.DynamoNodeStore)."""

    def __init__(self, tables: Tables | None = None) -> None:
        self.t = tables or Tables()

    def get(self, node_id: str) -> Node | None:
        with self.t.lock:
            return clone(self.t.nodes.get(node_id))

    def all(self) -> list[Node]:
        with self.t.lock:
            return [clone(n) for _, n in sorted(self.t.nodes.items())]

    def _fleet(self, gpu_type: str, delta: int) -> None:
        f = self.t.fleet_of(gpu_type)
        self.t.fleet[gpu_type] = replace(f, gpus=f.gpus + delta)

    def _raise_largest(self, gpu_type: str, gpus: int, now: datetime) -> None:
        """A new largest node of the type (and of all types) is a new generation."""
        for t in (gpu_type, ALL_TYPES):
            if self.t.fleet_of(t).largest_node < gpus:
                self.t.fleet[t] = replace(self.t.fleet_of(t), largest_node=gpus)
                self.t.reshape(t, now)

    def register(self, node_id: str, *, gpus: int, gpu_type: str, labels: dict,
                 address: str, inbox_queue_url: str, now: datetime,
                 current: Node | None, isolation: str = "none",
                 fresh_s: float = 0.0) -> Node:
        """Create or update a node; capacity moves gpus_free and the fleet by the
        same delta, and a new generation of every fleet whose registered GPUs
        changed (``current`` is only a hint here: the fake reads its own); a
        call-in that changes nothing within ``fresh_s`` writes nothing."""
        now = ms(now)
        with self.t.lock:
            node = self.t.nodes.get(node_id)
            if node is not None and fresh_call_in(
                    node, gpus=gpus, gpu_type=gpu_type, labels=labels, address=address,
                    inbox_queue_url=inbox_queue_url, isolation=isolation, now=now,
                    fresh_s=fresh_s):
                return clone(node)
            if node is None:
                self.t.nodes[node_id] = Node(
                    node_id=node_id, gpus=gpus, gpus_free=gpus, gpu_type=gpu_type,
                    state=NodeState.READY, inbox_queue_url=inbox_queue_url, last_seen_at=now,
                    registered_at=now, labels=clone(labels), address=address,
                    isolation=isolation)
                for t in (gpu_type, ALL_TYPES):
                    self._fleet(t, gpus)
                    self.t.reshape(t, now)
                self.t.bump_room(gpu_type, now)
                self._raise_largest(gpu_type, gpus, now)
                return clone(self.t.nodes[node_id])
            was_down = node.state is NodeState.DOWN
            node.last_seen_at, node.labels, node.address = now, clone(labels), address
            node.inbox_queue_url, node.isolation = inbox_queue_url, isolation
            if was_down:  # a cordon it had holds on
                node.state = NodeState.DRAINING if node.cordon else NodeState.READY
            changed = gpus != node.gpus or gpu_type != node.gpu_type
            if changed:
                deltas = {node.gpu_type: -node.gpus, ALL_TYPES: gpus - node.gpus}
                deltas[gpu_type] = deltas.get(gpu_type, 0) + gpus
                # ALL_TYPES always moves on: its generation says "some type changed"
                for t, d in deltas.items():
                    if d or t == ALL_TYPES:
                        self._fleet(t, d)
                        self.t.reshape(t, now)
                node.gpus_free += gpus - node.gpus
                node.gpus, node.gpu_type = gpus, gpu_type
            if changed or (was_down and not node.cordon):  # room may have appeared
                self.t.bump_room(gpu_type, now)
                self._raise_largest(gpu_type, gpus, now)
            return clone(node)

    def cordon(self, node_id: str, cordon: dict, now: datetime) -> Node | None:
        with self.t.lock:
            node = self.t.nodes.get(node_id)
            if node is None:
                return None
            node.cordon = clone(cordon)
            if node.state is NodeState.READY:
                node.state = NodeState.DRAINING
            return clone(node)

    def uncordon(self, node_id: str, now: datetime) -> Node | None:
        with self.t.lock:
            node = self.t.nodes.get(node_id)
            if node is None or node.cordon is None:
                return clone(node)
            node.cordon = None
            if node.state is NodeState.DRAINING:
                node.state = NodeState.READY
                self.t.bump_room(node.gpu_type, ms(now))
            return clone(node)

    def record_failure(self, node_id: str, entry: str, since: str) -> list[str]:
        with self.t.lock:
            node = self.t.nodes.get(node_id)
            if node is None:
                return []
            node.failures = frozenset(failures_since(node.failures | {entry}, since))
            return sorted(node.failures)

    def fleet_of(self, gpu_type: str | None) -> Fleet:
        with self.t.lock:
            return self.t.fleet_of(fleet_key(gpu_type))

    def fleets(self) -> list[Fleet]:
        """Every fleet item: each GPU type's and ``*``, by key."""
        with self.t.lock:
            return [f for _, f in sorted(self.t.fleet.items())]

    def line(self) -> Line | None:
        with self.t.lock:
            return None if self.t.line is None else Line.from_json(self.t.line)

    def set_line(self, line: Line) -> None:
        with self.t.lock:
            self.t.line = line.to_json()

    def mark_swept(self, fleet: Fleet) -> None:
        """Record the generation as swept, unless the fleet moved on meanwhile
        (an unwritten fleet has no generation: nothing is written)."""
        with self.t.lock:
            stored = self.t.fleet.get(fleet.key)
            if stored is not None and stored.generation and \
                    stored.generation == fleet.generation:
                self.t.fleet[fleet.key] = replace(stored, swept_generation=fleet.generation)

    def ready_pages(self, gpu_type: str | None, min_free: int) -> Iterator[list[Node]]:
        """READY nodes with at least ``min_free`` GPUs, most free first, in pages."""
        with self.t.lock:
            ready = sorted((clone(n) for n in self.t.nodes.values()
                            if n.state is NodeState.READY and n.gpus_free >= min_free
                            and (gpu_type is None or n.gpu_type == gpu_type)),
                           key=lambda n: (-n.gpus_free, n.node_id))
        for i in range(0, len(ready), CANDIDATE_PAGE):
            yield ready[i:i + CANDIDATE_PAGE]

    def silent_since(self, before: datetime) -> list[Node]:
        with self.t.lock:
            return [clone(n) for _, n in sorted(self.t.nodes.items())
                    if n.state is not NodeState.DOWN and n.last_seen_at < ms(before)]

    def down_holding_attempts(self) -> list[Node]:
        """DOWN nodes on which some attempt still holds GPUs."""
        with self.t.lock:
            return [clone(n) for _, n in sorted(self.t.nodes.items())
                    if n.state is NodeState.DOWN and n.attempts]

    def mark_down(self, node: Node) -> bool:
        with self.t.lock:
            stored = self.t.nodes.get(node.node_id)
            if stored is None or stored.last_seen_at != ms(node.last_seen_at):
                return False  # it called in since it was read
            stored.state = NodeState.DOWN
            return True

    def mark_lost(self, node_id: str, key: str) -> bool:
        with self.t.lock:
            stored = self.t.nodes.get(node_id)
            if stored is None or key not in stored.attempts:
                return False
            stored.lost = stored.lost | {key}
            return True

    def attempts_on(self, node_id: str) -> list[tuple[str, int]]:
        with self.t.lock:
            stored = self.t.nodes.get(node_id)
            keys = stored.attempts if stored is not None else ()
            return sorted((k.rpartition("#")[0], int(k.rpartition("#")[2])) for k in keys)


#: what the adapter reads back of a rank's record (sent_at and pause_reason
#: are stored for diagnosis only; prev_heard_at and ended are not the store's)
_READ_BACK = tuple(f.name for f in dataclasses.fields(Beat) if f.name not in (
    "rank", "node_id", "prev_heard_at", "ended", "sent_at", "pause_reason"))
#: what an entry that is not a beat sets in its rank's record when it has them
_NOTED = ("paused_until", "proc", "sampled_at", "io_at", "active_at", "wrote_at",
          "arrived_seq", "arrived_name")


def _kept(b: Beat, names: tuple[str, ...]) -> dict:
    """Fields of ``b`` as the adapter stores them (times to the millisecond)."""
    return {n: _ms(v) if isinstance(v, datetime) else clone(v)
            for n in names for v in (getattr(b, n),)}


class FakeHeartbeatStore:
    """chalicelib.service.ports.HeartbeatStore in memory: one record per rank."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, int, int], dict] = {}
        #: (job_id, attempt, node_id) -> the last post's ``now``
        self.posts: dict[tuple[str, int, str], datetime] = {}
        self._lock = threading.Lock()

    def record(self, job_id: str, attempt: int, entries: Sequence[Beat],
               now: datetime, node_of: Mapping[int, str]) -> None:
        """Beats replace their rank's record, then other entries merge into it
        (records by rank: how the adapter groups them by host is its own)."""
        with self._lock:
            for node_id in {b.node_id for b in entries}:
                self.posts[(job_id, attempt, node_id)] = ms(now)
            for b in entries:
                if b.heard_at is not None:
                    self.items[(job_id, attempt, b.rank)] = _kept(b, _READ_BACK)
            for b in entries:
                if b.heard_at is None:
                    item = self.items.setdefault((job_id, attempt, b.rank), {})
                    item.update((k, v) for k, v in _kept(b, _NOTED).items() if v is not None)

    def read(self, job_id: str, attempt: int, node_of: Mapping[int, str]) -> list[Beat]:
        with self._lock:
            return [Beat(rank, node_of[rank], **{k: clone(v) for k, v in self.items.get(
                (job_id, attempt, rank), {}).items()}) for rank in range(len(node_of))]

    def last_posts(self, attempts: Mapping[tuple[str, int], Mapping[int, str]],
                   nodes: Collection[str]) -> dict[str, datetime]:
        with self._lock:
            out: dict[str, datetime] = {}
            for (job_id, attempt, node_id), at in self.posts.items():
                if (job_id, attempt) in attempts and node_id in nodes and (
                        node_id not in out or at > out[node_id]):
                    out[node_id] = at
            return out

    def seed(self, job_id: str, attempt: int, beats: dict[int, Beat]) -> None:
        """Records as a test wants them, as read back (heard_at and all)."""
        with self._lock:
            for rank, b in beats.items():
                self.items[(job_id, attempt, rank)] = {n: getattr(b, n) for n in _READ_BACK}


class FakeCollectorStore:
    """chalicelib.service.ports.CollectorStore in memory."""

    def __init__(self, previous_scan: datetime | None = None,
                 latest_ingest: datetime | None = None) -> None:
        self._scan: tuple[datetime | None, datetime | None, str | None] = (
            _ms(previous_scan), None, None)
        self._marks = [ms(latest_ingest)] if latest_ingest else []
        self._last_mark: datetime | None = None

    def mark_ingest(self, now: datetime) -> None:
        # as the adapter: at most one mark a second (per process)
        if self._last_mark is not None and abs((now - self._last_mark).total_seconds()) < 1.0:
            return
        self._last_mark = now
        self._marks.append(ms(now))

    def latest_ingest(self) -> datetime | None:
        return max(self._marks) if self._marks else None

    def previous_scan(self) -> tuple[datetime | None, datetime | None, str | None]:
        return self._scan

    def record_scan(self, now: datetime, hold_until: datetime | None = None,
                    hold_reason: str | None = None) -> None:
        self._scan = (ms(now), _ms(hold_until), hold_reason)


class FakeInbox:
    """chalicelib.service.ports.Inbox in memory: a list of messages per queue URL."""

    def __init__(self, prefix: str = "fake://inbox/") -> None:
        self.prefix = prefix
        self.queues: dict[str, list[dict]] = {}
        #: queue URLs whose sends fail (a dependency failure to inject)
        self.failing: set[str] = set()
        self._lock = threading.Lock()

    def ensure(self, node_id: str) -> str:
        url = self.prefix + node_id
        with self._lock:
            self.queues.setdefault(url, [])
        return url

    def is_current(self, node_id: str, url: str) -> bool:
        return url == self.prefix + node_id

    def send(self, queue_url: str, message: dict) -> None:
        if queue_url in self.failing:
            raise ConnectionError(f"sending to {queue_url} failed")
        with self._lock:
            if queue_url not in self.queues:
                raise LookupError(f"no queue {queue_url}")
            self.queues[queue_url].append(clone(message))

    def drain(self, queue_url: str) -> list[dict]:
        """Every message sent to the queue since the last drain."""
        with self._lock:
            out, self.queues[queue_url] = self.queues.get(queue_url, []), []
            return out

    @property
    def sent(self) -> list[dict]:
        """Every message waiting in any queue, in queue then send order."""
        with self._lock:
            return [m for _, q in sorted(self.queues.items()) for m in q]


class FailingInbox:
    """The queue service is down: every send fails (after whatever the caller
    wrote first); inboxes are still made by the inbox it wraps."""

    def __init__(self, real) -> None:
        self.real, self.attempts = real, 0

    def ensure(self, node_id: str) -> str:
        return self.real.ensure(node_id)

    def is_current(self, node_id: str, url: str) -> bool:
        return self.real.is_current(node_id, url)

    def send(self, queue_url: str, message: dict) -> None:
        self.attempts += 1
        raise ConnectionError("SQS unreachable")


class FakeNudge:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


class FakeFollowUps:
    """The follow-up queue (adapters/inbox.py SqsFollowUps): the job ids sent,
    in order, until :meth:`deliver` hands them to a consumer."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, job_id: str) -> None:
        self.sent.append(job_id)

    def deliver(self, consume) -> int:
        """Each message sent so far, as app.py's follow_up gets it; how many."""
        sent, self.sent = self.sent, []
        for job_id in sent:
            consume(json.dumps({"job_id": job_id}))
        return len(sent)


class FakeFeeds:
    """chalicelib.service.ports.FeedLog in memory (adapters/feed_store.DynamoFeeds)
    over the world's job stories: a told story event is unfed until
    ``mark_fed`` (as its key stays in the job's ``unfed_keys``), and fed once
    a marker is written for it (``append``). Its index is never stale."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables
        self.heads: dict[str, FeedHead] = {}
        self.feeds: dict[str, dict[int, dict]] = {}
        self.fed: set[tuple[str, str]] = set()
        self.marked: set[tuple[str, str]] = set()

    def unfed(self, job_id: str) -> dict[str, dict | None]:
        with self.t.lock:
            return {k: dict(v) for k, v in sorted(self.t.job_events.get(job_id, {}).items())
                    if feed.told(k) and (job_id, k) not in self.marked}

    def unfed_jobs(self, tenant: str, limit: int) -> list[str]:
        with self.t.lock:
            return sorted(j for j, job in self.t.jobs.items()
                          if job.tenant == tenant and self.unfed(j))[:limit]

    def unfed_tenants(self, limit: int) -> list[str]:
        with self.t.lock:
            return sorted({job.tenant for j, job in self.t.jobs.items() if self.unfed(j)})[:limit]

    def head(self, tenant: str) -> FeedHead:
        return self.heads.get(tenant, FeedHead())

    def append(self, tenant: str, read: FeedHead, ms: int,
               events: Sequence[tuple[int, dict]], fed: Sequence[tuple[str, str]]) -> None:
        with self.t.lock:
            if not events and not fed:
                return
            gone = [f for f in fed if f in self.fed]
            if gone:
                raise AlreadyFed(gone)
            head = self.head(tenant)
            if head.seq != read.seq:
                raise Contended(tenant)
            self.fed.update(fed)
            self.feeds.setdefault(tenant, {}).update((seq, json.loads(json.dumps(e)))
                                                     for seq, e in events)
            top = events[-1][0] if events else read.seq
            self.heads[tenant] = replace(head, seq=top, ms=ms)

    def mark_fed(self, job_id: str, keys: Collection[str]) -> None:
        with self.t.lock:
            self.marked.update((job_id, k) for k in keys)

    def events(self, tenant: str, after: int, upto: int, limit: int) -> list[tuple[int, dict]]:
        with self.t.lock:
            rows = sorted((s, e) for s, e in self.feeds.get(tenant, {}).items()
                          if after < s <= upto)
            return [(s, dict(e)) for s, e in rows[:limit]]

    def pushed(self, tenant: str, read: FeedHead, upto: int) -> None:
        with self.t.lock:
            head = self.head(tenant)
            if head.seq < upto or head.pushed > upto or (upto >= read.seq and head.seq != upto):
                return  # (the real one's condition fails: nothing changes)
            self.heads[tenant] = replace(head, pushed=upto)

    def push_due(self, limit: int) -> list[str]:
        with self.t.lock:
            return sorted(t for t, h in self.heads.items() if h.seq > h.pushed)[:limit]


class FakeUsage:
    """chalicelib.service.ports.UsageRollup in memory (adapters/usage_store.
    DynamoUsage): cells by (tenant, granularity, period, dimension, value),
    summed; one marker per (job, attempt); the tenants seen per UTC day."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[tuple[str, str, int, str, str], dict[str, int]] = {}
        self.marked: set[tuple[str, int]] = set()
        self.days: dict[int, set[str]] = {}
        #: (job, attempt) -> when it ended, not rolled up yet (the adapter's
        #: due items, written with the attempt's end: ``mark_due``)
        self.pending: dict[tuple[str, int], datetime] = {}

    def mark_due(self, job_id: str, attempt: int, at: datetime) -> None:
        with self.lock:
            self.pending[(job_id, attempt)] = ms(at)

    def done(self, job_id: str, attempt: int) -> None:
        with self.lock:
            self.pending.pop((job_id, attempt), None)

    def due(self, before: datetime, limit: int) -> list[tuple[str, int]]:
        with self.lock:
            return [k for k, at in self.pending.items() if at < ms(before)][:limit]

    def add(self, tenant: str, job_id: str, attempt: int,
            increments: Mapping[Key, Mapping[str, int]]) -> bool:
        with self.lock:
            if (job_id, attempt) in self.marked:
                return False
            self.marked.add((job_id, attempt))
            for (gran, at, dim, value), counts in increments.items():
                row = self.rows.setdefault((tenant, gran, at, dim, value), {})
                for k, v in counts.items():
                    row[k] = row.get(k, 0) + v
                self.days.setdefault(at - at % DAY_MS, set()).add(tenant)
            return True

    def cells(self, tenant: str, granularity: str, dim: str,
              start_ms: int, end_ms: int) -> list[UsageCell]:
        with self.lock:
            out = [UsageCell(at, value, {k: v for k, v in row.items() if k != "jobs"},
                             row.get("jobs", 0))
                   for (t, g, at, d, value), row in self.rows.items()
                   if t == tenant and g == granularity and d == dim and start_ms <= at < end_ms]
        return sorted(out, key=lambda c: (c.at_ms, c.value))

    def tenants(self, start_ms: int, end_ms: int) -> list[str]:
        first = start_ms - start_ms % DAY_MS
        with self.lock:
            return sorted({t for d, ts in self.days.items() if first <= d < end_ms for t in ts})


class RecordingSink:
    """chalicelib.service.ports.EventSink that keeps what was put; ``fail``
    makes the next puts raise (a bus that refuses)."""

    def __init__(self) -> None:
        self.put_events: list[dict] = []
        self.fail: Exception | None = None

    def put(self, events: Sequence[dict]) -> None:
        if self.fail is not None:
            raise self.fail
        self.put_events.extend(events)


class FakeWebhookStore:
    """service.ports.WebhookStore in memory, answering exactly what
    adapters/webhook_store.DynamoWebhookStore answers (tests/contract/
    test_webhook_store.py runs both)."""

    def __init__(self) -> None:
        self.webhooks: dict[tuple[str, str], Any] = {}
        self.counts: dict[str, int] = {}
        self.log: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def create(self, webhook, limit: int) -> bool:
        with self._lock:
            if self.counts.get(webhook.tenant, 0) >= limit:
                return False
            key = (webhook.tenant, webhook.webhook_id)
            if key in self.webhooks:
                return False
            self.counts[webhook.tenant] = self.counts.get(webhook.tenant, 0) + 1
            # stored to the millisecond, as the table stores times
            self.webhooks[key] = replace(webhook, types=tuple(webhook.types),
                                         created_at=ms(webhook.created_at))
            return True

    def get(self, tenant: str, webhook_id: str):
        return self.webhooks.get((tenant, webhook_id))

    def webhooks_of(self, tenant: str) -> list:
        return sorted((w for (t, _), w in self.webhooks.items() if t == tenant),
                      key=lambda w: (w.created_at, w.webhook_id))

    def delete(self, tenant: str, webhook_id: str) -> bool:
        with self._lock:
            if self.webhooks.pop((tenant, webhook_id), None) is None:
                return False
            self.counts[tenant] -= 1
            return True

    def failed(self, tenant: str, webhook_id: str, at: datetime):
        with self._lock:
            w = self.webhooks.get((tenant, webhook_id))
            if w is None:
                return None
            if w.failing_since is None:
                w = self.webhooks[(tenant, webhook_id)] = replace(w, failing_since=ms(at))
            return w.failing_since

    def succeeded(self, tenant: str, webhook_id: str) -> None:
        with self._lock:
            w = self.webhooks.get((tenant, webhook_id))
            if w is not None:
                self.webhooks[(tenant, webhook_id)] = replace(w, failing_since=None)

    def disable(self, tenant: str, webhook_id: str, at: datetime) -> bool:
        with self._lock:
            w = self.webhooks.get((tenant, webhook_id))
            if w is None or w.state != "enabled":
                return False
            self.webhooks[(tenant, webhook_id)] = replace(w, state="disabled",
                                                          disabled_at=ms(at))
            return True

    def record(self, webhook_id: str, delivery) -> None:
        from chalicelib.adapters.webhook_store import delivery_key
        d = replace(delivery, at=ms(delivery.at), next_retry_at=_ms(delivery.next_retry_at))
        with self._lock:
            self.log.setdefault(webhook_id, {})[delivery_key(d)] = d

    def deliveries(self, webhook_id: str, page_size: int, after: str | None):
        with self._lock:
            keys = sorted(self.log.get(webhook_id, {}), reverse=True)
            if after is not None:
                keys = [k for k in keys if k < after]
            page = keys[:page_size]
            last = page[-1] if len(keys) > page_size and page else None
            return [self.log[webhook_id][k] for k in page], last


class FakeWebhookQueue:
    """The deliveries' queue (adapters/webhook_queue.py SqsWebhookQueue): each
    message and its delay, until :meth:`deliver` hands them to a consumer;
    ``failing`` makes every send raise."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict, int]] = []
        self.failing = False

    def send(self, message: dict, delay_s: int = 0) -> None:
        if self.failing:
            raise ConnectionError("SQS unreachable")
        assert 0 <= delay_s <= 900, delay_s
        self.sent.append((clone(message), delay_s))

    def send_many(self, messages: list[dict]) -> None:
        for message in messages:
            self.send(message)

    def deliver(self, consume) -> int:
        """Each message sent so far, as app.py's deliver_webhook gets it; how many."""
        sent, self.sent = self.sent, []
        for message, _ in sent:
            consume(json.dumps(message))
        return len(sent)


class NullTelemetry:
    """Telemetry that records nothing."""

    def count(self, name: str, value: float = 1) -> None: ...
    def seconds(self, name: str, value: float) -> None: ...
    def begin(self, request_id: str | None) -> None: ...
    def flush(self) -> None: ...


class RecordingTelemetry(NullTelemetry):
    """Telemetry that keeps what it is told: counts summed by name, timings,
    the request ids begun and how many flushes."""

    def __init__(self) -> None:
        self.counts: dict[str, float] = {}
        self.timings: dict[str, list[float]] = {}
        self.begun: list[str | None] = []
        self.flushed = 0

    def count(self, name: str, value: float = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def seconds(self, name: str, value: float) -> None:
        self.timings.setdefault(name, []).append(value)

    def begin(self, request_id: str | None) -> None:
        self.begun.append(request_id)

    def flush(self) -> None:
        self.flushed += 1


class FakeLogReader:
    """chalicelib.service.ports.LogReader over given events (stream, time ms,
    message, id), a page of ``limit`` at a time, oldest first, its token the
    position after the page's last event.

    As the adapter on the embedded moto does, it answers a read of more than
    100 streams (CloudWatch's by-prefix read) with every stream of the log
    group: moto ignores ``logStreamNamePrefix``. ``ignores_filter=True`` makes
    it ignore the stream names as well: a store that returns anything."""

    def __init__(self, events: list[tuple] | None = None, *,
                 ignores_filter: bool = False) -> None:
        self.events = list(events or [])
        self.ignores_filter = ignores_filter
        self.reads = 0

    def put(self, stream: str, time_ms: int, message: str) -> None:
        self.events.append((stream, time_ms, message, f"{len(self.events):056d}"))

    def read(self, streams: list[str], prefix: str, *, start_ms: int | None,
             token: str | None, limit: int) -> LogPage:
        self.reads += 1
        every = self.ignores_filter or len(streams) > MAX_STREAM_NAMES
        chosen = sorted((e for e in self.events if (every or e[0] in streams)
                         and (start_ms is None or e[1] >= start_ms)), key=lambda e: e[1])
        try:
            at = int(token) if token else 0
        except ValueError:
            return LogPage([], None)  # as CloudWatch (and moto) answer a token not theirs
        rest = chosen[at:at + limit]
        return LogPage(rest, str(at + limit) if rest and at + limit < len(chosen) else None)


@dataclass
class FakeServices:
    store: FakeJobStore
    nodes_store: FakeNodeStore
    jobs: Any
    nodes: Any
    attempts: Any
    placer: Any
    reconciler: Any
    heartbeats: Any
    scanner: Any
    cordons: Any
    pipelines: Any


class World:
    """Every fake over shared tables, and the services of bootstrap.build over them."""

    def __init__(self, clock: Clock = utcnow) -> None:
        self.clock = clock
        self.tables = Tables()
        self.store = FakeJobStore(self.tables, clock)
        self.nodes = FakeNodeStore(self.tables)
        self.beats = FakeHeartbeatStore()
        self.collector = FakeCollectorStore()
        self.inbox = FakeInbox()
        self.nudge = FakeNudge()
        self.telemetry = RecordingTelemetry()

    def services(self, *, page_token_key: bytes = b"fake-page-key",
                 scans_per_hour: float = 60.0, period_s: float = 60.0,
                 resend_after_s: float = 30.0, down_after_s: float = 60.0,
                 limits: quotas.TenantLimits = quotas.NO_LIMITS,
                 settle_s: float = SETTLE_S, auto_cordon_failures: int = 3,
                 auto_cordon_window_s: float = 3600.0, auto_cordon_tenants: int = 2,
                 classes: PriorityClasses = NO_CLASSES,
                 preempt_min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
                 follow_up_queue: FakeFollowUps | None = None):
        """The services as bootstrap.build wires them (no fan-out, no logs);
        ``limits`` are the tenants' (none by default), ``settle_s`` the placer's;
        jobs' follow-ups go through ``follow_up_queue`` (none: in the call)."""
        from chalicelib.bootstrap import follow_ups
        from chalicelib.service.attempts import AttemptsService
        from chalicelib.service.bus import Bus
        from chalicelib.service.cancels import Canceller
        from chalicelib.service.cordons import Cordons, FailureWatch
        from chalicelib.service.dispatch import Dispatcher
        from chalicelib.service.heartbeats import HeartbeatsService
        from chalicelib.service.jobs import JobsService
        from chalicelib.service.nodes import NodesService
        from chalicelib.service.pipelines import PipelinesService
        from chalicelib.service.placement import Placer
        from chalicelib.service.reconciler import Reconciler
        from chalicelib.service.scan import Scanner

        clock, dispatcher, bus = self.clock, Dispatcher(self.inbox), Bus()
        canceller = Canceller(self.store, dispatcher, resend_after_s=resend_after_s,
                              telemetry=self.telemetry, clock=clock)
        pipelines = PipelinesService(self.store, canceller, self.nudge,
                                     scans_per_hour=scans_per_hour, clock=clock)
        jobs = JobsService(self.store, dispatcher, self.nudge, page_token_key=page_token_key,
                           scans_per_hour=scans_per_hour, cancel_resend_after_s=resend_after_s,
                           telemetry=self.telemetry, clock=clock, limits=limits,
                           classes=classes, pipelines=pipelines, canceller=canceller,
                           fleet_of=self.nodes.fleet_of, line_of=self.nodes.line,
                           publish=bus.publish)
        watch = FailureWatch(self.nodes, failures=auto_cordon_failures,
                             window_s=auto_cordon_window_s, tenants=auto_cordon_tenants,
                             clock=clock)
        attempts = AttemptsService(self.store, dispatcher, self.nudge, clock=clock,
                                   publish=bus.publish)
        follow_ups(bus, pipelines=pipelines, attempts=attempts, watch=watch,
                   queue=follow_up_queue)
        heartbeats = HeartbeatsService(self.store, self.beats, self.collector,
                                       scans_per_hour=scans_per_hour, telemetry=self.telemetry,
                                       page_token_key=page_token_key, clock=clock)
        return FakeServices(
            store=self.store, nodes_store=self.nodes, jobs=jobs,
            nodes=NodesService(self.nodes, self.inbox, self.collector, clock=clock,
                               publish=bus.publish, down_after_s=down_after_s),
            attempts=attempts,
            placer=Placer(self.store, self.nodes, dispatcher, resend_after_s=resend_after_s,
                          clock=clock, limits=limits, settle_s=settle_s, classes=classes,
                          preempt_min_runtime_s=preempt_min_runtime_s, publish=bus.publish),
            reconciler=Reconciler(self.store, self.nodes, dispatcher, attempts,
                                  resend_after_s=resend_after_s, down_after_s=down_after_s,
                                  pipelines=pipelines, beats=self.beats,
                                  placed=heartbeats.node_of, clock=clock),
            heartbeats=heartbeats,
            scanner=Scanner(self.store, heartbeats, self.collector, attempts,
                            period_s=period_s, telemetry=self.telemetry, clock=clock),
            cordons=Cordons(self.nodes, self.store, attempts, clock=clock), pipelines=pipelines)
