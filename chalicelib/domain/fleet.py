"""The registered fleet per GPU type, parking of jobs that can never fit it,
and the capacity summary that lets jobs that merely wait skip a run.

A job that can never fit the fleet as registered (placement.never_fits) is
*parked*: moved out of the PENDING partition the placer reads each run, with the
fleet *generation* it was judged against. Every change of a type's registered
GPUs or largest node bumps that type's generation and the generation of ``*``
(all types); the placer judges a changed type's parked jobs again once, then
records the generation as swept. So a run reads the jobs that could fit, not
the ones that never can. Pure: no AWS here.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

ALL_TYPES = "*"
#: the fleet table's item of the placer's line (domain/queue.py), beside the
#: types' summaries: no node's GPU type has a "#"
LINE_KEY = "#line"
#: a sweep only counts as complete this long after the change it answers:
#: a job parked just before the change may take that long to appear in the
#: (eventually consistent) index the sweep reads
SETTLE_S = 10.0


@dataclass(frozen=True)
class Fleet:
    #: a GPU type, or ALL_TYPES
    key: str
    gpus: int = 0
    largest_node: int = 0
    generation: int = 0
    swept_generation: int = 0
    changed_at: datetime | None = None
    #: the capacity summary (placement.still_waiting): moves whenever room may
    #: have appeared for the type (GPUs released, a node registered, grown or
    #: back from DOWN), in the same transactions; and when it last moved
    room_version: int = 0
    room_at: datetime | None = None

    @property
    def unswept(self) -> bool:
        return self.generation != self.swept_generation

    def settled(self, now: datetime, settle_s: float = SETTLE_S) -> bool:
        """True when no job parked before the last change can still be unseen."""
        return self.changed_at is None or (now - self.changed_at).total_seconds() >= settle_s


def fleet_key(gpu_type: str | None) -> str:
    return gpu_type or ALL_TYPES


def room_types(gpu_type: str | None) -> list[str]:
    """The fleets that room on a node of ``gpu_type`` concerns: its type's and
    every type's."""
    return [gpu_type, ALL_TYPES] if gpu_type and gpu_type != ALL_TYPES else [ALL_TYPES]


def parked_partition(gpu_type: str | None) -> str:
    """The by_active_state partition of parked jobs of a type (``*``: any type)."""
    return f"PARKED#{fleet_key(gpu_type)}"
