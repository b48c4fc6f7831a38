"""A real, tiny Hugging Face ``Trainer`` job: DDP over gloo on CPU, no torchrun.

    gpujobs submit --ranks 4 --gpus-per-rank 2 -- /path/to/python examples/hf_train.py

The Trainer (through Accelerate) reads what the agent sets as torchrun would:
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, and joins the
process group over gloo (``ddp_backend="gloo"``, ``use_cpu=True``); the script
checks that it runs distributed over all WORLD_SIZE ranks.

It trains a linear model (a plain ``nn.Module`` whose forward returns
``{"loss": ...}``) on an in-memory dataset for ``STEPS`` steps (default 12),
with ``gpujobs_heartbeat.hf_callback()`` (a beat per step, a declared pause
until the next beat when a save or an evaluation follows) and a checkpoint
every ``CKPT_EVERY`` steps (default 5), and prints ``rank R: N steps`` at the
end.

``CKPT_STEP=s CKPT_S=30``: rank 0's save of the checkpoint of step s lasts
about ``CKPT_S`` seconds of real I/O (``save_model``, which only rank 0
writes in, also writes the model's state and ``CKPT_MB`` MiB of ballast,
default 48, at a pace). The Trainer has no barrier after a save: the other
ranks go on to the next step and wait in its gradient all-reduce for rank 0,
the usual pattern. ``CKPT_DIR`` (default: the temporary directory) holds the
checkpoints.
"""
from __future__ import annotations

import os
import tempfile
import time

import gpujobs_heartbeat
import torch
import torch.distributed as dist
from ddp_train import PacedFile, leave
from transformers import Trainer, TrainingArguments


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Samples(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        data = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=data)
        self.y = (self.x * torch.arange(1.0, 9.0)).sum(dim=1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


class SlowSaveTrainer(Trainer):
    """Rank 0's save of the checkpoint of ``slow_step`` lasts ``slow_s``."""

    slow_step, slow_s, slow_mib = -1, 0.0, 48

    def save_model(self, output_dir=None, _internal_call=False) -> None:
        super().save_model(output_dir, _internal_call)
        if not (self.args.should_save and self.state.global_step == self.slow_step):
            return
        t0 = time.monotonic()
        path = os.path.join(output_dir or self.args.output_dir, "slow_state.pt")
        f = PacedFile(path, self.slow_mib << 20, self.slow_s)
        try:
            torch.save({"model": self.model.state_dict(),
                        "ballast": torch.zeros(self.slow_mib << 18)}, f)
        finally:
            f.close()
        print(f"rank 0: checkpoint of step {self.state.global_step} saved in "
              f"{time.monotonic() - t0:.1f} s", flush=True)


def main() -> int:
    steps = int(os.environ.get("STEPS", "12"))
    every = int(os.environ.get("CKPT_EVERY", "5"))
    ckpt_s = float(os.environ.get("CKPT_S", "30"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"rank {rank} pid {os.getpid()}", flush=True)

    SlowSaveTrainer.slow_step = int(os.environ.get("CKPT_STEP", "-1"))
    SlowSaveTrainer.slow_s = ckpt_s
    SlowSaveTrainer.slow_mib = int(os.environ.get("CKPT_MB", "48"))
    out = os.path.join(os.environ.get("CKPT_DIR", tempfile.gettempdir()),
                       f"hf-{os.environ.get('GPUJOBS_JOB_ID', os.getpid())}")
    args = TrainingArguments(
        output_dir=out, use_cpu=True, ddp_backend="gloo", max_steps=steps,
        per_device_train_batch_size=8, save_strategy="steps", save_steps=every,
        logging_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, ddp_find_unused_parameters=False, seed=0)
    torch.manual_seed(0)
    trainer = SlowSaveTrainer(
        model=Linear(), args=args, train_dataset=Samples(8 * steps * world, 1000),
        callbacks=[gpujobs_heartbeat.hf_callback(max_checkpoint_s=ckpt_s + 60)])
    trainer.train()
    # the Trainer ran as one of WORLD_SIZE ranks of a process group over gloo
    assert dist.is_initialized() and dist.get_world_size() == world, args.parallel_mode
    assert (dist.get_rank(), dist.get_backend()) == (rank, "gloo")
    print(f"rank {rank}/{world} (local {args.local_process_index}) {args.parallel_mode}: "
          f"{trainer.state.global_step} steps", flush=True)
    print(f"rank {rank}: {trainer.state.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    leave(main())  # without the teardown that can abort a finished rank (ddp_train.leave)
