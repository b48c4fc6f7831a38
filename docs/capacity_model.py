"""The capacity and cost model of docs/deploy.md, as arithmetic you can re-run.

    python docs/capacity_model.py            # the tables in docs/deploy.md

What each operation costs (HTTP requests, DynamoDB and SQS requests, write
and read units, and the keys it writes and reads) is not typed in here: it is
counted on moto by running the real service code, ``python bench/op_counts.py
--write docs/op_counts.json``, and read from that file
(tests/test_capacity_model.py fails when the file differs from a fresh count).
The inputs below are the fleet, the workload mix, Lambda's durations and the
prices. Prices are AWS us-east-1 list prices as of the author's knowledge
(late 2024 / 2025), without free tiers, savings plans or reserved capacity:
check the current pricing pages before relying on them.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys
from datetime import datetime, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
# the fan-out's own threshold, shard sizing and packing, so the model cannot drift from it
from agent.runner import Settings  # noqa: E402
from chalicelib.adapters import heartbeat_store  # noqa: E402
from chalicelib.domain.jobs import Job  # noqa: E402
from chalicelib.domain.spec import JobSpec  # noqa: E402
from chalicelib.domain.states import JobState  # noqa: E402
from chalicelib.service.scan import MAX_JOBS_PER_SCAN  # noqa: E402
from chalicelib.service.scan_fanout import RANK_COST_S, ScanFanout  # noqa: E402

COUNTS_FILE = pathlib.Path(__file__).resolve().parent / "op_counts.json"
SCALES = (1_000, 10_000, 100_000)          # GPUs
GPUS_PER_HOST = 8
INTERVAL_S = 10                           # rank heartbeat interval (one POST per host)
# A busy host's agent calls in every BUSY_CALL_IN_S (its heartbeat POSTs show
# it alive in between), on one of those POSTs; the reconcile, once a minute,
# reads when each host silent by its call-ins last posted (the fleet below is
# busy; an idle host calls in every 10 s by PUT)
BUSY_CALL_IN_S = Settings.busy_call_in_s
DOWN_AFTER_S = 60                         # GPUJOBS_NODE_DOWN_AFTER_S's default
SECONDS_PER_MONTH = 730 * 3600            # AWS bills a month as 730 hours

# Job mix: share of GPUs, ranks (1 GPU each, 8 per host), mean run time (h);
# bench/op_counts.py counts a job of each of these sizes
MIX = {"large": (0.50, 256, 24.0), "medium": (0.30, 64, 4.0), "small": (0.20, 8, 1.0)}
GET_PER_RUNNING_JOB_PER_MIN = 1           # users and dashboards reading a job
CANCEL_SHARE = 0.10                       # host-starts that later get a CANCEL
# The tenant event feed (issue 45): each job's events are numbered and put on
# EventBridge (counted: feed_lifecycle, one sweep of a whole life; deployed,
# the feed timer's sweeps and the tenants' reads see a life's events in up to
# FEED_ROUNDS_PER_LIFE rounds, each numbering round writing the job again);
# each event is delivered to WEBHOOKS_PER_EVENT webhooks (an assumption: an
# SQS send, receive and delete, one invocation, a delivery record and a read
# of the webhook per delivery)
FEED_ROUNDS_PER_LIFE = 4
WEBHOOKS_PER_EVENT = 1.0
DELIVERY_SQS, DELIVERY_WRU, DELIVERY_RRU, DELIVERY_S = 3, 1, 1, 0.2
POLLS_PER_HOST_PER_MIN = 3                # the agent's 20-s SQS long polls of its inbox
ESM_POLLS_PER_MIN = 5 * 3                 # the event source mappings' polls

# DynamoDB's per-partition limits, and the targets of issue 30 (at 100,000 GPUs)
KEY_WRITES_PER_S, KEY_READS_PER_S = 1_000, 3_000
TARGET_MONTH, TARGET_PER_1000_GPU_H = 9_500, 0.13

# Lambda: memory (GB) and mean billed duration (s)
API_GB, HB_S, OTHER_S = 0.5, 0.035, 0.060
CARRIED_S = 0.015   # a carried call-in's two more DynamoDB round trips (GetItem, UpdateItem)
SCAN_GB, PLACE_GB, RECONCILE_GB = 1.769, 0.5, 0.5
# The stall scan is paid per running *rank*, not per job (issue 16): judging a
# rank costs 45 us of client CPU (bench/scan_rank_cost.py: the slope of
# Scanner.scan_job between a 64- and a 1,024-rank job, moto's CPU taken out, on
# one full vCPU, which scan and scan_shard get at 1,769 MB; at M MB the CPU
# parts stretch by 1,769 / M). Per job: 2.5 ms of client CPU (the same run's
# intercept), the attempt's consistent GetItem (every scan, since issue 11),
# one consistent heartbeat Query per 512 ranks; a shard also re-reads the job.
SCAN_PERIOD_S = 60
SCAN_FIXED_S = 0.2                        # scanner record, RUNNING index Query
SCAN_RANK_CPU_S = 45e-6 * 1.769 / SCAN_GB
SCAN_JOB_CPU_S = 2.5e-3 * 1.769 / SCAN_GB
SCAN_GET_S, SCAN_QUERY_S = 0.005, 0.010   # DynamoDB latency: GetItem; Query of <= 512 ranks
HB_SHARD_RANKS = 512                      # heartbeat_store.SHARD_RANKS
PLACE_RUN_S = 0.5
API_CONCURRENCY_PER_RPS = 0.036           # ~ mean duration: containers per request/s

# Prices, us-east-1 list (USD)
APIGW_REST_TIERS = [(333e6, 3.50), (667e6, 2.80), (19e9, 2.38), (math.inf, 1.51)]
APIGW_HTTP_TIERS = [(300e6, 1.00), (math.inf, 0.90)]
LAMBDA_PER_M, LAMBDA_GB_S = 0.20, 0.0000166667
DDB_WRU_PER_M, DDB_RRU_PER_M = 0.625, 0.125          # on-demand, after the Nov 2024 cut
DDB_WCU_HOUR, DDB_RCU_HOUR = 0.00065, 0.00013        # provisioned
SQS_PER_M = 0.40
EVENTBRIDGE_PER_M = 1.00                             # custom events put
LOGS_PER_GB = 0.50
LOG_BYTES_PER_INVOCATION = 350                       # START/END/REPORT platform lines


def tiered(count: float, tiers) -> float:
    cost, left = 0.0, count
    for size, price in tiers:
        take = min(left, size)
        cost += take / 1e6 * price
        left -= take
        if left <= 0:
            break
    return cost


def judge_s(ranks: int, *, shard: bool) -> float:
    """One job's judgement in a scan invocation (a shard re-reads the job first)."""
    return (SCAN_JOB_CPU_S + SCAN_GET_S * (2 if shard else 1)
            + math.ceil(ranks / HB_SHARD_RANKS) * SCAN_QUERY_S + ranks * SCAN_RANK_CPU_S)


