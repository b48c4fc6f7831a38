"""A real, tiny PyTorch Lightning job: DDP over gloo on CPU, no torchrun.

    gpujobs submit --ranks 4 --gpus-per-rank 2 -- /path/to/python examples/lightning_train.py

Lightning reads what the agent sets as torchrun would: TORCHELASTIC_RUN_ID
makes it pick its ``TorchElasticEnvironment`` (RANK, WORLD_SIZE, LOCAL_RANK,
GROUP_RANK, MASTER_ADDR, MASTER_PORT), which creates processes externally, so
Lightning spawns none of its own: each rank the agent started is one process
of the job (the script checks both and says so). ``devices`` is
LOCAL_WORLD_SIZE and ``num_nodes`` WORLD_SIZE // LOCAL_WORLD_SIZE.

It trains a linear model on random data for ``STEPS`` steps (default 12),
with ``gpujobs_heartbeat.lightning_callback()`` (a beat per step, a declared
pause around each checkpoint save and each validation) and
``ModelCheckpoint(every_n_train_steps=CKPT_EVERY)`` (default 5), and prints
``rank R: N steps`` at the end.

``CKPT_STEP=s CKPT_S=30``: the checkpoint of step s is written by rank 0 at a
pace that makes its save last about ``CKPT_S`` seconds of real I/O (a
``CheckpointIO`` plugin that writes the ``torch.save`` bytes of the checkpoint
and ``CKPT_MB`` MiB of ballast, default 48, slowly), while the other ranks
wait in Lightning's barrier after the save (``Trainer.save_checkpoint``): the
usual pattern. Other checkpoints are written at full speed. ``CKPT_DIR``
(default: the temporary directory) holds them.
"""
from __future__ import annotations

import os
import tempfile
import time

import gpujobs_heartbeat
import lightning.pytorch as pl
import torch
from ddp_train import PacedFile, leave
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class SlowCheckpointIO(TorchCheckpointIO):
    """Writes the checkpoint of ``slow_step`` (and its ballast) in ``seconds``."""

    def __init__(self, slow_step: int, seconds: float, mib: int) -> None:
        super().__init__()
        self.slow_step, self.seconds, self.mib = slow_step, seconds, mib

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        step = checkpoint.get("global_step")
        if step != self.slow_step:
            return super().save_checkpoint(checkpoint, path, storage_options)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t0 = time.monotonic()
        f = PacedFile(str(path), self.mib << 20, self.seconds)
        try:
            torch.save({**checkpoint, "ballast": torch.zeros(self.mib << 18)}, f)
        finally:
            f.close()
        print(f"rank 0: checkpoint of step {step} saved in {time.monotonic() - t0:.1f} s",
              flush=True)


def main() -> int:
    steps = int(os.environ.get("STEPS", "12"))
    every = int(os.environ.get("CKPT_EVERY", "5"))
    ckpt_step = int(os.environ.get("CKPT_STEP", "-1"))
    ckpt_s = float(os.environ.get("CKPT_S", "30"))
    ckpt_dir = os.environ.get("CKPT_DIR", tempfile.gettempdir())
    world, local_world = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    print(f"rank {rank} pid {os.getpid()}", flush=True)

    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(32 * steps, 8, generator=data)
    y = (x * torch.arange(1.0, 9.0)).sum(dim=1, keepdim=True)
    # DDP gives each rank its own shard of the batches (DistributedSampler)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)

    trainer = pl.Trainer(
        accelerator="cpu", devices=local_world, num_nodes=world // local_world,
        strategy=DDPStrategy(process_group_backend="gloo"),
        plugins=[SlowCheckpointIO(ckpt_step, ckpt_s, int(os.environ.get("CKPT_MB", "48")))],
        callbacks=[gpujobs_heartbeat.lightning_callback(max_checkpoint_s=ckpt_s + 60),
                   ModelCheckpoint(dirpath=os.path.join(ckpt_dir, f"lightning-{os.getpid()}"),
                                   every_n_train_steps=every, save_top_k=-1)],
        max_steps=steps, max_epochs=1, limit_val_batches=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False)
    env = trainer.strategy.cluster_environment
    # the agent's processes are the job's: Lightning must not start its own
    assert isinstance(env, TorchElasticEnvironment) and env.creates_processes_externally, env
    assert (env.global_rank(), env.world_size()) == (rank, world), env
    trainer.fit(Linear(), loader)
    print(f"rank {trainer.global_rank}/{trainer.world_size} (local {trainer.local_rank}, "
          f"node {trainer.node_rank}) in {type(env).__name__}: {trainer.global_step} steps",
          flush=True)
    print(f"rank {rank}: {trainer.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    leave(main())  # without the teardown that can abort a finished rank (ddp_train.leave)
