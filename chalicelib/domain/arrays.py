"""Job arrays (``array``): one parent, ``size`` indexed children.

The parent never runs. Its children are made lazily (the pipelines service
materialises them as room opens, at most FEED_WINDOW a call), at most
``window`` of them open (made and not ended) at once: ``max_parallel`` when
given, else :data:`FEED_WINDOW`.
Each child is an ordinary job (its own retries, quotas, fair share), whose
id is fixed by its parent and index (``ids.child_job_id``), so making one
twice is impossible, and whose spec is the parent's for its index
(domain/spec.py ``JobSpec.child``).

The parent counts its children in five counters, each written in the same
transaction as the child's transition that moves it: ``materialized``,
``placed`` (SCHEDULED or RUNNING now), ``succeeded``, ``failed`` and
``cancelled``. Pure: no AWS here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .states import JobState

MAX_SIZE = 10_000
#: open children of an array without max_parallel; children made per call
FEED_WINDOW = 500
#: children made per transaction (with the parent's counter: 100 items)
FEED_BATCH = 99
#: children its create makes (the rest follow as indexes end, and the
#: reconciler's sweep each minute): a create stays one small transaction more
FIRST_BATCH = 8
#: what every child is told, besides the parent's env
INDEX_ENV = "GPUJOBS_ARRAY_INDEX"
SIZE_ENV = "GPUJOBS_ARRAY_SIZE"
#: the counters of a parent, as the job item stores them
COUNTERS = ("materialized", "placed", "succeeded", "failed", "cancelled")
#: the counter a child's terminal state moves
ENDED_COUNTER = {JobState.SUCCEEDED: "succeeded", JobState.FAILED: "failed",
                 JobState.CANCELLED: "cancelled"}


@dataclass(frozen=True)
class ArraySpec:
    """A spec's ``array`` (domain/spec.py)."""
    size: int
    max_parallel: int | None = None
    max_failed_indexes: int | None = None
    #: env values by index: each holds ``size`` values, index i gets the i-th
    env: Mapping[str, tuple[str, ...]] | None = None

    @property
    def window(self) -> int:
        """How many children may be open at once: max_parallel, else FEED_WINDOW."""
        return min(self.max_parallel or FEED_WINDOW, self.size)


@dataclass(frozen=True)
class Counts:
    materialized: int = 0
    placed: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0

    @classmethod
    def of(cls, values: Mapping[str, int | None]) -> "Counts":
        return cls(**{k: int(values.get(k) or 0) for k in COUNTERS})

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def open(self) -> int:
        """Children made and not ended."""
        return self.materialized - self.ended

    def by_state(self, size: int) -> dict[str, int]:
        """The indexes by state: PENDING (not made yet, or waiting to be
        placed), RUNNING (SCHEDULED or RUNNING), and the three ends."""
        return {"PENDING": size - self.placed - self.ended, "RUNNING": self.placed,
                "SUCCEEDED": self.succeeded, "FAILED": self.failed,
                "CANCELLED": self.cancelled}


def failing(a: ArraySpec, c: Counts) -> bool:
    """More indexes failed than max_failed_indexes allows: the array fails fast."""
    return a.max_failed_indexes is not None and c.failed > a.max_failed_indexes


def stopping(a: ArraySpec, c: Counts, cancel_requested: bool) -> bool:
    """No more children are made: cancelled, or failing fast."""
    return cancel_requested or failing(a, c)


def to_make(a: ArraySpec, c: Counts, cancel_requested: bool) -> range:
    """The indexes to make now: up to the window, in index order."""
    if stopping(a, c, cancel_requested):
        return range(0)
    n = max(0, min(a.window - c.open, a.size - c.materialized))
    return range(c.materialized, c.materialized + n)


def done(a: ArraySpec, c: Counts, cancel_requested: bool) -> bool:
    """Every index has ended, or none will run any more and none is open."""
    if c.open:
        return False
    return c.materialized >= a.size or stopping(a, c, cancel_requested)


def final(a: ArraySpec, c: Counts, cancel_requested: bool) -> tuple[JobState, dict | None]:
    """The parent's end once :func:`done`, and its exit (None: succeeded).
    Indexes never made are counted as cancelled."""
    never = a.size - c.materialized
    if cancel_requested:
        return JobState.CANCELLED, {"reason": "cancelled", "exit_code": None,
                                    "detail": _tally(a, c, never)}
    if failing(a, c):
        return JobState.FAILED, {
            "reason": "max_failed_indexes", "exit_code": None,
            "detail": f"{c.failed} indexes failed, more than max_failed_indexes "
                      f"{a.max_failed_indexes}; {_tally(a, c, never)}"}
    if c.failed or c.cancelled:
        return JobState.FAILED, {"reason": "array_failed", "exit_code": None,
                                 "detail": _tally(a, c, never)}
    return JobState.SUCCEEDED, None


def _tally(a: ArraySpec, c: Counts, never: int) -> str:
    parts = [f"{c.succeeded} of {a.size} indexes succeeded"]
    if c.failed:
        parts.append(f"{c.failed} failed")
    if c.cancelled or never:
        parts.append(f"{c.cancelled + never} cancelled"
                     + (f" ({never} never started)" if never else ""))
    return ", ".join(parts)


def child_name(name: str | None, index: int) -> str | None:
    return None if name is None else f"{name}[{index}]"
