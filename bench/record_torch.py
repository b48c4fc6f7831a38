"""Record real DDP runs through the local stack: the traces bench/stall_sim.py
draws its torch-shaped scenario from, and the real figures it is checked against.

    .venv/bin/python bench/record_torch.py [--hangs N] [--ckpts N] [--out PATH]
    make record-torch                       # the same, default settings

Needs the torch virtualenv (``make torch-venv``; GPUJOBS_TORCH_PYTHON names
another). Takes 6 to 9 minutes on 2 cores (365 s for the committed trace).
It starts the local stack as tests/e2e's ``agent_stack`` fixture does (``devstack.stack.start_stack``: two
agents of 4 GPUs, a scan every second, agent grace 2 s) and runs
examples/ddp_train.py as 4 ranks of 2 GPUs (ranks 0-1 on one agent, 2-3 on
the other), ``heartbeat.interval_s`` 1, one job at a time:

* ``ckpt``: healthy, ``INSTRUMENT=full``, rank 0 saves a 30 s checkpoint
  (``CKPT_S=30``, a declared pause with real writes) after step 20 while
  ranks 1-3 wait in the barrier; ``on_stall: restart`` (a false alarm would
  restart it), run to its end;
* ``hang``: ``INSTRUMENT=full``, rank 3 sleeps before the forward of step
  ``HANG_STEP`` (20, 25, 30, ...), its peers block in DDP's all-reduce;
  recorded until the stall is convicted and 8 s more, then cancelled;
* ``beats``: healthy, ``INSTRUMENT=beats`` (beat timing only), 400 steps of
  0.2 s, run to its end.

While a job runs, ``GET /v1/jobs/{id}/ranks`` and ``GET /v1/jobs/{id}`` are
polled every 0.25 s (a poll of both takes about as long again on 2 cores). Per poll, per rank: ``last_heard_at``, ``beat_at``,
``step``, ``status``, ``paused``, the collective's seq and name, the process
sample's state, cpu and I/O rates; a row is kept only when it differs from the
rank's previous one (the poll times are kept apart, so an unchanged rank is
known to have been unchanged). Every time is the server's clock, in seconds
after the job's first poll, rounded to 1 ms. Per job also: the health as it
changed (status, verdict rank/by/text, false alarms), the job's stall events
(their time is ``detected_at``), the outcome, and, for a hang, when the
culprit reached its hang (its last beat: the first poll showing step
``HANG_STEP - 1``, its ``beat_at``).

Writes ``bench/traces/torch_ddp.json`` (about 100-200 KB). That file is
committed: it is data bench/stall_sim.py reads (``--quick`` included),
not a cache. Re-record after a change to the agent's posting, the rank-side
helper or the scan, and commit the new file with the bench's new figures.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from datetime import datetime

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import _quiet  # noqa: E402,F401 - no INFO logs unless GPUJOBS_VERBOSE=1

from devstack.reach import examples  # noqa: E402
from devstack.stack import Api, start_stack  # noqa: E402

TOKENS = [{"token": "bench", "tenant": "bench"}]
DDP = str(examples() / "ddp_train.py")  # where the ranks can read it (devstack/reach.py)
OUT = ROOT / "bench" / "traces" / "torch_ddp.json"
#: the agent_stack fixture's settings (tests/conftest.py)
STACK_ENV = {"GPUJOBS_AGENTS": "2", "GPUJOBS_GPUS_PER_AGENT": "4", "GPUJOBS_SCAN_PERIOD_S": "1",
             "GPUJOBS_AGENT_GRACE_S": "2"}
POLL_S = 0.25
JOB_TIMEOUT_S = 300
AFTER_STALL_S = 8.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _parse(t: str | None) -> datetime | None:
    return None if t is None else datetime.fromisoformat(t.replace("Z", "+00:00"))


def spec(python: str, scenario: str, tmp: pathlib.Path, hang_step: int = 20) -> dict:
    base = {"name": f"record-{scenario}", "command": [python, DDP], "ranks": 4,
            "gpus_per_rank": 2, "heartbeat": {"interval_s": 1}}
    if scenario == "ckpt":
        return {**base, "on_stall": "restart", "max_attempts": 2,
                "env": {"INSTRUMENT": "full", "STEPS": "60", "STEP_S": "0.2", "CKPT_STEP": "20",
                        "CKPT_S": "30", "CKPT_DIR": str(tmp)}}
    if scenario == "hang":
        return {**base, "env": {"INSTRUMENT": "full", "STEPS": "100000", "STEP_S": "0.2",
                                "PG_TIMEOUT_S": "900", "HANG_RANK": "3",
                                "HANG_STEP": str(hang_step)}}
    if scenario == "beats":
        return {**base, "env": {"INSTRUMENT": "beats", "STEPS": "400", "STEP_S": "0.2"}}
    raise ValueError(scenario)


class Recorder:
    """One job's compact trace, times in seconds after its first poll."""

    def __init__(self) -> None:
        self.t0: datetime | None = None
        self.polls: list[float] = []
        self.rows: list[list] = []
        self.health: list[list] = []
        self._last: dict[int, tuple] = {}
        self._last_health: tuple | None = None
        self.nodes: dict[int, str] = {}

    def rel(self, t: str | None) -> float | None:
        x = _parse(t)
        return None if x is None or self.t0 is None else round((x - self.t0).total_seconds(), 3)

    def add(self, ranks: dict, job: dict) -> float:
        now = _parse(ranks["now"])
        if self.t0 is None:
            self.t0 = now
        t = self.rel(ranks["now"])
        self.polls.append(t)
        for r in ranks.get("ranks") or []:
            proc, coll = r.get("proc") or {}, r.get("collective") or {}
            self.nodes.setdefault(r["rank"], r.get("node_id"))
            row = (self.rel(r.get("last_heard_at")), self.rel(r.get("beat_at")), r.get("step"),
                   r.get("status"), int(bool(r.get("paused"))), coll.get("seq"), coll.get("name"),
                   proc.get("state"), None if proc.get("cpu") is None else round(proc["cpu"], 2),
                   proc.get("io_bps"), proc.get("write_bps"), self.rel(proc.get("sampled_at")))
            if self._last.get(r["rank"]) != row:
                self._last[r["rank"]] = row
                self.rows.append([t, r["rank"], *row])
        h = job.get("health") or {}
        v = h.get("verdict") or {}
        hrow = (job["state"], h.get("status"), v.get("rank"), v.get("by"), v.get("text"),
                h.get("false_alarms"), self.rel(h.get("detected_at")))
        if hrow != self._last_health:
            self._last_health = hrow
            self.health.append([t, *hrow])
        return t


