"""One rank of tests/agent/test_rankside_torch.py: a tiny model under DDP (or
FSDP: MODEL=fsdp1|fsdp2; MODEL=ddp_fp16: DDP with another hook) over gloo on CPU, made instrumented by the one line
users write, with no explicit collective in the training loop. After each
step it prints the collective mark its own heartbeat file holds; with
HANG_RANK=r HANG_STEP=s, rank r sleeps just before the forward of step s;
with BURN_RANK=r BURN_S=x, rank r burns x s of CPU each step, outside any
collective (a straggler), and every rank prints its step time outside
collectives as the record holds it."""
from __future__ import annotations

import os
import sys
import time

import gpujobs_heartbeat as hb
import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    kind = os.environ.get("MODEL", "ddp")
    hang_rank = int(os.environ.get("HANG_RANK", "-1"))
    hang_step = int(os.environ.get("HANG_STEP", "-1"))
    burn_s = float(os.environ.get("BURN_S", "0")) if rank == int(
        os.environ.get("BURN_RANK", "-1")) else 0.0
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        model = hb.instrument(DistributedDataParallel(net))
        assert hb.instrument(model) is model  # idempotent: a second call adds no marks
    elif kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = hb.instrument(FullyShardedDataParallel(net, device_id=torch.device("cpu")))
    elif kind == "ddp_fp16":  # another of torch's hooks, run after the mark
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            fp16_compress_hook,
        )
        from torch.nn.parallel import DistributedDataParallel
        model = hb.instrument(DistributedDataParallel(net), hook=fp16_compress_hook)
    else:
        from torch.distributed.fsdp import fully_shard
        model = hb.instrument(fully_shard(net))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    print(f"rank {rank} pid {os.getpid()} ready", flush=True)
    for step in range(int(os.environ.get("STEPS", "5"))):
        x = torch.randn(4, 8, generator=data)
        if rank == hang_rank and step == hang_step:
            while True:
                time.sleep(60)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        until = time.perf_counter() + burn_s
        while time.perf_counter() < until:  # a slow rank: work outside any collective
            pass
        hb.beat(step)
        r = hb.read(os.environ["GPUJOBS_HEARTBEAT_FILE"])
        print(f"step {step} seq {r.collective_seq} name {r.collective_name}", flush=True)
        if burn_s or os.environ.get("BURN_RANK"):
            print(f"step_time_ns {r.step_time_ns}", flush=True)
    # both ranks finished their last all-reduce; tearing gloo down with
    # destroy_process_group() sometimes aborted one rank at exit
    # ("terminate called without an active exception", SIGABRT: twice in
    # fresh clones), and a barrier first would be one more marked collective.
    # The rank has nothing left to do: it leaves without the teardown.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
