"""What the hostile-rank tests share (tests/agent/test_hostile_ranks.py,
tests/e2e/test_node_loss.py, tests/e2e/test_isolation.py): a bare uid for
tests that run a rank as one of their own, an interpreter such a uid can
run (the tests' own lives under /root, 0700), a rank that beats for ever,
and one that replaces its own heartbeat file with something that is no
record (a FIFO, a link to /dev/zero, a 10 GiB sparse file)."""
from __future__ import annotations

import os
import shutil

from agent.isolation import RankIdentity

#: a uid no passwd entry has, outside the agent's default pool (70000-70999),
#: for tests that run ranks as a uid without an agent's pool
TEST_UID = 79990

#: the kinds of file HOSTILE puts where its record was (its argv[1])
KINDS = ("fifo", "devzero", "sparse")

#: beats five times, then puts argv[1]'s kind of file where its record was,
#: prints "REPLACED <kind>", sleeps
HOSTILE = r"""
import os, sys, time
from gpujobs_heartbeat import beat
for step in range(5):
    beat(step)
    time.sleep(0.1)
time.sleep(1.5)  # the agent has read (and posted) a record by now
path = os.environ["GPUJOBS_HEARTBEAT_FILE"]
os.unlink(path)
kind = sys.argv[1]
if kind == "fifo":
    os.mkfifo(path)
elif kind == "devzero":
    os.symlink("/dev/zero", path)
else:
    open(path, "wb").close()
    os.truncate(path, 10 << 30)
print("REPLACED", kind, flush=True)
time.sleep(3600)
"""


def steady(period_s: float) -> str:
    """A rank that beats every ``period_s`` for ever."""
    return ("import time\nfrom gpujobs_heartbeat import beat\nstep = 0\n"
            f"while True:\n    beat(step)\n    step += 1\n    time.sleep({period_s})\n")


def bare_identity(uid: int = TEST_UID, home: str = "/") -> RankIdentity | None:
    """Ranks as ``uid`` (no passwd entry: setuid to a bare number), when the
    tests run as root; else None."""
    if os.geteuid() != 0:
        return None
    return RankIdentity(f"gpujobs-{uid}", uid, uid, home)


def rank_python(default: str) -> str:
    """An interpreter a pool uid can run when the tests run as root (the
    tests' own is under /root, 0700); ``default`` otherwise."""
    if os.geteuid() != 0:
        return default
    return shutil.which("python3", path="/usr/bin:/bin") or default
