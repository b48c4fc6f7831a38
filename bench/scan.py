"""Stall-scan cost against history: time and DynamoDB reads of one scan over the
same 50 running jobs x 64 ranks, with and without 10 times as many finished jobs
(and their heartbeat items) in the tables.

``.venv/bin/python bench/scan.py`` from the repository root. As in
bench/placement.py (set up by bench/harness.py, as this is), everything runs in-process on moto (``mock_aws``);
the tables and queues come from infra/template.yaml, deployed through
CloudFormation by devstack/resources.py, and the services from
chalicelib.bootstrap.

Two stacks are deployed side by side and set up identically through the
services, except for the history:

* ``plain`` (Stage ``sc0``): 50 nodes of 64 h100 GPUs register; 50 jobs of 64
  ranks x 1 GPU are created, placed by ``services.placer.run()`` (one node
  each), report STARTED for all their ranks and post one heartbeat for every
  rank (``services.heartbeats.ingest``): 50 RUNNING jobs, 3,200 ranks in 50 host items.
* ``history`` (Stage ``sc1``): first one job runs to the end through the
  services: created, placed, STARTED, a heartbeat for every rank, then EXITED
  0 for every rank, so it is SUCCEEDED and its heartbeat items (stamped a
  minute or two before the measurement, TTL 7 days) stay in the table, as do
  its attempt and LAUNCH intent. Its items are then copied 499 times under new
  job ids (``Stack.clone_history``: exactly what running each through the
  services leaves, written in batches; running 500 through the services took
  4 minutes of moto work on a loaded machine); then the same 50 running jobs as
  ``plain``. The finished jobs have 32 ranks by default (``--history-ranks``):
  the history holds 16,000 old heartbeat items, 5 times the running ones
  (64 ranks doubles the set-up, about a minute, and gave the same ratio).

The set-up is untimed; the final states are checked: 500 SUCCEEDED, 50
RUNNING, every node's GPUs accounted for, every table's item count.

Each round first posts a fresh heartbeat for every running rank in both stacks
(untimed, so every scan finds 50 healthy jobs, as in production), then times
two scans, A cold, B cold (with ``--warm`` then B warm, A warm), where A is
``plain`` in even rounds and ``history`` in odd ones:

* ``cold``: ``services.scanner.run()`` with the heartbeats service's placement
  cache emptied, as in a scanner Lambda's first scan in a fresh container
  (it reads every running attempt once);
* ``warm`` (with ``--warm``): ``services.scanner.run()`` again right after, the
  steady state of a warm scanner. Since the scan reads each attempt fresh
  (issue 11: it needs the ranks that exited or stopped), a warm scan makes the
  same reads as a cold one, so it is no longer timed by default.

Every scan is checked: 50 jobs, no incident, nothing suppressed. The scan's
DynamoDB requests are counted with the botocore ``request-created`` hook of
bench/endpoints.py (retries count too), and the items its reads returned with an
``after-call`` hook (``install_item_counter``). Times are the calling thread's CPU time
(moto answers on that thread without I/O, so this is the work done, and other
processes on a busy machine barely move it); wall time is recorded too. As in
bench/placement.py, the cyclic GC is off inside the timed calls and the set-up's
heap is frozen (``gc.freeze``). PynamoDB models are bound per stack: switching
stack swaps every model's table name and its (already created) connection, so
no client is made inside a timed call.

**moto's Query.** moto 5 answers a Query by walking every item of the table
(the base table and every index alike), so on moto as shipped a Query's cost
grows with the table, which DynamoDB's does not (a Query reads one partition,
sorted by its range key). By default the bench makes moto's *base-table* Query
read the hash key's own bucket instead (``partition_queries``): the same items
in the same order, checked against moto's own answer for every running job's
shard (and a few finished ones) before any measurement. Index Queries are left as moto has them: the
scan's one Query on the sparse ``by_active_state`` index still walks all 550
jobs in ``history`` (against 50 in ``plain``), a cost DynamoDB would not have
(finished jobs leave that index). ``--moto-as-is`` measures moto unchanged.

Prints per stack and mode the median CPU ms and requests of a scan, and the
ratio history / plain: the median over rounds of the ratio within a round (as
bench/placement.py). A warm-up round is not recorded (its scans write every
job's first health). Ends with ``scan-bench: history_ratio=<x>``: the larger of
the cold and warm CPU-time ratios (target at most 1.1).

Options: --rounds R (2), --history-factor F (10), --history-ranks N (32),
--running J (50), --ranks N (64), --moto-as-is; --quick: one round of 2 jobs
x 8 ranks against 4 finished ones (the smoke test). Shared set-up:
bench/harness.py.
"""
from __future__ import annotations

