"""What each operation of the control plane costs in requests and capacity units,
counted on moto by running the real service code: the input of docs/capacity_model.py.

``.venv/bin/python bench/op_counts.py`` from the repository root;
``--write docs/op_counts.json`` records the counts the model reads
(tests/test_capacity_model.py fails when the file differs from a fresh count).

An embedded moto server (devstack/motoserver.py) with the stack of
infra/template.yaml; the services built by ``bootstrap.build`` on a clock the
bench moves; HTTP operations go through the app's routes (bench/endpoints.py's
``LambdaHTTP``) with a tenant or an agent token, the scheduled ones call the
service as the schedule does. Every botocore client is hooked
(``harness.install_request_counter``): each request is counted by service and
operation, and its capacity by DynamoDB's documented rules, not by moto's
``ConsumedCapacity``:

- writes (``harness.write_units``): 1 WRU per started KB of the larger of
  the item before and after, twice in a transaction, plus each GSI entry put
  or deleted (both when its key changed, one when a projected attribute did);
- reads (here): GetItem / BatchGetItem 1 RRU per started 4 KB of the item,
  Query / Scan the summed size of the items read (before any filter, every
  attribute), rounded up to 4 KB; at least one unit a request or item;
  half if eventually consistent (every index read), twice in a transaction.

Read sizes come from the same request sent again, without its filter and
projection, on a client that is not counted. Every key written or read is
recorded with its ids replaced by ``<job>``, ``<node>``, ``<tenant>``: what
the model needs to find each table's and index's hottest key.

Operations (after a warm-up, caches as in steady state): one host's heartbeat
POST (8 ranks of an 8-, 64- and 256-rank job), the same POST carrying the
node's call-in (a busy host's one request an interval: 8 ranks of the 8-rank
job), a node call-in by PUT with nothing changed (an idle host's; both
averaged over one ``ensure`` period of call-ins), GET job, a stall
scan with one running job of 8, 64 and 256 ranks (``Scanner.run``, minus an
idle scan), an idle placement run, the reconcile, a job's lifecycle
(create, placement, STARTED and EXITED per host) of 1 and 2 hosts, and the
usage rollup of an attempt held 0, 1 and 25 hours.
"""
from __future__ import annotations

import collections
import datetime as dt
import json
import math
import pathlib
import re
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.runner import Settings  # noqa: E402
from bench import harness  # noqa: E402
from bench.harness import Fail, item_size  # noqa: E402

STAGE = "opc"
TENANT, TENANT_TOKEN, AGENT_TOKEN = "octenant", "oc-tenant", "oc-agent"
RANKS_PER_HOST = 8
INTERVAL_S = 10
SIZES = (8, 64, 256)
SPARE = "oc-node-spare"
#: a busy agent's call-in period (its posts show it alive in between)
BUSY_CALL_IN_S = Settings.busy_call_in_s
RECONCILE_PERIOD_S = 60      # app.py: the reconcile runs once a minute
KEY_IDS = ((re.compile(r"job_[0-9A-Za-z]+"), "<job>"), (re.compile(r"oc-node-[\w-]+"), "<node>"),
           (re.compile(TENANT), "<tenant>"),
           # the usage table's due items: a shard by the job id's hash
           (re.compile(r"due#\d+"), "due#<0..15>"))
#: the floor per host per interval: one request, one item under 1 KB
FLOOR = {"requests": 1, "wru": 1}


def generic(key: Any) -> str:
    text = str(key)
    for pattern, name in KEY_IDS:
        text = pattern.sub(name, text)
    return text


# -- DynamoDB's read rules ------------------------------------------------------------
def read_units(sizes: list[int], consistent: bool, per_item: bool) -> float:
    """RRUs of one read: per item (GetItem, BatchGetItem) or of the summed size
    (Query, Scan), 4 KB a unit, at least one; half if eventually consistent."""
    units = (sum(max(1, math.ceil(s / 4096)) for s in sizes) if per_item
             else max(1, math.ceil(sum(sizes) / 4096)))
    return units if consistent else units / 2


