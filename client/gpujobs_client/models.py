"""Small typed views of the API's JSON.

Each object keeps the JSON it was made from in ``raw`` (members the SDK does
not know yet included: the API may add members, and clients ignore those they
do not know). Times are the API's RFC 3339 strings, unchanged; use
:func:`parse_time` for a ``datetime``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

STATES = ("PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
#: the priority class of a job whose spec names none (the server's, always there)
DEFAULT_PRIORITY_CLASS = "default"


def parse_time(value: str | None) -> datetime | None:
    """``2025-01-31T12:00:00.123Z`` as an aware ``datetime`` (None stays None)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _whole(value: Any) -> int | None:
    """An integer field of the wire, None when absent or not an integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Exit:
    """How a job or an attempt ended: ``reason`` (``succeeded``,
    ``rank_failed``, ``node_lost``, ``stalled``, ``timeout``, ``preempted``,
    ``pending_timeout``, ``cancelled``...), the first failed rank's exit code,
    rank and node, what else the server says of it (``detail``: "node n1
    drained: bad ECC" for a preemption) and the retry rules' ``decision``."""
    reason: str
    exit_code: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    rank: int | None = None
    """The rank that failed first (None when no rank did)."""
    node_id: str | None = None
    """The node it ran on."""
    decision: str | None = None
    """Why the next attempt was made, or why none was: "node_lost (rank 3):
    retried, not counted (uncounted retry 2 of 10)"; for ``pending_timeout``,
    how long it waited and why."""
    detail: str | None = None
    """More about the end, when the server says more: a preemption's cause
    ("node n1 drained: bad ECC"), a ``dependency_failed``'s "job_x ended
    FAILED; this job needed it to succeed", an array's tally of its
    indexes."""
    dependency: str | None = None
    """For ``dependency_failed``: the job of ``depends_on`` that can no
    longer end as required."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Exit | None":
        if d is None:
            return None
        return cls(reason=str(d.get("reason", "")), exit_code=_opt_int(d.get("exit_code")),
                   raw=dict(d), rank=_opt_int(d.get("rank")), node_id=d.get("node_id"),
                   decision=d.get("decision"), detail=d.get("detail"),
                   dependency=d.get("dependency"))


@dataclass(frozen=True)
class Verdict:
    """``health.verdict``: the server's one answer to "which rank stopped".
    ``text`` is the sentence to show first; ``ranks`` the ranks it names
    (``[rank]``, or the tied ranks when ``rank`` is None)."""
    rank: int | None
    ranks: list[int]
    node_id: str | None
    by: str
    confidence: str
    text: str
    stack: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def is_tie(self) -> bool:
        return self.rank is None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Verdict | None":
        if not d:
            return None
        return cls(rank=_opt_int(d.get("rank")), ranks=[int(r) for r in d.get("ranks") or []],
                   node_id=d.get("node_id"), by=str(d.get("by", "")),
                   confidence=str(d.get("confidence", "")), text=str(d.get("text", "")),
                   stack=d.get("stack"), raw=dict(d))


@dataclass(frozen=True)
class JobHealth:
    status: str
    threshold_s: float | None
    first_stalled_rank: int | None
    last_heard_at: str | None
    detected_at: str | None
    stalled_ranks: list[int]
    raw: dict[str, Any] = field(repr=False, compare=False)
    verdict: Verdict | None = None
    """Which rank stopped, when the server names one (None otherwise);
    ``first_stalled_rank`` is only the rank silent longest."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "JobHealth":
        d = d or {}
        return cls(status=str(d.get("status", "UNKNOWN")),
                   threshold_s=_opt_float(d.get("threshold_s")),
                   first_stalled_rank=_opt_int(d.get("first_stalled_rank")),
                   last_heard_at=d.get("last_heard_at"), detected_at=d.get("detected_at"),
                   stalled_ranks=[int(r) for r in d.get("stalled_ranks") or []], raw=dict(d),
                   verdict=Verdict.from_json(d.get("verdict")))


@dataclass(frozen=True)
class Preempting:
    """``job.preempting``: a PENDING job of a class that preempts waits for
    the running jobs of lower classes it preempted (``jobs``, at ``at``, for
    its class ``priority_class``) to stop; the server removes it once the job
    is placed."""
    jobs: list[str]
    at: str | None
    priority_class: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Preempting | None":
        if not d:
            return None
        return cls(jobs=[str(j) for j in d.get("jobs") or []], at=d.get("at"),
                   priority_class=d.get("class"), raw=dict(d))


#: the conditions of a dependency (``depends_on[].condition``): the job named
#: must end SUCCEEDED, FAILED or CANCELLED (``failed``), or at all (``ended``)
CONDITIONS = ("succeeded", "failed", "ended")
DEFAULT_CONDITION = "succeeded"


@dataclass(frozen=True)
class Dependency:
    """One member of ``spec.depends_on``: the job waits until ``job_id``
    has ended as ``condition`` asks (``succeeded``, ``failed`` or
    ``ended``), and ends ``dependency_failed`` once it cannot."""
    job_id: str
    condition: str = DEFAULT_CONDITION

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Dependency":
        return cls(job_id=str(d.get("job_id", "")),
                   condition=str(d.get("condition") or DEFAULT_CONDITION))


#: the states an array counts its indexes in (``array.counts``): PENDING
#: includes the indexes not made yet, RUNNING the SCHEDULED ones
ARRAY_COUNT_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class ArrayProgress:
    """``job.array`` of an array's parent: its ``size`` (indexes 0 to
    size - 1), how many children were made so far (``materialized``: they
    are made as room opens, up to ``max_parallel`` open at once) and how
    many indexes are in each state (``counts``, every state of
    :data:`ARRAY_COUNT_STATES`; they add up to ``size``)."""
    size: int
    materialized: int
    counts: dict[str, int]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def ended(self) -> int:
        """Indexes that ended, whichever way."""
        return sum(self.counts.get(s, 0) for s in TERMINAL_STATES)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "ArrayProgress | None":
        if not d:
            return None
        counts = d.get("counts") or {}
        return cls(size=int(d.get("size") or 0), materialized=int(d.get("materialized") or 0),
                   counts={**{s: 0 for s in ARRAY_COUNT_STATES},
                           **{str(k): int(v or 0) for k, v in counts.items()}},
                   raw=dict(d))


@dataclass(frozen=True)
class QueueStanding:
    """``job.queue`` of a PENDING job read by id: its ``position`` among the
    ``of`` jobs in the placer's line that want the same GPUs (1: tried
    next), the nearest jobs ``ahead`` and the placed jobs it is
    ``waiting_for`` (each ``{"job_id", "gpus"[, "ends_by"]}``, ``job_id``
    None for another tenant's), the ``estimated_start`` (None when unknown)
    and its ``basis`` in words, as of ``as_of``."""
    position: int
    of: int
    gpu_type: str | None
    ahead: list[dict[str, Any]]
    waiting_for: list[dict[str, Any]]
    estimated_start: str | None
    basis: str
    as_of: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "QueueStanding | None":
        if not d:
            return None
        return cls(position=int(d.get("position") or 0), of=int(d.get("of") or 0),
                   gpu_type=d.get("gpu_type"), ahead=[dict(a) for a in d.get("ahead") or []],
                   waiting_for=[dict(w) for w in d.get("waiting_for") or []],
                   estimated_start=d.get("estimated_start"), basis=str(d.get("basis") or ""),
                   as_of=str(d.get("as_of") or ""))


@dataclass(frozen=True)
class Usage:
    """``job.usage`` of a job read by id: the GPU time it held
    (``gpu_seconds``: GPUs x placement to end, over every attempt), the
    part that was productive, the rest by cause (``startup``, ``stalled``,
    ``failed_attempt``, ``preempted``, ``node_lost``, ``cancelled``,
    ``checkpoint``, ``timeout``: docs/openapi.yaml defines each), and
    ``goodput`` (productive / held; None when nothing was held).
    ``estimated``: no step of its ranks was recorded, so the split is an
    estimate."""
    gpu_seconds: int
    productive_gpu_seconds: int
    lost_gpu_seconds: dict[str, int]
    goodput: float | None
    estimated: bool

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Usage | None":
        if not d:
            return None
        goodput = d.get("goodput")
        return cls(gpu_seconds=int(d.get("gpu_seconds") or 0),
                   productive_gpu_seconds=int(d.get("productive_gpu_seconds") or 0),
                   lost_gpu_seconds={str(k): int(v or 0)
                                     for k, v in (d.get("lost_gpu_seconds") or {}).items()},
                   goodput=None if goodput is None else float(goodput),
                   estimated=bool(d.get("estimated")))


@dataclass(frozen=True)
class Job:
    id: str
    name: str | None
    state: str
    spec: dict[str, Any]
    attempt: int
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    cancel_requested_at: str | None
    cancel_reason: str | None
    health: JobHealth
    exit: Exit | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    replayed: bool = field(default=False, compare=False)
    """True when ``create_job`` got back the job an earlier request with the
    same ``Idempotency-Key`` made (``Idempotent-Replayed: true``)."""
    idempotency_key: str | None = field(default=None, compare=False)
    """The key ``create_job`` sent (None on jobs from other calls)."""
    pending_reason: str | None = None
    """Why a PENDING job waits ("can never fit: ..."), from the placer; kept
    on a job that waited past its ``max_pending_s``."""
    pending_since: str | None = None
    """When it last became PENDING (its ``max_pending_s`` counts from here);
    None once placed."""
    uncounted_retries: int = 0
    """Its retries that did not count against ``max_attempts`` (the retry
    rules' ``retry_uncounted``): ``attempt - uncounted_retries`` attempts
    counted."""
    preempting: Preempting | None = None
    """Set while the job (PENDING, of a class that preempts) waits for the
    jobs it preempted to stop; None otherwise, and from a server that
    predates priority classes."""
    waiting_for: list[str] = field(default_factory=list)
    """The jobs of ``depends_on`` not yet ended as required, in the spec's
    order, while the job waits for them (its ``pending_reason`` names the
    first: "waiting for job_x to succeed"); empty once none is left, for a
    job without dependencies, and from a server that predates them."""
    parent_id: str | None = None
    """An array's child: the array (its parent job); None otherwise."""
    array_index: int | None = None
    """An array's child: its index (``GPUJOBS_ARRAY_INDEX``); None otherwise."""
    array: ArrayProgress | None = None
    """An array's parent: its size and its indexes by state; None for any
    other job."""
    queue: QueueStanding | None = None
    """A PENDING job read by id (``get_job``): where it stands in the
    placer's line; None otherwise, on list pages, and from a server that
    predates it."""
    usage: Usage | None = None
    """A job read by id (``get_job``): what its GPU time bought so far; None
    on list pages and from a server that predates it."""

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def is_array(self) -> bool:
        """An array's parent: a job that never runs itself, whose indexes do."""
        return self.array is not None

    @property
    def depends_on(self) -> list[Dependency]:
        """``spec.depends_on``: the jobs it waits for and the condition on each."""
        return [Dependency.from_json(d) for d in self.spec.get("depends_on") or []
                if isinstance(d, Mapping)]

    @property
    def priority_class(self) -> str:
        """The operator's priority class the job is in (``spec.priority_class``;
        ``default`` when the spec names none)."""
        return str(self.spec.get("priority_class") or DEFAULT_PRIORITY_CLASS)

    @property
    def priority(self) -> int:
        """``spec.priority``: the order of the tenant's own jobs within its class."""
        return int(self.spec.get("priority") or 0)

    @property
    def ranks(self) -> int | None:
        return _opt_int(self.spec.get("ranks"))

    @property
    def counted_attempts(self) -> int:
        """The attempts so far that count against ``max_attempts``."""
        return max(0, self.attempt - self.uncounted_retries)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, replayed: bool = False,
                  idempotency_key: str | None = None) -> "Job":
        return cls(id=str(d["id"]), name=d.get("name"), state=str(d.get("state", "")),
                   spec=dict(d.get("spec") or {}), attempt=int(d.get("attempt") or 0),
                   created_at=d.get("created_at", ""), updated_at=d.get("updated_at", ""),
                   started_at=d.get("started_at"), finished_at=d.get("finished_at"),
                   cancel_requested_at=d.get("cancel_requested_at"),
                   cancel_reason=d.get("cancel_reason"),
                   health=JobHealth.from_json(d.get("health")),
                   exit=Exit.from_json(d.get("exit")), raw=dict(d), replayed=replayed,
                   idempotency_key=idempotency_key, pending_reason=d.get("pending_reason"),
                   pending_since=d.get("pending_since"),
                   uncounted_retries=int(d.get("uncounted_retries") or 0),
                   preempting=Preempting.from_json(d.get("preempting")),
                   waiting_for=[str(j) for j in d.get("waiting_for") or []],
                   parent_id=d.get("parent_id"), array_index=_opt_int(d.get("array_index")),
                   array=ArrayProgress.from_json(d.get("array")),
                   queue=QueueStanding.from_json(d.get("queue")),
                   usage=Usage.from_json(d.get("usage")))


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_page_token: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobPage":
        return cls(jobs=[Job.from_json(j) for j in d.get("jobs") or []],
                   next_page_token=d.get("next_page_token"), raw=dict(d))


