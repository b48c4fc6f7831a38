"""The torch-shaped scenario of bench/stall_sim.py, drawn from real runs.

bench/record_torch.py records real DDP jobs (examples/ddp_train.py, 4 ranks
over 2 agents, ``heartbeat.interval_s`` 1, a scan every second) through the
local stack into ``bench/traces/torch_ddp.json``. This module

1. derives the simulation's parameters from that trace (:func:`shape`): the
   step times (successive ``beat_at`` over step numbers), the agent's post
   spacing (successive receive times of a node's ranks), the spread of the
   ranks' beats within a step, the checkpoint pattern (who pauses, for how
   long, the declared bound, which ranks wait and how far their collective
   marks are ahead of the paused one's, the writer's I/O rate) and the
   collective-wait pattern of a hang (the culprit's mark, how far each peer's
   last beat lies from the culprit's, how far their marks are ahead);
2. simulates many jobs of that shape (:func:`simulate`): each rank's record
   file as the rank-side helper writes it (a beat, a collective mark, a
   pause and its end), each agent's visit once an interval at its own phase
   building the post entries as agent/beats.py does (fresh records only,
   ``age_s``, ``resumed``, the pause's ``remaining_s``, the process sample),
   ingest through ``stall.received``, the heartbeat store's overwrite and
   note semantics, and a scan every ``scan_period_s`` at its own phase
   calling ``judge()`` with the job's settings;
3. reads the same three figures off the real runs (:func:`real`): what the
   real stack did (its stall events, ``health.detected_at``, the verdict, the
   outcome), not a replay.

Figures: false alarms per job-hour of the checkpoint jobs, the detection
delay of a hang (the culprit's last ``beat_at`` to the scan that convicted),
and the share of hangs whose ``verdict.rank`` is the culprit. :func:`agree`
is the rule they are compared by.
"""
from __future__ import annotations

import bisect
import json
import math
import pathlib
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "agent" / "rankside"))
from gpujobs_heartbeat import EXIT_MAX_S  # noqa: E402 - the helper's own exit pause

from chalicelib.domain.spec import HeartbeatSpec
from chalicelib.domain.stall import judge, received
from chalicelib.domain.threshold import threshold_s

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRACE = ROOT / "bench" / "traces" / "torch_ddp.json"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: the heartbeat store's note: what an entry that is no beat sets when it has it
_NOTED = ("paused_until", "pause_reason", "proc", "sampled_at", "io_at", "active_at",
          "wrote_at", "arrived_seq", "arrived_name")


def load(path: pathlib.Path = TRACE) -> dict:
    return json.loads(path.read_text())


def _rows(run: dict) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for row in run["rows"]:
        d = dict(zip(run["rows_fields"], row))
        out.setdefault(d["rank"], []).append(d)
    return out


def _health(run: dict) -> list[dict]:
    return [dict(zip(run["health_fields"], h)) for h in run["health"]]


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] if xs else float("nan")


# ----------------------------------------------------------------------------- the shape
@dataclass
class Shape:
    ranks: int
    interval_s: float
    scan_period_s: float
    threshold_s: float
    node_of: dict[int, int]
    step_s: list[float]                  # one step, beat to beat (lockstep)
    sleep_s: float                       # of a step, the STEP_S sleep after beat()
    post_gap_s: list[float]              # successive posts of one node's ranks
    beat_spread_s: list[float]           # a rank's beat_at after the step's earliest
    beat_to_receive_s: list[float]       # heard_at - beat_at of a stepping rank (validation)
    stepping_cpu: list[float]
    startup_s: list[float]               # RUNNING to the first beat (torch's import, the rendezvous)
    exit_s: list[tuple]                  # a rank's last beat to its exit recorded: (after, by)
    #: a rank's last training beat to its declared exit pause (the rank-side
    #: helper's atexit: the script is done, the interpreter tears down);
    #: empty for a trace recorded before the helper declared it
    exit_pause_s: list[tuple] = field(default_factory=list)  # (after, by), as exit_s
    ckpts: list[dict] = field(default_factory=list)
    hangs: list[dict] = field(default_factory=list)


