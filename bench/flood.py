"""Another tenant's placement during and after a flood of never-fitting jobs,
on the local stack, against its placement on the same stack before the flood
(issue 24, item 6).

    .venv/bin/python bench/flood.py [--quick] [--jobs N] [--clients C] [--rounds R]

Starts the local stack as ``make up`` does (``devstack.stack.start_stack``,
real HTTP, the embedded moto) with one real agent of a GPU type of its own
("fresh", 1 GPU). Then, timed as the wall time from acme's ``POST /v1/jobs``
(1 GPU of that type, ``sleep 1``) until the job is RUNNING (its LAUNCH was
sent and the agent started it), each run waiting for the job to end:

* the baseline: acme's job on the quiet stack, ``--rounds`` times (median);
* during: globex creates ``--jobs`` jobs of a GPU type no node has, at
  priority 1,000,000, ``--clients`` at a time; once half are in, acme's job;
* after: acme's job again, the flood all PENDING.

Then globex cancels 40 of its jobs, ``--clients`` at a time. Printed: the
flood's creates (jobs/s, p50 and max latency), each time and its ratio to the
baseline, the cancels' p50 and max. A time over 60 s is cut at 60 (and
counted so). The last line reads ``flood-bench: during_ratio=<x>
after_ratio=<x> create_p50_ms=<n> cancel_p50_ms=<n>``.
``--quick`` (the smoke test): 16 jobs (two a client), one baseline round.
"""
from __future__ import annotations

import concurrent.futures as cf
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from devstack.stack import Api, start_stack  # noqa: E402
from tests.support.agents import real_agents  # noqa: E402

#: real_agents reads its nodes as e2e-tenant; its agent token is e2e-<node>-agent
TOKENS = [{"token": "e2e-tenant", "tenant": "e2e"}, {"token": "globex", "tenant": "globex"},
          {"token": "acme", "tenant": "acme"}, {"token": "e2e-fresh-agent", "agent": "fresh"}]
FLOOD = {"name": "flood", "command": ["sleep", "1"], "ranks": 1, "gpus_per_rank": 1,
         "gpu_type": "no-such-gpu", "priority": 1_000_000}
ACME = {"name": "acme", "command": ["sleep", "1"], "ranks": 1, "gpus_per_rank": 1,
        "gpu_type": "fresh-gpu"}
CUT_S = 60.0


def to_running(acme: Api) -> float:
    """Seconds from acme's create until its job runs (cut at CUT_S); then its end."""
    start = time.monotonic()
    r = acme.post("/v1/jobs", json=ACME)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    took = CUT_S
    while time.monotonic() - start < CUT_S:
        if acme.get(f"/v1/jobs/{job_id}").json()["state"] in ("RUNNING", "SUCCEEDED"):
            took = time.monotonic() - start
            break
        time.sleep(0.05)
    while acme.get(f"/v1/jobs/{job_id}").json()["state"] not in (
            "SUCCEEDED", "FAILED", "CANCELLED"):
        if time.monotonic() - start > 3 * CUT_S:
            acme.post(f"/v1/jobs/{job_id}/cancel", json={})
            break
        time.sleep(0.2)
    return took


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None, help="the flood's jobs (520)")
    parser.add_argument("--clients", type=int, default=8, help="the flood's concurrency (8)")
    parser.add_argument("--rounds", type=int, default=None, help="baseline rounds (3)")
    args = parser.parse_args()
    jobs = harness.pick(args.jobs, 520, 16, args.quick)
    rounds = harness.pick(args.rounds, 3, 1, args.quick)
    harness.banner("flood", moto_mode="the local stack's embedded")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-bench-flood-"))
    stack = start_stack(tmp, TOKENS)
    try:
        with real_agents(stack.api, {"fresh": (1, "fresh-gpu")}, tmp):
            acme = Api(stack.api, "acme")
            baseline = statistics.median(to_running(acme) for _ in range(rounds))
            clients = [Api(stack.api, "globex") for _ in range(args.clients)]
            made: list[str] = []
            latency: list[float] = []

            def create(i: int) -> None:
                t = time.monotonic()
                r = clients[i % len(clients)].post("/v1/jobs", json=FLOOD)
                latency.append(time.monotonic() - t)
                assert r.status_code == 201, r.text
                made.append(r.json()["id"])

            start = time.monotonic()
            with cf.ThreadPoolExecutor(args.clients) as pool:
                done = [pool.submit(create, i) for i in range(jobs)]
                while len(made) < jobs // 2:
                    time.sleep(0.05)
                during = to_running(acme)
                for f in done:
                    f.result()
            flood_s = time.monotonic() - start
            after = to_running(acme)
            cancels: list[float] = []

            def cancel(i: int) -> None:
                t = time.monotonic()
                r = clients[i % len(clients)].post(f"/v1/jobs/{made[i]}/cancel", json={})
                cancels.append(time.monotonic() - t)
                assert r.status_code in (200, 202), r.text
            with cf.ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(cancel, range(min(40, len(made)))))
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    create_p50 = statistics.median(latency) * 1000
    cancel_p50 = statistics.median(cancels) * 1000
    print(f"flood: {jobs} jobs by {args.clients} clients in {flood_s:.1f} s "
          f"({jobs / flood_s:.1f} jobs/s), create p50 {create_p50:.0f} ms, "
          f"max {max(latency) * 1000:.0f} ms")
    for what, took in (("baseline (quiet stack)", baseline), ("during the flood", during),
                       ("after the flood", after)):
        cut = " (cut: not RUNNING)" if took >= CUT_S else ""
        print(f"acme's job RUNNING after {took:6.2f} s  {what}{cut}  "
              f"ratio {took / baseline:.2f}")
    print(f"cancels of the flood's jobs: p50 {cancel_p50:.0f} ms, max {max(cancels) * 1000:.0f} ms")
    harness.machine_line("flood", during_ratio=f"{during / baseline:.2f}",
                         after_ratio=f"{after / baseline:.2f}",
                         create_p50_ms=f"{create_p50:.0f}", cancel_p50_ms=f"{cancel_p50:.0f}")


if __name__ == "__main__":
    main()
