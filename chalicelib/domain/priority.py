"""Priority classes and preemption (issue 28): pure rules, no AWS.

The operator configures the classes (GPUJOBS_PRIORITY_CLASSES, JSON:
``{"urgent": {"value": 1000, "preempts": true, "tenants": ["acme"]},
"batch": {"value": -100}}``; ``tenants``, when given, are the only ones that
may submit to the class: who may preempt is the operator's choice);
a job names one in ``priority_class`` (default :data:`DEFAULT_CLASS`, value
0, which preempts nothing unless configured to). The placer tries higher
classes first, each class fairly between tenants; a tenant's own
``priority`` orders its jobs within a class.

A job of a class that ``preempts`` and does not fit takes GPUs from running
jobs of strictly lower classes, chosen as Kueue chooses
(:func:`choose_victims`):

1. lowest class first;
2. among equals, one that frees the fewest GPUs beyond what is needed, then
   the most recently started (the least work lost);
3. only jobs that have run at least ``min_runtime_s`` (no thrash: a job
   requeued by a preemption is not preempted again before it made progress);
4. only if the job then fits: the victims' GPUs plus what is free must hold
   its gang (``placement.plan``); never a preemption that would not help;
5. then victims that turn out not to be needed are given back (the set is
   minimal: removing any one leaves the job unplaceable), so no more GPUs
   are freed than needed.

A preempted job's attempt ends with reason ``preempted`` (retried without
counting by default, domain/retry.py) and its ranks get SIGTERM and their
grace period, so they can checkpoint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Mapping, Sequence

DEFAULT_CLASS = "default"
#: a job preempted for another may not be preempted again before this
DEFAULT_MIN_RUNTIME_S = 300.0
#: a preemption recorded on a job this long ago without it being placed is
#: stale: its victims stopped and the GPUs went elsewhere; it may preempt again
PREEMPTION_STALE_S = 600.0
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    preempts: bool = False
    #: the tenants that may use it; None: every tenant
    tenants: frozenset[str] | None = None

    def allows(self, tenant: str) -> bool:
        return self.tenants is None or tenant in self.tenants


@dataclass(frozen=True)
class PriorityClasses:
    by_name: Mapping[str, PriorityClass]

    def of(self, name: str | None) -> PriorityClass:
        """The class a spec names (absent: the default); KeyError if unknown."""
        return self.by_name[name or DEFAULT_CLASS]

    def value_of(self, name: str | None) -> int:
        """The value of the class a job names; an unknown name (a class removed
        since) is the default's, so nothing already queued is stranded."""
        cls = self.by_name.get(name or DEFAULT_CLASS)
        return (cls or self.by_name[DEFAULT_CLASS]).value

    def names(self) -> list[str]:
        return sorted(self.by_name, key=lambda n: (-self.by_name[n].value, n))

    @classmethod
    def parse(cls, raw: str | None) -> "PriorityClasses":
        """From GPUJOBS_PRIORITY_CLASSES; raises ValueError naming what is wrong."""
        classes = {DEFAULT_CLASS: PriorityClass(DEFAULT_CLASS, 0)}
        if not raw:
            return cls(classes)
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"GPUJOBS_PRIORITY_CLASSES is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError("GPUJOBS_PRIORITY_CLASSES maps class names to objects")
        for name, c in data.items():
            if not isinstance(name, str) or not 1 <= len(name) <= 64 \
                    or not set(name) <= _NAME_CHARS:
                raise ValueError(f"GPUJOBS_PRIORITY_CLASSES: {name!r} is not a class name "
                                 "(1 to 64 of [A-Za-z0-9._-])")
            if not isinstance(c, dict) or set(c) - {"value", "preempts", "tenants"}:
                raise ValueError(f"GPUJOBS_PRIORITY_CLASSES: {name} takes value, preempts "
                                 "and tenants")
            value, preempts, tenants = c.get("value", 0), c.get("preempts", False), \
                c.get("tenants")
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not -1_000_000 <= value <= 1_000_000:
                raise ValueError(f"GPUJOBS_PRIORITY_CLASSES: {name}.value must be an integer "
                                 "in -1000000..1000000")
            if not isinstance(preempts, bool):
                raise ValueError(f"GPUJOBS_PRIORITY_CLASSES: {name}.preempts must be true "
                                 "or false")
            if tenants is not None and (not isinstance(tenants, list) or not all(
                    isinstance(t, str) and t for t in tenants)):
                raise ValueError(f"GPUJOBS_PRIORITY_CLASSES: {name}.tenants must be a list "
                                 "of tenant names")
            classes[name] = PriorityClass(name, value, preempts,
                                          None if tenants is None else frozenset(tenants))
        return cls(classes)


NO_CLASSES = PriorityClasses({DEFAULT_CLASS: PriorityClass(DEFAULT_CLASS, 0)})


@dataclass(frozen=True)
class Victim:
    """A running job that could make room: its class value, when it started,
    and the GPUs its attempt holds on each node."""
    job_id: str
    class_value: int
    started_at: datetime
    gpus_by_node: Mapping[str, int]
    #: the GPU types of those nodes ("" where unrecorded)
    node_types: frozenset[str] = frozenset()

    @property
    def gpus(self) -> int:
        return sum(self.gpus_by_node.values())


def eligible(victims: Sequence[Victim], class_value: int, now: datetime,
             min_runtime_s: float) -> list[Victim]:
    """Those of strictly lower class that ran long enough, in preemption
    order: lowest class first, then the most recently started."""
    ok = [v for v in victims if v.class_value < class_value
          and (now - v.started_at).total_seconds() >= min_runtime_s]
    return sorted(ok, key=lambda v: (v.class_value, -v.started_at.timestamp(), v.job_id))


def choose_victims(candidates: Sequence[Victim], free: Mapping[str, int],
                   fits: Callable[[Mapping[str, int]], bool]) -> list[Victim] | None:
    """The victims to preempt so that ``fits(free GPUs by node)`` holds, or
    None when even all of them would not make room. ``free`` is what the
    candidate nodes have free now; ``candidates`` come in :func:`eligible`'s
    order (lowest class, then the most recently started).

    Class by class from the lowest: if one victim of the class completes the
    room, the one freeing the fewest GPUs (then the most recently started);
    else the class's most recently started, and on. Last, victims not needed
    are given back, the most valuable first, so the set is minimal."""
    def room(chosen: Sequence[Victim]) -> dict[str, int]:
        out = dict(free)
        for v in chosen:
            for node, g in v.gpus_by_node.items():
                out[node] = out.get(node, 0) + g
        return out

    chosen: list[Victim] = []
    left = list(candidates)
    while left:
        lowest = left[0].class_value
        same = [v for v in left if v.class_value == lowest]
        completing = [v for v in same if fits(room([*chosen, v]))]
        if completing:
            # fewest GPUs freed beyond the need; then the order given (newest)
            pick = min(completing, key=lambda v: (v.gpus, same.index(v)))
            chosen.append(pick)
            break
        chosen.append(same[0])
        left.remove(same[0])
    else:
        return None
    for v in reversed(list(chosen)):
        rest = [c for c in chosen if c is not v]
        if rest and fits(room(rest)):
            chosen = rest
    return chosen
