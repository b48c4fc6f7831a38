"""Pipelines and sweeps: what follows a job's end, and an array's children.

- A new job is named on each job it waits for once it is created (so a
  create that fails, or a replay, names nothing), then reads their states
  again; a job's end is written *before* its dependents are read. So
  whichever side comes second sees the other: a dependency that ends while
  its dependent is being created is never missed (both may act; every write
  is conditional, so it is once). Dependents are capped (MAX_DEPENDENTS)
  when the dependent is submitted: racing submits may pass it by a few.
- ``ended`` runs after every terminal transition: it tells the job's array
  and its dependents, and goes on down the chain with whatever that ended.
  It costs a few requests per dependent, never a scan.
- An array's first children (FIRST_BATCH) are made by its create, the next
  ones each time one of them ends, and by the sweep.
- ``sweep`` (the reconciler's, each minute) is the backstop when a process
  died between a write and its follow-up: it feeds and ends the open arrays
  and, at most every RECHECK_S, reads again what the waiting jobs wait for.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Protocol, Sequence

from ..domain import arrays, dependencies as deps
from ..domain.arrays import Counts
from ..domain.clock import Clock
from ..domain.errors import InvalidArgument
from ..domain.health import initial_health
from ..domain.ids import child_job_id
from ..domain.jobs import Job
from ..domain.spec import JobSpec
from ..domain.states import JobState
from .cancels import Canceller
from .ports import Arrays, Dependencies, JobReads, Nudge, StateChanged

log = logging.getLogger(__name__)
_RACE_RETRIES = 3
#: how often the sweep reads again what every waiting job waits for
RECHECK_S = 300.0
#: waiting jobs and open arrays read per sweep
SWEEP_LIMIT = 5000
#: an array's open children a cancel request cancels itself, and a sweep run
#: at most: the request answers at once, the sweep does the rest
CANCELS_INLINE, CANCELS_PER_SWEEP = 100, 1000


class PipelinesPorts(JobReads, Dependencies, Arrays, Protocol):
    """Jobs, who waits on whom, and arrays' children."""