def shape(doc: dict) -> Shape:
    interval = float(doc["interval_s"])
    step_s, gaps, spread, b2r, cpu, startup, exits = [], [], [], [], [], [], []
    exit_pauses: list[tuple] = []
    ckpts, hangs = [], []
    node_of = {r: i for i, ranks in enumerate(doc["nodes"]) for r in ranks}
    for run in doc["runs"]:
        by = _rows(run)
        env = run["env"]
        stop = math.inf
        if run["scenario"] == "hang":
            stop = run["fault_at"] if run.get("fault_at") is not None else math.inf
        quiet = []                       # the checkpoint's window: no step times from it
        if run["scenario"] == "ckpt":
            p = [r for rows in by.values() for r in rows if r["paused"]]
            if p:
                quiet = [min(r["t"] for r in p) - 2, max(r["t"] for r in p) + 3]
        if run.get("nodes"):
            names = sorted(set(run["nodes"].values()))
            node_of = {int(r): names.index(n) for r, n in run["nodes"].items()}
        at_step: dict[int, list[float]] = {}
        for rows in by.values():
            prev = None
            heard = sorted({r["last_heard_at"] for r in rows if r["last_heard_at"] is not None})
            for a, b in zip(heard, heard[1:]):
                if b - a < 1.6 * interval and b < stop and not (quiet and quiet[0] < b < quiet[1]):
                    gaps.append(round(b - a, 3))
            for r in rows:
                if r["beat_at"] is None or r["step"] is None or r["beat_at"] >= stop:
                    continue
                in_quiet = quiet and quiet[0] < r["t"] < quiet[1]
                if prev is not None and r["step"] > prev["step"] and r["beat_at"] > prev["beat_at"] \
                        and not in_quiet and r["step"] - prev["step"] <= 10:
                    step_s.append((r["beat_at"] - prev["beat_at"]) / (r["step"] - prev["step"]))
                    b2r.append(r["last_heard_at"] - r["beat_at"])
                    if r["cpu"] is not None:
                        cpu.append(r["cpu"])
                if not in_quiet:
                    at_step.setdefault(r["step"], []).append(r["beat_at"])
                prev = r
        for xs in at_step.values():
            if len(xs) == len(by):
                spread += [round(x - min(xs), 3) for x in xs]
        firsts = [r["beat_at"] for rows in by.values() for r in rows if r["beat_at"] is not None]
        if firsts:
            startup.append(min(firsts))
        exits += _exits(run, by)
        exit_pauses += _exit_pauses(run, by)
        if run["scenario"] == "ckpt":
            ckpts.append(_ckpt_pattern(run, by, env))
        if run["scenario"] == "hang" and run.get("fault_at") is not None:
            hangs.append(_hang_pattern(run, by, env))
    thr = threshold_s(int(doc["ranks"]), 3600.0 / doc["stack"]["scan_period_s"], interval,
                      HeartbeatSpec.miss_probability,
                      HeartbeatSpec.false_positive_budget_per_hour)
    recorded = {run["threshold_s"] for run in doc["runs"] if run.get("threshold_s")}
    assert recorded <= {thr}, f"the stack's threshold {recorded} is not threshold_s()'s {thr}"
    sleep = float(doc["runs"][0]["env"].get("STEP_S", 0))
    return Shape(int(doc["ranks"]), interval, float(doc["stack"]["scan_period_s"]), thr, node_of,
                 step_s, sleep, gaps, spread, b2r, cpu, startup, exits, ckpts=ckpts,
                 hangs=hangs, exit_pause_s=exit_pauses)


def _exit_pauses(run: dict, by: dict) -> list[tuple]:
    """How long after its last training beat a rank that finished was seen in
    its exit pause: between the poll before /ranks first showed it paused
    past the last step and that poll, as ``_exits`` reads an exit."""
    steps = int(run["env"].get("STEPS", 0))
    out = []
    for rows in by.values():
        last = next((r for r in rows if r["step"] == steps - 1 and r["beat_at"] is not None),
                    None)
        paused = None if last is None else next(
            (r for r in rows if r["t"] >= last["t"] and r["paused"]), None)
        if paused is None:
            continue
        i = bisect.bisect_left(run["polls"], paused["t"])
        before = max(last["beat_at"], run["polls"][i - 1] if i > 0 else last["beat_at"])
        out.append((round(before - last["beat_at"], 3), round(paused["t"] - last["beat_at"], 3)))
    return out


