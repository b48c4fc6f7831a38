"""Jobs use cases: idempotent create, read, keyset listing, cancel as an intent."""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Callable, Protocol, Sequence

from ..domain import (
    arrays,
    cursor,
    dependencies,
    idempotency,
    placement,
    queue,
    quotas,
    usage,
)
from ..domain.clock import Clock, utcnow
from ..domain.errors import (
    AlreadyFinished,
    ApiError,
    Forbidden,
    IdempotencyKeyReused,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    RequestInProgress,
    ServiceUnavailable,
)
from ..domain.fleet import Fleet
from ..domain.happened import JobEnded
from ..domain.health import initial_health
from ..domain.ids import is_job_id, new_job_id
from ..domain.jobs import Job
from ..domain.priority import NO_CLASSES, PriorityClasses
from ..domain.queue import Line
from ..domain.quotas import TenantLimits
from ..domain.spec import JobSpec
from ..domain.states import JobState
from . import limits
from .bus import Publish, nowhere
from .cancels import Canceller
from .dispatch import Dispatcher
from .pipelines import PipelinesService
from .ports import (
    Arrays,
    Attempts,
    Contended,
    FleetChanged,
    IdemClaim,
    IdempotencyConflict,
    JobReads,
    JobWrites,
    Nudge,
    PendingLimitReached,
    Telemetry,
)
from .views import JobView, view_of

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50
#: how often a command retries after losing a conditional write to a racer
_RACE_RETRIES = 3


#: a job's fields other than those job_wire_bytes encodes: names, ids, times
_JOB_FIXED_BYTES = 640


def _variable(job: JobView) -> list:
    return [job["spec"], job["health"], job["exit"], job["name"], job["cancel_reason"],
            job["pending_reason"], job["waiting_for"]]


def job_wire_bytes(job: JobView) -> int:
    """An upper bound of the bytes ``job`` takes in a response's proxy payload."""
    return _JOB_FIXED_BYTES + limits.proxy_bytes(_variable(job))


def jobs_wire_bytes(jobs: Sequence[JobView]) -> int:
    """An upper bound of the bytes ``jobs`` take together (one encoding, not
    one per job: a page is cut only when this exceeds its budget)."""
    return _JOB_FIXED_BYTES * len(jobs) + limits.proxy_bytes([_variable(j) for j in jobs])


#: how long a warm function's creates share one read of a GPU type's fleet
FLEET_TTL_S = 5.0


class RecentFleets:
    """A GPU type's fleet as read at most ``ttl_s`` ago, so creates do not
    each pay a read (a create is one write round trip). Being stale is safe
    either way: a job judged to fit that no longer does is parked by the
    placer as before; a job judged never to fit is parked by a write
    conditioned on the fleet's generation, which fails if a node came
    meanwhile (FleetChanged), and then the fleet is read again (:meth:`forget`)."""

    def __init__(self, read: Callable[[str | None], Fleet], clock: Clock,
                 ttl_s: float = FLEET_TTL_S) -> None:
        """``clock``: the service's (a clock moved by a test or a bench moves
        this cache's time too); one that went back counts as expired."""
        self._read, self._ttl_s, self._clock = read, ttl_s, clock
        self._seen: dict[str | None, tuple[datetime, Fleet]] = {}

    def __call__(self, gpu_type: str | None) -> Fleet:
        now = self._clock()
        seen = self._seen.get(gpu_type)
        if seen is None or not 0 <= (now - seen[0]).total_seconds() <= self._ttl_s:
            seen = (now, self._read(gpu_type))
            self._seen[gpu_type] = seen
        return seen[1]

    def forget(self, gpu_type: str | None) -> None:
        self._seen.pop(gpu_type, None)


class JobsServicePorts(JobReads, JobWrites, Attempts, Arrays, Protocol):
    """What the jobs service calls: jobs, the attempts list, a placed job's
    cancel, an array's children."""


