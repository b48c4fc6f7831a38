"""What a host's heartbeat post costs to write on moto: the whole map against
a clause a rank.

A host whose every rank beat writes each of its items' ``ranks`` map in one
clause (adapters/heartbeat_store.py); a post that leaves a rank out sets each
record that came in a clause of its own, the form every post took before. On
moto an UpdateItem's cost grows with its clauses (its expression is parsed
and walked per clause), and that kept a 65,536-rank job on 64 nodes of 1,024
GPUs from beating on time on the local stack (tests/e2e/test_huge_hang.py).
This bench writes one host's post of ``--ranks`` ranks through the heartbeat
store on moto in-process, both ways, in interleaved rounds: every rank (the
whole map) and every rank but one an item (a clause a rank). Ends with
``beat-write-bench: ranks=.. requests=.. ms_whole=.. ms_clauses=.. ratio=..``
(medians; ``ratio`` is whole over clauses; ``--quick``, the smoke test: one
round of 64 ranks: two items, so both forms still split a post).
docs/benchmarks.md has the runs.
"""
from __future__ import annotations

import pathlib
import statistics
import sys
import time
from datetime import datetime, timezone

import _quiet  # noqa: F401 - first: no INFO logs unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402


def main() -> None:
    p = harness.parser(__doc__)
    p.add_argument("--ranks", type=int, help="the host's ranks (GPUs; 1024, --quick 64)")
    args = p.parse_args()
    args.ranks = harness.pick(args.ranks, 1024, 64, args.quick)
    rounds = 1 if args.quick else 7
    harness.banner("heartbeat write")
    harness.start_moto()
    from chalicelib.adapters.heartbeat_store import RANKS_PER_ITEM
    from chalicelib.domain.stall import Beat

    store = harness.deploy("beatwrite", install=False).heartbeats.beats
    node_of = {r: "host" for r in range(args.ranks)}
    #: a rank an item left out of the clause-a-rank post
    left_out = set(range(RANKS_PER_ITEM - 1, args.ranks, RANKS_PER_ITEM))

    def post(attempt: int, every_rank: bool) -> tuple[float, int]:
        now = datetime.now(timezone.utc)
        beats = [Beat(r, "host", heard_at=now, step=attempt) for r in range(args.ranks)
                 if every_rank or r not in left_out]
        before = len(harness.CALLS)
        began = time.perf_counter()
        store.record("bench-job", attempt, beats, now, node_of)
        return (time.perf_counter() - began) * 1000, len(harness.CALLS) - before

    ms: dict[str, list[float]] = {"whole": [], "clauses": []}
    requests: dict[str, int] = {}
    for attempt in range(1, rounds + 2):  # each round's items exist: its first write made them
        post(attempt, True)
        for name in ms:
            took, requests[name] = post(attempt, name == "whole")
            if attempt > 1:  # the first round warms the clients
                ms[name].append(took)
    ratio = harness.median_ratio(ms["whole"], ms["clauses"])
    whole, clauses = statistics.median(ms["whole"]), statistics.median(ms["clauses"])
    print(f"one host's post of {args.ranks} ranks in items of {RANKS_PER_ITEM} "
          f"(medians of {rounds}): whole map {whole:.1f} ms in {requests['whole']} "
          f"UpdateItems, a clause a rank {clauses:.1f} ms in {requests['clauses']}; "
          f"ratio {ratio:.2f}")
    if requests["whole"] != requests["clauses"]:
        raise harness.Fail(f"the two forms made {requests} requests: not the same work")
    harness.machine_line("beat-write", ranks=args.ranks, requests=requests["whole"],
                         ms_whole=f"{whole:.1f}", ms_clauses=f"{clauses:.1f}",
                         ratio=f"{ratio:.2f}")


if __name__ == "__main__":
    main()