def _exits(run: dict, by: dict) -> list[tuple]:
    """How long after its last beat a rank that finished training was recorded
    exited: between the poll before /ranks showed it exited and that poll.
    Ranks the agent stopped (a restart after a stall) are left out: their own
    exit was not seen, only that it took longer than the stall's detection
    (a rank that exited on its own meanwhile is ``exited``, not ``stopped``)."""
    steps = int(run["env"].get("STEPS", 0))
    out = []
    for rows in by.values():
        for prev, r in zip(rows, rows[1:]):
            if r["status"] == "exited" and prev["status"] not in ("exited", "stopped") \
                    and prev["step"] == steps - 1 and prev["beat_at"] is not None:
                i = bisect.bisect_left(run["polls"], r["t"])
                before = run["polls"][i - 1] if i > 0 else prev["t"]
                out.append((round(before - prev["beat_at"], 3), round(r["t"] - prev["beat_at"], 3)))
    return out


def _ckpt_pattern(run: dict, by: dict, env: dict) -> dict:
    """Who paused, for how long (its last step beat to its first beat after
    the pause, the ``alive()`` leaving it), the declared bound, the waiting
    ranks' statuses and how far their marks were ahead of the paused one's."""
    steps = int(env["STEPS"])
    # the checkpoint's pause, not the exit's (after the last step, every rank)
    paused = sorted({r["rank"] for rows in by.values() for r in rows
                     if r["paused"] and r["step"] is not None and r["step"] < steps - 1})
    out = {"paused": paused, "step": int(env["CKPT_STEP"]), "steps": steps,
           "bound_s": float(env.get("CKPT_S", 30)) + 60.0}
    if not paused:
        return {**out, "pause_s": None}
    p = paused[0]
    rows = by[p]
    first = next(r for r in rows if r["paused"] and r["step"] < steps - 1)
    after = next((r for r in rows if r["t"] > first["t"] and not r["paused"]
                  and r["beat_at"] is not None and r["beat_at"] > first["beat_at"] + 1), None)
    out["pause_s"] = None if after is None else round(after["beat_at"] - first["beat_at"], 3)
    resumed = next((r for r in rows if r["t"] > first["t"] and not r["paused"]), None)
    window = (first["t"], resumed["t"] if resumed else math.inf)
    seq_p = first["seq"]
    ahead, statuses = [], []
    for rank, rs in by.items():
        if rank in paused:
            continue
        inside = [r for r in rs if window[0] <= r["t"] < window[1]]
        seqs = [r["seq"] for r in inside if r["seq"] is not None]
        if seqs and seq_p is not None:
            ahead.append(statistics.mode(seqs) - seq_p)
        statuses += [r["status"] for r in inside]
    out["marks_ahead"] = ahead
    out["waiting_share"] = round(statuses.count("waiting") / max(1, len(statuses)), 3)
    wr = [r["write_bps"] for r in rows if window[0] <= r["t"] < window[1] and r["write_bps"]]
    out["write_bps"] = int(statistics.median(wr)) if wr else 0
    return out


def _hang_pattern(run: dict, by: dict, env: dict) -> dict:
    """The culprit's last beat and mark; each peer's last beat relative to
    the culprit's, its final mark ahead of the culprit's, and its last
    receive after the culprit's last beat (when it went quiet)."""
    c = run["culprit"]
    fault = run["fault_at"]
    final = {rank: rows[-1] for rank, rows in by.items()}
    live_final = {}
    for rank, rows in by.items():   # the last row before the job was stopped
        rs = [r for r in rows if r["status"] not in ("stopped", "exited")]
        live_final[rank] = rs[-1] if rs else final[rank]
    cf = live_final[c]
    peers = {rank: {"beat_off_s": round(f["beat_at"] - fault, 3),
                    "quiet_after_s": round(f["last_heard_at"] - fault, 3),
                    "marks_ahead": None if f["seq"] is None or cf["seq"] is None
                    else f["seq"] - cf["seq"]}
             for rank, f in live_final.items() if rank != c}
    return {"culprit": c, "step": int(env["HANG_STEP"]), "culprit_seq": cf["seq"],
            "culprit_quiet_after_s": round(cf["last_heard_at"] - fault, 3), "peers": peers}


