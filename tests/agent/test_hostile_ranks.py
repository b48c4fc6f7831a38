"""Issue 24, item 4 with real processes: no rank can stall the agent.

A real agent (``python -m agent``; as root, when the tests run as root, with
each job's ranks run as a uid of its pool, as on a host) runs two jobs from a
real SQS inbox (moto) for a fake control plane. One rank is hostile: it beats,
then replaces its own heartbeat file with a FIFO (the incident: the agent
blocked for ever in ``open``, the node went DOWN), a symbolic link to
/dev/zero, or a 10 GiB sparse file. The other job's rank beats on.

For each: the agent's loop keeps going (it keeps calling in, every second
here on its heartbeat posts, and posting the other job's beats, advancing), the hostile rank's record is no record (no
beat posted for it any more; its process samples still are, so its job alone
goes silent), one WARNING names the file (not one a tick), and the agent's
peak memory does not grow.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time

import pytest

from agent.uidpool import DEFAULT_RANK_UIDS
from tests.hostile_ranks import HOSTILE, rank_python, steady
from tests.support.procs import kill_ranks_in_state, stop_process
from tests.support.waits import wait_until

from .harness import PY
from .test_integration import AgentProcess, FakeControlPlane, send

STEADY = steady(0.05)

@pytest.fixture
def node(sqs):
    """A fake control plane and a real agent on ``sqs``; as root, ranks run as
    uids of its default pool under a state directory they can reach
    (pytest's is 0700). The
    agent is stopped by its own pid and every rank it records is killed, also
    when the test fails."""
    isolated = os.geteuid() == 0
    home = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-hostile-"))
    os.chmod(home, 0o711)
    # a pool's uid cannot reach the test's own interpreter (under /root)
    python = rank_python(PY)
    with FakeControlPlane(sqs[1], flaky=0) as plane:
        # a busy node calls in every --busy-call-in-s: 1 s, so its call-ins
        # show the loop going on
        agent = AgentProcess(plane.url, home / "state", "--watchdog-s", "5",
                             "--busy-call-in-s", "1",
                             "--rank-uids", DEFAULT_RANK_UIDS if isolated else "")
        try:
            agent.wait_ready()
            yield plane, agent, home / "state", python, isolated
        finally:
            stop_process(agent.proc)
            print("--- agent output ---\n" + "".join(agent.output))  # shown on failure
            kill_ranks_in_state(home / "state")
            shutil.rmtree(home, ignore_errors=True)


def peak_rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def calls_in(plane: FakeControlPlane) -> int:
    """The node's call-ins: PUTs and those carried by heartbeat posts."""
    with plane.lock:
        return len(plane.puts) + len(plane.carried)


def steps(plane: FakeControlPlane, job_id: str) -> list[int]:
    return [r["step"] for r in plane.rank_beats(job_id) if "step" in r]


@pytest.mark.parametrize("kind", ["fifo", "devzero", "sparse"])
def test_a_rank_that_replaces_its_heartbeat_file_stalls_nothing_but_its_own_job(
        sqs, node, kind):
    """Invariant: whatever a rank puts at its heartbeat file's path, the
    agent's loop keeps ticking (the node keeps calling in, other jobs' beats
    keep being posted), only that rank's own record is lost, the refusal is
    logged once, and the agent's memory stays bounded."""
    plane, agent, state_dir, python, isolated = node
    for job, argv in (("job_steady", [python, "-c", STEADY]),
                      ("job_hostile", [python, "-c", HOSTILE, kind])):
        send(sqs, {"type": "LAUNCH", "job_id": job, "attempt": 1, "ranks": [0],
                   "world_size": 1, "command": argv, "env": {},
                   "heartbeat_interval_s": 0.2})
    log = state_dir / "logs" / "job_hostile" / "1" / "rank-0.log"
    wait_until(lambda: log.exists() and "REPLACED" in log.read_text(), timeout=60,
               what="the hostile rank to replace its heartbeat file")
    assert steps(plane, "job_hostile"), "it beat before: its record was read"
    if isolated:
        hb = state_dir / "heartbeats" / "job_hostile" / "1"
        assert 70000 <= hb.stat().st_uid <= 70999, "ranks ran as a uid of the pool"
    peak_before = peak_rss_kib(agent.proc.pid)
    time.sleep(0.5)  # a post of the last record may still be on its way
    hostile_steps = len(steps(plane, "job_hostile"))
    calls, steady = calls_in(plane), max(steps(plane, "job_steady"), default=-1)

    # the loop goes on: it calls in, and posts the other job's new beats
    wait_until(lambda: calls_in(plane) >= calls + 3
               and max(steps(plane, "job_steady"), default=-1) >= steady + 20, timeout=60,
               what="more node heartbeats and new beats of the steady job")
    assert agent.proc.poll() is None, "the agent runs on"
    # the hostile rank's job alone lost its record; its process is still watched
    assert len(steps(plane, "job_hostile")) == hostile_steps, "no beat from what it put there"
    beats = [r for r in plane.rank_beats("job_hostile") if "step" in r]
    assert [r["step"] for r in beats] == sorted(r["step"] for r in beats) \
        and all("age_s" in r for r in beats), f"a beat read from what it put there: {beats}"
    wait_until(lambda: any("proc" in r and "step" not in r
                           for r in plane.rank_beats("job_hostile")), timeout=30,
               what="process samples of the hostile rank")
    # one warning for the file, not one a tick
    path = str(state_dir / "heartbeats" / "job_hostile" / "1" / "rank-0")
    refused = [line for line in agent.output if "not reading" in line and path in line]
    why = {"fifo": "a FIFO", "devzero": "a symbolic link", "sparse": "10737418240 bytes"}[kind]
    assert len(refused) == 1 and why in refused[0], refused
    assert not [line for line in agent.output if "not reading" in line and path not in line]
    grown = peak_rss_kib(agent.proc.pid) - peak_before
    assert grown < 32 * 1024, f"the agent's peak memory grew by {grown} KiB"


#: job A's rank: finds job B's rank by its (public) command line, then tries
#: to kill it, read its environment, and open, replace or remove its heartbeat
#: file (argv[1]); prints "REPORT {json}" of what each attempt met
NEIGHBOUR = r"""
import json, os, signal, sys
hb = sys.argv[1]
report = {"uid": os.getuid(), "found": [], "met": {}}
def attempt(what, fn):
    try:
        fn()
        report["met"][what] = "done"
    except OSError as e:
        report["met"][what] = type(e).__name__
for pid in os.listdir("/proc"):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if b"VICTIM-B" in argv and int(pid) != os.getpid():
        report["found"].append(int(pid))
        attempt(f"environ {pid}", lambda: open(f"/proc/{pid}/environ", "rb").read())
        attempt(f"stop {pid}", lambda: os.kill(int(pid), signal.SIGSTOP))
        attempt(f"kill {pid}", lambda: os.kill(int(pid), signal.SIGKILL))
attempt("read heartbeat", lambda: open(hb, "rb").read())
attempt("write heartbeat", lambda: open(hb, "ab").write(b"forged"))
attempt("remove heartbeat", lambda: os.unlink(hb))
fake = os.path.join(os.environ["HOME"], "frozen")
open(fake, "w").write("{}")
attempt("replace heartbeat", lambda: os.rename(fake, hb))
attempt("list its folder", lambda: os.listdir(os.path.dirname(hb)))
print("REPORT", json.dumps(report), flush=True)
"""


def test_a_rank_of_one_job_cannot_touch_another_jobs_rank_on_its_host(sqs, node):
    """Issue 24, item 2: two jobs on one agent run as two uids; job A's rank
    cannot stop, kill or read the environment of job B's rank, nor read,
    write, remove or replace its heartbeat file; job B's beats keep coming."""
    plane, agent, state_dir, python, isolated = node
    if not isolated:
        pytest.skip("a uid per job takes an agent running as root")
    send(sqs, {"type": "LAUNCH", "job_id": "job_b", "attempt": 1, "ranks": [0],
               "world_size": 1, "command": [python, "-c", STEADY, "VICTIM-B"], "env": {},
               "heartbeat_interval_s": 0.2})
    wait_until(lambda: len(steps(plane, "job_b")) >= 3, timeout=60, what="job B beats")
    hb = state_dir / "heartbeats" / "job_b" / "1" / "rank-0"
    send(sqs, {"type": "LAUNCH", "job_id": "job_a", "attempt": 1, "ranks": [0],
               "world_size": 1, "command": [python, "-c", NEIGHBOUR, str(hb)], "env": {},
               "heartbeat_interval_s": 0.2})
    log = state_dir / "logs" / "job_a" / "1" / "rank-0.log"
    wait_until(lambda: log.exists() and "REPORT" in log.read_text(), timeout=60,
               what="job A's rank to report")
    import json
    report = json.loads(log.read_text().split("REPORT ", 1)[1].split("\n")[0])
    uids = {k: a["uid"] for k, a in json.loads(
        (state_dir / "state.json").read_text())["attempts"].items()}
    assert report["uid"] == uids["job_a/1"] != uids["job_b/1"], "two jobs, two uids"
    assert hb.stat().st_uid == uids["job_b/1"]
    assert report["found"], "it found job B's rank (command lines are public)"
    assert set(report["met"].values()) == {"PermissionError"}, report["met"]
    # job B never noticed: its rank runs, its beats keep coming
    seen = max(steps(plane, "job_b"))
    wait_until(lambda: max(steps(plane, "job_b")) >= seen + 10, timeout=60,
               what="job B's beats to go on")
