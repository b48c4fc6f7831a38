"""Load on the local stack over real HTTP: N concurrent clients for a bounded time.

``make bench`` runs ``.venv/bin/python bench/load.py``. It starts a throwaway
local stack (``GPUJOBS_EPHEMERAL=1``, two agents running the jobs), then runs
a *baseline* of one client, then ``--clients`` clients (default 50), each in
its own thread with its own HTTP connection, for ``--seconds`` (default 12;
the baseline for ``--baseline-seconds``, 4). Every client loops over a mix of operations: create (30 %, a third with
an Idempotency-Key), get (25 %), list (20 %, some with a state filter),
cancel (10 %) and heartbeats (15 %, as the agent token for all nodes, for a
job it created: 202 when placed, 409 before). It prints throughput, p50/p99
latency, the count of each status per operation, the scaling ratio of the
loaded run's throughput over the baseline's, and ends with::

    load-bench: clients=50 rps=<x> p99_ms=<y> errors_5xx=<n> retry_after_503=<m>

``errors_5xx`` counts 5xx answers other than ``503`` with ``Retry-After`` (which
a client is told to retry, and is counted on its own) plus transport failures.
The stack is stopped by its own pid whatever happens. ``--quick`` (the smoke
test): 5 clients for 2 s after 1 s of the baseline. See docs/benchmarks.md.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

#: (option, default, --quick): the defaults keep `make bench` under 6 minutes
QUICK = (("clients", 50, 5), ("seconds", 12, 2), ("baseline_seconds", 4, 1))
READY = re.compile(r"ready: API (http://\S+)")
MIX = [("create", 30), ("get", 25), ("list", 20), ("cancel", 10), ("heartbeats", 15)]


def start_stack(folder: pathlib.Path) -> tuple[subprocess.Popen, str]:
    tokens = folder / "tokens.json"
    tokens.write_text(json.dumps([{"token": "load-tenant", "tenant": "load"},
                                  {"token": "load-agent", "agent": "*"}]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PORT": "0", "GPUJOBS_TOKENS_FILE": str(tokens),
             "GPUJOBS_EPHEMERAL": "1", "GPUJOBS_AGENTS": "2", "GPUJOBS_GPUS_PER_AGENT": "8",
             "GPUJOBS_SCAN_PERIOD_S": "5"})
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        m = READY.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    stop_stack(proc)
    raise SystemExit("load-bench: the local stack did not become ready")


def stop_stack(proc: subprocess.Popen) -> None:
    """SIGTERM, then after 20 s SIGKILL to the stack's own process group (its
    agents and their ranks too: it was started in a session of its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            print("!! the local stack did not stop within 20 s of SIGTERM: killed", flush=True)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Results:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.statuses: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self.errors_5xx = 0
        self.retry_after_503 = 0

    def add(self, op: str, status: str, seconds: float, retry_after: bool) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[op][status] += 1
            if status == "503" and retry_after:
                self.retry_after_503 += 1
            elif status.startswith("5") or status == "transport":
                self.errors_5xx += 1


def client(api: str, seconds: float, results: Results, seed: int) -> None:
    rng = random.Random(seed)
    s = requests.Session()
    tenant = {"Authorization": "Bearer load-tenant", "Content-Type": "application/json"}
    agent = {"Authorization": "Bearer load-agent", "Content-Type": "application/json"}
    mine: list[str] = []
    ops, weights = zip(*MIX)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        op = rng.choices(ops, weights)[0]
        if op != "create" and op != "list" and not mine:
            op = "create"
        job = rng.choice(mine) if mine else None
        if op == "create":
            headers = dict(tenant)
            if rng.random() < 1 / 3:
                headers["Idempotency-Key"] = f"k-{seed}-{rng.randrange(50)}"
            call = ("POST", "/v1/jobs", headers,
                    {"command": ["true"], "ranks": rng.choice([1, 2]), "gpus_per_rank": 1})
        elif op == "get":
            call = ("GET", f"/v1/jobs/{job}", tenant, None)
        elif op == "list":
            q = rng.choice(["", "?state=RUNNING", "?page_size=10", "?state=PENDING"])
            call = ("GET", f"/v1/jobs{q}", tenant, None)
        elif op == "cancel":
            call = ("POST", f"/v1/jobs/{job}/cancel", tenant, {"reason": "load"})
        else:
            call = ("POST", f"/v1/jobs/{job}/heartbeats", agent,
                    {"attempt": 1, "ranks": [{"rank": 0, "step": 1}]})
        method, path, headers, body = call
        started = time.perf_counter()
        try:
            r = s.request(method, api + path, headers=headers, timeout=30,
                          data=None if body is None else json.dumps(body))
            status, retry_after = str(r.status_code), "Retry-After" in r.headers
            if op == "create" and r.status_code == 201:
                mine.append(r.json()["id"])
        except requests.RequestException:
            status, retry_after = "transport", False
            s = requests.Session()
        results.add(op, status, time.perf_counter() - started, retry_after)


def run(api: str, clients: int, seconds: float) -> tuple[Results, float]:
    results = Results()
    threads = [threading.Thread(target=client, args=(api, seconds, results, i), daemon=True)
               for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return results, time.monotonic() - started


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else 0.0


def report(name: str, clients: int, results: Results, elapsed: float) -> float:
    n = len(results.latencies)
    rps = n / elapsed if elapsed else 0.0
    print(f"{name}: clients={clients} requests={n} seconds={elapsed:.1f} rps={rps:.1f} "
          f"p50_ms={pct(results.latencies, 0.5):.1f} p99_ms={pct(results.latencies, 0.99):.1f}")
    for op, counts in sorted(results.statuses.items()):
        print(f"  {op:<10} " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return rps


def main() -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--clients", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--baseline-seconds", type=float, default=None)
    args = ap.parse_args()
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))
    with tempfile.TemporaryDirectory(prefix="gpujobs-load-") as folder:
        t = time.monotonic()
        proc, api = start_stack(pathlib.Path(folder))
        print(f"local stack ready in {time.monotonic() - t:.1f} s", flush=True)
        try:
            base, base_s = run(api, 1, args.baseline_seconds)
            base_rps = report("baseline", 1, base, base_s)
            loaded, loaded_s = run(api, args.clients, args.seconds)
            rps = report("loaded", args.clients, loaded, loaded_s)
        finally:
            t = time.monotonic()
            stop_stack(proc)
            print(f"local stack stopped in {time.monotonic() - t:.1f} s", flush=True)
    print(f"scaling: rps({args.clients} clients) / rps(1 client) = "
          f"{rps / base_rps if base_rps else 0:.2f}")
    harness.machine_line("load", clients=args.clients, rps=f"{rps:.1f}",
                         p99_ms=f"{pct(loaded.latencies, 0.99):.1f}",
                         errors_5xx=loaded.errors_5xx, retry_after_503=loaded.retry_after_503)
    return 0


if __name__ == "__main__":
    sys.exit(main())
