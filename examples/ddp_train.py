"""A real, tiny DDP training job: torch.distributed over gloo on CPU, no torchrun.

    gpujobs submit --ranks 4 --gpus-per-rank 2 -- /path/to/python examples/ddp_train.py

Every rank reads what the agent sets as torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT for ``init_method="env://"``; LOCAL_RANK), prints
``rank R pid PID``, trains a linear model for ``STEPS`` steps (default 20)
under DistributedDataParallel, calls ``beat(step)`` once a step, checks that
every rank ends with the same weights (DDP's gradient all-reduce keeps them
equal), and exits 0. Under torchrun or on a laptop it runs the same: the
rank-side helper is then a no-op (``pip install ./agent/rankside`` makes it
importable there).

How much of the rank-side helper it uses, ``INSTRUMENT``:

* ``none``: imports nothing of gpujobs (an uninstrumented job: the agent has
  only the processes to go by);
* ``beats`` (the default): ``beat(step)`` once a step;
* ``full``: also ``model = instrument(DistributedDataParallel(...))``, the one
  line that marks every collective DDP runs, and ``declare_checkpoints()``,
  which makes each ``torch.save`` a declared pause.

Scenarios, for the tests:

* ``FAIL_RANK=r FAIL_STEP=s``: rank r exits 1 at step s, before its step's
  backward (its peers' gloo then fails at once: "Connection closed by peer",
  so they exit 1 too), or with ``FAIL_STEP=-1`` before it joins the process
  group (its peers then wait in the rendezvous, and nothing but rank r fails).
* ``HANG_RANK=r HANG_STEP=s``: rank r sleeps forever in ``hang()`` just before
  the forward of step s; its peers block in that step's all-reduce.
* ``CKPT_STEP=s CKPT_S=30``: after step s, rank 0 saves a checkpoint
  (``torch.save`` of the model, the optimiser and ``CKPT_MB`` MiB of ballast,
  default 48) to a file in ``CKPT_DIR`` (default: the temporary directory)
  whose writes are paced so the save takes about ``CKPT_S`` seconds of real
  I/O, while every other rank waits in ``dist.barrier()``: the usual pattern.
* ``STEP_S`` sleeps that long each step.
* ``SLOW_RANK=r SLOW_S=x``: rank r burns x s of CPU each step, outside any
  collective (a straggler: its peers wait for it in the next all-reduce).
"""
from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

INSTRUMENT = os.environ.get("INSTRUMENT", "beats")
if INSTRUMENT == "none":
    def beat(step: int) -> None:
        pass
else:
    import gpujobs_heartbeat
    from gpujobs_heartbeat import beat


def hang() -> None:
    while True:
        time.sleep(3600)


class PacedFile:
    """A real file whose writes take ``seconds`` for ``size`` bytes in all."""

    def __init__(self, path: str, size: int, seconds: float) -> None:
        self._f = open(path, "wb")
        self._rate = size / max(seconds, 0.001)
        self._start = time.monotonic()
        self._written = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for i in range(0, len(view), 1 << 20):
            chunk = view[i:i + (1 << 20)]
            self._f.write(chunk)
            self._f.flush()
            self._written += len(chunk)
            ahead = self._written / self._rate - (time.monotonic() - self._start)
            if ahead > 0:
                time.sleep(ahead)
        return len(view)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def checkpoint(model, opt, step: int, seconds: float) -> None:
    """Rank 0 saves while its peers wait in the barrier."""
    if dist.get_rank() == 0:
        mib = int(os.environ.get("CKPT_MB", "48"))
        state = {"step": step, "model": model.state_dict(), "opt": opt.state_dict(),
                 "ballast": torch.zeros(mib << 18)}  # mib MiB of float32
        path = os.path.join(os.environ.get("CKPT_DIR", tempfile.gettempdir()),
                            f"ddp-ckpt-{os.getpid()}-{step}.pt")
        f = PacedFile(path, mib << 20, seconds)
        t0 = time.monotonic()
        try:
            torch.save(state, f)
        finally:
            f.close()
            os.unlink(path)
        print(f"rank 0: checkpoint of step {step} saved in {time.monotonic() - t0:.1f} s",
              flush=True)
    dist.barrier()


def main() -> int:
    steps = int(os.environ.get("STEPS", "20"))
    step_s = float(os.environ.get("STEP_S", "0"))
    fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
    fail_step = int(os.environ.get("FAIL_STEP", "0"))
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "-1"))
    ckpt_step = int(os.environ.get("CKPT_STEP", "-1"))
    ckpt_s = float(os.environ.get("CKPT_S", "30"))
    slow_s = float(os.environ.get("SLOW_S", "0"))
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "120")))
    print(f"rank {os.environ['RANK']} pid {os.getpid()}", flush=True)
    if fail_step < 0 and int(os.environ["RANK"]) == fail_rank:
        print(f"rank {fail_rank}: failing before it joins", file=sys.stderr, flush=True)
        return 1
    if INSTRUMENT == "full":
        gpujobs_heartbeat.declare_checkpoints(max_s=ckpt_s + 60)
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    print(f"rank {rank}/{world} (local {local_rank}) on {os.environ.get('GPUJOBS_NODE_ID', '-')}"
          f": joined at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    if INSTRUMENT == "full":
        model = gpujobs_heartbeat.instrument(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    target = torch.arange(1.0, 9.0)
    loss = torch.zeros(())
    for step in range(steps):
        x = torch.randn(32, 8, generator=data)
        y = (x * target).sum(dim=1, keepdim=True)
        if rank == hang_rank and step == hang_step:
            print(f"rank {rank}: hanging before the forward of step {step}", flush=True)
            hang()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == fail_rank and step == fail_step:
            print(f"rank {rank}: failing at step {step}", file=sys.stderr, flush=True)
            return 1
        opt.zero_grad()
        loss.backward()  # DDP's gradient all-reduce, issued by its C++ Reducer
        opt.step()
        if rank == slow_rank:  # a straggler: work outside any collective
            until = time.perf_counter() + slow_s
            while time.perf_counter() < until:
                pass
        beat(step)
        if step == ckpt_step:
            checkpoint(model, opt, step, ckpt_s)
        if step_s:
            time.sleep(step_s)

    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(g, weights) for g in gathered), "replicas diverged"
    print(f"rank {rank}: {steps} steps, loss {loss.item():.4f}, replicas in sync", flush=True)
    dist.destroy_process_group()
    return 0


def leave(code: int) -> NoReturn:
    """Exit a rank that is done with ``code``, every output flushed, without
    the interpreter's teardown. torch keeps the gloo group alive in C++ past
    destroy_process_group() (a dozen references, checked on 2.13), so its
    threads were torn down by the interpreter's and the C++ runtime's exit
    handlers, which now and then aborted a rank that had finished ("terminate
    called without an active exception", exit code 134: a healthy job FAILED
    in CI, this script's once and the Hugging Face example's once, after
    every rank printed its last step). The trainer examples leave this way
    too."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