import collections
import contextlib
import datetime as dt
import gc
import io
import logging
import pathlib
import statistics
import sys
import time
import warnings

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.harness import (  # noqa: E402
    CALLS,
    READS,
    Fail,
    moto_housekeeping,
    split,
)

TENANT = "bench"
GPUS_PER_NODE = 64
GPU_TYPE = "h100"
TARGET = 1.1
#: (option, default, --quick): the defaults keep `make bench` under 6 minutes
QUICK = (("rounds", 2, 1), ("running", 50, 2), ("ranks", 64, 8), ("history_factor", 10, 2),
         ("history_ranks", 32, 8))
AGENT = None  # Principal("agent", "*"), set in main (after moto starts)


# -- counting items ---------------------------------------------------------------------
#: items DynamoDB returned to reads since the last clear
ITEMS = [0]


def install_item_counter() -> None:
    """Beside bench/endpoints.py's request counter (installed first, by
    start_moto): every DynamoDB client made from now on also counts the items
    its reads return (Query and Scan ``Count``, a GetItem's ``Item``, a
    BatchGetItem's ``Responses``), which is what DynamoDB's read capacity is
    charged for."""
    import botocore.session

    original = botocore.session.Session.create_client

    def count(parsed=None, model=None, **_):
        if not parsed or model is None or model.name not in READS:
            return
        if "Count" in parsed:
            ITEMS[0] += parsed["Count"]
        elif "Item" in parsed:
            ITEMS[0] += 1
        elif isinstance(parsed.get("Responses"), dict):
            ITEMS[0] += sum(len(v) for v in parsed["Responses"].values())
        elif isinstance(parsed.get("Responses"), list):
            ITEMS[0] += sum(1 for r in parsed["Responses"] if r.get("Item"))

    def create_client(self, service_name, *args, **kwargs):
        client = original(self, service_name, *args, **kwargs)
        if service_name == "dynamodb":
            client.meta.events.register("after-call.dynamodb", count)
        return client

    botocore.session.Session.create_client = create_client


# -- one stack ----------------------------------------------------------------------------
class VirtualClock:
    """The services' clock in this bench: it moves only when the bench says so
    (one scan period per round), so the scans see the same heartbeat ages and
    scan lags however slowly a busy machine runs the set-up or a round (on the
    wall clock, a round slower than two periods made every scan a "late" one
    that convicts nobody, and set-up slower than the stall threshold made the
    waiting jobs' ranks look silent)."""

    def __init__(self) -> None:
        from chalicelib.domain.clock import utcnow

        self.now = utcnow()

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


CLOCK = VirtualClock()


