"""The small interfaces the services need. Adapters implement them; tests may
substitute fakes (for example an inbox whose sends fail)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Collection, Iterator, Mapping, Protocol, Sequence

from ..domain.attempts import Attempt
from ..domain.fleet import Fleet
from ..domain.intents import Intent
from ..domain.jobs import Job
from ..domain.nodes import Node
from ..domain.placement import Plan
from ..domain.queue import Line
from ..domain.rollup import Key
from ..domain.stall import Beat
from ..domain.states import JobState
from ..domain.webhooks import Delivery, Target, Webhook
from .views import JobView


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


class CapacityChanged(Exception):
    """A reservation lost: these nodes no longer have the room that was read."""

    def __init__(self, node_ids: list[str]) -> None:
        super().__init__(", ".join(node_ids))
        self.node_ids = node_ids


class PendingLimitReached(Exception):
    """The tenant already has as many PENDING jobs as it may (nothing was written)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"max_pending_jobs {limit} reached")
        self.limit = limit


class FleetChanged(Exception):
    """A job was to be made parked, but its fleet moved on from the generation
    it was judged against (nothing was written): judge it again."""


class Contended(Exception):
    """A transaction lost to a concurrent one on a shared item (a tenant's
    counter); nothing was written and trying again is safe."""


@dataclass(frozen=True)
class OutboxEntry:
    intent: Intent
    #: nodes that have not acknowledged yet
    unacked: frozenset[str]
    due_at: datetime
    sends: int


class JobReads(Protocol):
    """A job read and shown: one job, a tenant's page, its story."""

    def get(self, job_id: str, *, consistent: bool = True) -> Job | None:
        """The job; ``consistent=False``: eventually consistent (half the read
        units; it may miss the last second's writes)."""
    def view(self, job_id: str) -> JobView | None: ...
    def view_with_story(self, job_id: str) -> tuple[JobView, list[dict]] | None:
        """The job's view and the events of its own item (oldest first, as
        served: not its attempts' rank events), read at once, for its
        ``usage``; None when there is no such job."""
    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[JobView], str | None]: ...
    def events(self, job_id: str) -> list[dict]: ...
    def ping(self) -> None: ...


class JobQueue(Protocol):
    """The active-state index: the placement queue, the jobs placed, the
    parked never-fitting jobs (domain/fleet.py), and what the placer notes
    on a waiting job."""

    def pending(self, limit: int) -> Iterator[Job]: ...
    def active(self, state: JobState, limit: int) -> list[Job]: ...
    def set_pending_reason(self, job: Job, reason: str | None,
                           waiting_on: str | None = None) -> None: ...
    def mark_preempting(self, job: Job, preempting: dict, reason: str, stale_before: str,
                        now: datetime) -> bool: ...
    def parked(self, gpu_type: str | None) -> Iterator[Job]: ...
    def park(self, job: Job, reason: str, fleet: Fleet) -> bool: ...
    def unpark(self, job: Job) -> bool: ...


class JobWrites(Protocol):
    """A job created under an idempotency key, and the transitions that
    concern the job alone (each a conditional write on the states
    domain/states.py's table says it leaves)."""

    def create(self, job: Job, claim: IdemClaim | None, *,
               reclaim: IdemRecord | None = None, max_pending: int | None = None,
               parked: Fleet | None = None) -> None: ...
    def cancel_unplaced(self, job: Job, now: datetime, reason: str | None) -> Job: ...
    def expire_pending(self, job: Job, now: datetime, exit_: dict) -> Job: ...
    def start(self, job: Job, now: datetime) -> Job: ...
    def record_health(self, job: Job, health: dict, *, incident_key: str | None = None,
                      recovered: bool = False,
                      events: Sequence[tuple[str, dict]] = ()) -> bool: ...


class Jobs(JobReads, JobQueue, JobWrites, Protocol):
    """Every port of the job item: what the contract suite runs on the fake
    and on moto (a service asks for the parts it calls)."""


class Dependencies(Protocol):
    """Who waits on whom (domain/dependencies.py)."""

    def add_dependent(self, job_id: str, dependent_id: str) -> None: ...
    def states(self, job_ids: Sequence[str], *,
               count_dependents: bool = False) -> dict[str, tuple[str, JobState, int]]: ...
    def waiting(self, limit: int) -> list[Job]: ...
    def wait_for(self, job: Job, waiting_for: Sequence[str], reason: str | None,
                 now: datetime) -> bool: ...
    def fail_dependency(self, job: Job, now: datetime, exit_: dict) -> Job: ...


