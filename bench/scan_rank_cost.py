"""Client CPU of judging one running rank in the stall scan, against the bare
reads of its heartbeats, measured in the same run: the input of the scan's
fan-out (``chalicelib/service/scan_fanout.RANK_COST_S``) and of the capacity
model in docs/deploy.md.

``.venv/bin/python bench/scan_rank_cost.py`` from the repository root. moto
in-process (``mock_aws``) with the stack of infra/template.yaml, set up by
bench/harness.py; moto's base-table Query reads one partition
(``harness.partition_queries``, as in bench/scan.py). Set-up, untimed: for each
size N (64 and 1,024 ranks by default) a node of N GPUs registers and one job
of N ranks x 1 GPU is created, placed by ``services.placer.run()`` and reports
STARTED on every rank: one RUNNING job per size.

Each round first posts a fresh heartbeat for every rank of every job
(untimed, so every judgement finds a healthy job, as in production), then
times, per size, in an order that alternates from round to round:

* ``scan``: ``services.scanner.scan_job(job, now)``, the per-job judgement
  the scheduled scan and every ``scan_shard`` run: the attempt read fresh,
  one strongly consistent heartbeat Query per 512 ranks, ``judge``, and the
  health write when the health changed (it does not, after the warm-up);
* ``reads`` (the baseline): the same strongly consistent Queries of the job's
  heartbeat shards, bare boto3 (no parameter validation, as PynamoDB's
  client), every page, the items counted: what any scan must do per rank.

Both are *client side*: CPU time of the calling thread minus the CPU spent
inside moto's in-process stub answering the requests (``harness.moto_cpu_timer``,
the method of bench/endpoints.py), what a Lambda pays while DynamoDB answers
elsewhere. moto's own CPU is most of a call here (the 137 us per rank first
quoted for the scan in issue 16 included it). The cyclic GC is off inside the
timed calls and the set-up's heap frozen.

The cost per rank is the slope of the medians between the smallest and the
largest job (a least-squares line over all sizes when more are given), so
the per-job part (attempt read, request overheads) cancels out; it is
reported too, as the intercept. The ratio is the scan's slope over the bare
reads': what judging adds per rank to reading it. The last lines compare
``RANK_COST_S`` with the measurement and end with ``scan-rank-bench:
us_per_rank=<scan slope> reads_us_per_rank=<baseline slope>
ratio_vs_reads=<ratio> us_per_job=<intercept>``.

Options: --rounds R (15), --sizes 64,1024; --quick: 2 rounds of 8 and 64
ranks (the smoke test).
"""
from __future__ import annotations

import gc
import math
import pathlib
import statistics
import sys
import time

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.harness import MOTO_CPU_NS, Fail  # noqa: E402

TENANT = "bench"
GPU_TYPE = "h100"
STAGE = "src0"
#: (option, default, --quick)
QUICK = (("rounds", 15, 2), ("sizes", "64,1024", "8,64"))


def client_ms(fn) -> tuple[float, float]:
    """(client-side CPU ms, moto's CPU ms) of ``fn()`` on this thread."""
    gc.collect()
    MOTO_CPU_NS[0] = 0
    gc.disable()
    try:
        t0 = time.thread_time_ns()
        fn()
        used = time.thread_time_ns() - t0
    finally:
        gc.enable()
    moto = MOTO_CPU_NS[0]
    return (used - moto) / 1e6, moto / 1e6


def fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line (exact for two points)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
             / sum((x - mx) ** 2 for x in xs))
    return slope, my - slope * mx