def run_job(api: Api, body: dict, scenario: str, hang_step: int | None) -> dict:
    r = api.post("/v1/jobs", json=body)
    r.raise_for_status()
    job_id = r.json()["id"]
    rec = Recorder()
    started = time.monotonic()
    stall_seen_at = None
    cancelled = False
    job: dict = {}
    while time.monotonic() - started < JOB_TIMEOUT_S:
        polled = time.monotonic()
        job = api.get(f"/v1/jobs/{job_id}").json()
        ranks = api.get(f"/v1/jobs/{job_id}/ranks").json()
        if job["state"] in ("RUNNING",) or rec.t0 is not None:
            rec.add(ranks, job)
        if job["state"] in TERMINAL:
            break
        v = (job.get("health") or {}).get("verdict")
        if scenario == "hang" and v and stall_seen_at is None:
            stall_seen_at = time.monotonic()
        if stall_seen_at is not None and not cancelled and \
                time.monotonic() - stall_seen_at > AFTER_STALL_S:
            api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "recorded"})
            cancelled = True
        time.sleep(max(0.0, POLL_S - (time.monotonic() - polled)))
    else:
        api.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "record timeout"})
        for _ in range(60):
            job = api.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in TERMINAL:
                break
            time.sleep(1)
    events = api.get(f"/v1/jobs/{job_id}/events").json()["events"]
    attempts = api.get(f"/v1/jobs/{job_id}/attempts").json()["attempts"]
    stalls = [{"detected_at": rec.rel(e["time"]), "rank": e.get("rank"), "ranks": e.get("ranks"),
               "reason": e.get("reason"), "attempt": e.get("attempt")}
              for e in events if e["type"] == "stalled"]
    started_ev = [rec.rel(e["time"]) for e in events if e["type"] == "started"]
    out = {"scenario": scenario, "job_id": job_id, "env": body["env"],
           "on_stall": body.get("on_stall", "report"), "t0": rec.t0 and rec.t0.isoformat(),
           "started_at": started_ev[0] if started_ev else None,
           "nodes": {str(r): n for r, n in sorted(rec.nodes.items())},
           "threshold_s": (job.get("health") or {}).get("threshold_s"),
           "outcome": {"state": job.get("state"), "exit": job.get("exit"),
                       "attempts": len(attempts), "cancelled_by_recorder": cancelled,
                       "false_alarms": (job.get("health") or {}).get("false_alarms")},
           "stalls": stalls,
           "polls": rec.polls,
           "rows_fields": ["t", "rank", "last_heard_at", "beat_at", "step", "status", "paused",
                           "seq", "name", "state", "cpu", "io_bps", "write_bps", "sampled_at"],
           "rows": rec.rows,
           "health_fields": ["t", "state", "status", "verdict_rank", "verdict_by",
                             "verdict_text", "false_alarms", "detected_at"],
           "health": rec.health}
    if hang_step is not None:
        out["culprit"] = 3
        last = [row for row in rec.rows if row[1] == 3 and row[4] == hang_step - 1]
        # the culprit's last beat(): its beat_at once it was posted with step HANG_STEP - 1
        out["fault_at"] = last[0][3] if last else None
        out["fault_seen_at"] = last[0][0] if last else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hangs", type=int, default=4, help="hang runs (HANG_STEP 20, 25, ...)")
    ap.add_argument("--ckpts", type=int, default=2, help="checkpoint runs")
    ap.add_argument("--beats", type=int, default=1, help="uninstrumented-timing runs")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    args = ap.parse_args(argv)
    python = os.environ.get("GPUJOBS_TORCH_PYTHON") or str(ROOT / ".venv-torch" / "bin" / "python")
    if not os.access(python, os.X_OK):
        sys.exit(f"no torch virtualenv at {python} (make torch-venv builds it)")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-record-torch-"))
    began = time.perf_counter()
    stack = start_stack(tmp, TOKENS, **STACK_ENV)
    runs = []
    try:
        api = Api(stack.api, "bench")
        plan = ([("ckpt", None)] * args.ckpts + [("hang", 20 + 5 * i) for i in range(args.hangs)]
                + [("beats", None)] * args.beats)
        for scenario, hang_step in plan:
            t = time.perf_counter()
            body = spec(python, scenario, tmp, hang_step or 20)
            run = run_job(api, body, scenario, hang_step)
            runs.append(run)
            print(f"{scenario:6} {run['job_id']}: {run['outcome']['state']}, "
                  f"{len(run['polls'])} polls, {len(run['rows'])} rows, stalls "
                  f"{[(s['detected_at'], s['rank']) for s in run['stalls']]}, fault_at "
                  f"{run.get('fault_at')} ({time.perf_counter() - t:.0f} s)", flush=True)
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the stack's folders, the agents' logs
    doc = {"recorded": datetime.now().astimezone().isoformat(timespec="seconds"),
           "stack": {**STACK_ENV, "scan_period_s": float(STACK_ENV["GPUJOBS_SCAN_PERIOD_S"])},
           "poll_s": POLL_S, "interval_s": 1, "ranks": 4, "nodes": [[0, 1], [2, 3]],
           "runs": runs, "wall_s": round(time.perf_counter() - began, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out} "
          f"({args.out.stat().st_size / 1024:.0f} KB) in {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