# ----------------------------------------------------------------------------- simulation
def _dt(x: float | None) -> datetime | None:
    return None if x is None else T0 + timedelta(seconds=x)


@dataclass
class _Write:
    """The rank's record file after one write (gpujobs_heartbeat._flush)."""
    t: float
    step: int
    beat_t: float
    seq: int | None
    name: str | None
    deadline: float          # 0: no pause


class _Rank:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.writes: list[_Write] = []
        self.times: list[float] = []
        self.busy: list[tuple] = []        # (from, to, write_bps)

    def write(self, t: float, **kw) -> None:
        last = self.writes[-1] if self.writes else _Write(0.0, 0, 0.0, None, None, 0.0)
        w = _Write(t, kw.get("step", last.step), kw.get("beat_t", last.beat_t),
                   kw.get("seq", last.seq), kw.get("name", last.name),
                   kw.get("deadline", last.deadline))
        self.writes.append(w)
        self.times.append(t)

    def at(self, t: float) -> tuple[int, _Write | None]:
        i = bisect.bisect_right(self.times, t) - 1
        return i, (self.writes[i] if i >= 0 else None)


def _job(sh: Shape, rng: random.Random, kind: str) -> tuple[list[_Rank], float, dict]:
    """The ranks' record writes for one job: ``ckpt`` (healthy, one declared
    checkpoint of a rank while the others wait in the barrier) or ``hang``
    (the culprit stops before a step's forward, its peers in its all-reduce)."""
    ranks = [_Rank(r) for r in range(sh.ranks)]
    spread = {r.rank: rng.choice(sh.beat_spread_s) for r in ranks}
    t = rng.choice(sh.startup_s)       # the first beat, after the job's start
    seq = 1
    info: dict = {}
    if kind == "ckpt":
        pat = rng.choice([c for c in sh.ckpts if c.get("pause_s")])
        steps, ck = pat["steps"], pat["step"]
        ahead = max(1, statistics.mode(pat.get("marks_ahead") or [1]))
        hang_step, culprit = None, None
    else:
        pat = rng.choice(sh.hangs)
        steps, ck = 10 ** 6, None
        hang_step, culprit = pat["step"], pat["culprit"]
        info["culprit"] = culprit
    compute = max(0.002, statistics.median(sh.step_s) - sh.sleep_s)
    step = 0
    while step < steps:
        dur = rng.choice(sh.step_s)
        b = t + dur
        if step == hang_step:
            # the culprit sleeps before the forward; its peers mark the
            # forward and their bucket, then wait in the all-reduce
            info["fault_at"] = ranks[culprit].writes[-1].beat_t
            for r in ranks:
                if r.rank == culprit:
                    continue
                ahead = pat["peers"].get(r.rank, pat["peers"].get(str(r.rank), {}))
                n = ahead.get("marks_ahead") or 2
                arrive = b - compute + spread[r.rank]
                for i in range(n):
                    r.write(arrive + 0.001 * i, seq=seq + i + 1, name="ddp_allreduce")
            return ranks, math.inf, info
        for r in ranks:
            bt = b + spread[r.rank]
            r.write(bt - compute, seq=seq + 1, name="ddp_forward")
            r.write(bt - compute / 2, seq=seq + 2, name="ddp_allreduce")
            r.write(bt, step=step, beat_t=bt)
        seq += 2
        t = b
        if step == ck:
            pause = pat["pause_s"] - dur  # its last step beat to the beat leaving the pause
            end = t + pause
            for r in ranks:
                bt = t + spread[r.rank]
                if r.rank in pat["paused"]:
                    r.write(bt + 0.001, deadline=bt + 0.001 + pat["bound_s"])
                    r.busy.append((bt + 0.5, end - 0.5, pat["write_bps"]))
                    r.write(end + spread[r.rank], beat_t=end + spread[r.rank], deadline=0.0)
                    r.write(end + spread[r.rank] + 0.001, seq=seq + 1, name="barrier")
                else:   # in the barrier, marks ahead of the paused rank's as recorded
                    r.write(bt + 0.001, seq=seq + ahead, name="barrier")
            seq += ahead
            t = end
            info["pause"] = (t - pause, t)
        step += 1
    # the end: the weights' all_gather (a mark), then the process group's and
    # the interpreter's teardown until each node's agent records its exits
    info["last_beat"] = t
    exits = {}
    for node in sorted(set(sh.node_of.values())):
        lo, hi = rng.choice(sh.exit_s)
        exits[node] = t + rng.uniform(lo, hi)
    info["exit"] = {r.rank: exits[sh.node_of[r.rank]] for r in ranks}
    for r in ranks:
        r.write(t + spread[r.rank] + sh.sleep_s, seq=seq + 1, name="all_gather")
        if sh.exit_pause_s:  # the helper's atexit: a beat and a pause of EXIT_MAX_S
            at = t + spread[r.rank] + rng.uniform(*rng.choice(sh.exit_pause_s))
            if at < info["exit"][r.rank]:
                r.write(at, beat_t=at, deadline=at + EXIT_MAX_S)
    return ranks, max(exits.values()), info


