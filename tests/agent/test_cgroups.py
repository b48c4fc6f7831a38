"""A cgroup around every attempt's ranks (issue 41, item 2), with real
processes and the host's real cgroups, as root, each rank as a bare uid of
its own:

- every process a rank starts is in its attempt's cgroup, also one that left
  the rank's process group and session;
- at the attempt's end what is left in the cgroup is frozen and SIGKILLed,
  the cgroup removed, and only then does the uid go back to the pool;
- a job's fork bomb stops at its cgroup's pids limit.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from agent.cgroups import JobCgroups, Limits, cgroup_name
from agent.records import lines_of
from tests.hostile_ranks import bare_identity
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import launch, message, pooled_agent, run_until

#: forks a daemon that leaves the rank's group and session, notes its pid in
#: argv[1], and sleeps; the rank itself then ends at once, exit 0
ESCAPE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        os.closerange(0, 1024)
        time.sleep(600)
    os._exit(0)
os.wait()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
"""

#: starts sleepers until the host refuses, then says how many it started
BOMB = """
import subprocess
started = []
try:
    for _ in range(200):
        started.append(subprocess.Popen(["sleep", "60"]))
except OSError as e:
    print("refused after", len(started), type(e).__name__, flush=True)
for p in started:
    p.kill()
"""


@pytest.fixture
def identity():
    identity = bare_identity()
    assert identity is not None, "cgroups take root: run the agent's tests as root, as CI does"
    return identity


@pytest.fixture
def cgroups():
    """The agent's cgroups under a base of this test's own, removed after."""
    found = JobCgroups.detect(f"gpujobs-test/{uuid.uuid4().hex[:12]}",
                              limits=Limits(pids_max=24))
    assert found is not None, "this host has cgroups (v2 with pids, or v1): see the log"
    yield found
    for base in found.bases():
        for d in sorted(base.glob("*"), reverse=True):
            if d.is_dir():
                found.kill(d.name)
                wait_until(lambda d=d: not found.members(d.name), what="the cgroup empty")
                d.rmdir()
        base.rmdir()


def python() -> str:
    found = shutil.which("python3", path="/usr/bin:/bin")
    assert found, "a python3 every uid can run"
    return found


def test_a_daemon_that_left_its_ranks_group_is_in_the_cgroup_and_dies_with_the_attempt(
        shared_world, identity, cgroups, caplog):
    agent = pooled_agent(shared_world, identity, cgroups=cgroups)
    noted = shared_world.tmp / "daemon.pid"
    agent.handle(message(launch("job_cg", command=[python(), "-c", ESCAPE, str(noted)]), 1))
    name = cgroup_name("job_cg", 1)
    daemon = int(wait_until(lambda: noted.exists() and noted.read_text(), what="the daemon"))
    try:
        assert daemon in cgroups.members(name), "born inside, whatever group it left for"
        assert "/gpujobs-test/" in Path(f"/proc/{daemon}/cgroup").read_text()
        run_until(agent, lambda: shared_world.state()["attempts"]["job_cg/1"]["uid_freed"],
                  timeout=30, what="the uid back in the pool")
        assert not alive(daemon), "killed through the cgroup"
        assert any("left in its cgroup" in r.getMessage() and str(daemon) in r.getMessage()
                   for r in caplog.records), caplog.text
        assert not any(d.exists() for d in cgroups.dirs(name)), "the cgroup removed"
        assert shared_world.state()["attempts"]["job_cg/1"]["cgroup"] is None
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


def test_a_fork_bomb_stops_at_its_jobs_pids_limit(shared_world, identity, cgroups):
    agent = pooled_agent(shared_world, identity, cgroups=cgroups)
    agent.handle(message(launch("job_fb", command=[python(), "-c", BOMB]), 1))
    run_until(agent, lambda: shared_world.api.of("EXITED"), timeout=60, what="the bomb's end")
    said = lines_of(shared_world.paths.log_file("job_fb", 1, 0).read_bytes(), "stdout")
    assert said and said[0].startswith("refused after "), said
    started = int(said[0].split()[2])
    assert started < 24, f"{started} processes started past a pids limit of 24"


def test_on_cgroup_v2_the_files_written_are_v2s(tmp_path):
    """This host has v1 only, so v2's side is shown on a tree laid out as
    cgroup v2 (plain files, not the kernel's): where the limits, the freeze
    and the membership are read and written, and that a kill spares the
    shims and thaws after."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "gpujobs").mkdir()
    (tmp_path / "gpujobs" / "cgroup.subtree_control").write_text("")
    (tmp_path / "gpujobs" / "n1").mkdir()
    (tmp_path / "gpujobs" / "n1" / "cgroup.subtree_control").write_text("")
    found = JobCgroups.detect("gpujobs/n1", root=tmp_path,
                              limits=Limits(pids_max=64, memory_max=1 << 30))
    assert found is not None and found.v2
    [made] = found.make("job_v2.1")
    job = Path(made)
    assert job == tmp_path / "gpujobs" / "n1" / "job_v2.1"
    assert ((job / "pids.max").read_text(), (job / "memory.max").read_text()) == (
        "64", str(1 << 30))
    shim, rank = (subprocess.Popen(["sleep", "60"]) for _ in range(2))
    try:
        (job / "cgroup.procs").write_text(f"{shim.pid}\n{rank.pid}\n")
        assert found.members("job_v2.1") == sorted([shim.pid, rank.pid])
        assert found.kill("job_v2.1", spare=[shim.pid]) == [rank.pid]
        assert rank.wait(10) == -9 and shim.poll() is None, "the shim is spared"
        assert (job / "cgroup.freeze").read_text() == "0", "thawed after"
    finally:
        for p in (shim, rank):
            p.kill()
            p.wait(10)


def test_an_agent_removes_the_empty_cgroups_no_attempt_of_its_owns(cgroups):
    """Invariant: cgroups an agent stopped mid-attempt left behind (its ranks
    killed by someone else) are removed by the next agent on that node, unless
    an attempt of its state owns one, a process still runs in it, or it is
    young (another agent of that node name may have just made it)."""
    for name in ("job_gone.1", "job_owned.1", "job_busy.1"):
        cgroups.make(name)
    busy = subprocess.Popen(["sleep", "60"])
    try:
        (cgroups.dirs("job_busy.1")[0] / "cgroup.procs").write_text(str(busy.pid))
        assert cgroups.remove_leftovers(["job_owned.1"]) == [], "all young"
        later = time.time() + 3600
        assert cgroups.remove_leftovers(["job_owned.1"], now=later) == ["job_gone.1"]
        assert all(not d.exists() for d in cgroups.dirs("job_gone.1"))
        assert all(d.is_dir() for n in ("job_owned.1", "job_busy.1") for d in cgroups.dirs(n))
    finally:
        busy.kill()
        busy.wait(10)