class Setup:
    """One RUNNING job of each size, on a node of its own."""

    def __init__(self, sizes: list[int]) -> None:
        from chalicelib.domain.principal import Principal
        from chalicelib.domain.states import JobState

        self.agent = Principal("agent", "*")
        self.services = s = harness.deploy(STAGE)
        self.table = s.config.heartbeats_table
        self.ddb, _ = harness.plain_clients()
        self.jobs: dict[int, str] = {}
        for n in sizes:
            s.nodes.register(self.agent, f"rank-cost-{n}", {"gpus": n, "gpu_type": GPU_TYPE})
            body = {"name": "scan-rank-cost", "command": ["python", "train.py"], "ranks": n,
                    "gpus_per_rank": 1, "gpu_type": GPU_TYPE}
            job_id = s.jobs.submit(TENANT, body, None)[0]["job_id"]
            s.placer.run()
            attempt = s.store.attempt(job_id, 1)
            if attempt is None:
                raise Fail(f"the {n}-rank job was not placed")
            for node_id, ranks in sorted(attempt.node_ranks.items()):
                s.attempts.report(self.agent, job_id, 1, {
                    "type": "STARTED", "node_id": node_id, "ranks": list(ranks)})
            if s.store.get(job_id).state is not JobState.RUNNING:
                raise Fail(f"the {n}-rank job is not RUNNING")
            self.jobs[n] = job_id

    def beat(self, n: int, step: int) -> None:
        self.services.heartbeats.ingest(self.agent, self.jobs[n], {
            "attempt": 1, "ranks": [{"rank": r, "step": step} for r in range(n)]})

    def scan(self, n: int):
        """The timed judgement of the job as the scan lists it (read untimed)."""
        from chalicelib.domain.clock import utcnow

        job = self.services.store.get(self.jobs[n])
        scan_job = self.services.scanner.scan_job
        return lambda: scan_job(job, utcnow())

    def reads(self, n: int):
        """The baseline: the job's heartbeat shards, bare strongly consistent Queries."""
        from chalicelib.adapters.heartbeat_store import SHARD_RANKS

        job_id, query = self.jobs[n], self.ddb.query

        def read() -> None:
            items = 0
            for shard in range(math.ceil(n / SHARD_RANKS)):
                kwargs = {"TableName": self.table, "ConsistentRead": True,
                          "KeyConditionExpression": "#k = :k",
                          "ExpressionAttributeNames": {"#k": "shard_key"},
                          "ExpressionAttributeValues": {":k": {"S": f"{job_id}#1#{shard}"}}}
                while True:
                    page = query(**kwargs)
                    items += sum(1 for i in page["Items"] for r in i["ranks"]["M"].values()
                                 if "h" in r["M"])  # a host's ranks
                    if "LastEvaluatedKey" not in page:
                        break
                    kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            if items != n:
                raise Fail(f"the baseline read {items} ranks' heartbeats of {n}")
        return read

    def check(self, n: int) -> None:
        """Every judgement found the job healthy: no stalled rank, health OK."""
        health = self.services.store.get(self.jobs[n]).health
        if health.get("status") != "OK" or health.get("stalled_ranks"):
            raise Fail(f"the {n}-rank job was judged {health}")

    def flush(self) -> None:
        """What the handler does after each invocation: emit the metrics gathered."""
        import contextlib
        import io
        import warnings

        telemetry = getattr(self.services, "telemetry", None)
        if telemetry is not None:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                telemetry.flush()


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sizes", default=None, help="job sizes in ranks (64,1024)")
    args = parser.parse_args()
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if len(sizes) < 2:
        parser.error("--sizes needs at least two job sizes")

    started = time.monotonic()
    harness.banner("scan per-rank cost")
    harness.start_moto()
    harness.moto_cpu_timer()
    patch = harness.partition_queries().__enter__()
    setup = Setup(sizes)
    from chalicelib.service.scan_fanout import RANK_COST_S

    harness.moto_housekeeping()
    gc.collect()
    gc.freeze()  # the set-up's heap (moto's tables) is never garbage
    client = {(k, n): [] for k in ("scan", "reads") for n in sizes}
    moto = {(k, n): [] for k in ("scan", "reads") for n in sizes}
    for i in range(args.rounds + 2):  # two warm-up rounds: first health writes, clients
        for n in sizes:
            setup.beat(n, step=i + 1)
        setup.flush()
        order = [(k, n) for n in sizes for k in ("scan", "reads")]
        for k, n in (order if i % 2 == 0 else order[::-1]):
            c, m = client_ms(setup.scan(n) if k == "scan" else setup.reads(n))
            if i >= 2:
                client[k, n].append(c)
                moto[k, n].append(m)
        setup.flush()
    for n in sizes:
        setup.check(n)
    patch.__exit__(None, None, None)

    med = {key: statistics.median(v) for key, v in client.items()}
    moto_med = {key: statistics.median(v) for key, v in moto.items()}
    print(f"\none RUNNING job per size, every rank heard; medians of {args.rounds} rounds "
          f"(+2 warm-up), order alternating;\nms: client-side CPU of the calling thread "
          f"(moto's CPU answering the requests taken out, shown beside)")
    head = f"{'ranks':>6} {'scan_job ms':>12} {'(moto)':>8} {'bare reads ms':>14} {'(moto)':>8} " \
           f"{'ratio':>6}"
    print(head)
    print("-" * len(head))
    for n in sizes:
        print(f"{n:>6} {med['scan', n]:>12.2f} {moto_med['scan', n]:>8.2f} "
              f"{med['reads', n]:>14.2f} {moto_med['reads', n]:>8.2f} "
              f"{med['scan', n] / med['reads', n]:>6.2f}")
    slope, intercept = fit(sizes, [med["scan", n] for n in sizes])
    base_slope, _ = fit(sizes, [med["reads", n] for n in sizes])
    moto_slope, _ = fit(sizes, [moto_med["scan", n] for n in sizes])
    us, base_us, moto_us = slope * 1e3, base_slope * 1e3, moto_slope * 1e3
    if us <= 0 or base_us <= 0:
        raise Fail(f"no cost per rank measured (scan {us:.2f} us, reads {base_us:.2f} us): "
                   f"sizes too close or the machine too noisy")
    ratio = us / base_us
    how = f"slope {sizes[0]} -> {sizes[-1]} ranks" if len(sizes) == 2 else \
        f"least-squares slope over {len(sizes)} sizes"
    print(f"per rank ({how}): scan_job {us:.1f} us, bare "
          f"reads {base_us:.1f} us, ratio {ratio:.2f}; moto's own CPU answering the scan "
          f"{moto_us:.1f} us more (client + moto {us + moto_us:.0f} us)")
    print(f"per job (intercept): scan_job {intercept * 1e3:.0f} us client CPU")
    print(f"scan_fanout.RANK_COST_S = {RANK_COST_S * 1e6:.0f} us a rank: "
          f"{RANK_COST_S * 1e6 / us:.2f} x the client CPU measured here (it adds read latency)")
    print(f"total run time {time.monotonic() - started:.0f} s")
    harness.machine_line("scan-rank", us_per_rank=f"{us:.1f}", reads_us_per_rank=f"{base_us:.1f}",
                         ratio_vs_reads=f"{ratio:.2f}", us_per_job=f"{intercept * 1e3:.0f}")
    gc.freeze()  # spare the interpreter's exit a full collection of moto's heap
    return 0


if __name__ == "__main__":
    sys.exit(main())