def _used(params: dict, texts: list[str]) -> dict:
    """The request's names and values that the kept expressions still use."""
    out = {k: v for k, v in params.items() if k not in (
        "FilterExpression", "ProjectionExpression", "Select", "AttributesToGet",
        "ExpressionAttributeNames", "ExpressionAttributeValues", "ReturnConsumedCapacity")}
    words = set(re.findall(r"[#:]\w+", " ".join(texts)))
    for part in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
        kept = {k: v for k, v in params.get(part, {}).items() if k in words}
        if kept:
            out[part] = kept
    return out


class Meter(harness.write_units):
    """``harness.write_units`` plus DynamoDB's read units and the keys touched."""

    def __init__(self, raw) -> None:
        super().__init__()
        self.raw, self.rru = raw, 0.0
        self.keys: dict[str, collections.Counter] = {"w": collections.Counter(),
                                                     "r": collections.Counter()}

    def before(self, operation: str, params: dict, context: dict) -> None:
        super().before(operation, params, context)
        if operation in harness.READS:
            try:
                self._read(operation, params)
            except Exception as e:  # noqa: BLE001 - a meter never changes the request
                self.errors += 1
                print(f"!! read meter failed on {operation}: {e!r}", file=sys.stderr)

    def _after(self, status: int, targets: list) -> None:
        for target in targets:   # one at a time: each item's units go to its own key
            table0 = dict(self.by_table)
            super()._after(status, [target])
            for name, units in self.by_table.items():
                if units - table0.get(name, 0):
                    self.keys["w"][self._key_name(name, target)] += units - table0.get(name, 0)

    def _key_name(self, name: str, target: tuple) -> str:
        """``table|hash key`` or ``table/index|index hash key`` of a written item."""
        table, _, index = name.partition("/")
        schema = self.schema(table)
        attr = schema["indexes"][index] if index else schema["hash"]
        _, key, _tx, _check, old = target
        new = harness.moto_item(table, key) or {}
        value = new.get(attr) or (old or {}).get(attr) or key.get(attr)
        return f"{name}|{generic(next(iter(value.values()))) if value else '?'}"

    _schemas: dict[str, dict] = {}

    def schema(self, table: str) -> dict:
        if table not in self._schemas:
            t = self.raw.describe_table(TableName=table)["Table"]
            self._schemas[table] = {
                "hash": t["KeySchema"][0]["AttributeName"],
                "indexes": {i["IndexName"]: i["KeySchema"][0]["AttributeName"]
                            for i in t.get("GlobalSecondaryIndexes", [])}}
        return self._schemas[table]

    def _read(self, operation: str, params: dict) -> None:
        if operation in ("GetItem", "BatchGetItem", "TransactGetItems"):
            gets = ([(params["TableName"], params["Key"], params.get("ConsistentRead", False))]
                    if operation == "GetItem" else
                    [(t, k, r.get("ConsistentRead", False))
                     for t, r in params["RequestItems"].items() for k in r["Keys"]]
                    if operation == "BatchGetItem" else
                    [(g["Get"]["TableName"], g["Get"]["Key"], True)
                     for g in params["TransactItems"]])
            for table, key, consistent in gets:
                item = self.raw.get_item(TableName=table, Key=key).get("Item")
                units = read_units([item_size(item)], consistent, per_item=True)
                units *= 2 if operation == "TransactGetItems" else 1
                self.rru += units
                value = key[self.schema(table)["hash"]]
                self.keys["r"][f"{table}|{generic(next(iter(value.values())))}"] += units
            return
        texts = [params.get("KeyConditionExpression", "")]
        again = _used(params, texts)
        items = getattr(self.raw, "query" if operation == "Query" else "scan")(**again)["Items"]
        units = read_units([item_size(i) for i in items], params.get("ConsistentRead", False),
                           per_item=False)
        self.rru += units
        table, index = params["TableName"], params.get("IndexName")
        name = f"{table}/{index}" if index else table
        if operation == "Query":
            schema = self.schema(table)
            attr = schema["indexes"][index] if index else schema["hash"]
            names = {v: k for k, v in params.get("ExpressionAttributeNames", {}).items()}
            m = re.search(rf"({re.escape(names.get(attr, attr))})\s*=\s*(:\w+)", texts[0])
            value = params["ExpressionAttributeValues"][m.group(2)] if m else {"S": "?"}
            self.keys["r"][f"{name}|{generic(next(iter(value.values())))}"] += units
        else:
            self.keys["r"][f"{name}|<scan>"] += units


