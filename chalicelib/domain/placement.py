"""Gang placement as pure functions: which ranks go to which node.

All ranks of a job are placed at once or not at all. Nodes arrive most-free
first, and ranks fill them in order (ranks 0..k-1 on the first node, and so on),
so a gang spans as few nodes as possible and neighbouring ranks share a host.
Candidates are consumed lazily: planning stops reading nodes once the gang fits.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generator, Iterable

from .attempts import placement_of
from .clock import iso, parse_iso

# the attempt's rendezvous port is part of the wire schema (the agent's default too)
from .wire import new_master_port as new_master_port

#: TransactWriteItems holds 100 items: the job, its attempt, its LAUNCH intent,
#: one capacity update per node, and the tenant's PENDING count
MAX_NODES_PER_GANG = 96
#: priorities lie in [-PRIORITY_RANGE, PRIORITY_RANGE]
PRIORITY_RANGE = 1_000_000


@dataclass(frozen=True)
class Candidate:
    node_id: str
    gpus_free: int


@dataclass(frozen=True)
class Plan:
    #: node id -> the global ranks it runs
    ranks_by_node: dict[str, list[int]]
    gpus_per_rank: int

    def gpus_by_node(self) -> dict[str, int]:
        return {n: len(r) * self.gpus_per_rank for n, r in self.ranks_by_node.items()}

    def placement(self) -> list[dict]:
        return placement_of(self.ranks_by_node)


def plan(ranks: int, gpus_per_rank: int, candidates: Iterable[Candidate]) -> Plan | None:
    """A placement of every rank, or None if these candidates cannot hold the gang."""
    by_node: dict[str, list[int]] = {}
    next_rank = 0
    for c in candidates:
        fits = min(c.gpus_free // gpus_per_rank, ranks - next_rank)
        if fits <= 0 or c.node_id in by_node:
            continue
        if len(by_node) == MAX_NODES_PER_GANG:
            return None
        by_node[c.node_id] = list(range(next_rank, next_rank + fits))
        next_rank += fits
        if next_rank == ranks:
            return Plan(by_node, gpus_per_rank)
    return None


def never_fits(ranks: int, gpus_per_rank: int, fleet_gpus: int, largest_node: int,
               gpu_type: str | None) -> str | None:
    """Why the fleet as registered could never hold this job, or None."""
    kind = f"{gpu_type} " if gpu_type else ""
    if gpus_per_rank > largest_node:
        return (f"each rank needs {gpus_per_rank} GPUs on one node; the largest "
                f"{kind}node has {largest_node}")
    if ranks * gpus_per_rank > fleet_gpus:
        return (f"needs {ranks * gpus_per_rank} {kind}GPUs; the fleet has {fleet_gpus}")
    per_node = largest_node // gpus_per_rank
    if -(-ranks // per_node) > MAX_NODES_PER_GANG:
        return f"would span more than {MAX_NODES_PER_GANG} nodes"
    return None


def queue_key(priority: int, job_id: str) -> str:
    """Sorts PENDING jobs by priority (higher first), then age (older first)."""
    return f"{PRIORITY_RANGE - priority:08d}#{job_id}"


# -- fairness between tenants (docs/security.md, "Placement") ---------------------
def fair_order(queues: dict[str, list], usage: dict[str, int],
               size, weight=lambda tenant: 1.0) -> Generator[Any, int | None, None]:
    """The order in which one placement run tries jobs: max-min fair share of GPUs
    between tenants (dominant resource fairness with the GPU as the one resource,
    admitting by the share *after* admission, as Kueue's fair sharing does),
    each tenant's share divided by its ``weight`` (2: entitled to twice as much).

    ``queues`` holds each tenant's jobs in its own order (its ``priority``, then
    age): priority orders a tenant's own jobs only. Each step takes the head job of
    the tenant whose GPUs in use plus that job's size is smallest (ties: fewer
    GPUs in use, then tenant name), so a tenant with huge or many jobs at the
    highest priority cannot keep a lighter tenant's small job waiting. The
    caller sends back, after each job, how many GPUs it placed (0: it did not
    fit now), and usage grows by that much.
    """
    heads = {t: 0 for t, q in queues.items() if q}
    used = {t: usage.get(t, 0) for t in heads}
    while heads:
        tenant = min(heads, key=lambda t: ((used[t] + size(queues[t][heads[t]])) / weight(t),
                                           used[t] / weight(t), t))
        i = heads[tenant]
        placed = yield queues[tenant][i]
        used[tenant] += placed or 0
        if i + 1 < len(queues[tenant]):
            heads[tenant] = i + 1
        else:
            del heads[tenant]


def class_order(queues: dict[str, list], usage: dict[str, int], size,
                class_of, weight=lambda tenant: 1.0) -> Generator[Any, int | None, None]:
    """:func:`fair_order` class by class, higher ``class_of(job)`` first
    (domain/priority.py): a higher class's jobs are all tried before a lower
    one's, and within a class the tenants share fairly, counting the GPUs
    each was given in the classes before. Sent the GPUs placed, as fair_order."""
    by_class: dict[int, dict[str, list]] = {}
    for tenant, jobs in queues.items():
        for job in jobs:
            by_class.setdefault(class_of(job), {}).setdefault(tenant, []).append(job)
    used = dict(usage)
    for value in sorted(by_class, reverse=True):
        tenant_of = {id(j): t for t, jobs in by_class[value].items() for j in jobs}
        inner = fair_order(by_class[value], dict(used), size, weight)
        placed: int | None = None
        while True:
            try:
                job = inner.send(placed)
            except StopIteration:
                break
            placed = yield job
            tenant = tenant_of[id(job)]
            used[tenant] = used.get(tenant, 0) + (placed or 0)


# -- waiting without rereading the fleet ----------------------------------------------
#: a waiting job is tried against the nodes at least this often, whatever its
#: type's capacity summary says (a bound on any room the summary missed)
RECHECK_S = 300.0
#: the READY-node index may trail its table by about this much: a job judged
#: against nodes read sooner than this after room appeared is tried again
INDEX_LAG_S = 10.0


def waiting_mark(room_version: int, room_at: datetime | None, now: datetime) -> str | None:
    """The note that a job found no room with the summary at ``room_version``,
    or None when the summary moved too recently for the node read to be trusted."""
    if room_at is not None and (now - room_at).total_seconds() < INDEX_LAG_S:
        return None
    return f"{room_version}@{iso(now)}"


def still_waiting(mark: str | None, room_version: int, now: datetime) -> bool:
    """True while nothing can have made room since ``mark`` was noted: the job
    is skipped without reading a node."""
    if not mark:
        return False
    version, _, at = mark.partition("@")
    try:
        age = (now - parse_iso(at)).total_seconds()
        return int(version) == room_version and 0 <= age < RECHECK_S
    except ValueError:
        return False