def _proc(r: _Rank, a: float, b: float, stepping: bool, teardown: bool = False) -> dict:
    for lo, hi, bps in r.busy:
        if lo < b and hi > a:
            return {"cpu": 0.5, "state": "D", "io_bps": bps, "write_bps": bps}
    if teardown:
        return {"cpu": 0.25, "state": "R", "io_bps": 0, "write_bps": 0}
    if stepping:
        return {"cpu": 0.02, "state": "S", "io_bps": 6000, "write_bps": 6000}
    return {"cpu": 0.0, "state": "S", "io_bps": 0, "write_bps": 0}


def _run_job(sh: Shape, rng: random.Random, kind: str) -> dict:
    ranks, end, info = _job(sh, rng, kind)
    interval = sh.interval_s
    visits = []                         # (time, node)
    horizon = end + 1.0 if end < math.inf else info["fault_at"] + 60.0
    for node in sorted(set(sh.node_of.values())):
        v = rng.uniform(0.0, interval)
        while v < horizon:
            visits.append((v, node))
            v += rng.choice(sh.post_gap_s)
    scan0 = rng.uniform(0.0, sh.scan_period_s)
    scans = [scan0 + k * sh.scan_period_s
             for k in range(int((horizon - scan0) / sh.scan_period_s) + 1)]
    events = sorted([(v, 0, node) for v, node in visits] + [(s, 1, None) for s in scans])
    store: dict[int, object] = {}
    posted: dict[int, int] = {}
    beat_ns: dict[int, float] = {}
    resumed: dict[int, tuple] = {}
    last_visit: dict[int, float] = {}
    hb = HeartbeatSpec()
    out = {"kind": kind, "convictions": 0, "hours": 0.0, "delay": None, "named": None}
    convicted_before = False
    first_beat = min(r.writes[0].t for r in ranks)
    for t, what, node in events:
        if what == 0:
            prev_v = last_visit.get(node, t - interval)
            last_visit[node] = t
            for r in ranks:
                if sh.node_of[r.rank] != node:
                    continue
                i, w = r.at(t)
                if w is None or info.get("exit", {}).get(r.rank, math.inf) <= t:
                    continue
                fresh = posted.get(r.rank) != i
                stepping = t <= info.get("last_beat", info.get("fault_at", math.inf)) + sh.sleep_s
                entry: dict = {"rank": r.rank}
                if fresh:
                    entry["step"] = w.step
                    if w.beat_t:
                        entry["age_s"] = round(max(0.0, t - w.beat_t), 3)
                        prev = beat_ns.get(r.rank)
                        gap = w.beat_t - prev if prev else 0.0
                        if gap > 2 * interval:
                            resumed[r.rank] = (w.beat_t, gap)
                        beat_ns[r.rank] = w.beat_t
                    if r.rank in resumed:
                        entry["resumed"] = {"age_s": round(max(0.0, t - resumed[r.rank][0]), 3),
                                            "gap_s": round(resumed[r.rank][1], 3)}
                    if w.seq is not None:
                        entry["collective"] = {"seq": w.seq, "name": w.name}
                    posted[r.rank] = i
                if w.deadline > t:
                    entry["pause"] = {"reason": "checkpoint", "remaining_s": round(w.deadline - t, 3)}
                entry["proc"] = _proc(r, prev_v, t, stepping and not w.deadline > t,
                                      t > info.get("last_beat", math.inf) + sh.sleep_s)
                b = received(entry, node_id=f"local-{node + 1}", now=_dt(t))
                if b.heard_at is not None or r.rank not in store:
                    store[r.rank] = b
                else:
                    old = store[r.rank]
                    store[r.rank] = type(old)(**{**old.__dict__, **{
                        k: getattr(b, k) for k in _NOTED if getattr(b, k) is not None}})
            continue
        if kind == "ckpt" and t >= end:
            break                        # every rank exited: the job is over
        if t < first_beat or len(store) < sh.ranks:
            continue
        ex = info.get("exit", {})
        beats = [replace(store[r], ended="exited") if ex.get(r, math.inf) <= t else store[r]
                 for r in sorted(store)]
        v = judge(beats, now=_dt(t), started_at=_dt(0.0),
                  threshold_s=sh.threshold_s, startup_grace_s=hb.startup_grace_s,
                  interval_s=interval, mode="auto", max_busy_s=hb.max_busy_s,
                  idle_s=hb.idle_s,
                  # the scan's own rule: once a rank exited 0 the job is finishing
                  finishing=any(ex.get(r, math.inf) <= t for r in store))
        stalled = bool(v.stalled)
        if kind == "ckpt":
            if stalled:                  # on_stall restart: this attempt ends here
                out["convictions"] += 1
                p = info.get("pause", (math.inf, math.inf))
                out["cause"] = ("exit" if t > info["last_beat"] else "checkpoint"
                                if p[0] <= t <= p[1] + 2 * sh.threshold_s else "other")
                end = t
                break
            continue
        if t < info["fault_at"]:
            if stalled and not convicted_before:
                out["convictions"] += 1
            convicted_before = stalled
            continue
        if stalled:
            c = info["culprit"]
            out["delay"] = t - (store[c].beat_at - T0).total_seconds()
            out["named"] = v.culprit is not None and v.culprit["rank"] == c
            out["by"] = v.culprit and v.culprit["by"]
            break
    out["hours"] = ((end if end < math.inf else info["fault_at"]) - 0.0) / 3600.0
    return out