# -- the stack ------------------------------------------------------------------------------
class Clock:
    """The services' one clock, moved by the bench; a fixed start, so that the
    items' sizes (times, TTL epochs) are the same in every run."""

    def __init__(self) -> None:
        self.t = dt.datetime(2026, 1, 5, 12, 0, 1, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += dt.timedelta(seconds=seconds)


class Bench:
    def __init__(self) -> None:
        import boto3

        self.server = harness.moto_server()
        url = self.server.endpoint_url
        # the meter's own client, made before the counting hook: not counted
        self.raw = boto3.client("dynamodb", region_name=harness.REGION, endpoint_url=url)
        harness.install_request_counter()
        self.clock = Clock()
        self.services = harness.deploy(STAGE, url, clock=self.clock, tokens=[
            {"token": TENANT_TOKEN, "tenant": TENANT}, {"token": AGENT_TOKEN, "agent": "*"}])
        import app as gpujobs
        from bench.endpoints import LambdaHTTP

        self.http = LambdaHTTP(gpujobs.app)
        self.nodes = 0

    def call(self, method: str, path: str, body: Any = None, agent: bool = False,
             status: int | None = None) -> dict:
        token = AGENT_TOKEN if agent else TENANT_TOKEN
        r = self.http.request(method, path, headers={"Authorization": f"Bearer {token}",
                                                     "Content-Type": "application/json"},
                              body=b"" if body is None else json.dumps(body).encode())
        if r.status_code >= 300 or (status and r.status_code != status):
            raise Fail(f"{method} {path}: HTTP {r.status_code}: {r.body[:300]!r}")
        return r.json_body

    def count(self, fn, times: int = 1, http: int = 0) -> dict:
        """What ``fn()`` costs, averaged over ``times`` calls."""
        harness.CALLS.clear()
        with Meter(self.raw) as m:
            for _ in range(times):
                fn()
        if m.errors:
            raise Fail(f"the write meter failed on {m.errors} requests")
        ops = collections.Counter(f"{s}:{op}" for s, op in harness.CALLS
                                  if s in ("dynamodb", "sqs", "events"))
        n = float(times)
        return {"http": http, "requests": {k: v / n for k, v in sorted(ops.items())},
                "wru": m.total / n, "rru": m.rru / n,
                "keys": {rw: {k: v / n for k, v in sorted(c.items())} for rw, c in m.keys.items()}}

    def node(self, node_id: str) -> None:
        self.call("PUT", f"/v1/nodes/{node_id}", {"gpus": RANKS_PER_HOST, "gpu_type": "H100",
                                                  "labels": {}}, agent=True)

    @staticmethod
    def call_in(node_id: str) -> dict:
        """The call-in of ``node`` as a heartbeat POST carries it."""
        return {"node_id": node_id, "gpus": RANKS_PER_HOST, "gpu_type": "H100", "labels": {}}

    def add_nodes(self, n: int) -> None:
        for _ in range(n):
            self.nodes += 1
            self.node(f"oc-node-{self.nodes}")

    def refresh(self, but: str | None = None) -> None:
        """Every node (``but`` one) calls in (untimed), so none is taken for lost."""
        for node_id in [f"oc-node-{i}" for i in range(1, self.nodes + 1)] + [SPARE]:
            if node_id != but:
                self.node(node_id)

    def create(self, ranks: int) -> str:
        return self.call("POST", "/v1/jobs", {
            "name": "opcounts", "command": ["python", "train.py"], "ranks": ranks,
            "gpus_per_rank": 1, "gpu_type": "H100"}, status=201)["id"]

    def place(self, job_id: str) -> None:
        report = self.services.placer.run()
        if job_id not in report.placed:
            raise Fail(f"{job_id} was not placed: {report}")

    def hosts(self, job_id: str) -> list[tuple[str, list[int]]]:
        return sorted(self.services.store.attempt(job_id, 1).node_ranks.items())

    def event(self, job_id: str, kind: str, node_id: str, ranks: list[int]) -> None:
        body = {"type": kind, "node_id": node_id, "ranks": ranks}
        if kind == "EXITED":
            body["exit_code"] = 0
        self.call("POST", f"/v1/jobs/{job_id}/attempts/1/events", body, agent=True)

    def beat(self, job_id: str, ranks: list[int], step: int, call_in: dict | None = None
             ) -> None:
        body: dict = {"attempt": 1, "ranks": [{"rank": r, "step": step} for r in ranks]}
        if call_in is not None:
            body["call_in"] = call_in
        self.call("POST", f"/v1/jobs/{job_id}/heartbeats", body, agent=True)

    def beat_all(self, job_id: str, step: int) -> None:
        for _, ranks in self.hosts(job_id):
            self.beat(job_id, list(ranks), step)

    # -- the operations ----------------------------------------------------------------
    def measure(self) -> dict:
        s, out = self.services, {}
        self.add_nodes(max(SIZES) // RANKS_PER_HOST)
        self.node(SPARE)
        out["placement_idle"] = self.count(s.placer.run)
        s.scanner.run()
        self.clock.advance(60)
        out["scan_idle"] = self.count(s.scanner.run)
        s.feed.sweep()  # (what the nodes' and earlier jobs' writes left for the feed)
        for hosts in (1, 2):
            out[f"lifecycle_{hosts}_host"], parts = self.lifecycle(hosts)
            if hosts == 1:
                out.update({f"job_{k}": v for k, v in parts.items() if k in ("create", "place")})
                # the tenant feed's part of it: the feed timer numbering the
                # life's events and putting them on the bus (issue 45)
                out["feed_lifecycle"] = self.feed_sweep()
            else:
                s.feed.sweep()
        for ranks in SIZES:
            out.update(self.running_job(ranks))
        self.refresh()
        out["reconcile"] = self.count(s.reconciler.run)
        # a node call-in, nothing changed: the average over ten minutes of
        # them (anything done now and then, as an inbox ensured, shows)
        period = 600 // INTERVAL_S

        def call_in():
            self.clock.advance(INTERVAL_S)
            # the process marked the ingest path within the last second for
            # another host's request (the mark is <= 1 write/s per process)
            s.scanner.collector._last_mark = self.clock.t
            self.node(SPARE)
        out["node_call_in"] = self.count(call_in, period, http=1)
        for ranks in SIZES:
            out[f"scan_{ranks}"] = sub(out[f"scan_{ranks}"], out["scan_idle"])
        out["bench_nodes"] = self.nodes + 1
        out["item_bytes"] = {"job": self.job_bytes,
                             "node": self.size(s.config.nodes_table,
                                               {"node_id": {"S": SPARE}})}
        self.reconcile_alone = out["reconcile"]
        out.update(self.busy_host(4))
        # a busy host's interval: one request, its beat; its call-in rides on
        # one beat in BUSY_CALL_IN_S / INTERVAL_S, and the reconcile (once a
        # minute) reads when it last posted
        beat, carried = out["heartbeat_post_8"], out["heartbeat_call_in_8"]
        out["per_host_interval"] = {"requests": beat["http"], "floor": FLOOR, **{
            f: beat[f] + (carried[f] - beat[f]) * INTERVAL_S / BUSY_CALL_IN_S
            + out["reconcile_busy_host"][f] * INTERVAL_S / RECONCILE_PERIOD_S
            for f in ("wru", "rru")}}
        out.update(self.usage_rolls())  # last: it moves the clock a day on
        return round_all(out)

    def feed_sweep(self) -> dict:
        """The feed timer's sweep of what was told since the last, and how
        many events it numbered."""
        told: list[int] = []
        counted = self.count(lambda: told.append(self.services.feed.sweep()["numbered"]))
        return {**counted, "events": told[0]}

    def lifecycle(self, hosts: int) -> tuple[dict, dict]:
        """A job of ``hosts`` hosts: created, placed, STARTED and EXITED per host."""
        self.refresh()
        parts = {"create": self.count(lambda: setattr(self, "job", self.create(
            hosts * RANKS_PER_HOST)), http=1)}
        job = self.job
        parts["place"] = self.count(lambda: self.place(job))
        parts["started"] = self.count(lambda: [self.event(job, "STARTED", n, list(r))
                                               for n, r in self.hosts(job)], http=hosts)
        self.beat_all(job, 1)
        parts["exited"] = self.count(lambda: [self.event(job, "EXITED", n, list(r))
                                              for n, r in self.hosts(job)], http=hosts)
        return add(*parts.values()), parts

    def usage_rolls(self) -> dict:
        """The usage rollup of one attempt's end (issue 46), alone: a job of
        one host with a label, held 0, 1 and 25 hours (a day crossed), its
        EXITED sent with the roll held back, then the roll counted (its
        job read, its cells and marker in transactions, its due item
        deleted). The model scales the hours between."""
        s, out = self.services, {}
        usage = s.usage
        assert usage is not None
        real = usage.roll
        for hours in (0, 1, 25):
            self.refresh()
            job = self.call("POST", "/v1/jobs", {
                "name": "opcounts", "command": ["python", "train.py"], "ranks": RANKS_PER_HOST,
                "gpus_per_rank": 1, "gpu_type": "H100", "labels": {"team": "nlp"}},
                status=201)["id"]
            self.place(job)
            for n, r in self.hosts(job):
                self.event(job, "STARTED", n, list(r))
            self.clock.advance(hours * 3600)
            self.refresh()
            usage.roll = lambda *a, **k: 0  # type: ignore[method-assign]
            try:
                for n, r in self.hosts(job):
                    self.event(job, "EXITED", n, list(r))
            finally:
                usage.roll = real  # type: ignore[method-assign]
            out[f"usage_roll_{hours}h"] = self.count(lambda job=job: real(job, 1))
        return out

    def running_job(self, ranks: int) -> dict:
        """One host's heartbeat POST, GET job and the stall scan of a running job."""
        s, out = self.services, {}
        self.refresh()
        job = self.create(ranks)
        self.place(job)
        for n, r in self.hosts(job):
            self.event(job, "STARTED", n, list(r))
        first = list(self.hosts(job)[0][1])
        self.beat_all(job, 1)
        self.clock.advance(0.5)   # the collector's ingest mark: <= 1/s per process
        out[f"heartbeat_post_{ranks}"] = self.count(lambda: self.beat(job, first, 2), http=1)
        out[f"get_job_{ranks}"] = self.count(lambda: self.call("GET", f"/v1/jobs/{job}"),
                                             http=1)
        for step in (3, 4):     # the second scan: the health as in steady state
            self.clock.advance(60)
            self.beat_all(job, step)
            self.clock.advance(1)
            scan = self.count(s.scanner.run)
        out[f"scan_{ranks}"] = scan
        self.job_bytes = self.size(s.config.jobs_table, {"job_id": {"S": job}})
        for n, r in self.hosts(job):
            self.event(job, "EXITED", n, list(r))
        return out

    def busy_host(self, times: int) -> dict:
        """A busy host (last: its clock would make the scans above see a
        paused collector): the beat of an 8-rank job carrying its node's
        call-in, nothing changed, as a busy agent sends it every
        BUSY_CALL_IN_S; and the reconcile that finds the host silent by its
        call-ins and its beats arriving (the cost of one such host, the
        reconcile of no such host taken out)."""
        s = self.services
        self.refresh()
        job = self.create(RANKS_PER_HOST)
        self.place(job)
        [(host, ranks)] = self.hosts(job)
        self.event(job, "STARTED", host, list(ranks))
        steps = iter(range(1, 10**6))
        self.beat(job, list(ranks), next(steps), call_in=self.call_in(host))

        def carried():
            self.clock.advance(BUSY_CALL_IN_S)
            s.scanner.collector._last_mark = self.clock.t   # as in node_call_in's
            self.beat(job, list(ranks), next(steps), call_in=self.call_in(host))
        out = {"heartbeat_call_in_8": self.count(carried, times, http=1)}
        self.clock.advance(s.config.node_down_after_s + 1)
        self.beat(job, list(ranks), next(steps))
        self.refresh(but=host)
        idle = self.count(s.reconciler.run)
        if idle["wru"]:
            raise Fail(f"a node was marked DOWN: {idle}")
        out["reconcile_busy_host"] = sub(idle, self.reconcile_alone)
        return out

    def size(self, table: str, key: dict) -> int:
        return item_size(self.raw.get_item(TableName=table, Key=key).get("Item"))


def combine(a: dict, b: dict, sign: int) -> dict:
    def merge(x: dict, y: dict) -> dict:
        return {k: x.get(k, 0) + sign * y.get(k, 0) for k in sorted(x.keys() | y.keys())
                if x.get(k, 0) + sign * y.get(k, 0)}
    return {"http": a["http"] + sign * b["http"], "requests": merge(a["requests"], b["requests"]),
            "wru": a["wru"] + sign * b["wru"], "rru": a["rru"] + sign * b["rru"],
            "keys": {rw: merge(a["keys"][rw], b["keys"][rw]) for rw in ("w", "r")}}


def add(*parts: dict) -> dict:
    out = parts[0]
    for p in parts[1:]:
        out = combine(out, p, 1)
    return out


def sub(a: dict, b: dict) -> dict:
    return combine(a, b, -1)


def round_all(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: round_all(v) for k, v in x.items()}
    if isinstance(x, float):
        return int(x) if x == int(x) else round(x, 4)
    return x


def measure() -> dict:
    bench = Bench()
    try:
        return bench.measure()
    finally:
        bench.server.stop()


def table(counts: dict) -> None:
    print(f"{'operation':<22} {'HTTP':>5} {'WRU':>7} {'RRU':>7}  DynamoDB / SQS requests")
    for name, c in counts.items():
        if isinstance(c, dict) and "keys" in c:
            reqs = ", ".join(f"{k.split(':')[1]} {v:g}" for k, v in c["requests"].items())
            print(f"{name:<22} {c['http']:>5g} {c['wru']:>7g} {c['rru']:>7g}  {reqs}")
    p = counts["per_host_interval"]
    print(f"item bytes: {counts['item_bytes']}")
    print(f"per host-interval: requests {p['requests']:g}, WRU {p['wru']:g}, RRU {p['rru']:g} "
          f"(floor: {FLOOR['requests']} request, {FLOOR['wru']} WRU)")


def main() -> None:
    import _quiet  # noqa: F401 - before the app: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

    ap = harness.parser(__doc__)
    ap.add_argument("--write", metavar="FILE", help="record the counts (docs/op_counts.json)")
    args = ap.parse_args()
    harness.banner("op counts", "server")
    counts = measure()
    table(counts)
    print("OPCOUNTS " + json.dumps(counts, sort_keys=True, separators=(",", ":")))
    if args.write:
        pathlib.Path(args.write).write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.write}")
    p = counts["per_host_interval"]
    harness.machine_line("opcounts", requests_per_host_interval=f"{p['requests']:g}",
                         wru_per_host_interval=f"{p['wru']:g}",
                         rru_per_host_interval=f"{p['rru']:g}")


if __name__ == "__main__":
    main()