class Arrays(Protocol):
    """An array's children, made as room opens (domain/arrays.py), and its end."""

    def arrays(self, limit: int) -> list[Job]: ...
    def make_children(self, parent: Job, children: Sequence[Job], now: datetime) -> bool: ...
    def mark_array_running(self, parent_id: str, tenant: str, now: datetime) -> bool: ...
    def request_array_cancel(self, parent: Job, now: datetime, reason: str | None) -> bool: ...
    def finish_array(self, parent: Job, to: JobState, exit_: dict | None,
                     now: datetime) -> bool: ...
    def children(self, parent_id: str, state: str | None, page_size: int,
                 after: str | None) -> tuple[list[JobView], str | None]: ...
    def open_children(self, parent_id: str, limit: int | None = None) -> list[Job]: ...


class Pipelines(Dependencies, Arrays, Protocol):
    """Dependencies and arrays together, as the contract suite runs them."""


class Attempts(Protocol):
    """Attempts: one placement of a job each, what its ranks reported (sets
    that only grow), and the GPUs it holds until each node gives them back."""

    def attempt(self, job_id: str, attempt: int) -> Attempt | None: ...
    def attempts(self, job_id: str) -> list[dict]: ...
    def record_ranks(self, job_id: str, attempt: int, kind: str, ranks: list[int],
                     exit_code: int | None = None, node_id: str | None = None,
                     stacks: list[dict] | None = None) -> Attempt: ...
    def release(self, attempt: Attempt, node_id: str,
                heard_at: datetime | None = None) -> bool: ...


class Outbox(Protocol):
    """Intents for agents, recorded before they are sent and resent until
    every target node acknowledged (at least once, never lost)."""

    def due_intents(self, now: datetime, limit: int) -> list[OutboxEntry]: ...
    def reschedule_intent(self, entry: OutboxEntry, due_at: datetime) -> None: ...
    def ack_intent(self, job_id: str, intent_id: str, node_id: str) -> None: ...


class Transitions(Protocol):
    """The transitions that open, stop or close an attempt. Each is ONE
    transaction across the concerns above, which is why none of them owns it:
    ``place`` moves the job, writes its attempt and LAUNCH intent and reserves
    the nodes' GPUs; ``request_cancel`` records the cancel with its CANCEL
    intent and retires the LAUNCH; ``end_attempt`` moves the job, closes the
    attempt, retires its LAUNCH and records the CANCEL to the nodes still
    running. Half of any of them would lose an intent or leak capacity."""

    def place(self, job: Job, plan: Plan, intent: Intent, now: datetime,
              resend_at: datetime | None = None,
              node_types: dict[str, str] | None = None) -> Job: ...
    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job: ...
    def end_attempt(self, job: Job, attempt: Attempt, to: JobState, exit_: dict,
                    now: datetime, stop: Intent | None = None, *,
                    uncounted: bool = False) -> Job: ...


class JobTables(Jobs, Attempts, Outbox, Transitions, Pipelines, Protocol):
    """Every port of the job's tables as one object: what bootstrap wires
    (adapters/store.DynamoStore; tests/fakes.FakeJobStore). No service asks
    for it: each asks for the narrowest union of the ports above it calls."""


class HeartbeatStore(Protocol):
    """One record per rank of an attempt, in and out as domain/stall.py's Beat
    (``node_of``, where each rank of the attempt runs, lets a store keep a
    host's records together)."""

    def record(self, job_id: str, attempt: int, entries: Sequence[Beat],
               now: datetime, node_of: Mapping[int, str]) -> None:
        """What one post said of its ranks, received at ``now``: each beat
        (``heard_at`` set) replaces its rank's record; each other entry (a
        declared pause, a process sample) is merged into it, the last beat's
        time left as it was, and its sample's times too unless it has newer."""
        ...

    def read(self, job_id: str, attempt: int, node_of: Mapping[int, str]) -> list[Beat]:
        """Every rank of ``node_of`` (ranks never heard too), as last recorded;
        ``sent_at`` and ``pause_reason`` are not read back."""
        ...

    def last_posts(self, attempts: Mapping[tuple[str, int], Mapping[int, str]],
                   nodes: Collection[str]) -> dict[str, datetime]:
        """When each of ``nodes`` last posted beats (of any entries) for any
        of ``attempts`` (``(job_id, attempt)`` -> where its ranks run), by the
        collector's clock (a ``record``'s ``now``); absent: it never did."""
        ...


