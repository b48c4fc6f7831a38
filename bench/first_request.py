"""First request of each handler in a fresh interpreter, against the same handler warm.

A cold Lambda container imports the app (measured apart, by bench/endpoints.py's
cold-start line), then serves its first request: that request builds the
services, makes the AWS clients it needs from the container's one botocore
session, compiles the schemas it validates with. This module measures, for every
HTTP route and scheduled function, the CPU time of that first call over the
median of the warm calls that follow, each in a fresh Python process.

The AWS side is a moto server in the parent process (infra/template.yaml
deployed into it), so a child's CPU time is the app's alone. The parent sets up
what the handlers act on (a node, a RUNNING 4-rank job with heartbeats, PENDING
jobs to cancel) through the app itself.

Used by bench/endpoints.py (section "first request per handler") and
bench/scale.py (``first_request_ms``). Run alone: ``python bench/first_request.py
[--runs N] [--quick]``
(``--quick``: one run of two handlers, for the smoke test).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

TENANT_TOKEN, AGENT_TOKEN = "fr-tenant", "fr-agent"
WARM_CALLS = 5
HANDLERS = ("create", "get", "list", "list_state", "cancel", "attempts", "event",
            "heartbeats", "ranks", "node_put", "nodes", "place", "scan", "reconcile")
#: with --quick, the first request of these only (one route, one scheduled function)
QUICK_HANDLERS = ("create", "scan")
BODY = {"name": "first-request", "command": ["python", "train.py"], "ranks": 1,
        "gpus_per_rank": 1, "gpu_type": "NONE-SUCH"}


# -- child: one fresh interpreter, one handler ------------------------------------------
def child(handler: str) -> None:
    fx = json.loads(os.environ["FR_FIXTURES"])
    from chalice.test import Client

    import app as gpujobs  # imported as Lambda would, before the first request

    client = Client(gpujobs.app, stage_name="dev", project_dir=str(ROOT))
    tenant = {"Authorization": f"Bearer {TENANT_TOKEN}", "Content-Type": "application/json"}
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}", "Content-Type": "application/json"}
    job, node = fx["job"], fx["node"]
    cancel_ids = iter(fx["cancel"])
    beats = json.dumps({"attempt": 1, "ranks": [{"rank": r, "step": 7} for r in range(4)]})
    started = json.dumps({"type": "STARTED", "ranks": fx["ranks"], "node_id": node})
    node_body = json.dumps({"gpus": 64, "gpu_type": "H100"})

    def http(method: str, path: str, headers: dict, body: str | None = None):
        return getattr(client.http, method)(path, headers=headers,
                                            **({"body": body} if body is not None else {}))

    calls = {
        "create": lambda: http("post", "/v1/jobs", {**tenant, "Idempotency-Key": uuid.uuid4().hex},
                               json.dumps(BODY)),
        "get": lambda: http("get", f"/v1/jobs/{job}", tenant),
        "list": lambda: http("get", "/v1/jobs?page_size=50", tenant),
        "list_state": lambda: http("get", "/v1/jobs?state=RUNNING", tenant),
        "cancel": lambda: http("post", f"/v1/jobs/{next(cancel_ids)}/cancel", tenant),
        "attempts": lambda: http("get", f"/v1/jobs/{job}/attempts", tenant),
        "event": lambda: http("post", f"/v1/jobs/{job}/attempts/1/events", agent, started),
        "heartbeats": lambda: http("post", f"/v1/jobs/{job}/heartbeats", agent, beats),
        "ranks": lambda: http("get", f"/v1/jobs/{job}/ranks", tenant),
        "node_put": lambda: http("put", f"/v1/nodes/{node}", agent, node_body),
        "nodes": lambda: http("get", "/v1/nodes", tenant),
        "place": lambda: client.lambda_.invoke("place", {}),
        "scan": lambda: client.lambda_.invoke("scan", {}),
        "reconcile": lambda: client.lambda_.invoke("reconcile", {}),
    }
    for name in ("place", "scan", "reconcile"):
        event = client.events.generate_cw_event(source="aws.events", detail_type="Scheduled Event",
                                                detail={}, resources=[])
        calls[name] = (lambda n, e: lambda: client.lambda_.invoke(n, e))(name, event)
    call = calls[handler]

    def timed() -> tuple[float, int]:
        t = time.thread_time()
        r = call()
        elapsed = time.thread_time() - t
        status = getattr(r, "status_code", 200)
        if status >= 300:
            raise SystemExit(f"{handler}: HTTP {status}: {r.body[:300]!r}")
        body = getattr(r, "body", None) or b""
        return elapsed, len(body if isinstance(body, bytes) else str(body).encode())

    first, size = timed()
    warm = [timed() for _ in range(WARM_CALLS)]
    from chalicelib.adapters import aws
    from chalicelib.config import Config

    cfg = Config.from_env()
    print(json.dumps({"first": first, "warm": statistics.median(w for w, _ in warm),
                      "bytes": max([size] + [b for _, b in warm]),
                      "clients": aws.session_for(cfg.region, cfg.endpoint_url).made()}))


# -- parent: the stack, the fixtures, one child per handler and run ------------------------
class Stack:
    """A moto server with the template deployed and the handlers' fixtures."""

    def __init__(self) -> None:
        from devstack import resources

        self.server = harness.moto_server()
        self.env = resources.deploy(self.server.endpoint_url, stage="fr" + uuid.uuid4().hex[:6])
        self.dir = tempfile.TemporaryDirectory(prefix="gpujobs-fr-")
        tokens = pathlib.Path(self.dir.name) / "tokens.json"
        tokens.write_text(json.dumps([{"token": TENANT_TOKEN, "tenant": "fr"},
                                      {"token": AGENT_TOKEN, "agent": "*"}]))
        self.env["GPUJOBS_TOKENS_FILE"] = str(tokens)

    def fixtures(self, cancels: int) -> dict:
        """The node and RUNNING job (made once), and ``cancels`` new PENDING jobs."""
        if getattr(self, "_base", None) is None:
            self._base = self._setup()
        s, base = self._base
        return {**base, "cancel": [s.jobs.submit("fr", BODY, None)[0]["job_id"]
                                   for _ in range(cancels)]}

    def _setup(self):
        from chalicelib import bootstrap
        from chalicelib.config import Config
        from chalicelib.domain.principal import Principal

        os.environ.update(self.env)
        s = bootstrap.build(Config.from_env())
        node = "fr-node-1"
        s.nodes.register(Principal("agent", "*"), node, {"gpus": 64, "gpu_type": "H100"})
        job, _ = s.jobs.submit("fr", {"command": ["python", "train.py"], "ranks": 4,
                                      "gpus_per_rank": 8, "gpu_type": "H100"}, None)
        job_id = job["job_id"]
        s.placer.run()
        ranks = list(range(4))
        s.attempts.report(Principal("agent", "*"), job_id, 1,
                          {"type": "STARTED", "ranks": ranks, "node_id": node})
        s.heartbeats.ingest(Principal("agent", "*"), job_id,
                            {"attempt": 1, "ranks": [{"rank": r, "step": 1} for r in ranks]})
        return s, {"job": job_id, "node": node, "ranks": ranks}

    def stop(self) -> None:
        self.server.stop()
        self.dir.cleanup()


