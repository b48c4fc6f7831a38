"""The job aggregate, its fields declared once (its spec: domain/spec.py).

Each field of :class:`Job` carries its :class:`Column`: how it is stored and
whether it is shown. The store's codec (adapters/jobs_table.py), the view
(service/views.py) and the API's job (api/representation.py) are made from
these declarations, so a field of the job is added here, in the model
(adapters/models.py) and in the contract (docs/openapi.yaml), and nowhere
else. Pure: no AWS here."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from .arrays import COUNTERS
from .spec import JobSpec
from .states import JobState

#: how a Job's field is stored, and read back (adapters/jobs_table.py)
TEXT, NUMBER, TIME, JSON, STATE, SPEC, SET, COUNTS = (
    "text", "number", "time", "json", "state", "spec", "set", "counts")


@dataclass(frozen=True)
class Column:
    """How one field of a Job is stored and shown: the one declaration the
    item codec, the view (service/views.py) and the API's job
    (api/representation.py) are made from."""
    #: how it is stored (one of TEXT, NUMBER, TIME, JSON, STATE, SPEC, SET,
    #: COUNTS: one stored number each, ``array_<counter>``)
    kind: str
    #: read into a view, to be shown
    view: bool = True
    #: its name in the API's job ("" the field's own); None: never shown
    api: str | None = ""
    #: an empty value (``{}``, ``[]``, an empty set) is stored as none
    empty_is_none: bool = False


def _col(kind: str, *, view: bool = True, api: str | None = "", empty_is_none: bool = False,
         **default: Any) -> Any:
    return field(metadata={"column": Column(kind, view, api, empty_is_none)}, **default)


@dataclass
class Job:
    job_id: str = _col(TEXT, api="id")
    #: who owns it: in the view (for who may read it), not in the API's job
    tenant: str = _col(TEXT, api=None)
    state: JobState = _col(STATE)
    spec: JobSpec = _col(SPEC)
    created_at: datetime = _col(TIME)
    updated_at: datetime = _col(TIME)
    name: str | None = _col(TEXT, default=None)
    attempt: int = _col(NUMBER, default=0)
    started_at: datetime | None = _col(TIME, default=None)
    finished_at: datetime | None = _col(TIME, default=None)
    cancel_requested_at: datetime | None = _col(TIME, default=None)
    cancel_reason: str | None = _col(TEXT, default=None)
    health: dict = _col(JSON, default_factory=dict)
    exit: dict | None = _col(JSON, default=None)
    #: the idempotency record this job was created under, if any
    idem_id: str | None = _col(TEXT, view=False, api=None, default=None)
    #: node id -> inbox queue URL, for the nodes holding the current attempt
    inboxes: dict[str, str] = _col(JSON, view=False, api=None, empty_is_none=True,
                                   default_factory=dict)
    #: why a PENDING job is not placed yet (None when nothing stands in the way)
    pending_reason: str | None = _col(TEXT, default=None)
    #: "<attempt>#<n>" of the last stall incident recorded (one per stall, once)
    incident_key: str | None = _col(TEXT, view=False, api=None, default=None)
    #: the placer's note "<fleet room version>@<when>": the job did not fit
    #: then, and need not be tried again until room appears (see placement)
    waiting_on: str | None = _col(TEXT, view=False, api=None, default=None)
    #: when it last became PENDING (its max_pending_s counts from here): its
    #: creation until it is first placed, then each retry's end
    pending_since: datetime | None = _col(TIME, default=None)
    #: its retries that did not count against max_attempts (domain/retry.py)
    uncounted_retries: int = _col(NUMBER, default=0)
    #: the preemption it waits on, {"jobs": [...], "at": iso, "class": name}
    #: (domain/priority.py); None once placed
    preempting: dict | None = _col(JSON, default=None)
    #: an array's child: its parent's id and its index (domain/arrays.py)
    parent_id: str | None = _col(TEXT, default=None)
    array_index: int | None = _col(NUMBER, default=None)
    #: an array's counters (arrays.COUNTERS); None for any other job. Shown
    #: as the API job's ``array`` (api/representation.py ``array_json``)
    array_counts: dict[str, int] | None = _col(COUNTS, api=None, default=None)
    #: the dependencies not ended yet, in the spec's order (domain/dependencies.py);
    #: None once none is left (or the job has none)
    waiting_for: list[str] | None = _col(JSON, empty_is_none=True, default=None)
    #: the jobs waiting on this one (they named it in depends_on): stored, never
    #: written with the job (each is added by the dependent's create)
    dependents: frozenset[str] = _col(SET, view=False, api=None, empty_is_none=True,
                                      default=frozenset())

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


#: every field of a Job and how it is stored and shown, in declaration order
COLUMNS: dict[str, Column] = {f.name: f.metadata["column"] for f in fields(Job)}


def stored_names(name: str) -> tuple[str, ...]:
    """The stored attributes of field ``name``: its own, or an array's counters'."""
    return tuple(f"array_{k}" for k in COUNTERS) if COLUMNS[name].kind == COUNTS else (name,)


#: the attributes a Job is read from and written to
STORED_FIELDS = tuple(n for name in COLUMNS for n in stored_names(name))
#: the attributes a view holds (service/views.py JobView)
VIEW_FIELDS = tuple(n for name, c in COLUMNS.items() if c.view for n in stored_names(name))
#: a field's name in the API's job, for each field shown under its own
API_NAMES = {name: c.api or name for name, c in COLUMNS.items() if c.api is not None}


def array_values(counts: dict[str, int] | None) -> dict[str, int | None]:
    """An array's counters under their stored names (``array_<counter>``)."""
    return {f"array_{k}": None if counts is None else counts.get(k, 0) for k in COUNTERS}