def scan(running: dict[str, float]) -> dict:
    """One minute's scan of the running jobs (rounded to whole jobs), fanned out
    exactly as chalicelib/service/scan_fanout.py decides and packs."""
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    jobs = [Job(job_id=f"{k}{i}", tenant="t", state=JobState.RUNNING,
                spec=JobSpec(command=("x",), ranks=MIX[k][1]), created_at=now, updated_at=now, attempt=1)
            for k in MIX for i in range(round(running[k]))][:MAX_JOBS_PER_SCAN]
    ranks = {j.job_id: MIX[j.job_id.rstrip("0123456789")][1] for j in jobs}

    class Queue:
        def __init__(self) -> None:
            self.bodies: list[str] = []

        def send(self, bodies: list[str]) -> None:
            self.bodies = bodies

    queue = Queue()
    fanout = ScanFanout(queue, None, period_s=SCAN_PERIOD_S)
    shards = fanout.send(jobs, now, None)
    if not shards:
        durations = [SCAN_FIXED_S + sum(judge_s(r, shard=False) for r in ranks.values())]
    else:
        durations = [SCAN_FIXED_S] + [
            sum(judge_s(ranks[j], shard=True) for j, _ in json.loads(b)["jobs"])
            for b in queue.bodies]
    return {"scan_ranks": sum(ranks.values()), "scan_jobs": len(jobs), "shards": shards,
            "shard_ranks": fanout.shard_ranks,
            "scan_cpu_s": sum(ranks.values()) * SCAN_RANK_CPU_S,
            "scan_s": max(durations), "scan_total_s": sum(durations),
            "sequential_s": SCAN_FIXED_S + sum(judge_s(r, shard=False) for r in ranks.values())}


