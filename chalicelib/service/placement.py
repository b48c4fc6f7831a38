"""Gang placement: PENDING jobs, in priority then age order, onto READY nodes.

Capacity is reserved by one transaction per job, conditioned on every node's
free GPUs and on the job still being the PENDING job that was read, so placers
running at once can neither oversubscribe a node nor place a job twice. Nodes
are read lazily, most free first, and once per run: a run reads about as many
nodes as its jobs need, not the whole fleet for every job.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Iterator, Mapping, Protocol

from ..domain import deadlines, placement, priority, queue, quotas
from ..domain.clock import Clock, iso, plus, utcnow
from ..domain.fleet import ALL_TYPES, SETTLE_S, Fleet, fleet_key
from ..domain.happened import ChildPlaced, JobEnded, PreemptionChosen
from ..domain.intents import launch_intent
from ..domain.jobs import Job
from ..domain.nodes import Node, NodeState
from ..domain.placement import Candidate
from ..domain.priority import (
    DEFAULT_CLASS,
    DEFAULT_MIN_RUNTIME_S,
    NO_CLASSES,
    PREEMPTION_STALE_S,
    PriorityClasses,
)
from ..domain.quotas import TenantLimits
from ..domain.states import PLACED, JobState
from .bus import Publish, nowhere
from .dispatch import Dispatcher
from .ports import (
    Attempts,
    CapacityChanged,
    Contended,
    Fleets,
    JobQueue,
    JobReads,
    JobWrites,
    Lines,
    NodeRegistry,
    StateChanged,
    Transitions,
)

log = logging.getLogger(__name__)
_RESERVE_RETRIES = 3
#: the placed jobs behind a line are read again at least this often, even
#: when no placement or release moved the line (a job's start moves the end
#: its time limit bounds)
LINE_REFRESH_S = 60.0


@dataclass
class PlacementReport:
    placed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    never: list[str] = field(default_factory=list)
    #: skipped: their tenant is at its max_running_gpus (no placement try used)
    limited: list[str] = field(default_factory=list)
    #: ended: they waited past their max_pending_s
    expired: list[str] = field(default_factory=list)
    #: did not fit, and preempted jobs of lower classes to make room
    preempting: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """What the scheduled run returns (its Lambda's result)."""
        return {"placed": len(self.placed), "waiting": len(self.waiting),
                "never": len(self.never)}


class _Pool:
    """The nodes one run has read, with the GPUs it has reserved on them since."""

    def __init__(self, nodes: PlacerNodes) -> None:
        self._store = nodes
        self._nodes: dict[str, Node] = {}
        self._order: dict[str, list[str]] = {}
        self._pages: dict[str, Iterator[list[Node]]] = {}

    def node(self, node_id: str) -> Node:
        return self._nodes[node_id]

    def candidates(self, gpu_type: str | None, min_free: int) -> Iterator[Candidate]:
        key = gpu_type or "*"
        order = self._order.setdefault(key, [])
        i = 0
        while True:
            while i < len(order):
                node = self._nodes[order[i]]
                i += 1
                if node.gpus_free >= min_free:
                    yield Candidate(node.node_id, node.gpus_free)
            if not self._read_page(key, gpu_type):
                return

    def _read_page(self, key: str, gpu_type: str | None) -> bool:
        pages = self._pages.get(key)
        if pages is None:
            pages = self._pages[key] = self._store.ready_pages(gpu_type, 1)
        page = next(pages, None)
        if page is None:
            self._pages[key] = iter(())
            return False
        for n in page:
            if n.node_id not in self._nodes:
                self._nodes[n.node_id] = n
            self._order[key].append(n.node_id)
        return True

    def reserve(self, gpus_by_node: dict[str, int]) -> None:
        for node_id, gpus in gpus_by_node.items():
            self._nodes[node_id].gpus_free -= gpus

    def refresh(self, node_ids: list[str]) -> None:
        for node_id in node_ids:
            fresh = self._store.get(node_id)
            if fresh is None or fresh.state.value != "READY":
                self._nodes[node_id].gpus_free = 0
            else:
                self._nodes[node_id] = fresh


class PlacerNodes(NodeRegistry, Fleets, Lines, Protocol):
    """What the placer reads of the nodes: the fleets, and a node by id."""


class PlacerPorts(JobReads, JobQueue, JobWrites, Attempts, Transitions, Protocol):
    """What the placer calls: the queue, a retried job's last attempt, and ``place``."""


class Placer:
    def __init__(self, store: PlacerPorts, nodes: PlacerNodes, dispatcher: Dispatcher, *,
                 resend_after_s: float, clock: Clock = utcnow,
                 limits: TenantLimits = quotas.NO_LIMITS, settle_s: float = SETTLE_S,
                 classes: PriorityClasses = NO_CLASSES,
                 preempt_min_runtime_s: float = DEFAULT_MIN_RUNTIME_S,
                 publish: Publish = nowhere) -> None:
        self.store, self.nodes, self.dispatcher, self._clock = store, nodes, dispatcher, clock
        #: tells what happened: a job it ended, an array's child placed, a
        #: victim chosen (domain/happened.py)
        self._publish = publish
        self._resend_after_s = resend_after_s
        self.limits = limits
        #: priority classes (domain/priority.py)
        self.classes = classes
        self._min_runtime_s = preempt_min_runtime_s
        #: what a preemption reads, once a run: running jobs with their GPUs,
        #: GPUs held by tenant and type (_running, _held_by_type)
        self._seen: dict[str, object] = {}
        #: how long after a fleet change its sweep of parked jobs is repeated
        self.settle_s = settle_s
        #: the line this placer last wrote (None: none yet; written once changed),
        #: and the fleets' room versions it was read against
        self._line: queue.Line | None = None
        self._line_rooms: dict[str, int] = {}
        self._line_read_at = datetime.min.replace(tzinfo=timezone.utc)

    def run(self, limit: int = 500, read_limit: int = 5000) -> PlacementReport:
        """One run: at most ``limit`` placement tries, over at most ``read_limit``
        PENDING jobs read. Jobs that can never fit the registered fleet are parked
        (not read again until their fleet changes) without using a try, and so
        are jobs of a tenant at its GPU limit skipped; the rest are tried in fair
        order between tenants (placement.fair_order)."""
        report = PlacementReport()
        self._seen = {}  # what preemptions read, once a run
        fleets = self._sweep_parked()
        marks: dict[str, str | None] = {}
        line: dict[str, list[Job]] = {}
        queues = self._fitting_by_tenant(read_limit, report, fleets, marks, line)
        # usage only matters between tenants (one tenant's queue is its own
        # order) and for tenants with a GPU limit
        usage = self._usage() if len(queues) > 1 or self._gpu_limited(queues) else {}
        order = placement.class_order(queues, usage, lambda j: j.spec.gpus,
                                      lambda j: self.classes.value_of(j.spec.priority_class),
                                      lambda t: self.limits.of(t).weight)
        pool = _Pool(self.nodes)
        held = dict(usage)
        placed_gpus = None
        placed: list[Job] = []
        tries = 0
        while tries < limit:
            try:
                job = order.send(placed_gpus)
            except StopIteration:
                break
            placed_gpus = 0
            if self._over_gpu_limit(job, held):
                report.limited.append(job.job_id)
                continue  # uses no try: a tenant at its limit cannot hold others back
            tries += 1
            if self._place(job, pool, marks.get(job.job_id)):
                report.placed.append(job.job_id)
                placed.append(job)
                placed_gpus = job.spec.gpus
                held[job.tenant] = held.get(job.tenant, 0) + placed_gpus
                by_type = self._seen.get("held")
                if isinstance(by_type, dict):  # read this run: it holds more now
                    key = (job.tenant, quotas.type_key(job.spec.gpu_type))
                    by_type[key] = by_type.get(key, 0) + placed_gpus
            elif self._preempt_for(job, pool):
                report.preempting.append(job.job_id)
            else:
                report.waiting.append(job.job_id)
        self._write_line(line, placed, held, fleets)
        return report

    # -- the line: where each waiting job stands (domain/queue.py) -------------
    def _write_line(self, line: dict[str, list[Job]], placed: list[Job], held: dict[str, int],
                    fleets: dict[str | None, Fleet]) -> None:
        """Write the jobs this run leaves waiting, in the order they would be
        placed as GPUs free up (the placer's class_order from the GPUs held
        now, each job counted as placed in its turn, which is how fair share
        moves on), the placed jobs whose GPUs they wait for and each type's
        registered GPUs, when that differs from what this placer last wrote."""
        gone = {j.job_id for j in placed}
        waiting = {t: left for t, jobs in line.items()
                   if (left := [j for j in jobs if j.job_id not in gone])}
        entries: list[queue.Entry] = []
        holders: list[queue.Holder] = []
        now = self._clock()
        rooms = {f.key: f.room_version for f in fleets.values()}
        if not waiting and (self._line is None or not self._line.entries):
            return  # nobody waits, and this placer wrote nobody in line: nothing to tell
        if waiting:
            order = placement.class_order(waiting, held, lambda j: j.spec.gpus,
                                          lambda j: self.classes.value_of(j.spec.priority_class),
                                          lambda t: self.limits.of(t).weight)
            entries = [queue.Entry(j.job_id, j.tenant, j.spec.gpus, fleet_key(j.spec.gpu_type))
                       for j in itertools.islice(_placing_each(order), queue.MAX_LINE)]
            last = self._line
            if last is not None and not placed and tuple(entries) == last.entries \
                    and rooms == self._line_rooms \
                    and (now - self._line_read_at).total_seconds() < LINE_REFRESH_S:
                # no job placed, none ended (the rooms would move): the GPUs
                # are held as the last line says, which need not be read again
                return
            holding = {j.job_id: (j, j.started_at or j.updated_at)
                       for jobs in self._placed_jobs().values() for j in jobs}
            holding.update((j.job_id, (j, now)) for j in placed)
            holders = [queue.holder_of(j.job_id, j.tenant, j.spec.gpus,
                                       fleet_key(j.spec.gpu_type), since, j.spec.max_runtime_s)
                       for j, since in holding.values()]
        new = queue.Line.of(now, entries, holders, {f.key: f.gpus for f in fleets.values()})
        self._line_rooms, self._line_read_at = rooms, now
        if not new.same_order(self._line):
            self.nodes.set_line(new)
            self._line = new

    # -- preemption: by priority class, and reclaiming guarantees (domain/priority.py)
    def _preempts(self, job: Job) -> bool:
        """May the job preempt? Its class does, or it is within its tenant's
        guaranteed GPUs of its type."""
        cls = self.classes.by_name.get(job.spec.priority_class or DEFAULT_CLASS)
        return (cls is not None and cls.preempts) or self._within_guarantee(job)

    def _within_guarantee(self, job: Job) -> bool:
        key = quotas.type_key(job.spec.gpu_type)
        mine = self.limits.of(job.tenant).guaranteed_gpus.get(key, 0)
        return bool(mine) and (self._held_by_type().get((job.tenant, key), 0)
                               + job.spec.gpus <= mine)

    def _preempt_for(self, job: Job, pool: "_Pool") -> bool:
        """A job that may preempt did not fit: preempt the running jobs that
        make room for it (priority.choose_victims), if any do: those of lower
        classes when its class preempts; else, within its tenant's guaranteed
        GPUs, those of tenants borrowing beyond their own. Recorded on the job
        first, by a conditional write: of placers racing for it, one preempts."""
        if not self._preempts(job):
            return False
        now = self._clock()
        stale_before = iso(plus(now, -PREEMPTION_STALE_S))
        if job.preempting and job.preempting.get("at", "") >= stale_before:
            return False  # its victims are still stopping
        cls = self.classes.of(job.spec.priority_class)
        for candidates, why, detail in (
                (self._lower_classes(job, cls.value, now) if cls.preempts else [],
                 "of lower priority classes", f"priority class {cls.name}"),
                (self._borrowed(job) if self._within_guarantee(job) else [],
                 f"borrowed beyond their tenants' guarantees, within {job.tenant}'s",
                 f"reclaiming {job.tenant}'s guaranteed GPUs")):
            chosen = self._choose(job, pool, candidates)
            if not chosen:
                continue
            ids = [v.job_id for v in chosen]
            reason = (f"preempting {', '.join(ids)} ({sum(v.gpus for v in chosen)} GPUs {why}) "
                      f"to make room ({cls.name})")
            if not self.store.mark_preempting(job, {"jobs": ids, "at": iso(now),
                                                    "class": cls.name},
                                              reason, stale_before, now):
                return False  # another placer did, or the job moved on
            for victim_id in ids:
                victim = self.store.get(victim_id)
                if victim is not None and victim.state in PLACED:
                    self._publish(PreemptionChosen(victim, {
                        "reason": "preempted", "exit_code": None,
                        "detail": f"by {job.job_id}, {detail}"}))
            self._taken().update(ids)  # this run's later preemptions look elsewhere
            log.info("job %s preempts %s: %s", job.job_id, ids, reason)
            return True
        return False

    def _choose(self, job: Job, pool: "_Pool",
                candidates: list[priority.Victim]) -> list[priority.Victim] | None:
        """The victims that make room for the job's gang, with what is free."""
        if not candidates:
            return None
        spec = job.spec
        gpu_type, g, ranks = spec.gpu_type, spec.gpus_per_rank, spec.ranks
        free = {c.node_id: c.gpus_free for c in pool.candidates(gpu_type, g)}
        for node_id in {n for v in candidates for n in v.gpus_by_node} - set(free):
            node = self.nodes.get(node_id)
            if node is not None and node.state is NodeState.READY \
                    and (gpu_type is None or node.gpu_type == gpu_type):
                free[node_id] = node.gpus_free
        # only GPUs the job could be placed on count: a victim's on a node not
        # READY (cordoned, DOWN) or of another type make no room
        usable = [replace(v, gpus_by_node={n: g for n, g in v.gpus_by_node.items() if n in free})
                  for v in candidates]
        candidates = [v for v in usable if v.gpus_by_node]

        def fits(room: Mapping[str, int]) -> bool:
            nodes = sorted(room.items(), key=lambda kv: (-kv[1], kv[0]))
            return placement.plan(ranks, g, (Candidate(n, f) for n, f in nodes)) is not None
        return priority.choose_victims(candidates, free, fits)

    def _lower_classes(self, job: Job, value: int, now) -> list[priority.Victim]:
        """Running jobs of classes below ``value`` that ran long enough, on
        nodes of the job's type, in preemption order (an attempt is read only
        for those)."""
        gpu_type = job.spec.gpu_type
        victims = (self._victim(r) for r in self._running()
                   if self.classes.value_of(r.spec.priority_class) < value and r.started_at is not None
                   and (now - r.started_at).total_seconds() >= self._min_runtime_s)
        return priority.eligible([v for v in victims if v is not None and _on_type(v, gpu_type)],
                                 value, now, self._min_runtime_s)

    def _borrowed(self, job: Job) -> list[priority.Victim]:
        """Jobs of other tenants holding GPUs of the job's type beyond their
        tenants' guarantees (the job being within its own): lowest class
        first, then the newest; a borrower is preempted down to its
        guarantee, never below, and without waiting for a minimum runtime
        (its GPUs were lent)."""
        key = quotas.type_key(job.spec.gpu_type)
        left = {t: n - self.limits.of(t).guaranteed_gpus.get(k, 0)
                for (t, k), n in self._held_by_type().items() if k == key}
        theirs = sorted((r for r in self._running() if r.tenant != job.tenant
                         and r.started_at is not None and left.get(r.tenant, 0) > 0
                         and quotas.type_key(r.spec.gpu_type) == key),
                        key=lambda r: (self.classes.value_of(r.spec.priority_class),
                                       -r.started_at.timestamp() if r.started_at else 0.0))
        out = []
        for r in theirs:
            v = self._victim(r)
            if v is not None and left[r.tenant] >= v.gpus:  # still at or above its guarantee
                left[r.tenant] -= v.gpus
                out.append(v)
        return out

    def _placed_jobs(self) -> dict[JobState, list[Job]]:
        """The SCHEDULED and RUNNING jobs, read once a run: the tenants' usage,
        the GPUs they hold by type, and a preemption's candidates all come
        from this one read."""
        if "placed" not in self._seen:
            self._seen["placed"] = {state: self.store.active(state, 10000)
                                    for state in (JobState.SCHEDULED, JobState.RUNNING)}
        return self._seen["placed"]  # type: ignore[return-value]

    def _taken(self) -> set[str]:
        """Jobs this run already preempted."""
        return self._seen.setdefault("taken", set())  # type: ignore[return-value]

    def _running(self) -> list[Job]:
        taken = self._taken()
        return [j for j in self._placed_jobs()[JobState.RUNNING] if j.job_id not in taken]

    def _victim(self, running: Job) -> priority.Victim | None:
        """A running job as a possible victim: the GPUs its attempt holds where
        (the attempt read once a run, and only for a job a preemption weighs)."""
        victims = self._seen.setdefault("victims", {})
        assert isinstance(victims, dict)
        if running.job_id not in victims:
            victims[running.job_id] = None
            attempt = self.store.attempt(running.job_id, running.attempt)
            if attempt is not None and running.started_at is not None:
                held = {n: g for n, g in attempt.node_gpus.items() if n not in attempt.released}
                if held:
                    victims[running.job_id] = priority.Victim(
                        running.job_id, self.classes.value_of(running.spec.priority_class),
                        running.started_at, held,
                        frozenset(attempt.node_types.get(n, "") for n in held))
        return victims[running.job_id]

    def _held_by_type(self) -> dict[tuple[str, str], int]:
        """GPUs each tenant's placed jobs hold, by the GPU type they asked for
        (once a run; what this run places is added as it goes)."""
        if "held" not in self._seen:
            held: dict[tuple[str, str], int] = {}
            for jobs in self._placed_jobs().values():
                for j in jobs:
                    key = (j.tenant, quotas.type_key(j.spec.gpu_type))
                    held[key] = held.get(key, 0) + j.spec.gpus
            self._seen["held"] = held
        return self._seen["held"]  # type: ignore[return-value]

    # -- per-tenant GPU limit (domain/quotas.py) ------------------------------
    def _gpu_limited(self, queues: dict[str, list[Job]]) -> bool:
        return any(self.limits.of(t).max_running_gpus is not None for t in queues)

    def _over_gpu_limit(self, job: Job, held: dict[str, int]) -> bool:
        """Would placing the job take its tenant past max_running_gpus? Then its
        pending_reason says so, and it waits without using a placement try."""
        reason = quotas.gpu_limit_reason(held.get(job.tenant, 0), job.spec.gpus,
                                         self.limits.of(job.tenant).max_running_gpus)
        if reason is not None:
            self._note(job, reason)
        return reason is not None

    # -- parked never-fitting jobs (domain/fleet.py) ---------------------------
    def _sweep_parked(self) -> dict[str | None, Fleet]:
        """When the fleet changed, judge the parked jobs of each changed type again
        (back to PENDING if they may fit now, a fresh reason if not); then record the
        generation as swept, once it has settled. Steady state: one read. Returns
        the fleets read, by GPU type (None: all types)."""
        everything = self.nodes.fleet_of(None)
        known: dict[str | None, Fleet] = {None: everything}
        if not everything.unswept:
            return known
        now = self._clock()
        all_swept = True
        changed = [f for f in self.nodes.fleets() if f.key != ALL_TYPES] + [everything]
        for fleet in changed:
            gpu_type = None if fleet.key == ALL_TYPES else fleet.key
            known[gpu_type] = fleet
            if not fleet.unswept:
                continue
            for job in self.store.parked(gpu_type):
                self._judge_parked(job, fleet)
            if fleet.settled(now, self.settle_s) and (fleet is not everything or all_swept):
                self.nodes.mark_swept(fleet)
            else:
                all_swept = False
        return known

    def _judge_parked(self, job: Job, fleet: Fleet) -> None:
        spec = job.spec
        impossible = placement.never_fits(spec.ranks, spec.gpus_per_rank, fleet.gpus,
                                          fleet.largest_node, spec.gpu_type)
        if impossible is None:
            self.store.unpark(job)
        elif job.pending_reason != f"can never fit: {impossible}":
            self.store.park(job, f"can never fit: {impossible}", fleet)

    def _fitting_by_tenant(self, read_limit: int, report: PlacementReport,
                           fleets: dict[str | None, Fleet] | None = None,
                           marks: dict[str, str | None] | None = None,
                           line: dict[str, list[Job]] | None = None) -> dict[str, list[Job]]:
        """PENDING jobs that could be placed now, per tenant in the tenant's own
        order; cancels of unplaced jobs are finished, never-fitting jobs parked,
        and jobs waiting on an unchanged capacity summary skipped without a node
        read (``marks`` gets the note each job tried leaves if it does not fit;
        ``line`` every job that stays in line, tried or not, and ``fleets``
        each type's fleet read)."""
        marks = {} if marks is None else marks
        line = {} if line is None else line
        fleets = {} if fleets is None else fleets
        queues: dict[str, list[Job]] = {}
        for job in self.store.pending(read_limit):
            if job.cancel_requested_at is not None:
                # cancelled while waiting for a new attempt (a retry that raced
                # the cancel): finish the cancel, and tell its dependents now
                try:
                    ended = self.store.cancel_unplaced(job, self._clock(), job.cancel_reason)
                except StateChanged:
                    continue
                self._publish(JobEnded(ended))
                continue
            if self._expired(job):
                report.expired.append(job.job_id)
                continue
            spec = job.spec
            gpu_type, g, ranks = spec.gpu_type, spec.gpus_per_rank, spec.ranks
            if gpu_type not in fleets:
                fleets[gpu_type] = self.nodes.fleet_of(gpu_type)
            fleet, now = fleets[gpu_type], self._clock()
            impossible = placement.never_fits(ranks, g, fleet.gpus, fleet.largest_node, gpu_type)
            if impossible:
                report.never.append(job.job_id)
                if spec.max_pending_s is not None:  # not parked: its wait is timed
                    self._note(job, f"can never fit: {impossible}")
                    continue
                # parked until the fleet changes: later runs do not read it again
                self.store.park(job, f"can never fit: {impossible}", fleet)
                continue
            line.setdefault(job.tenant, []).append(job)
            if placement.still_waiting(job.waiting_on, fleet.room_version, now) \
                    and not self._preempts(job):
                # no room since it last did not fit (a job that may preempt is
                # tried again: time alone makes victims eligible)
                report.waiting.append(job.job_id)
                continue
            if job.attempt and self._predecessor_running(job):
                report.waiting.append(job.job_id)
                continue
            marks[job.job_id] = placement.waiting_mark(fleet.room_version, fleet.room_at, now)
            queues.setdefault(job.tenant, []).append(job)
        return queues

    def _predecessor_running(self, job: Job) -> bool:
        """Do ranks of the job's last attempt still stop somewhere? Then its
        next attempt waits (Attempt.still_stopping), and says so."""
        last = self.store.attempt(job.job_id, job.attempt)
        nodes = last.still_stopping() if last is not None else []
        if nodes:
            self._note(job, f"waiting for attempt {job.attempt}'s ranks to stop on "
                            f"{', '.join(nodes[:8])}{' and more' if len(nodes) > 8 else ''}")
        return bool(nodes)

    def _expired(self, job: Job) -> bool:
        """Has the job waited past its max_pending_s? Then it ends here
        (domain/deadlines.py): never placed late, however late this runs."""
        now = self._clock()
        if not deadlines.pending_expired(job.spec, job.pending_since, now):
            return False
        try:
            ended = self.store.expire_pending(job, now, deadlines.pending_exit(
                job.spec, job.pending_reason))
            log.info("job %s waited past its max_pending_s: FAILED", job.job_id)
        except StateChanged:
            return True  # placed or cancelled meanwhile: that stands
        self._publish(JobEnded(ended))
        return True

    def _usage(self) -> dict[str, int]:
        """GPUs each tenant's placed jobs hold now (SCHEDULED and RUNNING)."""
        used: dict[str, int] = {}
        for jobs in self._placed_jobs().values():
            for job in jobs:
                used[job.tenant] = used.get(job.tenant, 0) + job.spec.gpus
        return used

    def _place(self, job: Job, pool: _Pool, mark: str | None = None) -> bool:
        if self._expired(job):
            return False
        spec = job.spec
        gpu_type, g, ranks = spec.gpu_type, spec.gpus_per_rank, spec.ranks
        for _ in range(_RESERVE_RETRIES):
            plan = placement.plan(ranks, g, pool.candidates(gpu_type, g))
            if plan is None:
                kind = f"{gpu_type} " if gpu_type else ""
                self._note(job, f"waiting for {ranks} x {g} free {kind}GPUs on READY nodes",
                           mark)
                return False
            attempt = job.attempt + 1
            first = plan.placement()[0]["node_id"]
            intent = launch_intent(
                job, attempt, plan.ranks_by_node,
                {n: pool.node(n).inbox_queue_url for n in plan.ranks_by_node},
                master_addr=pool.node(first).address,
                master_port=placement.new_master_port())
            now = self._clock()
            try:
                # the LAUNCH intent is durable before it is sent: a placer that
                # dies here is covered by the reconciler's resend
                self.store.place(job, plan, intent, now, plus(now, self._resend_after_s),
                                 {n: pool.node(n).gpu_type for n in plan.ranks_by_node})
            except CapacityChanged as lost:
                pool.refresh(lost.node_ids)
                continue
            except Contended:
                continue  # lost to a create on the tenant's count: nothing was written
            except StateChanged:
                return False  # placed by another placer, or cancelled meanwhile
            pool.reserve(plan.gpus_by_node())
            self.dispatcher.send(intent)
            if job.parent_id is not None and job.attempt == 0:
                self._publish(ChildPlaced(job))
            log.info("placed %s attempt %d on %s", job.job_id, attempt,
                     ",".join(plan.ranks_by_node))
            return True
        return False

    def _note(self, job: Job, reason: str, mark: str | None = None) -> None:
        if job.pending_reason != reason or job.waiting_on != mark:
            self.store.set_pending_reason(job, reason, mark)


def _placing_each(order) -> Iterator[Job]:
    """The jobs of a placement order (placement.class_order), each told
    placed with all its GPUs as it comes."""
    try:
        job = next(order)
        while True:
            yield job
            job = order.send(job.spec.gpus)
    except StopIteration:
        return


def _on_type(victim: priority.Victim, gpu_type: str | None) -> bool:
    """Does the victim hold GPUs a job of ``gpu_type`` could use?"""
    return gpu_type is None or gpu_type in victim.node_types or not victim.node_types - {""}
