"""An attempt: one placement of a job, and what its ranks have reported.

Per-rank progress only ever grows, so repeated or reordered reports cannot
undo each other: it is worked out (:func:`reported`) from the attempt's rank
events, one per node report, each stored once under a key that names the
report (domain/events.py), with its ranks as runs. An attempt's record thus
grows with its reports, not its ranks: a 65,536-rank attempt on 64 nodes
holds a few hundred runs, not four sets of 65,536 numbers (over DynamoDB's
400 KB). What the job does next follows from that progress alone
(:func:`outcome`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable

from .states import Event

#: the exit code recorded for ranks lost with their node (outside any real
#: exit status, which agents report within -255..255)
LOST = -1000
#: the exit code recorded for ranks their agent did not start because the
#: attempt's rendezvous port (MASTER_PORT) was held on the node of rank 0
#: (an EXITED report with ``not_started: port_in_use``): a cause outside the job
PORT_TAKEN = -1001


def rank_runs(ranks: Iterable[int]) -> list[list[int]]:
    """``[[0, 3], [7, 7]]`` for 0, 1, 2, 3, 7: a node's ranks as stored (a
    65,536-rank job's placement is a few KB of runs, not 450 KB of numbers)."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return runs


def from_runs(runs: Iterable) -> list[int]:
    """The ranks of :func:`rank_runs`' runs (a plain rank among them, as
    items written before runs hold, is itself)."""
    out: list[int] = []
    for run in runs:
        if isinstance(run, list):
            out.extend(range(int(run[0]), int(run[1]) + 1))
        else:
            out.append(int(run))
    return out


#: a rank event's type -> the progress it adds to
RANK_EVENTS = {"rank_started": "started", "rank_exited": "exited", "rank_stopped": "stopped"}


def reported(events: Iterable[dict]) -> dict:
    """``started``, ``exited``, ``stopped`` (sets of ranks) and ``exit_codes``
    (rank -> code) of an attempt's rank events. A rank reported exited twice
    keeps its later code, and of two at the same millisecond its real code
    over :data:`LOST` (its agent's word over the reconciler's guess)."""
    out: dict = {"started": set(), "exited": set(), "stopped": set(), "exit_codes": {}}
    exits = []
    for e in events:
        kind = RANK_EVENTS.get(e.get("type", ""))
        if kind is None:
            continue
        ranks = from_runs(e.get("ranks") or ())
        out[kind].update(ranks)
        if kind == "exited" and e.get("exit_code") is not None:  # EXITED needs one (the API)
            code = int(e["exit_code"])
            exits.append((e["time"], code != LOST, code, ranks))
    for _, _, code, ranks in sorted(exits, key=lambda x: x[:2]):
        out["exit_codes"].update(dict.fromkeys(ranks, code))
    return out


def placement_of(node_ranks: dict[str, list[int]]) -> list[dict]:
    """``[{"rank", "node_id"}, ...]`` by rank: where each rank runs."""
    return sorted(({"rank": r, "node_id": n} for n, rs in node_ranks.items() for r in rs),
                  key=lambda p: p["rank"])


@dataclass
class Attempt:
    job_id: str
    attempt: int
    state: str
    placement: list[dict]
    node_ranks: dict[str, list[int]]
    node_gpus: dict[str, int]
    world_size: int
    created_at: datetime
    finished_at: datetime | None = None
    exit: dict | None = None
    started: set[int] = field(default_factory=set)
    exited: set[int] = field(default_factory=set)
    stopped: set[int] = field(default_factory=set)
    exit_codes: dict[int, int] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    #: node id -> GPU type (attempts placed before it was recorded: empty)
    node_types: dict[str, str] = field(default_factory=dict)

    def ranks_on(self, node_id: str) -> list[int]:
        return self.node_ranks.get(node_id, [])

    def rank_nodes(self) -> dict[int, str]:
        """rank -> the node it runs on: ``node_ranks`` the other way round."""
        return {r: n for n, rs in self.node_ranks.items() for r in rs}

    @property
    def done(self) -> set[int]:
        return self.exited | self.stopped

    def node_done(self, node_id: str) -> bool:
        return set(self.ranks_on(node_id)) <= self.done

    def node_confirmed(self, node_id: str) -> bool:
        """Every rank on the node is known gone: stopped, or exited as its agent
        reported. A rank lost with its node (exit code LOST) is done for the
        job, but may still run there: only its agent's word that it is gone
        (STOPPED, or an EXITED with its real code) confirms it."""
        return all(r in self.stopped or (r in self.exited and self.exit_codes.get(r) != LOST)
                   for r in self.ranks_on(node_id))

    def still_stopping(self) -> list[str]:
        """The nodes whose ranks of this (ended) attempt may still run and
        will be confirmed gone (their GPUs not released yet): the job's next
        attempt waits for them, so two attempts never overlap (they would
        share its checkpoint directory, and a preempted rank still saving
        there would be overwritten or not yet read). Nodes whose ranks were
        all lost with the node are not waited for: a cut-off node may never
        answer."""
        return sorted(n for n, ranks in self.node_ranks.items()
                      if n not in self.released
                      and not all(self.exit_codes.get(r) == LOST for r in ranks))

    @property
    def all_done(self) -> bool:
        return len(self.done) >= self.world_size

    def first_failure(self) -> tuple[int, int] | None:
        """(rank, exit code) of the lowest failed rank, if any failed."""
        failed = sorted((r, c) for r, c in self.exit_codes.items() if c != 0)
        return failed[0] if failed else None


def outcome(attempt: Attempt, *, cancel_requested: bool) -> Event | None:
    """What the reports so far mean for the job, or None while it runs on.

    A requested cancel wins over exit codes (a rank killed by the cancel may
    exit non-zero) and completes when every rank is accounted for. Otherwise
    the first failure ends the attempt at once, and the rest are stopped:
    RANK_FAILED, which the job's retry rules (domain/retry.py) may turn into
    a RETRY.
    """
    if cancel_requested:
        return Event.STOPPED if attempt.all_done else None
    if attempt.first_failure() is not None:
        return Event.RANK_FAILED
    if len(attempt.exited) >= attempt.world_size:
        return Event.ALL_EXITED_OK
    return None


def exit_info(attempt: Attempt, event: Event) -> dict:
    if event is Event.ALL_EXITED_OK:
        return {"reason": "succeeded", "exit_code": 0}
    if event is Event.STOPPED:
        return {"reason": "cancelled", "exit_code": None}
    rank, code = attempt.first_failure() or (None, None)
    node = attempt.rank_nodes().get(rank) if rank is not None else None
    if code == LOST:
        return {"reason": "node_lost", "exit_code": None, "rank": rank, "node_id": node}
    if code == PORT_TAKEN:
        return {"reason": "port_in_use", "exit_code": None, "rank": rank, "node_id": node}
    return {"reason": "rank_failed", "exit_code": code, "rank": rank, "node_id": node}
