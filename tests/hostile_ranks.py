"""What the hostile-rank tests share (tests/agent/test_hostile_ranks.py,
tests/e2e/test_node_loss.py, tests/e2e/test_isolation.py): the unprivileged
user ranks run as when the tests run as root, a rank that beats for ever,
and one that replaces its own heartbeat file with something that is no
record (a FIFO, a link to /dev/zero, a 10 GiB sparse file)."""
from __future__ import annotations

import os
import pwd
import subprocess

RANK_USER = "gpujobs-test-rank"

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


def ensure_rank_user() -> str | None:
    """RANK_USER, created if missing, when the tests run as root; else None."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(RANK_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", RANK_USER], check=True)
    return RANK_USER