@dataclass(frozen=True)
class Placement:
    rank: int
    node_id: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Placement":
        return cls(rank=int(d["rank"]), node_id=str(d.get("node_id", "")))


@dataclass(frozen=True)
class Attempt:
    attempt: int
    state: str
    placement: list[Placement]
    created_at: str
    finished_at: str | None
    exit: Exit | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Attempt":
        return cls(attempt=int(d["attempt"]), state=str(d.get("state", "")),
                   placement=[Placement.from_json(p) for p in d.get("placement") or []],
                   created_at=d.get("created_at", ""), finished_at=d.get("finished_at"),
                   exit=Exit.from_json(d.get("exit")), raw=dict(d))


#: what a cordon does to the node's running jobs (``Cordon.drain``): left to
#: run (a cordon), preempted and requeued (a drain), or left to finish (a
#: drain that waits)
DRAIN_MODES = ("keep", "stop", "wait")


@dataclass(frozen=True)
class Cordon:
    """Why a node takes no new placements (``Node.cordon``): the ``reason``,
    who cordoned it (``by``: the operator's name, or ``gpujobs`` when the
    node cordoned itself, ``auto``), when (``at``), and what it does to the
    jobs running there (``drain``: ``keep``, ``stop`` or ``wait``)."""
    reason: str
    by: str
    at: str | None
    drain: str
    auto: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Cordon | None":
        if not d:
            return None
        return cls(reason=str(d.get("reason") or ""), by=str(d.get("by") or ""),
                   at=d.get("at"), drain=str(d.get("drain") or "keep"),
                   auto=bool(d.get("auto")), raw=dict(d))