class PipelinesService:
    def __init__(self, store: PipelinesPorts, canceller: Canceller, nudge: Nudge, *,
                 scans_per_hour: float, clock: Clock) -> None:
        self.store, self.canceller, self.nudge = store, canceller, nudge
        self._scans_per_hour, self._clock = scans_per_hour, clock
        self._rechecked_at: float | None = None
        self._running: set[str] = set()

    # -- create ------------------------------------------------------------
    def unmet(self, tenant: str, spec: JobSpec) -> list[str]:
        """The dependencies of a new job's spec not met yet, in order. Each
        named job must exist, be the tenant's and have room for one more
        dependent: else a 400 naming it, before anything is written."""
        named = spec.depends_on or ()
        if not named:
            return []
        seen: set[str] = set()
        for i, d in enumerate(named):
            if d.job_id in seen:
                raise InvalidArgument(f"depends_on names {d.job_id} twice",
                                      field=f"depends_on.{i}.job_id")
            seen.add(d.job_id)
        states = self.store.states([d.job_id for d in named], count_dependents=True)
        for i, d in enumerate(named):
            held = states.get(d.job_id)
            if held is None or held[0] != tenant:
                raise InvalidArgument(f"job {d.job_id} not found: a dependency must be an "
                                      "existing job of the same tenant",
                                      field=f"depends_on.{i}.job_id")
            if held[2] >= deps.MAX_DEPENDENTS:
                raise InvalidArgument(f"job {d.job_id} already has {deps.MAX_DEPENDENTS} "
                                      "dependents", field=f"depends_on.{i}.job_id")
        return [d.job_id for d in named if d.met_by(states[d.job_id][1]) is not True]

    def created(self, job: Job) -> None:
        """After the create: read again what it waits for (see the module);
        an array makes its first FIRST_BATCH children (one small transaction:
        the create answers fast, whatever the size)."""
        try:
            if job.waiting_for:
                for dep in job.waiting_for:  # named on each, then each read again
                    self.store.add_dependent(dep, job.job_id)
                self.ended_all(self.resolve(job))
            elif job.is_array:
                self.ended_all(self.array_changed(job.job_id, at_most=arrays.FIRST_BATCH))
        except Exception:  # noqa: BLE001 - the job is written; the sweep follows up
            log.exception("job %s created: what it waits for, or its first children, are "
                          "left to the sweep", job.job_id)

    # -- a job ended -------------------------------------------------------
    @staticmethod
    def follows(job: Job) -> bool:
        """Whether anything follows the ended ``job``: its array, its dependents."""
        return job.parent_id is not None or bool(job.dependents)

    def ended(self, job: Job) -> None:
        """Tell what follows ``job``, as its end wrote it (its dependents
        exact: an end is conditioned on the dependents read, or read after
        it), its array and its dependents, and whatever ends of them in turn.
        Never raises: the end is written, and the sweep makes up for a
        follow-up that failed."""
        if not self.follows(job):
            return  # nothing follows it: no request at all
        try:
            self.ended_all(self._follow(job))
        except Exception:  # noqa: BLE001 - the end is written; the sweep follows up
            log.exception("job %s ended: its dependents and array are left to the sweep",
                          job.job_id)

    def follow_up(self, body: str) -> None:
        """A follow-up message (bootstrap.follow_ups, app.py ``follow_up``):
        tell what follows the ended job it names, as it is now. Raises on a
        message that is none, and on a failure (the message comes again)."""
        try:
            job_id = json.loads(body)["job_id"]
            if not isinstance(job_id, str):
                raise TypeError(job_id)
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"not a follow-up: {body[:200]!r}") from None
        self.ended_all([job_id])

    def ended_all(self, job_ids: Sequence[str]) -> None:
        work = list(job_ids)
        while work:
            job = self.store.get(work.pop())  # after its end: its dependents as they are
            if job is not None and job.state.terminal:
                work += self._follow(job)

    def _follow(self, job: Job) -> list[str]:
        """Tell the ended ``job``'s array and dependents; the ids of what ended."""
        ended = []
        if job.parent_id is not None:
            ended += self.array_changed(job.parent_id,
                                        index_failed=job.state is JobState.FAILED)
        for dependent_id in sorted(job.dependents):
            dependent = self.store.get(dependent_id)
            if dependent is not None:
                ended += self.resolve(dependent)
        return ended

    def resolve(self, job: Job) -> list[str]:
        """Judge what a waiting job waits for: end it when one can no longer
        be met, release it when none is left, else say what is left. The ids
        of what ended (``job``, or nothing)."""
        for _ in range(_RACE_RETRIES):
            if job.state is not JobState.PENDING or not job.waiting_for:
                return []
            states = {k: s for k, (_, s, _) in self.store.states(job.waiting_for).items()}
            out = deps.judge(job.spec, states, only=job.waiting_for)
            now = self._clock()
            try:
                if out.failed is not None:
                    assert out.failed_state is not None
                    self.store.fail_dependency(job, now, deps.failed_exit(out.failed,
                                                                          out.failed_state))
                    return [job.job_id]
            except StateChanged:
                job = self.store.get(job.job_id) or job
                continue
            if out.waiting_for == tuple(job.waiting_for or ()):
                return []
            if self.store.wait_for(job, out.waiting_for,
                                   deps.waiting_reason(job.spec, out.waiting_for), now):
                if out.ready and job.is_array:  # its first children, now
                    return self.array_changed(job.job_id)
                if out.ready:
                    self.nudge()
                return []
            job = self.store.get(job.job_id) or job
        return []

    # -- arrays ------------------------------------------------------------
    def array_changed(self, parent_id: str, *, index_failed: bool = False,
                      at_most: int | None = None) -> list[str]:
        """Make the parent's next children (``at_most`` of them), end it when
        every index has, or stop its children when it fails fast. The ids of
        what ended."""
        for _ in range(_RACE_RETRIES):
            parent = self.store.get(parent_id)
            if parent is None or parent.state.terminal or parent.waiting_for \
                    or not parent.is_array:
                return []
            a = parent.spec.array
            assert a is not None
            c = Counts.of(parent.array_counts or {})
            cancelled = parent.cancel_requested_at is not None
            now = self._clock()
            if arrays.done(a, c, cancelled):
                to, exit_ = arrays.final(a, c, cancelled)
                if self.store.finish_array(parent, to, exit_, now):
                    return [parent_id]
                continue
            if arrays.stopping(a, c, cancelled):
                if index_failed and arrays.failing(a, c):
                    return self.stop_children(
                        parent, "more indexes failed than max_failed_indexes")
                return []
            indexes = arrays.to_make(a, c, cancelled)[:at_most or arrays.FEED_WINDOW]
            made = self.make_children(parent, indexes)
            if made is None:
                continue  # another made them meanwhile: judge again
            if (c.placed or c.ended) and parent.state is JobState.PENDING:
                self.store.mark_array_running(parent_id, parent.tenant, now)
            return []
        return []

    def make_children(self, parent: Job, indexes: range) -> int | None:
        """Make the children of ``indexes``, FEED_BATCH a transaction; how
        many were made (None: the parent moved on under us)."""
        made = 0
        counts = dict(parent.array_counts or {})
        for at in range(indexes.start, indexes.stop, arrays.FEED_BATCH):
            batch = range(at, min(at + arrays.FEED_BATCH, indexes.stop))
            now = self._clock()
            children = [self._child(parent, i, now) for i in batch]
            if not self.store.make_children(dataclasses.replace(parent, array_counts=counts),
                                            children, now):
                return None if made == 0 else made
            counts["materialized"] = counts.get("materialized", 0) + len(children)
            made += len(children)
        if made:
            self.nudge()
        return made

    def _child(self, parent: Job, index: int, now) -> Job:
        spec = parent.spec.child(index)
        return Job(job_id=child_job_id(parent.job_id, index), tenant=parent.tenant,
                   state=JobState.PENDING, spec=spec, created_at=now, updated_at=now,
                   name=arrays.child_name(parent.name, index),
                   health=initial_health(spec, self._scans_per_hour),
                   parent_id=parent.job_id, array_index=index)

    def index_placed(self, child: Job) -> None:
        """A child was placed: its array is RUNNING (written once; this
        process remembers the arrays it saw running)."""
        if child.parent_id is None or child.parent_id in self._running:
            return
        self.store.mark_array_running(child.parent_id, child.tenant, self._clock())
        if len(self._running) > 10_000:
            self._running.clear()
        self._running.add(child.parent_id)

    def cancel_array(self, parent: Job, reason: str | None) -> Job:
        """Record the cancel of an open array, then cancel its first
        :data:`CANCELS_INLINE` open children, as intents; the sweep cancels
        the rest (:data:`CANCELS_PER_SWEEP` a run), so the request answers at
        once however many children are open (issue 41: cancelling them all
        inline ran past API Gateway's 29 s limit; docs/benchmarks.md). It ends
        CANCELLED once every child has ended."""
        self.store.request_array_cancel(parent, self._clock(), reason)
        self.ended_all(self.stop_children(parent, reason or "the array was cancelled",
                                          CANCELS_INLINE))
        self.ended_all(self.array_changed(parent.job_id))
        return self.store.get(parent.job_id) or parent

    def stop_children(self, parent: Job, reason: str, limit: int | None = None) -> list[str]:
        """Cancel the first ``limit`` open children (default: all), as
        intents; the ids of those that ended at once (never placed), for
        ``ended_all``."""
        ended = []
        for child in self.store.open_children(parent.job_id, limit):
            child, now_ended = self.canceller.cancel(child, reason)
            if now_ended:
                ended.append(child.job_id)
        return ended

    # -- the backstop --------------------------------------------------------
    def sweep(self) -> dict:
        """Feed and end the open arrays; every RECHECK_S, judge every waiting
        job. How many of each were read."""
        read = {"arrays": 0, "waiting": 0}
        for parent in self.store.arrays(SWEEP_LIMIT):
            read["arrays"] += 1
            a = parent.spec.array
            c = Counts.of(parent.array_counts or {})
            if a is not None and arrays.stopping(a, c, parent.cancel_requested_at is not None) \
                    and c.open:
                self.ended_all(self.stop_children(parent, _stop_reason(parent),
                                                  CANCELS_PER_SWEEP))
            self.ended_all(self.array_changed(parent.job_id))
        now = self._clock().timestamp()
        if self._rechecked_at is None or now - self._rechecked_at >= RECHECK_S:
            self._rechecked_at = now
            for job in self.store.waiting(SWEEP_LIMIT):
                read["waiting"] += 1
                self.ended_all(self.resolve(job))
        return read


def _stop_reason(parent: Job) -> str:
    """Why the sweep cancels an array's children: the cancel's own reason,
    as the request gives it to the first ones, or its fail-fast stop."""
    if parent.cancel_requested_at is not None:
        return parent.cancel_reason or "the array was cancelled"
    return "the array is stopping"