class JobsService:
    def __init__(self, store: JobsServicePorts, dispatcher: Dispatcher, nudge: Nudge, *,
                 page_token_key: bytes, scans_per_hour: float, cancel_resend_after_s: float,
                 telemetry: Telemetry, clock: Clock = utcnow,
                 limits: TenantLimits = quotas.NO_LIMITS,
                 classes: PriorityClasses = NO_CLASSES,
                 pipelines: PipelinesService, canceller: Canceller,
                 fleet_of: Callable[[str | None], Fleet] | None = None,
                 line_of: Callable[[], Line | None] | None = None,
                 publish: Publish = nowhere) -> None:
        self.store, self.dispatcher, self.nudge = store, dispatcher, nudge
        #: a GPU type's registered fleet (NodeStore.fleet_of), as read at most
        #: FLEET_TTL_S ago: a job that can never fit it is made parked; None:
        #: every job is left to the placer
        self._fleets = RecentFleets(fleet_of, clock) if fleet_of is not None else None
        #: the placer's line (NodeStore.line): where a PENDING job stands
        self._line_of = line_of
        self.pipelines, self.canceller = pipelines, canceller
        #: tells what happened: a job it ended (domain/happened.py)
        self._publish = publish
        self._limits, self._classes = limits, classes
        self.telemetry = telemetry
        self._token_key = page_token_key
        self._scans_per_hour = scans_per_hour
        self._resend_after_s = cancel_resend_after_s
        self._clock = clock

    # -- create -----------------------------------------------------------
    def submit(self, tenant: str, body: dict,
               idempotency_key: str | None) -> tuple[JobView, bool]:
        """The new job as it is shown, or with a known key and the same body
        the job it made (second value True: a replay, read as the job's view).
        One write round trip on the first call."""
        name = body.get("priority_class")
        if name is not None and name not in self._classes.by_name:
            raise InvalidArgument(f"priority_class {name!r} is not one of this deployment's "
                                  f"classes: {', '.join(self._classes.names())}",
                                  field="priority_class")
        if not self._classes.of(name).allows(tenant):
            raise Forbidden(f"tenant {tenant} may not submit to priority class {name}",
                            field="priority_class")
        spec = JobSpec.parse(body)
        waiting_for = self.pipelines.unmet(tenant, spec)
        now = self._clock()
        claim = None if idempotency_key is None else IdemClaim(
            idempotency.record_id(tenant, idempotency_key), idempotency.body_hash(body))
        job = Job(job_id=new_job_id(), tenant=tenant, state=JobState.PENDING, spec=spec,
                  created_at=now, updated_at=now, name=spec.name,
                  health=initial_health(spec, self._scans_per_hour),
                  idem_id=None if claim is None else claim.idem_id,
                  waiting_for=waiting_for or None,
                  pending_reason=dependencies.waiting_reason(spec, waiting_for),
                  array_counts={k: 0 for k in arrays.COUNTERS} if spec.array else None)
        if claim is None:
            job, parked = self._write(job, None)
            return self._created(job, parked), False
        reclaim = None
        for _ in range(_RACE_RETRIES):
            try:
                job, parked = self._write(job, claim, reclaim)
                return self._created(job, parked), False
            except IdempotencyConflict as conflict:
                held = conflict.record
            if held is None:
                break
            if idempotency.is_expired(held.expires_at, now):
                reclaim = held  # retention is over: the key may make a new job
                continue
            if held.body_hash != claim.body_hash:
                raise IdempotencyKeyReused(
                    "Idempotency-Key was already used with a different request body",
                    field="Idempotency-Key")
            existing = self.store.view(held.job_id)
            if existing is not None:
                self.telemetry.count("IdempotentReplays")
                return existing, True
            break
        raise RequestInProgress("a request with this Idempotency-Key is in progress; retry")

    def _created(self, job: Job, parked: bool = False) -> JobView:
        self.telemetry.count("JobsCreated")
        self.pipelines.created(job)  # what it waits for, read again
        if not parked:  # a parked job gives a placement run nothing to do
            self.nudge()
        if job.waiting_for or job.is_array:  # as its follow-up left it
            return self.store.view(job.job_id) or view_of(job)
        return view_of(job)

    def _write(self, job: Job, claim: IdemClaim | None, reclaim=None) -> tuple[Job, bool]:
        """The create's one transaction, under the tenant's max_pending_jobs:
        over it is 429 quota_exceeded, never a silent queue (docs/security.md).
        A job that can never fit its type's fleet is made parked, with its
        reason, as the placer would park it (:meth:`_parked`): a flood of
        such jobs costs its sender one write a job, and placement runs
        nothing (not even a nudge). Returns the job as written, and whether
        it was made parked."""
        limit = self._limits.of(job.tenant).max_pending_jobs
        for _ in range(_RACE_RETRIES):
            written, fleet = self._parked(job)
            try:
                self.store.create(written, claim, reclaim=reclaim, max_pending=limit,
                                  parked=fleet)
                return written, fleet is not None
            except PendingLimitReached:
                self.telemetry.count("QuotaExceeded")
                raise QuotaExceeded(quotas.pending_limit_detail(
                    job.tenant, limit, job.pending_weight)) from None
            except Contended:
                continue  # a create of this tenant moved its count: nothing written
            except FleetChanged:  # a node moved the fleet it was judged on: read it again
                assert self._fleets is not None
                self._fleets.forget(job.spec.gpu_type)
        raise ServiceUnavailable(f"tenant {job.tenant}'s jobs are being created concurrently; "
                                 "retry")

    def _parked(self, job: Job) -> tuple[Job, Fleet | None]:
        """The job as it is to be written, and the fleet it can never fit (None:
        the placer judges it). Only a job the placer would park is judged: one
        ready to queue (no dependency left, no array), whose wait is not
        timed (max_pending_s: the placer ends it once it is over)."""
        spec = job.spec
        if self._fleets is None or job.waiting_for or job.is_array \
                or spec.max_pending_s is not None:
            return job, None
        fleet = self._fleets(spec.gpu_type)
        impossible = placement.never_fits(spec.ranks, spec.gpus_per_rank, fleet.gpus,
                                          fleet.largest_node, spec.gpu_type)
        if impossible is None:
            return job, None
        return replace(job, pending_reason=f"can never fit: {impossible}"), fleet

    # -- read -------------------------------------------------------------
    def get(self, tenant: str, job_id: str) -> Job:
        job = self.store.get(job_id) if is_job_id(job_id) else None
        if job is None or job.tenant != tenant:
            raise self._not_found(job_id)
        return job

    def read(self, tenant: str, job_id: str, *, field: str = "job_id") -> JobView:
        """``get`` as the job is shown (JobView): for reading it, not changing it."""
        view = self.store.view(job_id) if is_job_id(job_id) else None
        if view is None or view["tenant"] != tenant:
            raise self._not_found(job_id, field)
        return view

    def look(self, tenant: str, job_id: str) -> JobView:
        """``read``, with what its GPU time bought so far under ``usage``
        (domain/usage.py, from the story on the job's own item, read with
        it: no read more than ``read``) and a PENDING job's place in the
        placer's line under ``queue`` (domain/queue.py: one read of the
        line, never of the queue)."""
        found = self.store.view_with_story(job_id) if is_job_id(job_id) else None
        if found is None or found[0]["tenant"] != tenant:
            raise self._not_found(job_id)
        view, story = found
        gpus = 0
        if view["attempt"]:  # placed once at least: its spec says its GPUs
            spec = view["spec"].value()
            gpus = int(spec["ranks"]) * int(spec.get("gpus_per_rank") or 1)
        view["usage"] = usage.usage(usage.spans_of(story, gpus), self._clock())
        if view["state"] == JobState.PENDING.value and self._line_of is not None:
            view["queue"] = queue.standing(self._line_of(), job_id, tenant, self._clock())
        return view

    @staticmethod
    def _not_found(job_id: str, field: str = "job_id") -> ApiError:
        # another tenant's job is indistinguishable from a missing one
        return NotFound(f"job {job_id} not found", field=field)

    def attempts(self, tenant: str, job_id: str) -> list[dict]:
        self.read(tenant, job_id)
        return self.store.attempts(job_id)

    def events(self, tenant: str, job_id: str) -> list[dict]:
        """The job's story, oldest first (chalicelib/domain/events.py)."""
        self.read(tenant, job_id)
        return self.store.events(job_id)

    def list(self, tenant: str, *, state: str | None, page_size: int,
             page_token: str | None,
             parent: str | None = None) -> tuple[list[JobView], str | None]:
        """A page of the tenant's jobs, newest first, or with ``parent`` of
        that array's children, in index order; in ``state`` if given."""
        if state is not None and state not in JobState.__members__:
            raise InvalidArgument(f"state must be one of {', '.join(JobState.__members__)}",
                                  field="state")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be an integer from 1 to {MAX_PAGE_SIZE}",
                                  field="page_size")
        filter_key = f"state={state or ''}"
        if parent is not None:
            if self.read(tenant, parent, field="parent")["array_materialized"] is None:
                raise InvalidArgument(f"job {parent} is not an array", field="parent")
            filter_key = f"parent={parent};{filter_key}"
        after = None
        if page_token is not None:
            after = cursor.decode(page_token, tenant=tenant, filter_key=filter_key,
                                  secret=self._token_key)
        if parent is not None:
            jobs, resume_after = self.store.children(parent, state, page_size, after)
        else:
            jobs, resume_after = self.store.page(tenant, state, page_size, after)
        fits = limits.fit(jobs, job_wire_bytes, whole=jobs_wire_bytes)
        if fits < len(jobs):  # cut by size: resume right after the last job sent
            jobs, resume_after = jobs[:fits], jobs[fits - 1]["job_id"]
        token = None if resume_after is None else cursor.encode(
            resume_after, tenant=tenant, filter_key=filter_key, secret=self._token_key)
        return jobs, token

    # -- cancel -----------------------------------------------------------
    def cancel(self, tenant: str, job_id: str, reason: str | None) -> Job:
        """Record the cancel request before answering; agents do the stopping.
        An array's cancel is recorded on it, and each child is cancelled so."""
        job = self.get(tenant, job_id)
        if not _open_array(job):
            job, ended = self.canceller.cancel(job, reason)
            if ended:
                self._publish(JobEnded(job))
                return job
        if _open_array(job):  # (or released while its cancel was being recorded)
            return self.pipelines.cancel_array(job, reason)
        if job.state.terminal and job.state is not JobState.CANCELLED:
            raise AlreadyFinished(f"job {job_id} already {job.state.value}", field="job_id")
        return job


def _open_array(job: Job) -> bool:
    """An array not ended and not waiting: its children may be made."""
    return job.is_array and not job.state.terminal and not job.waiting_for
