"""A real, tiny DDP training job: torch.distributed over gloo on CPU, no torchrun.

    gpujobs submit --ranks 4 --gpus-per-rank 2 -- /path/to/python examples/ddp_train.py

Every rank reads what the agent sets as torchrun would (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT for ``init_method="env://"``; LOCAL_RANK), trains a
linear model for ``STEPS`` steps (default 20) under DistributedDataParallel,
calls ``beat(step)`` once a step, checks that every rank ends with the same
weights (DDP's gradient all-reduce keeps them equal), and exits 0. Under
torchrun or on a laptop it runs the same: the rank-side helper is then a no-op
(``pip install ./agent/rankside`` makes it importable there).

Faults, for the tests: ``FAIL_RANK=r FAIL_STEP=s`` makes rank r exit 1 at step
s, before its step's backward (its peers' gloo then fails at once: "Connection
closed by peer", so they exit 1 too), or with ``FAIL_STEP=-1`` before it joins
the process group (its peers then wait in the rendezvous, and nothing but rank
r fails). ``STEP_S`` sleeps that long each step.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from gpujobs_heartbeat import beat
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    steps = int(os.environ.get("STEPS", "20"))
    step_s = float(os.environ.get("STEP_S", "0"))
    fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
    fail_step = int(os.environ.get("FAIL_STEP", "0"))
    timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "120")))
    if fail_step < 0 and int(os.environ["RANK"]) == fail_rank:
        print(f"rank {fail_rank}: failing before it joins", file=sys.stderr, flush=True)
        return 1
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    print(f"rank {rank}/{world} (local {local_rank}) on {os.environ.get('GPUJOBS_NODE_ID', '-')}"
          f": joined at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    target = torch.arange(1.0, 9.0)
    loss = torch.zeros(())
    for step in range(steps):
        x = torch.randn(32, 8, generator=data)
        y = (x * target).sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if rank == fail_rank and step == fail_step:
            print(f"rank {rank}: failing at step {step}", file=sys.stderr, flush=True)
            return 1
        opt.zero_grad()
        loss.backward()  # DDP's gradient all-reduce, issued by its C++ Reducer
        opt.step()
        beat(step)
        if step_s:
            time.sleep(step_s)

    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(weights) for _ in range(world)]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(g, weights) for g in gathered), "replicas diverged"
    print(f"rank {rank}: {steps} steps, loss {loss.item():.4f}, replicas in sync", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