@dataclass(frozen=True)
class Node:
    node_id: str
    gpus: int | None
    gpus_free: int | None
    gpu_type: str | None
    state: str | None
    inbox_queue_url: str | None
    last_seen_at: str | None
    labels: dict[str, str]
    raw: dict[str, Any] = field(repr=False, compare=False)
    cordon: Cordon | None = None
    """Set while an operator's cordon or drain (or auto-cordon) keeps new
    placements off the node (its ``state`` is then ``DRAINING``, or ``DOWN``);
    None otherwise, and from a server that predates cordons."""

    @property
    def gpus_used(self) -> int | None:
        """GPUs held by attempts on the node (``gpus - gpus_free``)."""
        if self.gpus is None or self.gpus_free is None:
            return None
        return max(0, self.gpus - self.gpus_free)

    @property
    def is_drained(self) -> bool:
        """Cordoned with nothing left running: every GPU free."""
        return self.cordon is not None and self.gpus_used == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Node":
        return cls(node_id=str(d["node_id"]), gpus=_opt_int(d.get("gpus")),
                   gpus_free=_opt_int(d.get("gpus_free")), gpu_type=d.get("gpu_type"),
                   state=d.get("state"), inbox_queue_url=d.get("inbox_queue_url"),
                   last_seen_at=d.get("last_seen_at"), labels=dict(d.get("labels") or {}),
                   raw=dict(d), cordon=Cordon.from_json(d.get("cordon")))


