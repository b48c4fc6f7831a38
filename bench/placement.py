"""Placement throughput against the bare conditional writes it needs, and the
DynamoDB requests per placed job, at 10, 100 and 1000 nodes, in one run.

``.venv/bin/python bench/placement.py`` from the repository root. As in
bench/endpoints.py (whose request counter this imports), everything runs
in-process on moto (``mock_aws``); the tables and queues come from
infra/template.yaml, deployed through CloudFormation by devstack/resources.py,
and the services from chalicelib.bootstrap. Every scale deploys a fresh stack
(Stage ``pb<N>``), so no table carries items from one scale into the next.

At each scale one node registers through ``services.nodes.register`` (8 h100
GPUs) and the other N-1 are its item with their ids put in, written in batches
(untimed; see ``Scale.clone_nodes``); every round submits the same M seeded
jobs (ranks 1..4, gpus_per_rank 1..2, h100) through ``services.jobs.submit``
and times, in alternating order:

* placement: ``services.placer.run()``, repeated while a run both places jobs
  and leaves some waiting, so every job that fits is placed (at 10 nodes the
  second run places nothing); an untimed check then reads the attempts and
  nodes back: no job placed twice, no node over capacity, no waiting job that
  fits what is left;
* the baseline: another copy of the M jobs and, for each job placement placed,
  with the node map placement chose for it in the warm-up round, only the
  writes a placement needs at minimum, made with a plain boto3 client against
  the same moto tables: one TransactWriteItems per job (the job update
  conditioned on PENDING and its attempt, the attempt put, the LAUNCH outbox
  put, one ``gpus_free`` update per node conditioned on room and READY; items
  the store's own place transaction) and one SQS SendMessage per node used.

After each half its jobs, attempts and intents are deleted, the queues purged
and the nodes given their GPUs back, and moto's leaks are undone as
bench/endpoints.py does, so both halves start from the same tables (moto's
TransactWriteItems deep-copies every table it touches: the per-job cost grows
with the nodes table, for both sides alike). As in timeit, the cyclic GC is off
inside the timed calls: moto's table copies would otherwise set off full
collections of its heap every few transactions. Times are per placed job; the
ratio is the median over rounds of (placement / baseline) within a round, on
process CPU time: everything, moto included, runs in this process, so CPU time
is the work done and other processes on a busy machine barely move it (wall
time is shown too). The headline ratio is the 100-node one: every job fits
there, so both sides place the same jobs and nothing else, and moto's table
copies do not yet drown the difference. Requests are counted with the botocore
``request-created`` hook of bench/harness.py (retries count too); the nodes
placement reads are counted by wrapping the node store's ``ready_pages`` on the
instance (chalicelib is not changed). The last line reads
``placement-bench: ratio=<x> reads_per_job_10=<n> reads_per_job_1000=<n>``.

Options: --jobs M (50), --jobs-1000 M (default M), --rounds R (3),
--rounds-1000 R (1), --scales 10,100,1000, --seed N; --quick: 4 jobs, one
round, 10 nodes (the smoke test). Shared set-up: bench/harness.py.
"""
from __future__ import annotations

import collections
import gc
import json
import pathlib
import random
import re
import statistics
import sys
import time

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.harness import REGION, Fail, moto_housekeeping  # noqa: E402

TENANT = "bench"
GPUS_PER_NODE = 8
GPU_TYPE = "h100"
#: (option, default, --quick): the defaults keep `make bench` under 6 minutes
QUICK = (("jobs", 50, 4), ("rounds", 3, 1), ("rounds_1000", 1, 1),
         ("scales", "10,100,1000", "10"))


# -- environment ----------------------------------------------------------------
def start_moto() -> None:
    """moto in-process and the request counter, before any client exists."""
    # rounds purge the queues more often than once a minute
    harness.start_moto(MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR="false")


def deploy_stack(stage: str):
    """A fresh stack from infra/template.yaml, and services bound to it."""
    return harness.deploy(stage)


def job_bodies(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"name": f"pb-{i}", "command": ["python", "train.py", "--epochs", "1"],
             "ranks": rng.randint(1, 4), "gpus_per_rank": rng.randint(1, 2),
             "gpu_type": GPU_TYPE, "env": {"NCCL_DEBUG": "WARN"}}
            for i in range(count)]