@dataclass
class Figures:
    fa: int = 0
    hours: float = 0.0
    delays: list = field(default_factory=list)
    hangs: int = 0
    named: int = 0
    missed: int = 0
    by: dict = field(default_factory=dict)
    causes: dict = field(default_factory=dict)

    @property
    def fa_per_h(self) -> float:
        return self.fa / self.hours if self.hours else 0.0

    @property
    def delay_s(self) -> float:
        return statistics.median(self.delays) if self.delays else float("nan")

    @property
    def named_share(self) -> float:
        return self.named / self.hangs if self.hangs else float("nan")


def simulate(sh: Shape, jobs: int, seed: int) -> Figures:
    """``jobs`` checkpoint jobs and ``jobs`` hangs of the recorded shape."""
    rng = random.Random(seed * 1_000_003 + 23)
    f = Figures()
    for _ in range(jobs):
        r = _run_job(sh, rng, "ckpt")
        f.fa += r["convictions"]
        f.hours += r["hours"]
        if r["convictions"]:
            f.causes[r["cause"]] = f.causes.get(r["cause"], 0) + 1
    for _ in range(jobs):
        r = _run_job(sh, rng, "hang")
        f.hangs += 1
        if r["delay"] is None:
            f.missed += 1
            continue
        f.delays.append(r["delay"])
        f.named += bool(r["named"])
        f.by[r["by"]] = f.by.get(r["by"], 0) + 1
    return f