class Stack:
    """A deployed stack, its services, and the PynamoDB bindings that point at it."""

    def __init__(self, name: str, stage: str, nodes: int) -> None:
        import boto3

        from chalicelib.adapters.models import MODELS

        self.name = name
        t0 = time.perf_counter()
        self.services = harness.deploy(stage, clock=CLOCK)
        self.cfg = self.services.config
        self.models = list(MODELS)
        self.tables = {m: m.Meta.table_name for m in self.models}
        self.connections = {m: None for m in self.models}
        self.ddb = boto3.session.Session().client("dynamodb", region_name=self.cfg.region)
        self.running: list[str] = []
        self.finished: list[str] = []
        self.samples: dict[str, list] = collections.defaultdict(list)
        self.n_nodes = nodes
        self.activate()
        for i in range(nodes):
            self.services.nodes.register(AGENT, f"{name}-{i:03d}",
                                         {"gpus": GPUS_PER_NODE, "gpu_type": GPU_TYPE})
        self.deactivate()
        self.setup_s = time.perf_counter() - t0

    # PynamoDB reads Meta.table_name and caches one TableConnection per model class
    def activate(self) -> None:
        for m in self.models:
            m.Meta.table_name = self.tables[m]
            m._connection = self.connections[m]

    def deactivate(self) -> None:
        for m in self.models:
            self.connections[m] = m._connection

    # -- set-up (untimed) -----------------------------------------------------------
    def wave(self, count: int, ranks: int, finish: bool) -> list[str]:
        """``count`` jobs of ``ranks`` x 1 GPU: created, placed, STARTED on every
        rank, one heartbeat per rank; with ``finish``, EXITED 0 on every rank."""
        from chalicelib.domain.states import JobState

        s = self.services
        body = {"name": "scan-bench", "command": ["python", "train.py"], "ranks": ranks,
                "gpus_per_rank": 1, "gpu_type": GPU_TYPE, "env": {"NCCL_DEBUG": "WARN"}}
        ids = [s.jobs.submit(TENANT, dict(body), None)[0]["job_id"] for _ in range(count)]
        placed: list[str] = []
        for _ in range(5):
            report = s.placer.run()
            placed += report.placed
            if not report.waiting or not report.placed:
                break
        if sorted(placed) != sorted(ids):
            raise Fail(f"{self.name}: placed {len(placed)} of {count} jobs")
        for job_id in ids:
            attempt = s.store.attempt(job_id, 1)
            for node_id, node_ranks in sorted(attempt.node_ranks.items()):
                s.attempts.report(AGENT, job_id, 1, {"type": "STARTED", "node_id": node_id,
                                                     "ranks": list(node_ranks)})
            self.beat(job_id, ranks)
            if finish:
                for node_id, node_ranks in sorted(attempt.node_ranks.items()):
                    s.attempts.report(AGENT, job_id, 1, {"type": "EXITED", "exit_code": 0,
                                                         "node_id": node_id,
                                                         "ranks": list(node_ranks)})
        want = JobState.SUCCEEDED if finish else JobState.RUNNING
        states = collections.Counter(s.store.get(j).state for j in ids)
        if states != {want: count}:
            raise Fail(f"{self.name}: wave ended in {dict(states)}, expected {want.value}")
        return ids

    def beat(self, job_id: str, ranks: int, step: int = 1) -> None:
        self.services.heartbeats.ingest(AGENT, job_id, {
            "attempt": 1, "ranks": [{"rank": r, "step": step} for r in range(ranks)]})

    def fill(self, running: int, ranks: int, history: int, history_ranks: int) -> None:
        t0 = time.perf_counter()
        self.activate()
        if history:
            self.finished = self.wave(1, history_ranks, finish=True)
            self.clone_history(history - 1)
            moto_housekeeping()
        self.running = self.wave(running, ranks, finish=False)
        moto_housekeeping()
        self.check(running, ranks, history, history_ranks)
        self.deactivate()
        self.fill_s = time.perf_counter() - t0

    def clone_history(self, count: int) -> None:
        """``count`` more finished jobs, each the one finished job's items (its
        job, attempt, LAUNCH intent and heartbeat items, as the services wrote
        them) under a new job id, written in batches: what running each through
        the services would leave, without the ~0.5 s of moto work per job that
        made the set-up take minutes. The tables hold only that job's items
        when this runs; ``check`` counts them all afterwards."""
        import json

        from chalicelib.domain.ids import new_job_id

        [template] = self.finished
        tables = [self.cfg.jobs_table, self.cfg.attempts_table, self.cfg.outbox_table,
                  self.cfg.heartbeats_table]
        items = {t: [i for page in self.ddb.get_paginator("scan").paginate(TableName=t)
                     for i in page["Items"]] for t in tables}
        text = json.dumps(items)
        if any(template not in json.dumps(i) for t in tables for i in items[t]):
            raise Fail(f"{self.name}: the tables hold more than the template job's items")
        puts: list[tuple[str, dict]] = []
        for _ in range(count):
            job_id = new_job_id()
            clone = json.loads(text.replace(template, job_id))
            puts += [(table, item) for table, rows in clone.items() for item in rows]
            self.finished.append(job_id)
        for i in range(0, len(puts), 25):  # full batches, tables mixed
            batch: dict[str, list] = collections.defaultdict(list)
            for table, item in puts[i:i + 25]:
                batch[table].append({"PutRequest": {"Item": item}})
            self.ddb.batch_write_item(RequestItems=dict(batch))

    def count(self, table: str) -> int:
        return sum(page["Count"] for page in self.ddb.get_paginator("scan").paginate(
            TableName=table, Select="COUNT"))

    def rank_records(self) -> int:
        """The ranks the heartbeats table holds a beat of (an item is a host's)."""
        return sum(sum(1 for r in item.get("ranks", {}).get("M", {}).values()
                       if "h" in r["M"])
                   for page in self.ddb.get_paginator("scan").paginate(
                       TableName=self.cfg.heartbeats_table) for item in page["Items"])

    def check(self, running: int, ranks: int, history: int, history_ranks: int) -> None:
        from chalicelib.adapters.models import NodeModel

        self.items = {"jobs": self.count(self.cfg.jobs_table),
                      "heartbeats": self.rank_records(),
                      "attempts": self.count(self.cfg.attempts_table),
                      "outbox": self.count(self.cfg.outbox_table)}
        want = {"jobs": running + history, "heartbeats": running * ranks
                + history * history_ranks}
        if any(self.items[k] != v for k, v in want.items()):
            raise Fail(f"{self.name}: tables hold {self.items}, expected {want}")
        free = sum(int(n.gpus_free) for n in NodeModel.scan())
        if free != self.n_nodes * GPUS_PER_NODE - running * ranks:
            raise Fail(f"{self.name}: {free} GPUs free after set-up")

    # -- measurement ----------------------------------------------------------------
    def refresh(self, ranks: int, step: int) -> None:
        self.activate()
        with quiet():
            for job_id in self.running:
                self.beat(job_id, ranks, step)
            self.flush_telemetry()
        self.deactivate()

    def flush_telemetry(self) -> None:
        """What the Lambda handler does after each invocation: emit the metrics
        gathered (EMF lines on stdout, swallowed here), so none pile up and
        flush inside a timed scan."""
        telemetry = getattr(self.services, "telemetry", None)
        if telemetry is not None:
            with warnings.catch_warnings():  # "No application metrics to publish"
                warnings.simplefilter("ignore")
                telemetry.flush()

    def scan(self, mode: str, record: bool) -> None:
        self.activate()
        scanner = self.services.scanner
        if mode == "cold":
            self.services.heartbeats._placements.clear()
        gc.collect()
        CALLS.clear()
        ITEMS[0] = 0
        gc.disable()
        try:
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            result = scanner.run()
            wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
        finally:
            gc.enable()
        calls = split(CALLS)
        calls["items"] = ITEMS[0]
        self.deactivate()
        if result != {"jobs": len(self.running), "incidents": 0, "suppressed": None}:
            raise Fail(f"{self.name} {mode} scan: {result}")
        if record:
            self.samples[mode, "cpu"].append(cpu / 1e6)
            self.samples[mode, "wall"].append(wall / 1e6)
            self.samples[mode, "calls"].append(calls)

    def median(self, mode: str, what: str) -> float:
        if what in ("cpu", "wall"):
            return statistics.median(self.samples[mode, what])
        return statistics.median(c[what] for c in self.samples[mode, "calls"])

    def ops(self, mode: str) -> str:
        calls = self.samples[mode, "calls"]
        keys = sorted({k for c in calls for k in c
                       if k not in ("reads", "writes", "sqs", "items")})
        return ", ".join(f"{k} {statistics.median(c[k] for c in calls):g}" for k in keys)


