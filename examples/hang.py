"""A 4-rank "training" loop in which rank 3 hangs after 20 steps (alive, not
beating) and the other ranks block behind it two seconds later, as in an NCCL
hang. Used by the README's stall-detection walk-through."""
import os
import time

from gpujobs_heartbeat import beat

rank = int(os.environ["RANK"])
for step in range(100_000):
    if rank == 3 and step >= 20:
        time.sleep(3600)   # the culprit: still alive, no longer beating
    if rank != 3 and step >= 30:
        time.sleep(3600)   # the rest wait for it in the next collective
    beat(step)
    time.sleep(0.2)
