"""The capacity and cost model of docs/deploy.md, as arithmetic you can re-run.

    python docs/capacity_model.py            # the tables in docs/deploy.md

Every input is a named constant below; change one and re-run. Prices are
AWS us-east-1 list prices as of the author's knowledge (late 2024 / 2025),
without free tiers, savings plans or reserved capacity: check the current
pricing pages before relying on them.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys
from datetime import datetime, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
# the fan-out's own threshold, shard sizing and packing, so the model cannot drift from it
from chalicelib.domain.jobs import Job  # noqa: E402
from chalicelib.domain.states import JobState  # noqa: E402
from chalicelib.service.scan_fanout import RANK_COST_S, ScanFanout  # noqa: E402

SCALES = (1_000, 10_000, 100_000)          # GPUs
GPUS_PER_HOST = 8
INTERVAL_S = 10                           # rank heartbeat interval (one POST per host)
NODE_INTERVAL_S = 10                      # node call-in (PUT /v1/nodes/{id}) per host
SECONDS_PER_MONTH = 730 * 3600            # AWS bills a month as 730 hours

# Job mix: share of GPUs, ranks (1 GPU each, 8 per host), mean run time (h)
MIX = {"large": (0.50, 256, 24.0), "medium": (0.30, 64, 4.0), "small": (0.20, 8, 1.0)}
GET_PER_RUNNING_JOB_PER_MIN = 1           # users and dashboards reading a job
CANCEL_SHARE = 0.10                       # host-starts that later get a CANCEL

# Item sizes (bytes) and per-call work, read from the code (see docs/deploy.md)
HEARTBEAT_ITEM = 250
JOB_ITEM = 3_000
NODE_ITEM = 600
JOB_GET_RRU = {"large": 2, "medium": 1, "small": 1}   # consistent GetItem of the job
ATTEMPT_RRU = {"large": 3, "medium": 1, "small": 1}   # consistent GetItem of the attempt
NODE_GSIS_WRITTEN_PER_CALL_IN = 2         # ready_by_type + ready_any, ProjectionType ALL
WRU_PER_JOB, WRU_PER_HOST_START = 50, 34  # lifecycle writes incl. transactions' 2x and GSIs
MAX_JOBS_PER_SCAN = 5000                  # scan.py

# Lambda: memory (GB) and mean billed duration (s)
API_GB, HB_S, NODE_S, OTHER_S = 0.5, 0.035, 0.035, 0.060
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
ENSURE_EVERY_S = 600                      # nodes.py: CreateQueue per node per process

# Prices, us-east-1 list (USD)
APIGW_REST_TIERS = [(333e6, 3.50), (667e6, 2.80), (19e9, 2.38), (math.inf, 1.51)]
APIGW_HTTP_TIERS = [(300e6, 1.00), (math.inf, 0.90)]
LAMBDA_PER_M, LAMBDA_GB_S = 0.20, 0.0000166667
DDB_WRU_PER_M, DDB_RRU_PER_M = 0.625, 0.125          # on-demand, after the Nov 2024 cut
DDB_WCU_HOUR, DDB_RCU_HOUR = 0.00065, 0.00013        # provisioned
SQS_PER_M = 0.40
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
                spec={"ranks": MIX[k][1]}, created_at=now, updated_at=now, attempt=1)
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


def model(gpus: int) -> dict:
    hosts = gpus / GPUS_PER_HOST
    running = {k: gpus * share / ranks for k, (share, ranks, _) in MIX.items()}
    jobs = sum(running.values())
    starts_h = sum(running[k] / MIX[k][2] for k in MIX)
    host_starts_h = sum(running[k] / MIX[k][2] * MIX[k][1] / GPUS_PER_HOST for k in MIX)
    host_share = {k: gpus * MIX[k][0] / GPUS_PER_HOST / hosts for k in MIX}

    hb = hosts / INTERVAL_S
    node = hosts / NODE_INTERVAL_S
    gets = jobs * GET_PER_RUNNING_JOB_PER_MIN / 60
    lifecycle = (starts_h + 2 * host_starts_h) / 3600     # create + STARTED/EXITED per host
    api = hb + node + gets + lifecycle
    containers = api * API_CONCURRENCY_PER_RPS

    sc = scan(running)
    reconcile_s = 0.1 + hosts * NODE_ITEM / 1e6 * 0.1    # Scan pages of 1 MB, ~0.1 s each
    nudges = starts_h / 3600                             # place_on_nudge, unbatched
    invocations = api + (3 + sc["shards"]) / 60 + nudges
    gb_s = (API_GB * (hb * HB_S + node * NODE_S + (gets + lifecycle) * OTHER_S)
            + (SCAN_GB * sc["scan_total_s"] + PLACE_GB * PLACE_RUN_S
               + RECONCILE_GB * reconcile_s) / 60
            + PLACE_GB * PLACE_RUN_S * nudges)

    # DynamoDB writes per second
    w_beats = hb * GPUS_PER_HOST * math.ceil(HEARTBEAT_ITEM / 1024)
    w_nodes = node * (1 + NODE_GSIS_WRITTEN_PER_CALL_IN)
    w_marks = min(containers, api)                       # <= 1/s per container, 8 keys
    w_life = (WRU_PER_JOB * starts_h + WRU_PER_HOST_START * host_starts_h) / 3600
    wru = w_beats + w_nodes + w_marks + w_life + 1 / 60
    # DynamoDB reads per second
    r_beats = hb * sum(host_share[k] * JOB_GET_RRU[k] for k in MIX)
    r_nodes = node * 2                                   # two consistent GetItems per call-in
    r_gets = gets * 1.5
    scan_hb = sum(running[k] * math.ceil(MIX[k][1] * HEARTBEAT_ITEM / 4096) for k in MIX)
    scan_att = sum(running[k] * ATTEMPT_RRU[k] for k in MIX)   # every scan (issue 11)
    scan_idx = jobs * JOB_ITEM / 4096 * 0.5
    scan_jobs = sum(running[k] * JOB_GET_RRU[k] for k in MIX) if sc["shards"] else 0
    r_scan = (scan_hb + scan_att + scan_idx + scan_jobs + 5) / 60
    r_reconcile = hosts * NODE_ITEM / 4096 * 0.5 / 60
    rru = r_beats + r_nodes + r_gets + r_scan + r_reconcile

    # SQS requests per month
    sends = (host_starts_h * (1 + CANCEL_SHARE) + starts_h) * 730 + sc["shards"] * 60 * 730
    polls = hosts * 3 * 60 * 730                         # 20 s long polls, idle inbox
    deletes = host_starts_h * (1 + CANCEL_SHARE) * 730
    esm = 5 * 3 * 60 * 730
    create_queue = min(node, containers / 2 * hosts / ENSURE_EVERY_S) * SECONDS_PER_MONTH

    m = SECONDS_PER_MONTH
    cost = {
        "API Gateway (REST)": tiered(api * m, APIGW_REST_TIERS),
        "Lambda requests": invocations * m / 1e6 * LAMBDA_PER_M,
        "Lambda GB-s": gb_s * m * LAMBDA_GB_S,
        "DynamoDB writes": wru * m / 1e6 * DDB_WRU_PER_M,
        "DynamoDB reads": rru * m / 1e6 * DDB_RRU_PER_M,
        "SQS": (sends + polls + deletes + esm + create_queue) / 1e6 * SQS_PER_M,
        "CloudWatch Logs (platform lines only)":
            invocations * m * LOG_BYTES_PER_INVOCATION / 1e9 * LOGS_PER_GB,
    }
    return {
        "gpus": gpus, "hosts": hosts, "running_jobs": jobs, "starts_h": starts_h,
        "host_starts_h": host_starts_h, "hb": hb, "node": node, "gets": gets,
        "lifecycle": lifecycle, "api": api, "api_month": api * m, "containers": containers,
        "invocations": invocations, "invocations_month": invocations * m, "gb_s": gb_s,
        "gb_s_month": gb_s * m, **sc, "reconcile_s": reconcile_s,
        "w_beats": w_beats, "w_nodes": w_nodes, "w_marks": w_marks, "w_life": w_life,
        "wru": wru, "r_beats": r_beats, "r_nodes": r_nodes, "r_gets": r_gets,
        "r_scan": r_scan, "r_reconcile": r_reconcile, "rru": rru,
        "sends": sends, "polls": polls, "deletes": deletes, "esm": esm,
        "create_queue": create_queue, "cost": cost, "total": sum(cost.values()),
        "http_api": tiered(api * m, APIGW_HTTP_TIERS),
        "ddb_provisioned_writes": wru / 0.7 * DDB_WCU_HOUR * 730,
        "ready_gsi_wps": node,                          # writes/s on ONE GSI key ("1")
        "job_key_rru": JOB_GET_RRU["large"] * MIX["large"][1] / GPUS_PER_HOST / INTERVAL_S,
        "hb_key_wps": 512 / INTERVAL_S,
    }


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
    line("  node call-ins (hosts / 10 s)", d1, "node")
    line("  job reads; job lifecycle", lambda r: r, lambda r: f"{r['gets']:.2f}; {r['lifecycle']:.3f}")
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
    line("  heartbeats (8 items per POST)", n, "w_beats")
    line("  node call-ins (1 + 2 GSIs)", n, "w_nodes")
    line("  collector ingest marks (<= 1/s/container)", d1, "w_marks")
    line("  job lifecycle", d1, "w_life")
    line("**DynamoDB RRU / s**", n, "rru")
    line("  heartbeat POST: consistent GetItem of the job", n, "r_beats")
    line("  node call-in: 2 consistent GetItems", n, "r_nodes")
    line("  scan (per minute / 60)", d1, "r_scan")
    line("  reconcile nodes Scan (per minute / 60)", d2, "r_reconcile")
    line("SQS requests / month", mil, lambda r: r["sends"] + r["polls"] + r["deletes"] + r["esm"] + r["create_queue"])
    line("  of which agent long polls", mil, "polls")
    line("  of which CreateQueue (per-process ensure)", mil, "create_queue")
    for item in rows[0]["cost"]:
        line(item, usd, lambda r, item=item: r["cost"][item])
    line("**total / month (on-demand, REST API)**", usd, "total")
    line("  API Gateway if HTTP API instead", usd, "http_api")
    line("  DynamoDB writes if provisioned at 70 % use", usd, "ddb_provisioned_writes")
    line("writes/s on the ready_any GSI key (limit 1,000)", n, "ready_gsi_wps")


if __name__ == "__main__":
    main()
