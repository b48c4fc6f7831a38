"""Where a waiting job stands: the placer's line, and a job's place in it.

Each placement run ends with the jobs it left PENDING in the order it will try
them next (placement.class_order: priority class, then fair share between
tenants, then each tenant's own priority and age), with the placed jobs that
hold GPUs and the registered GPUs of each type. That is the :class:`Line`, one
record the placer writes when it changes. Reading a job then costs one read of
the line, never a walk of the queue (:func:`standing`).

A job competes with the jobs of its GPU type and with the jobs that take any
type (``*``), and waits for the GPUs the placed jobs of those types hold: a job
that takes any type counts as wanting and holding every type, so an estimate
errs late, not early. The estimate is the end of the running jobs' time limits
(``max_runtime_s``) that frees enough GPUs for the jobs ahead and then this
one, in order of those ends; it ignores how the GPUs are spread over nodes (a
gang may need them on fewer nodes), and it is unknown when the GPUs needed are
held by jobs without a limit. Another tenant's jobs are shown by their GPUs
and times, never by id. Pure: no AWS here.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from .clock import iso, iso_or_none, parse_iso, plus
from .fleet import ALL_TYPES

#: the line keeps the first jobs of the placer's order (its record stays
#: under about 60 KB); a job further back reads as not in the line
MAX_LINE = 500
#: and the first placed jobs by their ends (those with a time limit first);
#: the GPUs of all of them are counted by type
MAX_HOLDERS = 500
#: at most this many jobs ahead, and holders waited for, are named
SHOWN = 10


@dataclass(frozen=True)
class Entry:
    """A job in the line."""

    job_id: str
    tenant: str
    gpus: int
    gpu_type: str  # a type, or ALL_TYPES


@dataclass(frozen=True)
class Holder:
    """A placed job and the GPUs it holds: its end is bounded when it has a
    time limit (``ends_by``: its start, or its placement, plus the limit)."""

    job_id: str
    tenant: str
    gpus: int
    gpu_type: str
    ends_by: datetime | None = None
    limit_s: int | None = None


@dataclass(frozen=True)
class Line:
    as_of: datetime
    entries: tuple[Entry, ...] = ()
    #: the first MAX_HOLDERS placed jobs, soonest bounded end first
    holders: tuple[Holder, ...] = ()
    #: GPUs held by every placed job, by type (ALL_TYPES: jobs of any type)
    held: tuple[tuple[str, int], ...] = ()
    #: registered GPUs by type (ALL_TYPES: every type), as the run read them
    capacity: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, as_of: datetime, entries: Iterable[Entry], holders: Iterable[Holder],
           capacity: dict[str, int]) -> "Line":
        """The line of ``entries`` (in order), the placed jobs ``holders`` and
        the registered GPUs: the first of each kept, the holders' GPUs summed."""
        everyone = sorted(holders, key=lambda h: (h.ends_by is None, h.ends_by or as_of,
                                                  h.job_id))
        held: dict[str, int] = {}
        for h in everyone:
            held[h.gpu_type] = held.get(h.gpu_type, 0) + h.gpus
        return cls(as_of, tuple(entries)[:MAX_LINE], tuple(everyone[:MAX_HOLDERS]),
                   tuple(sorted(held.items())), tuple(sorted(capacity.items())))

    def same_order(self, other: "Line | None") -> bool:
        """Does ``other`` tell the same (its time aside)? Then it need not be written."""
        return other is not None and \
            (self.entries, self.holders, self.held, self.capacity) == \
            (other.entries, other.holders, other.held, other.capacity)

    def to_json(self) -> dict:
        return {"as_of": iso(self.as_of),
                "entries": [[e.job_id, e.tenant, e.gpus, e.gpu_type] for e in self.entries],
                "holders": [[h.job_id, h.tenant, h.gpus, h.gpu_type, iso_or_none(h.ends_by),
                             h.limit_s] for h in self.holders],
                "held": dict(self.held), "capacity": dict(self.capacity)}

    @classmethod
    def from_json(cls, data: dict) -> "Line":
        return cls(parse_iso(data["as_of"]),
                   tuple(Entry(i, t, int(g), k) for i, t, g, k in data["entries"]),
                   tuple(Holder(i, t, int(g), k, parse_iso(e) if e else None,
                                None if s is None else int(s))
                         for i, t, g, k, e, s in data["holders"]),
                   tuple(sorted((k, int(v)) for k, v in data["held"].items())),
                   tuple(sorted((k, int(v)) for k, v in data["capacity"].items())))


