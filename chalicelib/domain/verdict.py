"""The one answer to "which rank stopped": the verdict every surface shows.

When ranks of a job stall, the scan names one rank (or says that it cannot)
from the strongest evidence it has, in this order:

1. ``process``, state ``T``: a rank whose own process is stopped (SIGSTOP, a
   debugger) while its peers wait. Nothing else looks like that.
2. ``collective``: with collective-arrival marks (``instrument()`` in the
   training script, DDP's gradient buckets included), the collective the
   ranks wait in is the highest any live rank arrived at; the culprit is a
   rank that never arrived at it.
3. ``stack``: with the ranks' sampled Python stacks (domain/stacks.py), the
   quiet rank that is not inside a collective while its peers are.
4. ``process``, signature: the quiet rank whose process looks unlike its
   waiting peers' (asleep on a timer while they sleep on a futex, in a
   filesystem's D state, spinning while gloo peers sleep).
5. ``silence``: the order of the ranks' last beats. Inside one jitter band
   that order is noise: ranks that went quiet together are reported as a
   tie (``rank`` None) rather than naming the lowest of them.

The verdict is a plain JSON object (``health.verdict``, the ``Verdict``
schema of docs/openapi.yaml); ``text`` is the sentence people read.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from . import stacks
from .attempts import rank_runs
from .clock import iso

if TYPE_CHECKING:  # the judgement's own types; imported by stall.py at run time
    from .stall import RankView

#: ranks that are no rival for the first stop: gone, or declared paused
OUT = ("exited", "stopped", "paused")
#: how sure each kind of evidence is
CONFIDENCE = ("certain", "high", "medium", "low")
_NEVER = datetime.min.replace(tzinfo=timezone.utc)
#: the most ranks a verdict or a health record lists by number (its counts
#: say how many there are; GET /ranks lists every one): a record stays a few
#: KB at 65,536 ranks, far under DynamoDB's 400 KB item
MAX_LISTED = 64
#: the most runs a sentence names before it counts the rest
MAX_RUNS = 8


def span(ranks: list[int], max_runs: int = MAX_RUNS) -> str:
    """``0-3,7`` for [0, 1, 2, 3, 7]; past ``max_runs`` runs, the rest counted:
    ``0,2,4,6,8,10,12,14 and 32,760 more``."""
    runs = rank_runs(ranks)
    shown = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs[:max_runs])
    rest = sum(b - a + 1 for a, b in runs[max_runs:])
    return f"{shown} and {rest:,} more" if rest else shown


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {span(ranks)}"


def _made(c: RankView, by: str, confidence: str, text: str, **evidence: Any) -> dict:
    return {"rank": c.rank, "ranks": [c.rank], "ranks_count": 1, "node_id": c.node_id, "by": by,
            "confidence": confidence, "text": text, "stack": stacks.where(_stack(c)),
            "evidence": {**evidence, "beat_at": c.beat_at and iso(c.beat_at),
                         "receive_time": c.last_heard_at and iso(c.last_heard_at)}}


def by_exit(rank: int, exit_code: int | None, node_id: str | None) -> dict:
    """The verdict of an attempt a rank's failure ended."""
    on = f" on {node_id}" if node_id else ""
    return {"rank": rank, "ranks": [rank], "ranks_count": 1, "node_id": node_id, "by": "exit",
            "confidence": "certain", "text": f"rank {rank}{on} exited with code {exit_code}",
            "stack": None, "stacks": [], "evidence": {"exit_code": exit_code}}


def _sample(r: RankView) -> dict:
    """The rank's latest process sample ({} without one)."""
    return (r.beat.proc if r.beat is not None else None) or {}


def _stack(r: RankView) -> dict | None:
    return _sample(r).get("stack")


def _state(r: RankView) -> str | None:
    return _sample(r).get("state")


def _arrived(r: RankView) -> int:
    return -1 if r.beat is None or r.beat.arrived_seq is None else r.beat.arrived_seq


def _last(r: RankView) -> datetime:
    return r.beat_at or r.last_heard_at or _NEVER


#: how many quiet ranks' stacks a verdict keeps (the named rank's first)
MAX_STACKS = 16


def decide(ranks: list[RankView], first: RankView, co_first: list[RankView], *,
           band_s: float, signature) -> dict:
    """The verdict (see :func:`_decide`), with the stacks of the quiet ranks
    as they were when it was reached (``[{rank, where}]``, the named ranks'
    first, at most :data:`MAX_STACKS`): what the stall event shows under it."""
    named = _decide(ranks, first, co_first, band_s=band_s, signature=signature)
    quiet = sorted((r for r in ranks if r.status not in OUT and _stack(r) is not None),
                   key=lambda r: (r.rank not in named["ranks"], r.rank))
    named["stacks"] = [{"rank": r.rank, "where": stacks.where(_stack(r))}
                       for r in quiet[:MAX_STACKS]]
    return named


