"""A 4-rank "training" loop in which rank 3 hangs after 20 steps (alive, not
beating) and the other ranks block behind it six seconds later, as in an NCCL
hang. Used by the README's stall-detection walk-through and by the tests that
check rank 3 is named first.

The margin: at 1-s beats the others' silence starts six seconds after rank 3's,
so rank 3 is named first unless its agent's last post of it comes more than six
seconds late (on a loaded machine a post is a second or two late; two seconds
of gap were once crossed)."""
import os
import time

from gpujobs_heartbeat import beat

HUNG_AT = 20      # rank 3's last step is 19
BLOCKED_AT = 50   # the others' last step is 49: 30 steps of 0.2 s after rank 3's

rank = int(os.environ["RANK"])
for step in range(100_000):
    if rank == 3 and step >= HUNG_AT:
        time.sleep(3600)   # the culprit: still alive, no longer beating
    if rank != 3 and step >= BLOCKED_AT:
        time.sleep(3600)   # the rest wait for it in the next collective
    beat(step)
    time.sleep(0.2)
