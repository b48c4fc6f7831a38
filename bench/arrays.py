"""Arrays (issue 27): what creating a 10,000-index array costs against one plain
job, and what making and placing an array's children cost against creating
and placing plain jobs, each measured against its baseline in the same run.

``.venv/bin/python bench/arrays.py`` from the repository root. Set up by
bench/harness.py as the other benchmarks are: moto in-process, the stack
deployed from infra/template.yaml by devstack.resources, services from
chalicelib.bootstrap, DynamoDB and SQS requests counted by the botocore hook.
Write units are metered by ``harness.write_units``: DynamoDB's pricing rules
(1 unit per started KB of the larger item image, twice in a transaction, and
each global secondary index entry written) over the items moto holds before
and after each write. The meter's own CPU and wall time are taken out of
every timing; times are process CPU (the dispatcher sends from a thread
pool), the cyclic GC off inside the timed calls (as bench/placement.py), wall
time shown too. The tenant's ``max_pending_jobs`` is raised so that arrays of
10,000 fit, round after round.

**1. Create** (stack ``arc``). Each round posts, through the API handler as
Lambda invokes it (bench/endpoints.py's LambdaHTTP), in a shuffled order:
one plain job (the baseline), a 10,000-index array, and a 10,000-index array
with an ``array.env`` list of 10,000 values (3 characters each: about what a
64 KB body holds). Each answer must be 201, the arrays' with
``array.materialized`` FIRST_BATCH (the children its create makes). Medians over the rounds after the warm-up ones; the
ratio is the median over rounds of (array / plain) within a round.

**2. Children** (stack ``arb``). ``--nodes`` nodes of 8 ``h100`` GPUs (one
registered through the service, the others its item copied, as
bench/placement.py does), enough for every child at once. Each round runs two
halves, alternating which goes first, each on the same tables (everything a
half wrote is deleted after it, the nodes get their GPUs back):

* **array**: one array of ``--size`` indexes (default 120; one GPU each;
  ``array.env`` one value per index; ``max_parallel`` ``--max-parallel``,
  default 100, 0 for none: a window of 500) is created (untimed). Then,
  timed: its first window (``max_parallel`` children) made by
  ``services.pipelines.array_changed`` (what an index's end and the
  reconciler's sweep do: 99 children a transaction), placed by ``services.placer.run()`` repeated
  while it places; then for each of the other indexes, one placed child's
  end is reported (``EXITED`` 0, untimed, write units metered) and its
  follow-up ``services.pipelines.ended_all([child])`` makes the next index
  (timed: one child a transaction, as in steady state); then those are
  placed. ``--size`` is at most twice the window.
* **plain** (the baseline): the same shape with plain jobs of the same spec
  (each with its own env value): as many created through
  ``services.jobs.submit`` as the array's first window, placed, then for
  each of the others one placed job's end reported and one more job
  created, then those placed.

Per child or job: requests, write units and time, for making (batch and
one by one) against a plain create, and for placing against placing a
plain job. The last line reads ``arrays-bench: create_ms=<x>
create_ratio=<x> create_wru=<n> make_wru_per_child=<x>
place_ratio=<x> place_requests_per_child=<x> place_wru_ratio=<x>``.

Options: --create-rounds R (5), --warmup W (2, create rounds not counted),
--rounds R (2 children rounds), --size N (120), --max-parallel N (100),
--nodes N (size/8 + 1), --seed; --quick (the smoke test): 1 + 1 create
rounds, one children round of an array of 12 with ``max_parallel`` 10 (its
create makes FIRST_BATCH, 8, the sweep 2 more in one transaction, the ends 2
one by one: every step of a full run, on fewer children). The
issue's 1,000 children: ``--size 1000 --max-parallel 0 --rounds 1`` (a
quarter of an hour on moto).
"""
from __future__ import annotations

import collections
import gc
import json
import math
import pathlib
import random
import statistics
import sys
import time
import types

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.harness import REGION, Fail, moto_housekeeping  # noqa: E402
from chalicelib.domain.arrays import FIRST_BATCH, ArraySpec  # noqa: E402
from chalicelib.domain.happened import JobEnded  # noqa: E402