def counts() -> dict:
    return json.loads(COUNTS_FILE.read_text())


def minus(a: dict, b: dict) -> dict:
    """What operation ``a`` costs more than ``b`` (requests, units and keys)."""
    def diff(x: dict, y: dict) -> dict:
        out = {k: x.get(k, 0) - y.get(k, 0) for k in set(x) | set(y)}
        return {k: v for k, v in out.items() if abs(v) > 1e-9}
    return {"http": a["http"] - b["http"], "wru": a["wru"] - b["wru"],
            "rru": a["rru"] - b["rru"], "requests": diff(a["requests"], b["requests"]),
            "keys": {rw: diff(a["keys"][rw], b["keys"][rw]) for rw in ("r", "w")}}


def load(c: dict, counted: dict, rates: list[tuple[str, float, float, float]]) -> dict:
    """Writes/s and reads/s on every key, from each operation's counted keys and
    its rate: ``(operation, per s in all, per s on one job, per s on one node)``.
    A key with ``<job>`` in it takes the one-job rate (the largest job's
    operations), ``<node>`` the one-node rate, any other (a constant such as
    ``"1"`` or a state, or ``<tenant>``: one tenant's all) the whole rate."""
    keys: dict[str, list[float]] = {}
    for op, total, job, node in rates:
        for rw, i in (("w", 0), ("r", 1)):
            for key, units in counted[op]["keys"][rw].items():
                rate = job if "<job>" in key else node if "<node>" in key else total
                if key.endswith("nodes|<scan>"):   # the nodes table is read whole
                    units *= c["hosts"] / counted["bench_nodes"]
                keys.setdefault(key.split("-", 2)[-1], [0.0, 0.0])[i] += units * rate
    return keys