# -- one scale ----------------------------------------------------------------------
class Scale:
    def __init__(self, nodes: int, jobs: int, seed: int) -> None:
        import boto3

        from chalicelib.domain.principal import Principal

        self.n_nodes, self.n_jobs = nodes, jobs
        t0 = time.perf_counter()
        self.services = deploy_stack(f"pb{nodes}")
        self.cfg = self.services.config
        t1 = time.perf_counter()
        self.ddb, self.sqs = harness.plain_clients()
        self.cleanup = boto3.session.Session().client("dynamodb", region_name=REGION)
        node = self.services.nodes.register(Principal("agent", "*"), "node-0000",
                                            {"gpus": GPUS_PER_NODE, "gpu_type": GPU_TYPE})
        self.urls: dict[str, str] = {node.node_id: node.inbox_queue_url}
        self.clone_nodes(nodes)
        self.setup_s = (t1 - t0, time.perf_counter() - t1)
        summary = self.services.node_store.fleet_of(GPU_TYPE)
        fleet = (summary.gpus, summary.largest_node)
        if fleet != (GPUS_PER_NODE * nodes, GPUS_PER_NODE) or \
                len(self.services.nodes.list()) != nodes:
            raise Fail(f"N={nodes}: registration left the fleet at {fleet}")
        moto_housekeeping()
        self.bodies = job_bodies(jobs, seed)
        # node items placement reads (an instance wrapper: nothing in chalicelib changes)
        self.nodes_read = 0
        store = self.services.node_store
        ready_pages = store.ready_pages

        def counted(gpu_type, min_free):
            for page in ready_pages(gpu_type, min_free):
                self.nodes_read += len(page)
                yield page

        store.ready_pages = counted
        #: spec index -> the node map placement chose in the warm-up round
        self.plans: dict[int, dict[str, list[int]]] = {}
        self.created: list[str] = []
        self.touched: set[str] = set()
        self.samples: dict[str, list] = collections.defaultdict(list)
        #: CPU and wall milliseconds of every timed half
        self.cpu_wall = [0.0, 0.0]
        #: the items the warm-up round's placement wrote, by spec index, for
        #: the parity check of the baseline's (``parity``)
        self.placed_items: dict | None = None

    # -- fixtures (untimed) ------------------------------------------------------
    def clone_nodes(self, nodes: int) -> None:
        """Nodes 1..N-1 as registration would make them, without N registrations
        (each a transaction over the growing nodes table: 1000 took most of a
        minute on moto): node-0000's item, registered through the service, with
        its id put in, written in batches; each node's inbox made by the
        service's own ``inbox.ensure``; the fleet totals raised by the same
        update registration makes (``fleet_update``). The totals are checked after."""
        from chalicelib.adapters.fleet import ALL_TYPES, fleet_update
        from chalicelib.domain.clock import iso

        first = self.cleanup.get_item(TableName=self.cfg.nodes_table,
                                      Key={"node_id": {"S": "node-0000"}},
                                      ConsistentRead=True)["Item"]
        text = json.dumps(first)
        puts = []
        for i in range(1, nodes):
            node_id = f"node-{i:04d}"
            self.urls[node_id] = self.services.nodes.inbox.ensure(node_id)
            item = json.loads(text.replace("node-0000", node_id))
            if item["inbox_queue_url"]["S"] != self.urls[node_id]:
                raise Fail(f"{node_id}: inbox {self.urls[node_id]}, the clone says "
                           f"{item['inbox_queue_url']['S']}")
            puts.append({"PutRequest": {"Item": item}})
        for i in range(0, len(puts), 25):
            self.cleanup.batch_write_item(RequestItems={self.cfg.nodes_table: puts[i:i + 25]})
        if nodes > 1:  # registration's own fleet update, for the N-1 at once
            now = self.services.clock()
            for t in (GPU_TYPE, ALL_TYPES):
                self.cleanup.update_item(**fleet_update(
                    t, gpus=GPUS_PER_NODE * (nodes - 1), room_at=iso(now), changed_at=iso(now)))

    def submit(self, indices) -> list:
        jobs = []
        for i in indices:
            job = harness.new_job(self.services, TENANT, self.bodies[i])
            self.created.append(job.job_id)
            jobs.append((i, job))
        return jobs

    def collect_garbage(self) -> None:
        deletes: dict[str, list] = collections.defaultdict(list)
        for job_id in self.created:
            key = {"job_id": {"S": job_id}}
            deletes[self.cfg.jobs_table].append(key)
            deletes[self.cfg.attempts_table].append({**key, "attempt": {"N": "1"}})
            deletes[self.cfg.outbox_table].append({**key, "intent_id": {"S": "LAUNCH#1"}})
        self.created.clear()
        for table, keys in deletes.items():
            for i in range(0, len(keys), 25):
                self.cleanup.batch_write_item(RequestItems={table: [
                    {"DeleteRequest": {"Key": k}} for k in keys[i:i + 25]]})
        for url in [self.cfg.pending_queue_url, *(self.urls[n] for n in self.touched)]:
            if url:
                self.sqs.purge_queue(QueueUrl=url)
        # every node placement or the baseline reserved on gets its GPUs back
        for node_id in sorted(self.touched):
            self.cleanup.update_item(
                TableName=self.cfg.nodes_table, Key={"node_id": {"S": node_id}},
                UpdateExpression="SET #f = :g REMOVE #a",
                ExpressionAttributeNames={"#f": "gpus_free", "#a": "attempts"},
                ExpressionAttributeValues={":g": {"N": str(GPUS_PER_NODE)}})
        self.touched.clear()
        # the half's jobs are gone: so is the tenant's PENDING count (the waiting
        # ones' would otherwise add up to its max_pending_jobs over the rounds)
        self.cleanup.delete_item(TableName=self.cfg.tenants_table, Key={"tenant": {"S": TENANT}})
        moto_housekeeping()

    def baseline_items(self, jobs) -> list[tuple[list, list]]:
        """For each job: its TransactItems and its (queue URL, body) sends: the
        store's own place transaction (adapters/transitions.place_writes, the
        requests the store sends) and the Dispatcher's messages; ``parity``
        checks the items they leave against placement's after the warm-up
        round."""
        from chalicelib.adapters.transitions import place_writes
        from chalicelib.domain import placement
        from chalicelib.domain.clock import plus, utcnow
        from chalicelib.domain.intents import launch_intent
        from chalicelib.domain.placement import Plan

        out = []
        for index, job in jobs:
            plan = Plan(self.plans[index], job.spec.gpus_per_rank)
            attempt = job.attempt + 1
            first = plan.placement()[0]["node_id"]
            intent = launch_intent(job, attempt, plan.ranks_by_node,
                                   {n: self.urls[n] for n in plan.ranks_by_node},
                                   master_addr=first,
                                   master_port=placement.new_master_port())
            now = utcnow()
            items = place_writes(job, plan, intent, now,
                                 plus(now, self.cfg.cancel_resend_after_s),
                                 {n: GPU_TYPE for n in plan.gpus_by_node()})
            sends = [(self.urls[n], json.dumps(intent.message_for(n), separators=(",", ":")))
                     for n in intent.targets]
            out.append((items, sends))
        return out

    # -- the two halves ------------------------------------------------------------
    def _timed(self, fn):
        # process CPU time (the dispatcher sends from a thread pool); as timeit
        # does, no cyclic GC inside the timed calls: moto's whole-table copies (a
        # 1000-node table per node update) otherwise set off full collections
        # over moto's heap every few transactions, a cost of CPython's collector
        # running moto, not of either side
        self.nodes_read = 0
        t = harness.timed(fn, cpu="process", no_gc=True)
        self.cpu_wall[0] += t.cpu_ms
        self.cpu_wall[1] += t.wall_ms
        return t.wall_ms, t.cpu_ms, harness.split(t.calls), t.result

    def placement_half(self, record: bool) -> int:
        jobs = self.submit(range(self.n_jobs))

        def place():
            runs, placed = [], []
            while True:
                report = self.services.placer.run()
                runs.append(report)
                placed += report.placed
                if not report.waiting or not report.placed:
                    return runs, placed

        pending = self.pending()
        wall, cpu, calls, (runs, placed) = self._timed(place)
        pending -= self.pending()
        nodes_read = self.nodes_read
        index_of = {job.job_id: i for i, job in jobs}
        if len(set(placed)) != len(placed) or not set(placed) <= set(index_of):
            raise Fail(f"N={self.n_nodes}: placement placed a job twice or a stranger")
        if not placed:
            raise Fail(f"N={self.n_nodes}: nothing was placed")
        plans = self.check_placement(jobs, placed, runs[-1].waiting)
        if not self.plans:  # the warm-up round: the node maps the baseline replays
            self.plans = {index_of[j]: plans[j] for j in placed}
            self.placed_items = self.items({index_of[j]: j for j in placed})
            self.placed_items["PENDING count"] = pending
        elif sorted(index_of[j] for j in placed) != sorted(self.plans):
            raise Fail(f"N={self.n_nodes}: placement placed other jobs than in warm-up")
        if record:
            s = self.samples
            s["p_ms"].append(wall / len(placed))
            s["p_cpu"].append(cpu / len(placed))
            s["p_calls"].append(calls)
            s["p_placed"].append(len(placed))
            s["p_runs"].append(len(runs))
            s["p_nodes_read"].append(nodes_read)
            s["p_node_updates"].append(sum(len(p) for p in plans.values()))
        return len(placed)

    def check_placement(self, jobs, placed, waiting) -> dict[str, dict]:
        """Untimed: the node maps of the placed jobs, no node over capacity, and
        no waiting job that fits what is left."""
        from chalicelib.adapters.models import AttemptModel, NodeModel
        from chalicelib.domain.attempts import from_runs

        plans = {}
        used: collections.Counter = collections.Counter()
        for job_id in placed:
            a = AttemptModel.get(job_id, 1, consistent_read=True)
            plans[job_id] = {n: from_runs(r) for n, r in a.node_ranks.items()}
            used.update({n: int(g) for n, g in a.node_gpus.items()})
        self.touched |= set(used)
        free = {}
        for node_id in used:
            n = NodeModel.get(node_id, consistent_read=True)
            free[node_id] = int(n.gpus_free)
            if free[node_id] != GPUS_PER_NODE - used[node_id] or free[node_id] < 0:
                raise Fail(f"N={self.n_nodes}: {node_id} has {free[node_id]} GPUs free, "
                           f"{used[node_id]} of {GPUS_PER_NODE} reserved")
        untouched = GPUS_PER_NODE * (self.n_nodes - len(used))
        spec = {job.job_id: job.spec for _, job in jobs}
        for job_id in waiting:
            g, ranks = spec[job_id].gpus_per_rank, spec[job_id].ranks
            room = sum(f // g for f in free.values()) + untouched // GPUS_PER_NODE * \
                (GPUS_PER_NODE // g)
            if room >= ranks:
                raise Fail(f"N={self.n_nodes}: job {job_id} ({ranks} x {g}) waits but fits")
        return plans

    def items(self, job_ids: dict[int, str]) -> dict:
        """Untimed: the items a half left, for ``parity``: by spec index the job,
        its attempt and its LAUNCH intent, and every node it used."""
        def get(table: str, key: dict) -> dict:
            return self.cleanup.get_item(TableName=table, Key=key,
                                         ConsistentRead=True).get("Item", {})

        out: dict = {}
        for index, job_id in job_ids.items():
            key = {"job_id": {"S": job_id}}
            out[index] = {"job": get(self.cfg.jobs_table, key),
                          "attempt": get(self.cfg.attempts_table, {**key, "attempt": {"N": "1"}}),
                          "LAUNCH intent": get(self.cfg.outbox_table,
                                               {**key, "intent_id": {"S": "LAUNCH#1"}})}
        nodes = sorted({n for i in job_ids for n in self.plans[i]})
        out["nodes"] = {n: get(self.cfg.nodes_table, {"node_id": {"S": n}}) for n in nodes}
        out["ids"] = list(job_ids.values())
        return out

    def pending(self) -> int:
        """The tenant's PENDING count (issue 9), which placing a job lowers."""
        item = self.cleanup.get_item(TableName=self.cfg.tenants_table,
                                     Key={"tenant": {"S": TENANT}}, ConsistentRead=True)
        return int(item.get("Item", {}).get("pending", {}).get("N", 0))

    def parity(self, job_ids: dict[int, str], pending: int) -> None:
        """The baseline's items equal placement's (the store's place), ids
        and times aside, and it lowers the tenant's PENDING count as much: its
        writes are the same work, not just as many."""
        theirs, self.placed_items = self.placed_items, None
        if pending != theirs["PENDING count"]:
            raise Fail(f"parity N={self.n_nodes}: placement lowered the tenant's PENDING "
                       f"count by {theirs['PENDING count']}, the baseline by {pending}")
        ours = self.items(job_ids)
        # a LAUNCH message's port is drawn when its attempt is placed
        held = json.dumps([theirs, ours], default=str)
        ids = sorted({f'"master_port":{p}' for p in re.findall(r'master_port\\":(\d+)', held)})
        ids += theirs["ids"] + ours["ids"]
        compared = 0
        for index in job_ids:
            for what, item in ours[index].items():
                harness.same_items(f"N={self.n_nodes} job {index}: {what}", item,
                                   theirs[index][what], ids=ids)
                compared += 1
        for node_id, item in ours["nodes"].items():
            harness.same_items(f"N={self.n_nodes} {node_id}", item, theirs["nodes"][node_id],
                               ids=ids)
            compared += 1
        print(f"N={self.n_nodes}: parity: the baseline's {compared} items equal placement's "
              f"(ids and times aside)", flush=True)

    def baseline_half(self, record: bool) -> None:
        # all M jobs, as placement gets them, so both halves copy the same tables;
        # the ones placement left waiting stay PENDING here too
        jobs = [(i, job) for i, job in self.submit(range(self.n_jobs)) if i in self.plans]
        work = self.baseline_items(jobs)
        for index, _ in jobs:
            self.touched |= set(self.plans[index])
        ddb, sqs = self.ddb, self.sqs

        def run():
            for items, sends in work:
                ddb.transact_write_items(TransactItems=items)
                for url, body in sends:
                    sqs.send_message(QueueUrl=url, MessageBody=body)

        pending = self.pending()
        wall, cpu, calls, _ = self._timed(run)
        pending -= self.pending()
        if self.placed_items is not None:  # the warm-up round
            self.parity({i: job.job_id for i, job in jobs}, pending)
        expected = len(work), sum(len(s) for _, s in work)
        if (calls["TransactWriteItems"], calls["sqs"]) != expected or calls["reads"]:
            raise Fail(f"N={self.n_nodes}: the baseline made {dict(calls)}")
        if record:
            self.samples["b_ms"].append(wall / len(work))
            self.samples["b_cpu"].append(cpu / len(work))
            self.samples["b_node_updates"].append(sum(len(i) - 4 for i, _ in work))

    def round(self, index: int, record: bool) -> None:
        halves = [self.placement_half, self.baseline_half]
        if index % 2 and self.plans:  # the first round fixes the node maps to replay
            halves.reverse()
        for half in halves:
            half(record)
            # each half starts from the same tables: only the nodes, and its own jobs
            self.collect_garbage()

    # -- summary -------------------------------------------------------------------------
    def result(self) -> dict:
        s = self.samples
        calls = s["p_calls"]
        placed = s["p_placed"]
        per_job = {k: sum(c[k] for c in calls) / sum(placed) for k in ("reads", "writes", "sqs")}
        ops: collections.Counter = collections.Counter()
        for c in calls:
            ops.update({k: v for k, v in c.items() if k not in ("reads", "writes", "sqs")})
        p, b = statistics.median(s["p_ms"]), statistics.median(s["b_ms"])
        pc, bc = statistics.median(s["p_cpu"]), statistics.median(s["b_cpu"])
        return {"nodes": self.n_nodes, "jobs": self.n_jobs, "rounds": len(placed),
                "placed": statistics.median(placed), "runs": max(s["p_runs"]),
                "reads_per_run": sum(c["reads"] for c in calls) / sum(s["p_runs"]),
                "extra_writes": sum(c["writes"] - c["TransactWriteItems"] for c in calls)
                / len(calls),
                "p_ms": p, "b_ms": b, "p_cpu": pc, "b_cpu": bc,
                "ratio": harness.median_ratio(s["p_ms"], s["b_ms"]),
                "cpu_ratio": harness.median_ratio(s["p_cpu"], s["b_cpu"]),
                "ratios": sorted(x / y for x, y in zip(s["p_ms"], s["b_ms"])),
                "cpu_ratios": sorted(x / y for x, y in zip(s["p_cpu"], s["b_cpu"])),
                "per_job": per_job, "ops": {k: v / len(calls) for k, v in sorted(ops.items())},
                "nodes_read": statistics.median(s["p_nodes_read"]),
                "node_updates": (statistics.median(s["p_node_updates"]),
                                 statistics.median(s["b_node_updates"])),
                "setup_s": self.setup_s, "cpu_share": self.cpu_wall[0] / self.cpu_wall[1]}


def run_scale(nodes: int, jobs: int, rounds: int, seed: int) -> dict:
    t0 = time.perf_counter()
    scale = Scale(nodes, jobs, seed)
    scale.round(0, record=False)  # warm-up: also fixes the node maps the baseline replays
    gc.collect()
    for i in range(rounds):
        scale.round(i, record=True)
    r = scale.result()
    r["seconds"] = time.perf_counter() - t0
    deploy_s, register_s = r["setup_s"]
    share = r["cpu_share"]
    print(f"N={nodes:<5} {jobs} jobs x {rounds} rounds + 1 warm-up; deploy {deploy_s:.1f} s, "
          f"register {register_s:.1f} s, scale total {r['seconds']:.0f} s; the timed halves "
          f"got {share:.0%} of a CPU{'' if share >= 0.85 else '  !! BUSY MACHINE'}", flush=True)
    return r


def report(results: list[dict]) -> None:
    head = (f"{'nodes':>5} {'jobs':>4} {'placed':>6} {'runs':>4} {'place cpu':>9} "
            f"{'base cpu':>8} {'ratio':>5} {'place wall':>10} {'base wall':>9} {'ratio':>5}  "
            f"{'reads/job':>9} {'reads/run':>9} {'writes/job':>10} {'sqs/job':>7} "
            f"{'nodes read':>10}")
    print(head)
    print("-" * len(head))
    for r in results:
        pj = r["per_job"]
        print(f"{r['nodes']:>5} {r['jobs']:>4} {r['placed']:>6.0f} {r['runs']:>4} "
              f"{r['p_cpu']:>9.2f} {r['b_cpu']:>8.2f} {r['cpu_ratio']:>5.2f} "
              f"{r['p_ms']:>10.2f} {r['b_ms']:>9.2f} {r['ratio']:>5.2f}  "
              f"{pj['reads']:>9.2f} {r['reads_per_run']:>9.1f} {pj['writes']:>10.2f} "
              f"{pj['sqs']:>7.2f} {r['nodes_read']:>10.0f}")
    print()
    for r in results:
        ops = ", ".join(f"{k} {v:g}" for k, v in r["ops"].items())
        print(f"N={r['nodes']}: requests of a round's placement: {ops}; node updates "
              f"{r['node_updates'][0]:.0f} (baseline {r['node_updates'][1]:.0f}); writes "
              f"besides the placing transactions: {r['extra_writes']:g}")
        print(f"   per-round ratios, cpu: {', '.join(f'{x:.2f}' for x in r['cpu_ratios'])}; "
              f"wall: {', '.join(f'{x:.2f}' for x in r['ratios'])}")


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--jobs-1000", type=int, default=None,
                        help="jobs per round at 1000 nodes (default: --jobs); moto copies "
                             "the whole nodes table for every node a TransactWriteItems "
                             "updates, so a round there takes about 10 s")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--rounds-1000", type=int, default=None)
    parser.add_argument("--scales", default=None)
    args = parser.parse_args()
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))

    started = time.monotonic()
    harness.banner("placement")
    start_moto()
    scales = [int(x) for x in args.scales.split(",")]
    jobs_1000 = args.jobs if args.jobs_1000 is None else args.jobs_1000
    results = []
    for nodes in scales:
        big = nodes >= 1000
        results.append(run_scale(nodes, jobs_1000 if big else args.jobs,
                                 args.rounds_1000 if big else args.rounds, args.seed))
    print("\nms per placed job, medians over rounds in which placement and the baseline "
          "alternate going first;\nratio: median of the rounds' placement/baseline; "
          "requests per placed job and per placer run, every run of a round counted")
    report(results)
    by_n = {r["nodes"]: r for r in results}
    headline = by_n.get(100, results[0])
    print(f"total run time {time.monotonic() - started:.0f} s")
    print(f"headline ratio: N={headline['nodes']}, CPU time (wall {headline['ratio']:.2f})")
    reads_10 = by_n.get(10, by_n[min(by_n)])["per_job"]["reads"]
    reads_1000 = by_n.get(1000, by_n[max(by_n)])["per_job"]["reads"]
    print(f"placement-bench: ratio={headline['cpu_ratio']:.2f} reads_per_job_10={reads_10:.1f} "
          f"reads_per_job_1000={reads_1000:.1f}", flush=True)
    # spare the interpreter's exit a full collection of moto's heap
    gc.freeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
