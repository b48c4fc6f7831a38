"""The job aggregate (its spec: domain/spec.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

from ..fastjson import RawJSON
from .arrays import COUNTERS
from .clock import iso, iso_or_none
from .spec import JobSpec
from .states import JobState


@dataclass
class Job:
    job_id: str
    tenant: str
    state: JobState
    spec: JobSpec
    created_at: datetime
    updated_at: datetime
    name: str | None = None
    attempt: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    cancel_reason: str | None = None
    health: dict = field(default_factory=dict)
    exit: dict | None = None
    #: the idempotency record this job was created under, if any
    idem_id: str | None = None
    #: node id -> inbox queue URL, for the nodes holding the current attempt
    inboxes: dict[str, str] = field(default_factory=dict)
    #: why a PENDING job is not placed yet (None when nothing stands in the way)
    pending_reason: str | None = None
    #: "<attempt>#<n>" of the last stall incident recorded (one per stall, once)
    incident_key: str | None = None
    #: the placer's note "<fleet room version>@<when>": the job did not fit
    #: then, and need not be tried again until room appears (see placement)
    waiting_on: str | None = None
    #: when it last became PENDING (its max_pending_s counts from here): its
    #: creation until it is first placed, then each retry's end
    pending_since: datetime | None = None
    #: its retries that did not count against max_attempts (domain/retry.py)
    uncounted_retries: int = 0
    #: the preemption it waits on, {"jobs": [...], "at": iso, "class": name}
    #: (domain/priority.py); None once placed
    preempting: dict | None = None
    #: an array's child: its parent's id and its index (domain/arrays.py)
    parent_id: str | None = None
    array_index: int | None = None
    #: an array's counters (arrays.COUNTERS); None for any other job
    array_counts: dict[str, int] | None = None
    #: the dependencies not ended yet, in the spec's order (domain/dependencies.py);
    #: None once none is left (or the job has none)
    waiting_for: list[str] | None = None
    #: the jobs waiting on this one (they named it in depends_on)
    dependents: frozenset[str] = frozenset()

    @property
    def is_array(self) -> bool:
        return self.array_counts is not None

    @property
    def pending_weight(self) -> int:
        """How many PENDING jobs it counts as under max_pending_jobs: an
        array its indexes not made yet (a made child counts for itself),
        any other job one."""
        if self.array_counts is None:
            return 1
        assert self.spec.array is not None, "an array's spec"
        return self.spec.array.size - int(self.array_counts.get("materialized", 0))

    def __post_init__(self) -> None:
        if self.pending_since is None and self.attempt == 0 \
                and self.state is JobState.PENDING:
            self.pending_since = self.created_at  # never placed: waiting since created


#: a stored JSON value in a JobView: the JSON text the store holds, undecoded
#: (fastjson.RawJSON), from the store and from :func:`view_of` alike. It is
#: shown, not read: ``view["spec"]["ranks"]`` fails everywhere, and a service
#: that must read it decodes it (``view["spec"].value()``), or reads the Job.
Stored = RawJSON


class JobView(TypedDict):
    """A job as it is read and shown, not changed: what the representation
    takes, with its times already as API text (``clock.iso``).

    The store makes these straight from what it holds (for get and a list
    page: no Job, no time parsed and formatted again, 9 us a job); anything
    else makes them from a Job with :func:`view_of`. ``health`` may be None
    where a job never had any (shown as ``{}``).

    ``spec``, ``health`` and ``exit`` are JSON objects to be shown as they
    are, of one type whoever made the view (:data:`Stored`): the JSON text
    the store holds, kept undecoded (fastjson.RawJSON, 5 to 8 us a job less
    on a list page), which the representation's encoder writes out verbatim;
    :func:`view_of` encodes a Job's dicts to the same text."""
    job_id: str
    tenant: str
    state: str
    name: str | None
    spec: Stored
    attempt: int
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    cancel_requested_at: str | None
    cancel_reason: str | None
    health: Stored | None
    exit: Stored | None
    pending_reason: str | None
    pending_since: str | None
    uncounted_retries: int | None
    preempting: Stored | None
    parent_id: str | None
    array_index: int | None
    waiting_for: Stored | None
    array_materialized: int | None
    array_placed: int | None
    array_succeeded: int | None
    array_failed: int | None
    array_cancelled: int | None


#: the fields of a JobView, which are also the job's stored attribute names
VIEW_FIELDS = tuple(JobView.__annotations__)


def _stored(value: Any) -> Stored | None:
    return None if value is None else RawJSON.of(value)


def view_of(job: Job) -> JobView:
    """The job as it is shown: what the store's view of the same job is."""
    return {
        "job_id": job.job_id, "tenant": job.tenant, "state": job.state.value,
        "name": job.name, "spec": RawJSON.of(job.spec.to_json()), "attempt": job.attempt,
        "created_at": iso(job.created_at), "updated_at": iso(job.updated_at),
        "started_at": iso_or_none(job.started_at), "finished_at": iso_or_none(job.finished_at),
        "cancel_requested_at": iso_or_none(job.cancel_requested_at),
        "cancel_reason": job.cancel_reason, "health": _stored(job.health),
        "exit": _stored(job.exit), "pending_reason": job.pending_reason,
        "pending_since": iso_or_none(job.pending_since),
        "uncounted_retries": job.uncounted_retries, "preempting": _stored(job.preempting),
        "parent_id": job.parent_id, "array_index": job.array_index,
        "waiting_for": _stored(job.waiting_for), **array_values(job.array_counts),  # type: ignore[typeddict-item]
    }


def array_values(counts: dict[str, int] | None) -> dict[str, int | None]:
    """An array's counters under their stored names (``array_<counter>``)."""
    return {f"array_{k}": None if counts is None else counts.get(k, 0) for k in COUNTERS}