@dataclass(frozen=True)
class RankStatus:
    rank: int
    node_id: str | None
    last_heard_at: str | None
    silence_s: float | None
    step: int | None
    stalled: bool
    raw: dict[str, Any] = field(repr=False, compare=False)
    status: str | None = None
    """What the server says the rank is (``live``, ``waiting``,
    ``not_instrumented``, ``exited``...); None from a server that predates it."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RankStatus":
        return cls(rank=int(d["rank"]), node_id=d.get("node_id"),
                   last_heard_at=d.get("last_heard_at"), silence_s=_opt_float(d.get("silence_s")),
                   step=_opt_int(d.get("step")), stalled=bool(d.get("stalled")), raw=dict(d),
                   status=d.get("status"))


@dataclass(frozen=True)
class Ranks:
    """``GET /v1/jobs/{id}/ranks``: every rank of the current attempt, ordered
    by silence (longest first, ties by rank), as the server sends them."""
    attempt: int
    threshold_s: float | None
    now: str | None
    ranks: list[RankStatus]
    raw: dict[str, Any] = field(repr=False, compare=False)
    verdict: Verdict | None = None
    """The job's ``health.verdict``, sent along with the ranks."""

    @property
    def stalled(self) -> list[RankStatus]:
        return [r for r in self.ranks if r.stalled]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Ranks":
        return cls(attempt=int(d.get("attempt") or 0), threshold_s=_opt_float(d.get("threshold_s")),
                   now=d.get("now"), ranks=[RankStatus.from_json(r) for r in d.get("ranks") or []],
                   raw=dict(d), verdict=Verdict.from_json(d.get("verdict")))


@dataclass(frozen=True)
class HeartbeatAck:
    received_at: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "HeartbeatAck":
        return cls(received_at=str(d.get("received_at", "")), raw=dict(d))