class CollectorStore(Protocol):
    def mark_ingest(self, now: datetime) -> None: ...
    def latest_ingest(self) -> datetime | None: ...
    def previous_scan(self) -> tuple[datetime | None, datetime | None, str | None]: ...
    def record_scan(self, now: datetime, hold_until: datetime | None = None,
                    hold_reason: str | None = None) -> None: ...


class NodeRegistry(Protocol):
    """Nodes as their agents register them, and the attempts each holds."""

    def get(self, node_id: str) -> Node | None: ...
    def all(self) -> list[Node]: ...
    def register(self, node_id: str, *, gpus: int, gpu_type: str, labels: dict,
                 address: str, inbox_queue_url: str, now: datetime,
                 current: Node | None, isolation: str = "none",
                 fresh_s: float = 0.0) -> Node: ...
    def attempts_on(self, node_id: str) -> list[tuple[str, int]]: ...


class Fleets(Protocol):
    """The capacity placement reads: each GPU type's fleet and its READY nodes."""

    def fleet_of(self, gpu_type: str | None) -> Fleet: ...
    def fleets(self) -> list[Fleet]: ...
    def mark_swept(self, fleet: Fleet) -> None: ...
    def ready_pages(self, gpu_type: str | None, min_free: int) -> Iterator[list[Node]]: ...


class Lines(Protocol):
    """The placer's line: the waiting jobs in the order it tries them
    (domain/queue.py), written by each run that changes it."""

    def line(self) -> Line | None: ...
    def set_line(self, line: Line) -> None: ...


class NodeLiveness(Protocol):
    """Nodes gone quiet: marked DOWN, their attempts lost."""

    def silent_since(self, before: datetime) -> list[Node]: ...
    def mark_down(self, node: Node) -> bool: ...
    def mark_lost(self, node_id: str, key: str) -> bool: ...
    def down_holding_attempts(self) -> list[Node]: ...


class NodeCordons(Protocol):
    """Cordons (service/cordons.py) and the failures that may set one."""

    def cordon(self, node_id: str, cordon: dict, now: datetime) -> Node | None: ...
    def uncordon(self, node_id: str, now: datetime) -> Node | None: ...
    def record_failure(self, node_id: str, entry: str, since: str) -> list[str]: ...


class NodeStore(NodeRegistry, Fleets, Lines, NodeLiveness, NodeCordons, Protocol):
    """Every port of the nodes table: what bootstrap wires and the contract
    suite runs (a service asks for the parts it calls)."""


class Nudge(Protocol):
    """Asks for a placement run soon (after a create, or when GPUs free up)."""
    def __call__(self) -> None: ...


class FollowUps(Protocol):
    """Hands what follows a job's end (its array, its dependents) to a worker
    off the request that ended it (bootstrap.follow_ups)."""
    def send(self, job_id: str) -> None: ...


class Telemetry(Protocol):
    """Metrics and the request id of log lines (EMF records and Powertools' Logger on AWS)."""
    def count(self, name: str, value: float = 1) -> None: ...
    def seconds(self, name: str, value: float) -> None: ...
    def begin(self, request_id: str | None) -> None: ...
    def flush(self) -> None: ...


class Inbox(Protocol):
    def send(self, queue_url: str, message: dict) -> None: ...
    def ensure(self, node_id: str) -> str: ...

    def is_current(self, node_id: str, url: str) -> bool:
        """Is ``url`` what ``ensure(node_id)`` answers here: this stage's
        queue of the node, at the endpoint this process sends to (a local
        stack restarted on another port has another)?"""
        ...


@dataclass(frozen=True)
class LogPage:
    #: (stream name, time in ms, message, event id), oldest first
    events: list
    next_token: str | None


class LogReader(Protocol):
    """The ranks' logs (CloudWatch Logs), one page at a time."""
    def read(self, streams: list[str], prefix: str, *, start_ms: int | None,
             token: str | None, limit: int) -> LogPage: ...


@dataclass(frozen=True)
class FeedHead:
    """A tenant's feed as its head tells it (domain/feed.py): the last
    number given, the ms its id carried, and the last number pushed."""
    seq: int = 0
    ms: int = 0
    pushed: int = 0


class AlreadyFed(Exception):
    """Some story events were fed already (a marker exists): (job, key)."""

    def __init__(self, fed: list[tuple[str, str]]) -> None:
        super().__init__(f"already fed: {fed}")
        self.fed = fed


