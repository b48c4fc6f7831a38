"""``instrument(model)`` with real torch (issue 23, item 2): two ranks over
gloo on CPU, each its own process with its own heartbeat file, as an agent
starts them but without one. DDP's gradient all-reduce is issued by its C++
Reducer, out of reach of the wrapped torch.distributed functions: only the
communication hook and the forward marks that ``instrument`` adds see it. FSDP
(both versions) issues its collectives through torch.distributed's Python
functions, which the wrapping covers."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RANKSIDE = Path(__file__).resolve().parents[2] / "agent" / "rankside"
WORKER = str(Path(__file__).with_name("rankside_ddp_worker.py"))
sys.path.insert(0, str(RANKSIDE))

import gpujobs_heartbeat as hb  # noqa: E402

STARTUP_S = 120  # torch imports slowly on a loaded 2-core machine, twice at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """Two ranks of rankside_ddp_worker.py, stopped by their own pids."""

    def __init__(self, python: str, tmp_path: Path, **env: str) -> None:
        port = free_port()
        self.files = [str(tmp_path / f"rank-{r}") for r in range(2)]
        self.logs = [tmp_path / f"rank-{r}.out" for r in range(2)]
        self.procs = []
        for r in range(2):
            e = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port), "GPUJOBS_HEARTBEAT_FILE": self.files[r],
                 "PYTHONPATH": str(RANKSIDE), "OMP_NUM_THREADS": "1", **env}
            with open(self.logs[r], "w") as out:
                self.procs.append(subprocess.Popen([python, WORKER], env=e, stdout=out,
                                                   stderr=subprocess.STDOUT))

    def output(self, r: int) -> str:
        return self.logs[r].read_text()

    def records(self):
        return [hb.read(f) for f in self.files]

    def wait_exit(self, timeout: float) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


def marks(out: str) -> list[tuple[int, int, str]]:
    return [(int(s), int(q), n) for s, q, n in re.findall(r"step (\d+) seq (\d+) name (\S+)", out)]


@pytest.mark.parametrize("kind", ["ddp", "ddp_fp16", "fsdp1", "fsdp2"])
def test_healthy_steps_leave_every_rank_on_the_same_mark(torch_python, tmp_path, kind):
    ranks = Ranks(torch_python, tmp_path, MODEL=kind, STEPS="6")
    try:
        assert ranks.wait_exit(STARTUP_S) == [0, 0], ranks.output(0) + ranks.output(1)
        seen = [marks(ranks.output(r)) for r in range(2)]
        assert seen[0] == seen[1] and [s for s, _, _ in seen[0]] == list(range(6)), seen
        seqs = [q for _, q, _ in seen[0]]
        # the loop has no explicit collective: every mark is one DDP (or FSDP)
        # ran, two a step (DDP: the forward and the one gradient bucket; FSDP:
        # the forward's all-gather and the backward's reduce-scatter)
        assert all(b - a == 2 for a, b in zip(seqs, seqs[1:])), seqs
        assert seen[0][-1][2] == ("ddp_allreduce" if kind.startswith("ddp")
                                  else "reduce_scatter")
        a, b = ranks.records()
        assert a.collective_seq == b.collective_seq == seqs[-1] and a.step == b.step == 5
    finally:
        ranks.stop()


def test_a_rank_that_hangs_before_forward_is_behind_its_peer(torch_python, tmp_path):
    """Rank 1 sleeps before the forward of step 3: rank 0 marks that forward
    and its gradient bucket, then blocks in backward's all-reduce."""
    ranks = Ranks(torch_python, tmp_path, MODEL="ddp", STEPS="6", HANG_RANK="1",
                  HANG_STEP="3")
    try:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            a, b = ranks.records()
            if a and b and b.step == 2 and a.collective_seq > b.collective_seq:
                break
            assert all(p.poll() is None for p in ranks.procs), ranks.output(0) + ranks.output(1)
            time.sleep(0.2)
        else:
            raise AssertionError(f"rank 0 never got ahead: {ranks.records()}")
        time.sleep(1)  # rank 0 stays where it blocks: nothing more is marked
        a, b = ranks.records()
        assert a.step == b.step == 2, "neither finished step 3"
        assert (a.collective_name, b.collective_name) == ("ddp_allreduce", "ddp_allreduce")
        assert a.collective_seq == b.collective_seq + 2, "step 3's forward and its bucket"
        assert all(p.poll() is None for p in ranks.procs), "rank 0 waits, rank 1 sleeps"
    finally:
        ranks.stop()


def test_the_rank_that_burns_cpu_each_step_has_the_most_time_outside_collectives(
        torch_python, tmp_path):
    """Stragglers (issue 44): rank 1 burns 0.15 s of CPU a step outside any
    collective; rank 0 waits for it inside DDP's gradient all-reduce. Their
    wall step times are equal; their times outside collectives are not: the
    record names rank 1 as the slow one, by far (a score well under 0.7)."""
    ranks = Ranks(torch_python, tmp_path, MODEL="ddp", STEPS="12", BURN_RANK="1",
                  BURN_S="0.15")
    try:
        assert ranks.wait_exit(STARTUP_S) == [0, 0], ranks.output(0) + ranks.output(1)
        a, b = ranks.records()
        assert a.step_time_ns is not None and b.step_time_ns is not None
        assert b.step_time_ns >= 0.15e9, (a, b)
        score_0 = a.step_time_ns / b.step_time_ns  # the fastest over the slow one
        assert score_0 < 0.5, (a.step_time_ns, b.step_time_ns)
    finally:
        ranks.stop()