@dataclass(frozen=True)
class LogLine:
    """One line a rank wrote (GET /v1/jobs/{id}/logs)."""
    rank: int | None
    stream: str
    time: str
    line: str
    id: str | None
    attempt: int
    raw: dict[str, Any] = field(repr=False, compare=False)
    seq: int | None = None
    """The line's byte offset in the rank's file, increasing within a rank
    (None: shipped without one)."""
    next_seq: int | None = None
    """Where the rank's next line starts in its file (None: unknown)."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any], attempt: int) -> "LogLine":
        return cls(rank=_opt_int(d.get("rank")), stream=str(d.get("stream", "stdout")),
                   time=str(d.get("time", "")), line=str(d.get("line", "")), id=d.get("id"),
                   attempt=attempt, raw=dict(d), seq=_whole(d.get("seq")),
                   next_seq=_whole(d.get("next_seq")))


@dataclass(frozen=True)
class JobEvent:
    """One event of a job's story (GET /v1/jobs/{id}/events)."""
    type: str
    time: str
    attempt: int | None
    reason: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    decision: str | None = None
    """A ``retried`` or ``finished`` event's retry decision: why the next
    attempt was made, or why none was."""
    node_id: str | None = None
    """The node the event names (a failed rank's, a stalled rank's)."""
    jobs: list[str] = field(default_factory=list)
    """A ``preempting`` event's jobs: those of lower priority classes the job
    preempted to make room (empty for other events)."""
    detail: str | None = None
    """More about a ``finished`` event of a pipeline or an array: "job_x
    ended FAILED; this job needed it to succeed", an array's tally."""

    @property
    def stacks(self) -> list[dict[str, Any]]:
        """A ``rank_stopped`` event's stacks, sampled just before the SIGTERM:
        ``[{"rank", "where", "frames"}]`` (empty when it has none)."""
        return [s for s in self.raw.get("stacks") or [] if isinstance(s, dict)]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobEvent":
        return cls(type=str(d.get("type", "")), time=str(d.get("time", "")),
                   attempt=_opt_int(d.get("attempt")), reason=d.get("reason"), raw=dict(d),
                   decision=d.get("decision"), node_id=d.get("node_id"),
                   jobs=[str(j) for j in d.get("jobs") or []], detail=d.get("detail"))


@dataclass(frozen=True)
class FeedEvent:
    """One event of the tenant's feed (GET /v1/events): ``type`` is
    ``job.created``, ``job.state_changed``, ``job.retried``, ``job.stalled``
    or ``job.rank_slow``; ``data`` as the API documents it per type."""
    id: str
    type: str
    time: str
    job_id: str
    data: dict[str, Any] = field(compare=False)
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The event in words, as the CLI prints it: "RUNNING -> SUCCEEDED
        (attempt 1)", "rank 3 on node-2 stalled: <verdict>"."""
        d = self.data
        attempt = f" (attempt {d['attempt']})" if d.get("attempt") is not None else ""
        if self.type == "job.created":
            return "created"
        if self.type == "job.state_changed":
            moved = f"{d.get('from') or '?'} -> {d.get('to')}{attempt}"
            exit_ = d.get("exit") or {}
            why = d.get("reason")
            if exit_.get("rank") is not None:
                why = f"{why}: rank {exit_['rank']}" + (
                    f" on {exit_['node_id']}" if exit_.get("node_id") else "") + (
                    f" exited {exit_['exit_code']}" if exit_.get("exit_code") is not None else "")
            return moved + (f": {why}" if why else "")
        if self.type == "job.retried":
            return (f"attempt {d.get('attempt')} ended ({d.get('reason')}); attempt "
                    f"{d.get('next_attempt')} follows")
        if self.type == "job.stalled":
            return f"stalled{attempt}: {d.get('text')}"
        if self.type == "job.rank_slow":
            # the server's sentence says the rank, its node and how slow
            return f"slow{attempt}: {d.get('text') or 'rank ' + str(d.get('rank')) + ' is slow'}"
        if self.type == "webhook.disabled":
            return str(d.get("text") or f"webhook {d.get('webhook_id')} was disabled")
        return self.type

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FeedEvent":
        return cls(id=str(d.get("id", "")), type=str(d.get("type", "")),
                   time=str(d.get("time", "")), job_id=str(d.get("job_id", "")),
                   data=dict(d.get("data") or {}), raw=dict(d))


@dataclass(frozen=True)
class FeedPage:
    """A page of the tenant's feed and the cursor that follows it (never None)."""
    events: list[FeedEvent]
    next_cursor: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "FeedPage":
        return cls(events=[FeedEvent.from_json(e) for e in d.get("events") or []],
                   next_cursor=str(d.get("next_cursor") or ""))