def model(gpus: int, counted: dict | None = None) -> dict:
    k = dict(counted or counts())
    # a busy host's call-in rides on its heartbeat POST: what it adds to the
    # POST (no request of its own)
    k["call_in_carried"] = minus(k["heartbeat_call_in_8"], k["heartbeat_post_8"])
    hosts = gpus / GPUS_PER_HOST
    running = {m: gpus * share / ranks for m, (share, ranks, _) in MIX.items()}
    size = {m: MIX[m][1] for m in MIX}
    jobs = sum(running.values())
    starts_h = sum(running[m] / MIX[m][2] for m in MIX)
    host_starts_h = sum(running[m] / MIX[m][2] * size[m] / GPUS_PER_HOST for m in MIX)
    # a job's life, counted for a job of one host and of two: per job and per host
    one, two = k["lifecycle_1_host"], k["lifecycle_2_host"]
    per_host = {f: two[f] - one[f] for f in ("http", "wru", "rru")}
    per_job = {f: one[f] - per_host[f] for f in per_host}
    sqs_host = {q: two["requests"].get(q, 0) - one["requests"].get(q, 0)
                for q in two["requests"] if q.startswith("sqs:")}
    sqs_job = {q: one["requests"].get(q, 0) - sqs_host.get(q, 0)
               for q in one["requests"] if q.startswith("sqs:")}

    hb = {m: running[m] * size[m] / GPUS_PER_HOST / INTERVAL_S for m in MIX}  # posts/s
    node = hosts / BUSY_CALL_IN_S                          # carried call-ins / s
    # hosts silent by their call-ins (the reconcile reads their last post)
    silent = hosts * max(0.0, 1 - DOWN_AFTER_S / BUSY_CALL_IN_S)
    gets = {m: running[m] * GET_PER_RUNNING_JOB_PER_MIN / 60 for m in MIX}
    life = {f: (per_job[f] * starts_h + per_host[f] * host_starts_h) / 3600 for f in per_job}

    # the feed: one counted sweep of a life, plus the job's item written again
    # by each further numbering round (its mark_fed write, counted in the sweep)
    feed_life = k["feed_lifecycle"]
    job_write = math.ceil(k["item_bytes"]["job"] / 1024)
    feed_events = feed_life["events"] * starts_h / 3600          # events / s
    deliveries = feed_events * WEBHOOKS_PER_EVENT

    def feed_rate(field: str) -> float:
        more = {"wru": job_write * (FEED_ROUNDS_PER_LIFE - 1), "rru": 0, "http": 0}[field]
        per_delivery = {"wru": DELIVERY_WRU, "rru": DELIVERY_RRU, "http": 0}[field]
        return (feed_life[field] + more) * starts_h / 3600 + deliveries * per_delivery

    # the usage rollup (issue 46): a job's attempt end rolls up its hours'
    # cells under its GPU type, itself and its labels (one here). The counted
    # lifecycles hold no time; a job of the mix's hours adds the counted
    # roll of 1 h over the 0-h one, and each further hour its share of the
    # 25-h roll over the 1-h one.
    rolls = [k[f"usage_roll_{h}h"] for h in (0, 1, 25)]

    def usage_rate(field: str) -> float:
        def extra(hours: float) -> float:
            return rolls[1][field] - rolls[0][field] + \
                (hours - 1) * (rolls[2][field] - rolls[1][field]) / 24
        return sum(running[m] / MIX[m][2] * extra(MIX[m][2]) for m in MIX) / 3600

    def per_op(field: str) -> dict:
        return {"hb": sum(hb[m] * k[f"heartbeat_post_{size[m]}"][field] for m in MIX),
                "node": node * k["call_in_carried"][field],
                "gets": sum(gets[m] * k[f"get_job_{size[m]}"][field] for m in MIX),
                "life": life[field], "feed": feed_rate(field), "usage": usage_rate(field)}

    http = per_op("http")
    api = sum(http.values())
    # Agents call the agents' HTTP API, tenants the REST API (docs/deploy.md,
    # "Agent traffic on an HTTP API"). A job's life is one tenant request per
    # job (its create: the count per job of the 1- and 2-host lifecycles) and
    # agent requests per host (STARTED, EXITED: the count per host).
    agent_life = per_host["http"] * host_starts_h / 3600
    agent_api = http["hb"] + http["node"] + agent_life
    tenant_api = api - agent_api                      # job reads, creates
    containers = api * API_CONCURRENCY_PER_RPS

    sc = scan(running)
    node_bytes = k["item_bytes"]["node"]
    # Scan pages of 1 MB, ~0.1 s each; BatchGetItems of 100 host items, ~10 ms each
    reconcile_s = 0.1 + hosts * node_bytes / 1e6 * 0.1 + silent / 100 * 0.01
    nudges = starts_h / 3600                             # place_on_nudge, unbatched
    invocations = api + (4 + sc["shards"]) / 60 + nudges + deliveries
    gb_s = (API_GB * ((http["hb"] * HB_S + node * CARRIED_S)
                      + (http["gets"] + http["life"]) * OTHER_S)
            + (SCAN_GB * sc["scan_total_s"] + PLACE_GB * PLACE_RUN_S
               + RECONCILE_GB * reconcile_s) / 60
            + PLACE_GB * PLACE_RUN_S * nudges + API_GB * DELIVERY_S * deliveries)

    def scheduled(field: str) -> float:
        """The scan, placement and reconcile runs, once a minute, per second;
        a fanned-out scan's shards read each of their jobs again."""
        judged = sum(running[m] * k[f"scan_{size[m]}"][field] for m in MIX)
        again = sum(running[m] * k[f"get_job_{size[m]}"][field] for m in MIX) \
            if sc["shards"] and field == "rru" else 0
        nodes_scan = sum(v for key, v in k["reconcile"]["keys"]["r"].items()
                         if key.endswith("nodes|<scan>")) if field == "rru" else 0
        reconcile = (k["reconcile"][field] + nodes_scan * (hosts / k["bench_nodes"] - 1)
                     + silent * k["reconcile_busy_host"][field])
        return (k["scan_idle"][field] + judged + again + k["placement_idle"][field]
                + reconcile) / 60

    writes, reads = per_op("wru"), per_op("rru")
    w_marks = min(containers, api)   # the ingest mark: <= 1 PutItem/s per container, < 1 KB
    wru = sum(writes.values()) + w_marks + scheduled("wru")
    rru = sum(reads.values()) + scheduled("rru")

    # SQS requests per month
    m = SECONDS_PER_MONTH
    sends = ((sqs_job.get("sqs:SendMessage", 0) * starts_h
              + sqs_host.get("sqs:SendMessage", 0) * host_starts_h
              + CANCEL_SHARE * host_starts_h) / 3600 + sc["shards"] / 60) * m
    polls = hosts * POLLS_PER_HOST_PER_MIN / 60 * m
    deletes = host_starts_h * (1 + CANCEL_SHARE) / 3600 * m
    esm = ESM_POLLS_PER_MIN / 60 * m
    sends += deliveries * DELIVERY_SQS * m
    # CreateQueue: counted per call-in with one process serving the node; call-ins
    # spread over containers / 2 processes each ensure the node on their own
    per_call_in = k["call_in_carried"]["requests"].get("sqs:CreateQueue", 0)
    create_queue = node * min(1.0, per_call_in * max(1.0, containers / 2)) * m

    cost = {
        "API Gateway HTTP API (agents)": tiered(agent_api * m, APIGW_HTTP_TIERS),
        "API Gateway REST API (tenants)": tiered(tenant_api * m, APIGW_REST_TIERS),
        "Lambda requests": invocations * m / 1e6 * LAMBDA_PER_M,
        "Lambda GB-s": gb_s * m * LAMBDA_GB_S,
        "DynamoDB writes": wru * m / 1e6 * DDB_WRU_PER_M,
        "DynamoDB reads": rru * m / 1e6 * DDB_RRU_PER_M,
        "SQS": (sends + polls + deletes + esm + create_queue) / 1e6 * SQS_PER_M,
        "EventBridge (every feed event put)": feed_events * m / 1e6 * EVENTBRIDGE_PER_M,
        "CloudWatch Logs (platform lines only)":
            invocations * m * LOG_BYTES_PER_INVOCATION / 1e9 * LOGS_PER_GB,
    }
    largest = max(MIX, key=lambda x: size[x])
    big = size[largest]
    keys = load({"hosts": hosts}, k, [
        (f"heartbeat_post_{size[x]}", hb[x], hb[x] / running[x] if x == largest else 0,
         1 / INTERVAL_S) for x in MIX] + [
        ("call_in_carried", node, 0, 1 / BUSY_CALL_IN_S),
        ("reconcile_busy_host", silent / 60, silent / hosts * big / GPUS_PER_HOST / 60,
         silent / hosts / 60)] + [
        (f"get_job_{size[x]}", gets[x], GET_PER_RUNNING_JOB_PER_MIN / 60 if x == largest else 0,
         0) for x in MIX] + [
        (f"scan_{size[x]}", running[x] / 60, 1 / 60 if x == largest else 0, 0) for x in MIX] + [
        ("scan_idle", 1 / 60, 0, 0), ("placement_idle", 1 / 60, 0, 0),
        ("reconcile", 1 / 60, 0, 0),
        ("lifecycle_1_host", starts_h / 3600, 1 / (MIX[largest][2] * 3600), 0),
        ("lifecycle_2_host", (host_starts_h - starts_h) / 3600, 0, 0),
        ("lifecycle_1_host", -(host_starts_h - starts_h) / 3600, 0, 0),
        ("feed_lifecycle", starts_h / 3600, 1 / (MIX[largest][2] * 3600), 0),
        # (every start as a 25-h roll: the usage partitions' keys, on the high side)
        ("usage_roll_25h", starts_h / 3600, 0, 0)])
    # the ingest marks (left out of the counted operations: at most one a second
    # per container, whatever it serves), spread over their shards' keys
    shards = getattr(heartbeat_store, "INGEST_SHARDS", 1)
    keys[f"collector|ingest#<0..{shards - 1}>"] = [w_marks / shards, 0.0]
    total = sum(cost.values())
    return {
        "gpus": gpus, "hosts": hosts, "running_jobs": jobs, "starts_h": starts_h,
        "host_starts_h": host_starts_h, "hb": sum(hb.values()), "node": node,
        "gets": sum(gets.values()), "lifecycle": life["http"], "api": api,
        "api_month": api * m, "containers": containers,
        "agent_api": agent_api, "tenant_api": tenant_api, "agent_lifecycle": agent_life,
        "invocations": invocations, "invocations_month": invocations * m, "gb_s": gb_s,
        "gb_s_month": gb_s * m, **sc, "reconcile_s": reconcile_s,
        "w_beats": writes["hb"], "w_nodes": writes["node"], "w_marks": w_marks,
        "w_life": writes["life"], "w_feed": writes["feed"], "r_feed": reads["feed"],
        "w_usage": writes["usage"], "r_usage": reads["usage"],
        "feed_events": feed_events, "deliveries": deliveries,
        "w_scheduled": scheduled("wru"), "wru": wru,
        "r_beats": reads["hb"], "r_nodes": reads["node"], "r_gets": reads["gets"],
        "r_life": reads["life"], "r_scheduled": scheduled("rru"), "rru": rru,
        "sends": sends, "polls": polls, "deletes": deletes, "esm": esm,
        "create_queue": create_queue, "cost": cost, "total": total,
        "per_1000_gpu_h": total / (gpus * 730) * 1000,
        "http_api": tiered(api * m, APIGW_HTTP_TIERS),
        "rest_api": tiered(api * m, APIGW_REST_TIERS),
        "ddb_provisioned_writes": wru / 0.7 * DDB_WCU_HOUR * 730,
        "keys": keys, "largest_ranks": big,
    }