def competes(a: str, b: str) -> bool:
    """Do jobs of GPU types ``a`` and ``b`` (ALL_TYPES: any) want the same GPUs?"""
    return a == b or ALL_TYPES in (a, b)


def holder_of(job_id: str, tenant: str, gpus: int, gpu_type: str,
              since: datetime | None, limit_s: int | None) -> Holder:
    """A placed job as a holder: bounded by its limit from ``since`` (its start,
    or its placement while it starts)."""
    ends_by = plus(since, limit_s) if since is not None and limit_s is not None else None
    return Holder(job_id, tenant, gpus, gpu_type, ends_by, limit_s)


def standing(line: Line | None, job_id: str, tenant: str, now: datetime) -> dict | None:
    """The job's place in ``line`` as the API shows it (``queue``), or None
    when the line does not hold it (not ordered by a run yet, or too far back)."""
    if line is None:
        return None
    mine = next((i for i, e in enumerate(line.entries) if e.job_id == job_id), None)
    if mine is None:
        return None
    me = line.entries[mine]
    rivals = [e for e in line.entries if competes(e.gpu_type, me.gpu_type)]
    ahead = [e for e in line.entries[:mine] if competes(e.gpu_type, me.gpu_type)]
    holders = [h for h in line.holders if competes(h.gpu_type, me.gpu_type)]
    held = sum(g for t, g in line.held if competes(t, me.gpu_type))
    free = dict(line.capacity).get(me.gpu_type, 0) - held
    start, basis = _estimate(me, ahead, holders, free, now, tenant)
    return {"position": len(ahead) + 1, "of": len(rivals),
            "gpu_type": None if me.gpu_type == ALL_TYPES else me.gpu_type,
            "ahead": [{"job_id": _shown(e.job_id, e.tenant, tenant), "gpus": e.gpus}
                      for e in ahead[-SHOWN:]],
            "waiting_for": [{"job_id": _shown(h.job_id, h.tenant, tenant), "gpus": h.gpus,
                             "ends_by": iso_or_none(h.ends_by)} for h in holders[:SHOWN]],
            "estimated_start": iso_or_none(start), "basis": basis, "as_of": iso(line.as_of)}


def _shown(job_id: str, owner: str, reader: str) -> str | None:
    return job_id if owner == reader else None


def _estimate(me: Entry, ahead: list[Entry], holders: list[Holder], free: int,
              now: datetime, reader: str) -> tuple[datetime | None, str]:
    """When enough GPUs are free for the jobs ahead and then this one, given
    ``free`` GPUs now and the holders soonest end first, and why (naming the
    job whose limit frees them if it is the reader's)."""
    need = sum(e.gpus for e in ahead) + me.gpus
    if free >= need:
        return None, ("unknown: the registered GPUs not held would be enough, but some "
                      "may be on nodes that are not READY, or spread too thin for its "
                      "ranks; its pending_reason says what holds it back")
    for h in holders:
        if h.ends_by is None:
            break  # soonest end first: the rest have no limit either
        free += h.gpus
        if free >= need:
            who = _shown(h.job_id, h.tenant, reader) or "a job of another tenant"
            if h.ends_by <= now:
                return now, f"any moment: {who} has reached its {_span(h.limit_s)} limit"
            wait = (h.ends_by - now).total_seconds()
            return h.ends_by, (f"about {_span(wait)}, when {who} reaches its "
                               f"{_span(h.limit_s)} limit")
    return None, "unknown: the GPUs it waits for are held by jobs without a time limit"


def _span(seconds: float | None) -> str:
    """``40 s``, ``4 min``, ``2 h 5 min``: a wait as people say it."""
    s = int(round(seconds or 0))
    if s < 90:
        return f"{s} s"
    minutes = (s + 30) // 60
    if minutes < 120:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m} min" if m else f"{h} h"