def measure(runs: int = 3, handlers: tuple[str, ...] = HANDLERS,
            stack: Stack | None = None) -> dict[str, dict]:
    """Median first-request overhead (CPU s) per handler, over ``runs`` fresh
    interpreters each: {handler: {"extra", "first", "warm", "bytes", "clients"}}."""
    own = stack is None
    stack = stack or Stack()
    try:
        env = {**os.environ, **stack.env}
        env.pop("PYTHONPROFILEIMPORTTIME", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        out: dict[str, dict] = {}
        subprocess.run([sys.executable, "-c", "import app"], cwd=ROOT, env=env, check=True)
        for handler in handlers:
            samples = []
            for _ in range(runs):
                fx = stack.fixtures(WARM_CALLS + 1 if handler == "cancel" else 0)
                p = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()),
                                    "--child", handler], cwd=ROOT, capture_output=True,
                                   text=True, env={**env, "FR_FIXTURES": json.dumps(fx),
                                                   "POWERTOOLS_METRICS_DISABLED": "true"})
                if p.returncode:
                    raise RuntimeError(f"first request of {handler} failed:\n{p.stderr[-2000:]}")
                samples.append(json.loads(p.stdout.strip().splitlines()[-1]))
            out[handler] = {
                "extra": statistics.median(s["first"] - s["warm"] for s in samples),
                "first": statistics.median(s["first"] for s in samples),
                "warm": statistics.median(s["warm"] for s in samples),
                "bytes": max(s["bytes"] for s in samples), "clients": samples[-1]["clients"]}
        return out
    finally:
        if own:
            stack.stop()


def report(results: dict[str, dict], runs: int) -> float:
    """Print one line per handler; returns the worst overhead in CPU ms."""
    print(f"first request per handler (fresh interpreter, median of {runs}; CPU ms of the "
          f"first call over the median of {WARM_CALLS} warm calls; the clients it made):")
    for name, r in results.items():
        print(f"  {name:<11} +{r['extra'] * 1e3:6.1f} ms  (first {r['first'] * 1e3:6.1f}, "
              f"warm {r['warm'] * 1e3:5.1f})  {', '.join(r['clients']) or 'no AWS client'}")
    worst = max(results, key=lambda k: results[k]["extra"])
    print(f"first-request: worst +{results[worst]['extra'] * 1e3:.1f} ms ({worst})")
    return results[worst]["extra"] * 1e3


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    runs = harness.pick(args.runs, 3, 1, args.quick)
    report(measure(runs, QUICK_HANDLERS if args.quick else HANDLERS), runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