def hottest(keys: dict) -> dict[str, tuple[str, float, float]]:
    """Each table's and index's hottest key: (key, writes/s, reads/s)."""
    out: dict[str, tuple[str, float, float]] = {}
    for name, (w, r) in keys.items():
        where, key = name.split("|", 1)
        if key == "<scan>":   # a Scan reads every partition, no one key
            continue
        load_now = max(w / KEY_WRITES_PER_S, r / KEY_READS_PER_S)
        if where not in out or load_now > max(out[where][1] / KEY_WRITES_PER_S,
                                              out[where][2] / KEY_READS_PER_S):
            out[where] = (key, w, r)
    return dict(sorted(out.items()))


def verdict(row: dict) -> str:
    missed = []
    if row["total"] > TARGET_MONTH:
        missed.append(f"${row['total']:,.0f}/month > ${TARGET_MONTH:,}")
    if row["per_1000_gpu_h"] > TARGET_PER_1000_GPU_H:
        missed.append(f"${row['per_1000_gpu_h']:.3f} per 1,000 GPU-hours > "
                      f"${TARGET_PER_1000_GPU_H}")
    for where, (key, w, r) in hottest(row["keys"]).items():
        if w > KEY_WRITES_PER_S or r > KEY_READS_PER_S:
            missed.append(f"{where} key {key!r}: {w:,.0f} writes/s, {r:,.0f} reads/s")
    return "targets met" if not missed else "targets NOT met: " + "; ".join(missed)