class FeedLog(Protocol):
    """The tenants' event feeds (domain/feed.py) and the unfed events of the
    jobs' stories they are fed from."""
    def unfed_jobs(self, tenant: str, limit: int) -> list[str]:
        """Jobs of ``tenant`` with unfed story events (an index: may lag)."""
        ...

    def unfed_tenants(self, limit: int) -> list[str]: ...

    def unfed(self, job_id: str) -> dict[str, dict | None]:
        """The job's unfed story events, by key (read consistently); None
        for a key marked unfed whose event its story does not hold."""
        ...

    def head(self, tenant: str) -> FeedHead: ...

    def append(self, tenant: str, read: FeedHead, ms: int,
               events: Sequence[tuple[int, dict]], fed: Sequence[tuple[str, str]]) -> None:
        """Give ``events`` their numbers and mark the story events ``fed``
        (job, key) fed, in one write conditioned on the head ``read``:
        raises Contended when the head moved, AlreadyFed naming those fed
        meanwhile (nothing written either way)."""
        ...

    def mark_fed(self, job_id: str, keys: Collection[str]) -> None:
        """The job's story events ``keys`` are fed: no longer unfed."""
        ...

    def events(self, tenant: str, after: int, upto: int, limit: int) -> list[tuple[int, dict]]:
        """The tenant's events numbered after ``after`` and up to ``upto``,
        at most ``limit``, in order (read consistently)."""
        ...

    def pushed(self, tenant: str, read: FeedHead, upto: int) -> None:
        """Events up to ``upto`` were pushed; the feed leaves the push index
        when that is its head (conditioned on the head ``read``)."""
        ...

    def push_due(self, limit: int) -> list[str]:
        """Tenants with numbered events not pushed yet."""
        ...


class EventSink(Protocol):
    """Where every numbered event is put (EventBridge): raises when any is not."""
    def put(self, events: Sequence[dict]) -> None: ...


class WebhookStore(Protocol):
    """Webhooks and their deliveries log (adapters/webhook_store.py)."""
    def create(self, webhook: Webhook, limit: int) -> bool: ...
    def get(self, tenant: str, webhook_id: str) -> Webhook | None: ...
    def webhooks_of(self, tenant: str) -> list[Webhook]: ...
    def delete(self, tenant: str, webhook_id: str) -> bool: ...
    def failed(self, tenant: str, webhook_id: str, at: datetime) -> datetime | None: ...
    def succeeded(self, tenant: str, webhook_id: str) -> None: ...
    def disable(self, tenant: str, webhook_id: str, at: datetime) -> bool: ...
    def record(self, webhook_id: str, delivery: Delivery) -> None: ...
    def deliveries(self, webhook_id: str, page_size: int,
                   after: str | None) -> tuple[list[Delivery], str | None]: ...


class WebhookQueue(Protocol):
    """The deliveries' queue: one message a delivery attempt, held back
    ``delay_s`` seconds (at most 900); a send that fails raises."""
    def send(self, message: dict, delay_s: int = 0) -> None: ...
    def send_many(self, messages: list[dict]) -> None: ...


class Poster(Protocol):
    """POSTs one delivery to the checked address (adapters/webhook_post.py)."""
    def post(self, target: Target, headers: Mapping[str, str], body: bytes,
             timeout_s: float) -> int: ...


@dataclass(frozen=True)
class UsageCell:
    """One rolled-up cell of a tenant's usage (domain/rollup.py): a period
    (its start, ms), a group's value, its GPU-seconds by part
    (``productive`` or a cause; signed additions summed) and its jobs."""
    at_ms: int
    value: str
    counts: dict[str, int]
    jobs: int


class UsageRollup(Protocol):
    """Usage rolled up by hour and day, per tenant and group."""
    def add(self, tenant: str, job_id: str, attempt: int,
            increments: Mapping[Key, Mapping[str, int]]) -> bool:
        """Add what attempt ``attempt`` of ``job_id`` adds, once: False when
        it was added before (nothing written then)."""
        ...

    def cells(self, tenant: str, granularity: str, dim: str,
              start_ms: int, end_ms: int) -> list[UsageCell]:
        """The tenant's cells of ``granularity`` ("hour" or "day") and
        dimension ``dim`` whose period starts in [start_ms, end_ms), by
        period then value."""
        ...

    def tenants(self, start_ms: int, end_ms: int) -> list[str]:
        """The tenants with usage on the UTC days of [start_ms, end_ms), sorted."""
        ...

    def done(self, job_id: str, attempt: int) -> None:
        """The attempt's usage is rolled up: no longer due (written with the
        attempt's end: adapters/usage_store.due_put)."""
        ...

    def due(self, before: datetime, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` (job, attempt) that ended before ``before`` and
        are not rolled up yet."""
        ...