TENANT = "bench"
TOKEN = "bench"
GPUS_PER_NODE = 8
GPU_TYPE = "h100"
BIG = 10_000
SPEC = {"name": "sweep", "command": ["python", "train.py", "--epochs", "1"], "ranks": 1,
        "gpus_per_rank": 1, "gpu_type": GPU_TYPE, "env": {"NCCL_DEBUG": "WARN"}}
AGENT = None  # Principal("agent", "*"), made once chalicelib is importable
#: (option, default, --quick)
#: the children's defaults keep a run near a minute: moto copies every table a
#: TransactWriteItems touches, so a half's time grows with the square of --size
#: (120: 14 s of CPU a half, 500: 105 s, 1,000: 530 to 730 s; docs/benchmarks.md)
QUICK = (("create_rounds", 5, 1), ("warmup", 2, 1), ("rounds", 2, 1), ("size", 120, 12),
         ("max_parallel", 100, 10))


def compact(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def lr(i: int) -> str:
    """Index i's env value: a learning rate, 7 characters."""
    return f"{(i + 1) * 1e-6:.6f}"[:7]


class Meter:
    """One timed call, its requests and its write units."""

    __slots__ = ("cpu", "wall", "calls", "wru", "index_wru", "result")

    def __init__(self, fn) -> None:
        # as timeit, no cyclic GC inside the call (moto's whole-table copies
        # would set off collections of its heap), but no full collection
        # before each one either: a run makes thousands of these calls
        gc.disable()
        try:
            with harness.write_units() as wu:
                t = harness.timed(fn, cpu="process")
        finally:
            gc.enable()
        if wu.errors:
            raise Fail(f"the write-unit meter failed on {wu.errors} requests")
        self.cpu = t.cpu_ms - wu.cpu_ns / 1e6
        self.wall = t.wall_ms - wu.wall_ns / 1e6
        self.calls = harness.split(t.calls)
        self.wru, self.index_wru, self.result = wu.total, wu.index, t.result


def expect(response, status: int, what: str) -> dict:
    if response.status_code != status:
        raise Fail(f"{what}: HTTP {response.status_code}, expected {status}: "
                   f"{response.body[:300]!r}")
    return response.json_body


def ops_text(calls: collections.Counter, per: float = 1.0) -> str:
    keep = {k: v for k, v in calls.items() if k not in ("reads", "writes", "sqs")}
    return ", ".join(f"{k} {v / per:g}" for k, v in sorted(keep.items()))


# -- 1. create ------------------------------------------------------------------------------
def create_part(rounds: int, warmup: int, seed: int) -> dict:
    from bench.endpoints import LambdaHTTP

    harness.deploy("arc", tokens=[{"token": TOKEN, "tenant": TENANT}])
    import app as gpujobs

    http = LambdaHTTP(gpujobs.app)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    plain = {k: v for k, v in SPEC.items()}
    bodies = {
        "plain job": compact(plain),
        f"array of {BIG:,}": compact({**plain, "array": {"size": BIG}}),
        f"array of {BIG:,} + env": compact({**plain, "array": {
            "size": BIG, "env": {"SEED": [f"{i % 1000:03d}" for i in range(BIG)]}}}),
    }
    from chalicelib.api.validation import MAX_BODY_BYTES

    for name, body in bodies.items():
        if len(body) > MAX_BODY_BYTES:
            raise Fail(f"{name}: a body of {len(body)} bytes is over the limit")
    rng = random.Random(seed)
    samples: dict[str, list[Meter]] = collections.defaultdict(list)
    for r in range(warmup + rounds):
        order = list(bodies)
        rng.shuffle(order)
        for name in order:
            m = Meter(lambda b=bodies[name]: http.post("/v1/jobs", headers=headers, body=b))
            job = expect(m.result, 201, f"create {name}")
            if name != "plain job" and (job["array"]["size"], job["array"]["materialized"]) \
                    != (BIG, FIRST_BATCH):
                raise Fail(f"{name}: created as {job['array']}")
            if r >= warmup:
                samples[name].append(m)
        moto_housekeeping()
    base = samples["plain job"]
    out = {"bytes": {n: len(b) for n, b in bodies.items()}, "rows": {}}
    for name, ms in samples.items():
        out["rows"][name] = {
            "cpu": statistics.median(m.cpu for m in ms),
            "wall": statistics.median(m.wall for m in ms),
            "ratio": harness.median_ratio([m.cpu for m in ms], [m.cpu for m in base]),
            "wall_ratio": harness.median_ratio([m.wall for m in ms], [m.wall for m in base]),
            "calls": ms[0].calls, "varied": len({tuple(sorted(m.calls.items())) for m in ms}) > 1,
            "wru": ms[0].wru, "index_wru": ms[0].index_wru,
            "wru_varied": len({m.wru for m in ms}) > 1, "bytes": len(bodies[name])}
    return out


def report_create(out: dict, rounds: int) -> None:
    print(f"\n1. create, through the API handler: medians of {rounds} rounds, process CPU ms "
          f"(wall in brackets); ratio: median of the rounds' array/plain")
    head = (f"{'create':<22} {'body B':>7} {'CPU ms':>7} {'wall ms':>8} {'ratio':>6} "
            f"{'wall ratio':>10} {'reads':>5} {'writes':>6} {'sqs':>3} {'WRU':>5} "
            f"{'of it index':>11}  requests")
    print(head)
    print("-" * len(head))
    for name, r in out["rows"].items():
        c = r["calls"]
        print(f"{name:<22} {r['bytes']:>7} {r['cpu']:>7.2f} {r['wall']:>8.2f} "
              f"{r['ratio']:>6.2f} {r['wall_ratio']:>10.2f} {c['reads']:>5} {c['writes']:>6} "
              f"{c['sqs']:>3} {r['wru']:>5} {r['index_wru']:>11}  {ops_text(c)}"
              f"{' (varied)' if r['varied'] or r['wru_varied'] else ''}")


# -- 2. children --------------------------------------------------------------------------
class Children:
    def __init__(self, size: int, max_parallel: int | None, nodes: int, seed: int) -> None:
        import boto3

        from bench import placement
        from chalicelib.domain.principal import Principal

        global AGENT
        AGENT = Principal("agent", "*")
        self.size, self.max_parallel = size, max_parallel
        self.window = ArraySpec(size, max_parallel or None).window
        if size > 2 * self.window:
            raise Fail(f"--size {size} is more than twice the array's window "
                       f"({self.window}): the second window is made by the first's ends")
        self.services = harness.deploy("arb")
        self.cfg = self.services.config
        self.cleanup = boto3.session.Session().client("dynamodb", region_name=REGION)
        _, self.sqs = harness.plain_clients()
        node = self.services.nodes.register(AGENT, "node-0000",
                                            {"gpus": GPUS_PER_NODE, "gpu_type": GPU_TYPE})
        # the other nodes as bench/placement.py makes them: node-0000's item copied
        shim = types.SimpleNamespace(cleanup=self.cleanup, cfg=self.cfg,
                                     services=self.services,
                                     urls={node.node_id: node.inbox_queue_url})
        placement.Scale.clone_nodes(shim, nodes)
        self.urls = shim.urls
        fleet = self.services.node_store.fleet_of(GPU_TYPE)
        if fleet.gpus != GPUS_PER_NODE * nodes or fleet.gpus < size:
            raise Fail(f"the fleet has {fleet.gpus} GPUs for {size} children")
        self.n_nodes = nodes
        body = {**SPEC, "array": {"size": size, "env": {"LR": [lr(i) for i in range(size)]}}}
        if max_parallel:
            body["array"]["max_parallel"] = max_parallel
        self.array_body = body
        self.created: list[str] = []
        self.samples: dict[str, list] = collections.defaultdict(list)
        self.rng = random.Random(seed)
        moto_housekeeping()

    # -- fixtures (untimed) -------------------------------------------------------------
    def plain_body(self, i: int) -> dict:
        return {**SPEC, "env": {**SPEC["env"], "LR": lr(i)}}

    def end(self, job_id: str) -> int:
        """The placed job's one rank exits 0, as its agent reports it; the
        pipelines follow-up is not called (it is what is timed). Write units."""
        job = self.services.store.get(job_id)
        [node] = self.services.store.attempt(job_id, job.attempt).node_ranks
        attempts = self.services.attempts
        publish = attempts._publish  # the instance's: chalicelib unchanged
        attempts._publish = lambda e: None if isinstance(e, JobEnded) else publish(e)
        try:
            with harness.write_units() as wu:
                attempts.report(AGENT, job_id, job.attempt, {
                    "type": "EXITED", "node_id": node, "ranks": [0], "exit_code": 0})
        finally:
            attempts._publish = publish
        if self.services.store.get(job_id).state.value != "SUCCEEDED":
            raise Fail(f"{job_id} did not succeed")
        return wu.total

    def place_all(self) -> tuple[Meter, list[str]]:
        moto_housekeeping()  # untimed, so both halves' runs start from the same heap

        def place():
            placed = []
            while True:
                report = self.services.placer.run()
                placed += report.placed
                if not report.placed:
                    return placed
        m = Meter(place)
        return m, m.result

    def collect_garbage(self) -> None:
        deletes: dict[str, list] = collections.defaultdict(list)
        for job_id in self.created:
            key = {"job_id": {"S": job_id}}
            deletes[self.cfg.jobs_table].append(key)
            deletes[self.cfg.attempts_table].append({**key, "attempt": {"N": "1"}})
            deletes[self.cfg.outbox_table].append({**key, "intent_id": {"S": "LAUNCH#1"}})
        touched = set()
        for job_id in self.created:
            attempt = self.services.store.attempt(job_id, 1)  # the Attempts port
            if attempt is not None:
                touched |= set(attempt.node_gpus)
        self.created.clear()
        for table, keys in deletes.items():
            for i in range(0, len(keys), 25):
                self.cleanup.batch_write_item(RequestItems={table: [
                    {"DeleteRequest": {"Key": k}} for k in keys[i:i + 25]]})
        for node_id in sorted(touched):
            self.cleanup.update_item(
                TableName=self.cfg.nodes_table, Key={"node_id": {"S": node_id}},
                UpdateExpression="SET #f = :g REMOVE #a",
                ExpressionAttributeNames={"#f": "gpus_free", "#a": "attempts"},
                ExpressionAttributeValues={":g": {"N": str(GPUS_PER_NODE)}})
        for url in [self.cfg.pending_queue_url, *self.urls.values()]:
            if url:
                self.sqs.purge_queue(QueueUrl=url)
        self.cleanup.delete_item(TableName=self.cfg.tenants_table,
                                 Key={"tenant": {"S": TENANT}})
        moto_housekeeping()

    # -- the halves -------------------------------------------------------------------
    def array_half(self, record: bool) -> None:
        from chalicelib.domain.ids import child_job_id

        s = self.services
        view, _ = s.jobs.submit(TENANT, self.array_body, None)
        parent = view["job_id"]
        self.created += [parent, *(child_job_id(parent, i) for i in range(self.size))]
        made = Meter(lambda: s.pipelines.array_changed(parent))
        counts = s.store.get(parent).array_counts
        if counts["materialized"] != self.window:
            raise Fail(f"the sweep made {counts['materialized']} of a window of {self.window}")
        first, placed = self.place_all()
        if sorted(placed) != sorted(child_job_id(parent, i) for i in range(self.window)):
            raise Fail(f"the first runs placed {len(placed)} of {self.window} children")
        one_by_one, end_wru = [], []
        for n, job_id in enumerate(placed[:self.size - self.window]):
            if n and n % 50 == 0:
                moto_housekeeping()  # untimed: moto's tracked copies, see harness
            end_wru.append(self.end(job_id))
            before = s.store.get(parent).array_counts["materialized"]
            one_by_one.append(Meter(lambda j=job_id: s.pipelines.ended_all([j])))
            if s.store.get(parent).array_counts["materialized"] != before + 1:
                raise Fail("an index's end did not make exactly the next index")
        second, rest = self.place_all() if one_by_one else (None, [])
        if len(set(placed + rest)) != self.size:
            raise Fail(f"{len(set(placed + rest))} of {self.size} children were placed")
        state = s.store.get(parent)
        if state.state.value != "RUNNING" or state.array_counts["placed"] + \
                state.array_counts["succeeded"] != self.size:
            raise Fail(f"the array is {state.state.value} with {state.array_counts}")
        if record:
            self.samples["a_make"].append(made)
            self.samples["a_place"].append([first] + ([second] if second else []))
            self.samples["a_one"].append(one_by_one)
            self.samples["a_end_wru"].append(end_wru)
            self.samples["parent_bytes"].append(harness.item_size(harness.moto_item(
                self.cfg.jobs_table, {"job_id": {"S": parent}})))

    def plain_half(self, record: bool) -> None:
        s = self.services

        def create(indexes):
            def run():
                for i in indexes:
                    view, _ = s.jobs.submit(TENANT, self.plain_body(i), None)
                    self.created.append(view["job_id"])
            return run

        made = Meter(create(range(self.window)))
        first, placed = self.place_all()
        if len(placed) != self.window:
            raise Fail(f"placement placed {len(placed)} of {self.window} plain jobs")
        one_by_one, end_wru = [], []
        for n, job_id in enumerate(placed[:self.size - self.window]):
            if n and n % 50 == 0:
                moto_housekeeping()  # untimed, as in the array half
            end_wru.append(self.end(job_id))
            one_by_one.append(Meter(create([self.window + n])))
        second, rest = self.place_all() if one_by_one else (None, [])
        if len(set(placed + rest)) != self.size:
            raise Fail(f"{len(set(placed + rest))} of {self.size} plain jobs were placed")
        if record:
            self.samples["p_make"].append(made)
            self.samples["p_place"].append([first] + ([second] if second else []))
            self.samples["p_one"].append(one_by_one)
            self.samples["p_end_wru"].append(end_wru)

    def round(self, index: int, record: bool) -> None:
        halves = [self.array_half, self.plain_half]
        if index % 2:
            halves.reverse()
        for half in halves:
            t0 = time.perf_counter()
            half(record)
            self.collect_garbage()
            print(f"   round {index + 1}: {half.__name__.split('_')[0]} half "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)

    # -- summary ------------------------------------------------------------------------
    def result(self) -> dict:
        s = self.samples
        size, window, steady = self.size, self.window, self.size - self.window

        def per(meters: list[Meter], n: int) -> dict:
            calls: collections.Counter = collections.Counter()
            for m in meters:
                calls.update(m.calls)
            return {"cpu": sum(m.cpu for m in meters) / n, "wall": sum(m.wall for m in meters) / n,
                    "requests": sum(v for k, v in calls.items() if k in ("reads", "writes", "sqs"))
                    / n, "reads": calls["reads"] / n, "writes": calls["writes"] / n,
                    "sqs": calls["sqs"] / n, "wru": sum(m.wru for m in meters) / n,
                    "index_wru": sum(m.index_wru for m in meters) / n, "ops": calls, "n": n}

        rounds = len(s["a_make"])
        out = {"rounds": rounds, "size": size, "window": window, "nodes": self.n_nodes,
               "parent_bytes": s["parent_bytes"][-1]}
        for side in ("a", "p"):
            out[f"{side}_make"] = [per([m], window) for m in s[f"{side}_make"]]
            out[f"{side}_one"] = [per(ms, steady) for ms in s[f"{side}_one"]] if steady else []
            out[f"{side}_place"] = [per(ms, size) for ms in s[f"{side}_place"]]
            out[f"{side}_end_wru"] = statistics.mean(w for ws in s[f"{side}_end_wru"]
                                                     for w in ws) if steady else None
        return out


def report_children(r: dict) -> dict:
    def med(rows: list[dict], key: str) -> float:
        return statistics.median(x[key] for x in rows)

    def ratio(a: list[dict], b: list[dict], key: str = "cpu") -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(a, b))

    print(f"\n2. children: an array of {r['size']:,} (window {r['window']}, its item "
          f"{r['parent_bytes']:,} B with its env list) against {r['size']:,} plain jobs, "
          f"{r['nodes']} nodes x {GPUS_PER_NODE} GPUs; per child or job, medians of "
          f"{r['rounds']} rounds (CPU ms, process; ratio: median of the rounds' array/plain)")
    head = (f"{'what':<34} {'CPU ms':>7} {'wall ms':>8} {'ratio':>6} {'requests':>8} "
            f"{'reads':>6} {'writes':>6} {'sqs':>5} {'WRU':>7} {'of it index':>11}")
    print(head)
    print("-" * len(head))
    rows = [("make: first window, 99 a tx", "a_make", "p_make"),
            ("make: one per index end", "a_one", "p_one"),
            ("place", "a_place", "p_place")]
    plain_names = {"a_make": "create (baseline)", "a_one": "create (baseline)",
                   "a_place": "place a plain job (baseline)"}
    line = {}
    for name, a, p in rows:
        if not r[a]:
            continue
        for label, key, base in ((name, a, p), ("  " + plain_names[a], p, p)):
            rat = ratio(r[key], r[base])
            print(f"{label:<34} {med(r[key], 'cpu'):>7.3f} {med(r[key], 'wall'):>8.3f} "
                  f"{rat:>6.2f} {med(r[key], 'requests'):>8.2f} {med(r[key], 'reads'):>6.2f} "
                  f"{med(r[key], 'writes'):>6.2f} {med(r[key], 'sqs'):>5.2f} "
                  f"{med(r[key], 'wru'):>7.2f} {med(r[key], 'index_wru'):>11.2f}")
        line[a] = {"ratio": ratio(r[a], r[p]), "requests": med(r[a], "requests"),
                   "wru": med(r[a], "wru"), "wru_ratio": ratio(r[a], r[p], "wru")}
    for name, a in (("make, first window", "a_make"), ("make, one by one", "a_one"),
                    ("place", "a_place")):
        if r[a]:
            ops = r[a][-1]["ops"]
            print(f"   {name}: requests per child {ops_text(ops, r[a][-1]['n'])}")
    if r["a_end_wru"] is not None:
        print(f"   an index's end (EXITED, untimed): {r['a_end_wru']:.1f} WRU per child, "
              f"{r['p_end_wru']:.1f} per plain job")
    return line


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--create-rounds", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="children rounds")
    parser.add_argument("--size", type=int, default=None)
    parser.add_argument("--max-parallel", type=int, default=None,
                        help="the array's max_parallel (0: none, so a window of 500)")
    parser.add_argument("--nodes", type=int, default=None)
    args = parser.parse_args()
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))
    args.max_parallel = args.max_parallel or None
    nodes = args.nodes or math.ceil(args.size / GPUS_PER_NODE) + 1

    started = time.monotonic()
    harness.banner("arrays")
    # rounds purge the queues more often than once a minute; arrays of 10,000 fit
    harness.start_moto(MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR="false",
                       GPUJOBS_TENANT_MAX_PENDING_JOBS=str(10 ** 9))
    t0 = time.monotonic()
    created = create_part(args.create_rounds, args.warmup, args.seed)
    report_create(created, args.create_rounds)
    print(f"   (part 1 took {time.monotonic() - t0:.0f} s)")
    t0 = time.monotonic()
    children = Children(args.size, args.max_parallel, nodes, args.seed)
    print(f"\nchildren: deployed, {nodes} nodes, in {time.monotonic() - t0:.1f} s", flush=True)
    for i in range(args.rounds):
        children.round(i, record=True)
    line = report_children(children.result())
    print(f"total run time {time.monotonic() - started:.0f} s")
    big = created["rows"][f"array of {BIG:,}"]
    make = line.get("a_one") or line["a_make"]
    harness.machine_line(
        "arrays", create_ms=f"{big['cpu']:.2f}", create_ratio=f"{big['ratio']:.2f}",
        create_wru=big["wru"], make_wru_per_child=f"{make['wru']:.1f}",
        place_ratio=f"{line['a_place']['ratio']:.2f}",
        place_requests_per_child=f"{line['a_place']['requests']:.2f}",
        place_wru_ratio=f"{line['a_place']['wru_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