def check_partition_queries(stack: Stack) -> None:
    """The patched Query answers exactly as moto's own for every running shard."""
    from chalicelib.adapters.heartbeat_store import shard_key
    from chalicelib.adapters.models import HeartbeatModel

    stack.activate()
    keys = [shard_key(j, 1, 0) for j in stack.running + stack.finished[:5]]
    for key in keys:
        mine = [m.serialize() for m in HeartbeatModel.query(key, consistent_read=True)]
        with PATCH.moto_query():
            theirs = [m.serialize() for m in HeartbeatModel.query(key, consistent_read=True)]
        if mine != theirs or not mine:
            raise Fail(f"partition_queries: {key}: {len(mine)} items, moto {len(theirs)}")
    stack.deactivate()


def quiet():
    """stdout swallowed: the metrics the services print (EMF) during set-up."""
    return contextlib.redirect_stdout(io.StringIO())


# -- main ------------------------------------------------------------------------------------
def main() -> int:
    global AGENT, PATCH
    parser = harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--running", type=int, default=None)
    parser.add_argument("--ranks", type=int, default=None)
    parser.add_argument("--history-factor", type=int, default=None)
    parser.add_argument("--history-ranks", type=int, default=None,
                        help="ranks of each finished job (32; 64 makes the set-up twice as long)")
    parser.add_argument("--warm", action="store_true",
                        help="also time a scan right after each cold one (the same reads "
                             "since the scan reads each attempt fresh)")
    parser.add_argument("--moto-as-is", action="store_true",
                        help="measure moto's Query unchanged (walks the whole table)")
    args = parser.parse_args()
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))
    history_ranks = args.history_ranks
    modes = ("cold", "warm") if args.warm else ("cold",)
    history = args.history_factor * args.running
    if args.ranks > GPUS_PER_NODE or history_ranks > GPUS_PER_NODE:
        parser.error(f"ranks must fit one node of {GPUS_PER_NODE} GPUs")

    started = time.monotonic()
    harness.banner("stall-scan")
    harness.start_moto(MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR="false")
    install_item_counter()
    from chalicelib.domain.principal import Principal

    AGENT = Principal("agent", "*")
    if not args.moto_as_is:
        PATCH = harness.partition_queries().__enter__()
    # the services log every placement at INFO and print metrics (EMF) on
    # stdout: keep warnings, drop the rest
    for name in ("gpujobs", "chalicelib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    with quiet():
        plain = Stack("plain", "sc0", args.running)
        hist = Stack("history", "sc1", args.running)
    for s, finished in ((plain, 0), (hist, history)):
        with quiet():
            s.fill(args.running, args.ranks, finished, history_ranks)
            s.flush_telemetry()
        print(f"{s.name:<8} deploy + {s.n_nodes} nodes {s.setup_s:.1f} s, jobs {s.fill_s:.1f} s "
              f"({finished} SUCCEEDED, {args.running} RUNNING); items: "
              + ", ".join(f"{k} {v}" for k, v in s.items.items()), flush=True)
    if PATCH is not None:
        check_partition_queries(hist)
    # the set-up's heap (moto's tables above all) is never garbage: keep the
    # collector off it, so the rounds' collections stay small
    gc.collect()
    gc.freeze()
    stacks = [plain, hist]
    step = 1
    for i in range(args.rounds + 1):  # round 0 warms up: first health writes, clients
        step += 1
        CLOCK.advance(plain.cfg.scan_period_s)  # one scan period between rounds
        for s in stacks:
            s.refresh(args.ranks, step)
        # A cold, B cold, B warm, A warm; A is plain in even rounds, history in odd
        a, b = stacks if i % 2 == 0 else stacks[::-1]
        for s, mode in ((a, "cold"), (b, "cold"), (b, "warm"), (a, "warm")):
            if mode not in modes:
                continue
            s.scan(mode, record=i > 0)
        moto_housekeeping()
    cpu = sum(sum(s.samples[m, "cpu"]) for s in stacks for m in modes)
    wall = sum(sum(s.samples[m, "wall"]) for s in stacks for m in modes)
    share = cpu / wall

    print(f"\n{args.running} RUNNING jobs x {args.ranks} ranks in both stacks; history: "
          f"{history} SUCCEEDED jobs x {history_ranks} ranks; moto Query: "
          f"{'as shipped (walks the table)' if args.moto_as_is else 'one partition'}")
    print(f"medians of {args.rounds} rounds (+1 warm-up), the stacks taking turns to go "
          f"first; ms: CPU time of the calling thread;\nratio: median over rounds of "
          f"history/plain within a round (wall: the same on wall-clock time); DynamoDB requests and items per scan,\n"
          f"median; reads: GetItem, Query, Scan, BatchGetItem, TransactGetItems (items read: "
          f"items they returned), writes: the rest")
    head = (f"{'scan':<6} {'plain ms':>9} {'history ms':>10} {'ratio':>6} {'wall ratio':>10}  "
            f"{'reads plain':>11} {'reads hist':>10} {'ratio':>6}  {'items read':>11}  "
            f"{'writes':>6}")
    print(head)
    print("-" * len(head))
    ratios, per_round = {}, {}
    for mode in modes:
        p, h = plain.median(mode, "cpu"), hist.median(mode, "cpu")
        pr, hr = plain.median(mode, "reads"), hist.median(mode, "reads")
        per_round[mode] = [y / x for x, y in zip(plain.samples[mode, "cpu"],
                                                 hist.samples[mode, "cpu"])]
        ratios[mode] = statistics.median(per_round[mode])
        wall_ratio = harness.median_ratio(hist.samples[mode, "wall"], plain.samples[mode, "wall"])
        print(f"{mode:<6} {p:>9.1f} {h:>10.1f} {ratios[mode]:>6.2f} {wall_ratio:>10.2f}  "
              f"{pr:>11g} {hr:>10g} {hr / pr:>6.2f}  "
              f"{plain.median(mode, 'items'):>5g}/{hist.median(mode, 'items'):<5g}  "
              f"{plain.median(mode, 'writes'):>4g}/{hist.median(mode, 'writes'):g}")
    for mode in modes:
        for s in stacks:
            print(f"  {mode} {s.name}: {s.ops(mode)}; CPU ms by round "
                  + ", ".join(f"{x:.0f}" for x in s.samples[mode, "cpu"]))
        print(f"  {mode} ratios by round: " + ", ".join(f"{x:.2f}" for x in per_round[mode]))
    print(f"the timed scans got {share:.0%} of a CPU"
          f"{'' if share >= 0.85 else '  !! BUSY MACHINE: wall ratios unreliable'}")
    headline = max(ratios, key=ratios.get)
    print(f"total run time {time.monotonic() - started:.0f} s")
    print(f"history ratio: {headline} scan, CPU time (target at most {TARGET}; "
          + ", ".join(f"{m} {ratios[m]:.2f}" for m in modes) + ")")
    print(f"scan-bench: history_ratio={ratios[headline]:.2f}", flush=True)
    gc.freeze()  # spare the interpreter's exit a full collection of moto's heap
    return 0


if __name__ == "__main__":
    sys.exit(main())
