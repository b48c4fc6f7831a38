"""Host evidence (issue 11, item 3): the agent samples each rank's real process
group, and posts what it saw with the beats, or alone for a silent rank."""
import os
import signal
import subprocess
import sys
import time

import pytest

from agent.beats import BeatPoster
from agent.procs import ProcSampler
from agent.state import RUNNING, AttemptRecord, RankRecord

from .test_beats import Clock, FakeApi, writer

WRITER = """
import os, sys, time
buf = b"x" * (1 << 20)
with open(sys.argv[1], "wb") as f:
    while True:                       # a checkpoint: writes at a real rate
        f.write(buf); f.flush(); f.seek(0)
        time.sleep(0.005)
"""
READER = """
import sys, time
with open(sys.argv[1], "rb") as f:
    while True:                       # a data loader: reads at a real rate
        f.seek(0); f.read()
        time.sleep(0.005)
"""
SLEEPER = "import time\ntime.sleep(600)"      # a hang: no CPU, no I/O
SPINNER = "while True: pass"                   # a hang spinning on the CPU


@pytest.fixture
def group(tmp_path):
    """Start a real process leading its own process group; kill it by its id."""
    started = []

    def start(code, *args):
        p = subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)
        started.append(p)
        return p
    yield start
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)


def sample_until(sampler, groups, ok, timeout=20.0):
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline:
        seen = sampler.sample(groups)
        if seen and ok(seen):
            return seen
        time.sleep(0.3)
    raise AssertionError(f"never saw the expected sample: {seen}")


def _announced(code: str) -> str:
    """``code`` that first creates the file named by its last argument: it is
    then past its interpreter's start-up, whose reads are real I/O."""
    return "import pathlib, sys\npathlib.Path(sys.argv[-1]).touch()\n" + code


def _wait_for(paths, timeout=20.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never started: {paths}"
        time.sleep(0.02)


def test_the_sampler_tells_a_writer_from_a_sleeper_and_a_spinner(tmp_path, group):
    writer_p = group(WRITER, str(tmp_path / "ckpt.bin"))
    ready = [tmp_path / "sleeper.ready", tmp_path / "spinner.ready"]
    sleeper = group(_announced(SLEEPER), str(ready[0]))
    spinner = group(_announced(SPINNER), str(ready[1]))
    _wait_for(ready)  # sampled from here on: a loaded machine starts them slowly
    sampler = ProcSampler()
    groups = {"w": writer_p.pid, "s": sleeper.pid, "c": spinner.pid}
    seen = sample_until(sampler, groups,
                        lambda s: len(s) == 3 and s["w"]["io_bps"] >= 1 << 20
                        and s["c"]["cpu"] > 0.3 and s["s"]["cpu"] == 0)
    assert seen["s"]["io_bps"] < 4096 and seen["s"]["state"] == "S"
    assert seen["c"]["io_bps"] < 1 << 20 and seen["c"]["state"] == "R"
    assert all(v["procs"] == 1 for v in seen.values())
    assert "gpu_util" not in seen["w"], "no NVML here: the GPU fields are left out"


def test_the_first_sample_has_no_rate_and_a_vanished_group_reads_as_empty(group):
    p = group(SLEEPER)
    sampler = ProcSampler()
    assert sampler.sample({"k": p.pid}) == {}, "a rate needs two samples"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    time.sleep(0.01)
    [v] = sampler.sample({"k": p.pid}).values()
    assert v["procs"] == 0 and v["cpu"] == 0 and v["io_bps"] == 0


def test_nvml_fields_come_from_an_nvml_module_when_present(group):
    p = group(SLEEPER)

    class Fake:
        class P:
            pid, usedGpuMemory = p.pid, 3 << 30

        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetUtilizationRates = staticmethod(lambda h: type("U", (), {"gpu": 97})())
        nvmlDeviceGetComputeRunningProcesses = staticmethod(lambda h: [Fake.P()])
    sampler = ProcSampler(nvml=Fake)
    sampler.sample({"k": p.pid})
    time.sleep(0.05)
    [v] = sampler.sample({"k": p.pid}).values()
    assert v["gpu_util"] == 97 and v["gpu_mem_b"] == 3 << 30


class FakeSampler:
    def __init__(self, by_rank):
        self.by_rank, self.forgotten = by_rank, []

    def sample(self, groups):
        return {k: self.by_rank[k[1]] for k in groups if k[1] in self.by_rank}

    def forget(self, keys):
        self.forgotten += list(keys)

    def keys(self):
        return []


def test_a_silent_or_uninstrumented_rank_is_posted_with_its_sample_alone(tmp_path):
    rec = AttemptRecord(job_id="job_x", attempt=1, phase=RUNNING, ranks=[0, 1, 2],
                        heartbeat_interval_s=1.0)
    for r in (0, 1, 2):
        rec.procs[r] = RankRecord(rank=r, local_rank=r, slots=[r], exit_file="", log_file="",
                                  heartbeat_file=str(tmp_path / f"rank-{r}"), pid=1000 + r)
    sample = {"cpu": 0.0, "io_bps": 250e6, "state": "D", "procs": 2}
    clock, api = Clock(), FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock, wall=lambda: "2026-01-01T00:00:00.000Z",
                        sampler=FakeSampler({0: sample, 1: sample, 2: sample}))
    w0, w1 = writer(rec, 0), writer(rec, 1)
    w0.write(1)
    w1.write(1)
    w1.arrive(None, "allreduce")
    poster.tick([rec])
    by_rank = {e["rank"]: e for e in api.posts[-1][2]}
    assert by_rank[0]["step"] == 1 and by_rank[0]["proc"] == sample
    assert by_rank[1]["collective"] == {"seq": 0, "name": "allreduce"}
    assert by_rank[2] == {"rank": 2, "proc": sample}, "never beat: evidence only"
    clock.ns += int(1e9)
    poster.tick([rec])
    assert all(set(e) == {"rank", "proc"} for e in api.posts[-1][2]), \
        "silent ranks: their sample is posted, never a beat"