def main() -> None:
    rows = [model(g) for g in SCALES]

    def line(label, fmt, key):
        print(f"| {label} | " + " | ".join(fmt(r[key] if isinstance(key, str) else key(r))
                                          for r in rows) + " |")

    n = lambda x: f"{x:,.0f}"                   # noqa: E731
    d1 = lambda x: f"{x:,.1f}"                  # noqa: E731
    d2 = lambda x: f"{x:,.2f}"                  # noqa: E731
    mil = lambda x: f"{x / 1e6:,.1f} M"         # noqa: E731
    usd = lambda x: f"${x:,.0f}"                # noqa: E731
    print("| | " + " | ".join(f"{g:,} GPUs" for g in SCALES) + " |")
    print("|---|" + "---:|" * len(SCALES))
    line("hosts (8 GPUs each)", n, "hosts")
    line("running jobs", d1, "running_jobs")
    line("job starts / h; host starts / h", lambda r: r, lambda r: f"{r['starts_h']:,.0f}; {r['host_starts_h']:,.0f}")
    line("**API requests / s**", d1, "api")
    line("  rank heartbeats (hosts / 10 s)", d1, "hb")
    line(f"  node call-ins (hosts / {BUSY_CALL_IN_S:.0f} s, on a heartbeat POST)", d2, "node")
    line("  job reads; job lifecycle", lambda r: r, lambda r: f"{r['gets']:.2f}; {r['lifecycle']:.3f}")
    line("  of which agents (HTTP API); tenants (REST API)", lambda r: r,
         lambda r: f"{r['agent_api']:,.1f}; {r['tenant_api']:.2f}")
    line("API requests / month", mil, "api_month")
    line("**Lambda invocations / month**", mil, "invocations_month")
    line("Lambda GB-s / s; / month", lambda r: r, lambda r: f"{r['gb_s']:.2f}; {r['gb_s_month'] / 1e6:,.2f} M")
    line("API concurrency (containers)", d1, "containers")
    line(f"running ranks; scan shards (fan-out above {rows[0]['shard_ranks']:,} ranks "
         f"at {RANK_COST_S * 1e6:.0f} us)",
         lambda r: r, lambda r: f"{r['scan_ranks']:,}; {r['shards']}")
    line(f"scan judging CPU, all ranks (s, {SCAN_RANK_CPU_S * 1e6:.0f} us a rank)", d1,
         "scan_cpu_s")
    line("scan duration, longest invocation (s, 60 s timeout)", d1, "scan_s")
    line("  one sequential scan instead (s)", d1, "sequential_s")
    line("reconcile duration (s)", d2, "reconcile_s")
    line("**DynamoDB WRU / s**", n, "wru")
    line("  heartbeat POSTs", n, "w_beats")
    line("  node call-ins", n, "w_nodes")
    line("  collector ingest marks (<= 1/s/container)", d1, "w_marks")
    line("  job lifecycle", d1, "w_life")
    line("  event feed: numbering, pushes, webhook deliveries", d1, "w_feed")
    line("  usage rollup (each attempt's hours, per group)", d1, "w_usage")
    line("  scan, placement, reconcile (per minute / 60)", d1, "w_scheduled")
    line("**DynamoDB RRU / s**", n, "rru")
    line("  heartbeat POSTs", n, "r_beats")
    line("  node call-ins", n, "r_nodes")
    line("  job reads; job lifecycle", lambda r: r, lambda r: f"{r['r_gets']:.1f}; {r['r_life']:.1f}")
    line("  event feed", d1, "r_feed")
    line("  usage rollup", d1, "r_usage")
    line("  scan, placement, reconcile (per minute / 60)", d1, "r_scheduled")
    line("feed events / s (each put on EventBridge, delivered to webhooks)", d2, "feed_events")
    line("SQS requests / month", mil, lambda r: r["sends"] + r["polls"] + r["deletes"] + r["esm"] + r["create_queue"])
    line("  of which agent long polls", mil, "polls")
    line("  of which CreateQueue (per-process ensure)", mil, "create_queue")
    for item in rows[0]["cost"]:
        line(item, usd, lambda r, item=item: r["cost"][item])
    line("**total / month (on-demand)**", usd, "total")
    line("**$ per 1,000 GPU-hours**", lambda x: f"${x:.3f}", "per_1000_gpu_h")
    line("  API Gateway if all on the REST API (before)", usd, "rest_api")
    line("  API Gateway if tenants too on an HTTP API", usd, "http_api")
    line("  DynamoDB writes if provisioned at 70 % use", usd, "ddb_provisioned_writes")

    top = rows[-1]
    print(f"\nHottest key of every table and index at {top['gpus']:,} GPUs (per-partition limits "
          f"{KEY_WRITES_PER_S:,} writes/s, {KEY_READS_PER_S:,} reads/s; <job> is the "
          f"{top['largest_ranks']}-rank job):\n")
    print("| table / index | hottest key | writes/s | reads/s | |")
    print("|---|---|---:|---:|---|")
    for where, (key, w, r) in hottest(top["keys"]).items():
        over = "**over**" if w > KEY_WRITES_PER_S or r > KEY_READS_PER_S else "ok"
        print(f"| {where} | `{key}` | {w:,.1f} | {r:,.1f} | {over} |")
    k = counts()["per_host_interval"]
    print(f"\nper host-interval: requests {k['requests']:g}, WRU {k['wru']:g}, RRU {k['rru']:g} "
          f"(floor: {k['floor']['requests']} request, {k['floor']['wru']} WRU)")
    print(f"at {top['gpus']:,} GPUs: ${top['total']:,.0f}/month, "
          f"${top['per_1000_gpu_h']:.3f} per 1,000 GPU-hours: {verdict(top)}")


if __name__ == "__main__":
    main()