def _decide(ranks: list[RankView], first: RankView, co_first: list[RankView], *,
            band_s: float, signature) -> dict:
    """The verdict on a stall whose silence order starts with ``first``
    (``co_first``: its rivals by silence: ranks whose last beat came no
    later than its own, within ``band_s``, the band inside which the order of
    last beats is noise). ``signature``: stall.signature, what a rank's
    process sample looks like."""
    live = [r for r in ranks if r.status not in OUT]
    quiet = [r for r in live if r.status in ("stalled", "silent", "waiting", "not_instrumented",
                                              "awaiting_first_beat")]

    stopped = sorted((r for r in quiet if _state(r) in ("T", "t")), key=lambda r: (_last(r), r.rank))
    if stopped and len(stopped) < len(live):
        c = stopped[0]
        return _made(c, "process", "high",
                     f"rank {c.rank} on {c.node_id} is stopped (state T) while "
                     f"{_ranks([r.rank for r in live if r is not c])} wait",
                     state="T", signature="stopped")

    marked = [r for r in live if _arrived(r) >= 0]
    if marked:
        top = max(marked, key=lambda r: (_arrived(r), r.rank))
        seq = _arrived(top)
        missing = sorted((r for r in live if _arrived(r) < seq),
                         key=lambda r: (_arrived(r), _last(r), r.rank))
        if missing:
            c = missing[0]
            name = (top.beat and top.beat.arrived_name) or "collective"
            at = [r.rank for r in live if _arrived(r) >= seq]
            return _made(c, "collective", "high",
                         f"rank {c.rank} on {c.node_id} never reached {name} #{seq}, "
                         f"where {_ranks(at)} wait",
                         collective={"seq": seq, "name": name, "waiting": len(at),
                                     "missing": [r.rank for r in missing[:16]]},
                         arrived_seq=None if _arrived(c) < 0 else _arrived(c))

    sampled = [(r, stacks.waiting_in(_stack(r))) for r in quiet if _stack(r) is not None]
    waiting = [(r, w) for r, w in sampled if w is not None]
    loose = sorted((r for r, w in sampled if w is None), key=lambda r: (_last(r), r.rank))
    if waiting and loose:
        c = loose[0]
        kinds = sorted({w for _, w in waiting})
        return _made(c, "stack", "high" if len(loose) == 1 else "medium",
                     f"rank {c.rank} on {c.node_id} is not in a collective "
                     f"({stacks.where(_stack(c))}) while {_ranks([r.rank for r, _ in waiting])} "
                     f"wait in {', '.join(kinds)}",
                     waiting_in=kinds, waiting=[r.rank for r, _ in waiting][:16])

    # ranks never heard from (an uninstrumented job) are ordered by nothing
    pool = ([first, *co_first] if first.last_heard_at is not None
            else [r for r in quiet if r.stalled and r.last_heard_at is None])
    odd = _odd_one_out(quiet, pool, signature)
    if odd is not None:
        c, peers = odd
        mine = _look(c, signature)
        return _made(c, "process", "medium",
                     f"rank {c.rank} on {c.node_id} looks unlike its peers: {mine} "
                     f"while they are {peers}",
                     signature=mine, peers=peers, state=_state(c), cpu=_sample(c).get("cpu"))

    ordered = sorted(pool, key=lambda r: (_last(r), r.rank))
    c = ordered[0]
    tied = [r for r in ordered if (_last(r) - _last(c)).total_seconds() <= band_s]
    steps = sorted({r.step for r in tied if r.step is not None})
    behind = [r for r in tied if steps and r.step == steps[0]]
    if len(tied) > 1 and len(steps) > 1 and len(behind) == 1:
        c = behind[0]  # the same moment, but a step behind the others
        return _made(c, "silence", "medium",
                     f"rank {c.rank} on {c.node_id} went quiet a step behind "
                     f"{_ranks([r.rank for r in tied if r is not c])}", band_s=round(band_s, 3))
    if len(tied) > 1:
        ranks_ = sorted(r.rank for r in tied)
        within = f" (within {band_s:.1f} s)" if c.last_heard_at is not None else ""
        return {"rank": None, "ranks": ranks_[:MAX_LISTED], "ranks_count": len(ranks_),
                "node_id": None, "by": "silence",
                "confidence": "low",
                "text": (f"ranks {span(ranks_)} went quiet together{within}: "
                         "nothing tells which stopped first"),
                "stack": None, "evidence": {"band_s": round(band_s, 3)}}
    return _made(c, "silence", "medium", f"rank {c.rank} on {c.node_id} went quiet first",
                 band_s=round(band_s, 3))


def _look(r: RankView, signature) -> str | None:
    """What a rank's process looks like: its signature, and for a sleeping one
    what it sleeps on, when the agent could read its wait channel."""
    sig = signature(_sample(r) or None)
    wchan = _sample(r).get("wchan")
    if sig == "sleeping" and wchan and wchan != "0":
        return f"sleeping in {wchan}"
    return sig


def _odd_one_out(quiet: list[RankView], pool: list[RankView], signature) -> tuple | None:
    """Among ranks that heartbeats cannot order (they stopped in the same
    step), the one whose processes look unlike the ranks waiting for it.

    Ranks blocked in a collective all look alike: spinning (NCCL: the host
    thread waits on the GPU, a core at 100 %) or sleeping on a futex (gloo: a
    blocking receive). The rank that hung first is often doing something
    else: asleep on a timer or a lock while its peers wait on the network, in
    a filesystem's D state, or spinning in its own loop while gloo peers
    sleep. The peers' look is the strict majority of the job's quiet ranks
    (at least two); a candidate that looks otherwise is named, the earliest
    last beat first. When the culprit looks like its peers (a GPU hang spins
    like an NCCL wait) this says nothing.
    """
    if len(pool) < 2:
        return None
    looks = [_look(r, signature) for r in quiet]
    counts: dict[str, int] = {}
    for lk in looks:
        if lk is not None:
            counts[lk] = counts.get(lk, 0) + 1
    if not counts:
        return None
    peers, n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    if n < 2 or 2 * n <= sum(counts.values()):
        return None
    odd = [r for r in pool if _look(r, signature) not in (None, peers)]
    if not odd or len(odd) == len(pool):
        return None
    return min(odd, key=lambda r: (_last(r), r.rank)), peers