def test_the_sampler_tells_writes_from_reads(tmp_path, group):
    # a checkpoint writes, a data loader reads: only writes keep excusing a
    # silent rank beyond two intervals, so the sample says which is which
    (tmp_path / "data.bin").write_bytes(b"y" * (1 << 20))
    w, r = group(WRITER, str(tmp_path / "ckpt.bin")), group(READER, str(tmp_path / "data.bin"))
    sampler = ProcSampler()
    seen = sample_until(sampler, {"w": w.pid, "r": r.pid},
                        lambda s: len(s) == 2 and s["w"]["write_bps"] >= 1 << 20
                        and s["r"]["io_bps"] >= 1 << 20)
    assert seen["r"]["write_bps"] < 1 << 20
    assert seen["w"]["io_bps"] >= seen["w"]["write_bps"]


def _children(pid: int) -> list[int]:
    try:
        text = open(f"/proc/{pid}/task/{pid}/children").read()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def test_a_sigstopped_rank_reads_as_stopped_not_as_its_shims_sleep(tmp_path, group):
    """The shim sleeps in wait() for the command's whole life: the state posted is
    the command's own, so a SIGSTOPped rank shows T (issue 23, item 4)."""
    from agent.ranks import SHIM
    shim = subprocess.Popen(
        [sys.executable, "-I", str(SHIM), "--exit-file", str(tmp_path / "exit.json"), "--",
         sys.executable, "-c", _announced(SLEEPER), str(tmp_path / "ready")],
        start_new_session=True)
    rank = None
    try:
        _wait_for([tmp_path / "ready"])
        deadline = time.monotonic() + 20
        while not (kids := _children(shim.pid)):
            assert time.monotonic() < deadline, "the shim never started its command"
            time.sleep(0.02)
        [rank] = kids
        sampler = ProcSampler()
        seen = sample_until(sampler, {"r": shim.pid},
                            lambda s: s["r"]["procs"] == 2 and s["r"]["state"] == "S")
        os.kill(rank, signal.SIGSTOP)
        seen = sample_until(sampler, {"r": shim.pid}, lambda s: s["r"]["state"] == "T")
        assert seen["r"]["procs"] == 2
        with open(f"/proc/{shim.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] != "T", "the shim itself is not stopped"
        os.kill(rank, signal.SIGCONT)
        sample_until(sampler, {"r": shim.pid}, lambda s: s["r"]["state"] == "S")
    finally:
        if rank is not None:
            try:
                os.kill(rank, signal.SIGCONT)
                os.kill(rank, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(shim.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shim.wait(timeout=10)