# ----------------------------------------------------------------------------- the real runs
def real(doc: dict) -> Figures:
    """What the real stack did: stall events of the checkpoint runs per job-hour
    of running, and per hang its detection (health.detected_at, the scan's
    clock) after the culprit's last beat_at, and whether its verdict named it."""
    f = Figures()
    for run in doc["runs"]:
        hs = _health(run)
        span, since = 0.0, None           # seconds RUNNING, every attempt
        for h in hs:
            if h["state"] == "RUNNING" and since is None:
                since = h["t"]
            elif h["state"] != "RUNNING" and since is not None:
                span, since = span + h["t"] - since, None
        if since is not None:
            span += run["polls"][-1] - since
        if run["scenario"] == "ckpt":
            f.fa += len(run["stalls"])
            f.hours += span / 3600.0
            for st in run["stalls"]:
                c = _cause(run, st["detected_at"])
                f.causes[c] = f.causes.get(c, 0) + 1
        elif run["scenario"] == "hang":
            f.hangs += 1
            det = [h["detected_at"] for h in hs if h["detected_at"] is not None]
            if not det and run["stalls"]:
                det = [run["stalls"][0]["detected_at"]]
            if not det or run.get("fault_at") is None:
                f.missed += 1
                continue
            f.delays.append(round(det[0] - run["fault_at"], 3))
            named = [h for h in hs if h["verdict_rank"] is not None]
            rank = named[0]["verdict_rank"] if named else (run["stalls"] or [{}])[0].get("rank")
            f.named += rank == run["culprit"]
            by = named[0]["verdict_by"] if named else None
            f.by[by] = f.by.get(by, 0) + 1
    return f


def _cause(run: dict, at: float) -> str:
    """What a healthy job was doing when it was convicted: exiting (every rank
    past its last step), in its checkpoint (a rank paused or waiting), else other."""
    steps = int(run["env"].get("STEPS", 0))
    last = {}
    for rank, rows in _rows(run).items():
        before = [r for r in rows if r["t"] <= at]
        if before:
            last[rank] = before[-1]
    if last and all(r["step"] == steps - 1 for r in last.values()):
        return "exit"
    if any(r["paused"] or r["status"] == "waiting" for r in last.values()):
        return "checkpoint"
    return "other"


def healthy_false_alarms(doc: dict) -> tuple[int, float]:
    """Stall events of the runs that beat without a checkpoint, and their hours."""
    n, hours = 0, 0.0
    for run in doc["runs"]:
        if run["scenario"] == "beats":
            n += len(run["stalls"])
            hours += (run["polls"][-1] - run["polls"][0]) / 3600.0
    return n, hours


RULE = ("agree when: detection delays (medians) within max(1 interval, 25 %) of each "
        "other; named shares within 0.10; false alarms per job-hour both zero, or within "
        "a factor of 2")


def agree(sim: Figures, rl: Figures, interval_s: float) -> tuple[bool, list[str]]:
    why = []
    d_ok = abs(sim.delay_s - rl.delay_s) <= max(interval_s, 0.25 * rl.delay_s)
    why.append(f"delay {'ok' if d_ok else 'DIFFERS'}")
    n_ok = abs(sim.named_share - rl.named_share) <= 0.10
    why.append(f"named {'ok' if n_ok else 'DIFFERS'}")
    a, b = sim.fa_per_h, rl.fa_per_h
    fa_ok = (a == 0 and b == 0) or (a > 0 and b > 0 and max(a, b) <= 2 * min(a, b))
    why.append(f"false alarms {'ok' if fa_ok else 'DIFFER'}")
    return d_ok and n_ok and fa_ok, why
