"""Issue 24, item 2: a user per job on a host, from a pool of uids the agent
owns (agent/uidpool.py), with real processes as root: the pool's checks,
allocation by job id (the same uid on every node), exhaustion (the ranks do not start, saying why),
recycling only once no process of a uid is left, host-wide claims between
agents, and an agent restart keeping the allocation."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent.core import Agent
from agent.records import lines_of
from agent.state import StateFile
from agent.uidpool import (
    PoolExhausted,
    UidPool,
    UidRange,
    UidRangeError,
    check_range,
    parse_range,
    processes_by_uid,
)
from tests.hostile_ranks import rank_python
from tests.support.waits import wait_until

from .harness import PY, RecordingLauncher, World, launch, message, run_until

#: uids no passwd entry has, outside the default pool, for these tests alone
FIRST = 79900
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="running as a pool's uid takes root")
#: the uids these tests run processes as
TEST_UIDS = list(range(FIRST, FIRST + 10))


@pytest.fixture(autouse=True)
def no_process_of_the_test_uids_left():
    """Each test ends with no process of its uids left (killed, and gone), so
    the next one's pool starts free: a loaded host took longer than the
    World's cleanup waits to end a killed rank, and the next test found its
    one uid still held (fresh-clone run 13)."""
    yield
    for pids in processes_by_uid(TEST_UIDS).values():
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    wait_until(lambda: not processes_by_uid(TEST_UIDS), timeout=60,
               what="no process of the test uids left")


def test_a_range_is_first_to_last_and_empty_means_none():
    assert parse_range("70000-70999") == UidRange(70000, 70999)
    assert len(parse_range("5-5") or []) == 1 and parse_range("") is None
    for bad in ("x", "9-1", "1-", "-1-2"):
        with pytest.raises(UidRangeError):
            parse_range(bad)


def test_a_range_that_is_not_the_agents_alone_is_refused_saying_why(tmp_path):
    """uid 0, a user's uid, a group's gid, someone's subuid range, a uid the
    user namespace cannot map: each refused, named."""
    none = tmp_path / "none"
    ok = dict(subuid=str(none), subgid=str(none), uid_map=str(none))
    check_range(UidRange(70000, 70999), **ok)
    with pytest.raises(UidRangeError, match="holds uid 0"):
        check_range(UidRange(0, 10), **ok)
    with pytest.raises(UidRangeError, match=r"holds uid 1, user 'daemon'"):
        check_range(UidRange(1, 3), **ok)
    nogroup = next(g for g in range(100, 65534) if _is_group_only(g))
    with pytest.raises(UidRangeError, match=rf"holds gid {nogroup}, group "):
        check_range(UidRange(nogroup, nogroup), **ok)
    (tmp_path / "subuid").write_text("alice:70500:65536\n")
    with pytest.raises(UidRangeError, match=r"overlaps alice's range 70500-136035 in .*subuid"):
        check_range(UidRange(70000, 70999), **{**ok, "subuid": str(tmp_path / "subuid")})
    (tmp_path / "uid_map").write_text("         0          0      65536\n")
    with pytest.raises(UidRangeError, match="not every uid of it exists in this user namespace"):
        check_range(UidRange(70000, 70999), **{**ok, "uid_map": str(tmp_path / "uid_map")})


def _is_group_only(gid: int) -> bool:
    import grp
    import pwd
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    try:
        pwd.getpwuid(gid)
    except KeyError:
        return True
    return False


def pool(tmp_path: Path, size: int = 3, state: str = "state") -> UidPool:
    return UidPool(UidRange(FIRST, FIRST + size - 1), tmp_path / state,
                   claims=tmp_path / "claims")


def job_at(p: UidPool, offset: int, tag: str = "job") -> str:
    """A job id whose uid of choice is the pool's ``offset``-th."""
    return next(j for j in (f"{tag}_{i}" for i in range(10_000))
                if p.preferred(j) == FIRST + offset)


def test_a_job_s_uid_is_the_same_on_every_node_and_never_one_held(tmp_path):
    """Two hosts (claims of their own) pick the same uid for a job, for each
    of its attempts; one held here (another attempt of this agent) is passed
    over for the next, wrapping round; none free: exhausted, saying why."""
    a = UidPool(UidRange(FIRST, FIRST + 2), tmp_path / "a", claims=tmp_path / "claims-a")
    b = UidPool(UidRange(FIRST, FIRST + 2), tmp_path / "b", claims=tmp_path / "claims-b")
    job = job_at(a, 2)
    assert a.allocate(job, 1, set()) == b.allocate(job, 1, set()) == FIRST + 2
    assert b.allocate(job, 2, {FIRST + 2}) == FIRST, "the next, round the end"
    with pytest.raises(PoolExhausted) as e:
        a.allocate(job, 3, {FIRST, FIRST + 1, FIRST + 2})
    assert str(e.value) == (f"no free rank uid in --rank-uids {FIRST}-{FIRST + 2}: 3 held by "
                            "attempts on this node")


def test_agents_on_one_host_share_a_uid_for_one_attempt_and_never_for_two(tmp_path):
    """Each uid handed out is claimed host-wide with its attempt: another agent
    of the host (another state directory) gets the same uid for that attempt
    (its ranks on a second simulated node), skips it for any other while the
    claim is fresh or its state holds it, and takes over a stale claim."""
    a, b = pool(tmp_path, state="a"), pool(tmp_path, state="b")
    job, rival = job_at(a, 0), job_at(a, 0, "rival")
    uid = a.allocate(job, 1, set())
    assert uid == FIRST and b.allocate(job, 1, set()) == uid, "one attempt, one uid"
    assert b.allocate(rival, 1, {uid}) == FIRST + 1
    assert pool(tmp_path, state="c").allocate(rival, 2, set()) == FIRST + 2, \
        "never two attempts on one uid"
    # b's claims, old now, of uids b's state does not hold: stale, taken over
    for claim in (tmp_path / "claims").glob(f"{FIRST + 1}.*"):
        os.utime(claim, (time.time() - 3600,) * 2)
    assert pool(tmp_path, state="d").allocate(job_at(a, 1, "late"), 1, set()) == FIRST + 1


#: SYS_exit by machine: ends the calling thread only (exit_group ends all)
SYS_EXIT = {"x86_64": 60, "aarch64": 93}


def linger_as(uid: int, main_thread_exits: bool = False) -> int:
    """A daemon of ``uid`` that left its parent's session and group (what a
    rank's escaped grandchild is); its pid. ``main_thread_exits``: it starts
    a thread and ends its main thread alone (``SYS_exit``), so its own
    status reads ``State: Z`` while the thread runs on (issue 41, item 4)."""
    end_main = (f"import ctypes, threading\n"
                f"threading.Thread(target=time.sleep, args=(600,)).start()\n"
                f"ctypes.CDLL(None).syscall({SYS_EXIT[os.uname().machine]}, 0)\n"
                if main_thread_exits else "")
    script = ("import os, sys, time\n"
              f"os.setgid({uid}); os.setuid({uid})\n"
              "if os.fork(): os._exit(0)\n"
              "os.setsid()\n"
              "if os.fork(): os._exit(0)\n"
              "sys.stdout.write(str(os.getpid()) + '\\n'); sys.stdout.flush()\n"
              "os.closerange(0, 1024)\n"
              + end_main +
              "time.sleep(600)\n")
    out = subprocess.run([rank_python(sys.executable), "-c", script], capture_output=True,
                         text=True, timeout=30, check=True, cwd="/")
    return int(out.stdout.split()[0])


@root_only
def test_a_daemon_whose_main_thread_ended_keeps_its_uid_until_it_is_killed(tmp_path):
    """The attack of issue 41, item 4: a zombie main thread with a live
    thread was taken for no process, so its uid went back to the pool (and
    to the next tenant's job) while the daemon ran on."""
    p = pool(tmp_path, size=2)
    uid = p.allocate(job_at(p, 0), 1, set())
    pid = linger_as(uid, main_thread_exits=True)
    try:
        status = Path(f"/proc/{pid}/status")
        wait_until(lambda: "State:\tZ" in status.read_text(), timeout=10,
                   what="the daemon's main thread ended")
        assert processes_by_uid([uid]) == {uid: [pid]}, "its live thread runs as the uid"
        assert p.release(uid, p.busy()) is False, "a process of it lives"
        wait_until(lambda: not processes_by_uid([uid]), timeout=10, what="the daemon killed")
        assert p.release(uid, p.busy()) is True
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


@root_only
def test_a_uid_returns_only_once_every_process_of_it_is_gone(tmp_path):
    """A daemon of the uid keeps it taken (also from allocation: nobody gets
    a uid a process still has); releasing the uid SIGKILLs it (it is the
    job's), and only once none is left is the uid free, its HOME and its
    /dev/shm files removed."""
    p = pool(tmp_path, size=2)
    uid = p.allocate(job_at(p, 0), 1, set())
    assert uid == FIRST
    home = p.make_home(uid)
    (home / "notes").write_text("job A's")
    os.chown(home / "notes", uid, uid)
    shm = Path("/dev/shm") / f"gpujobs-test-{uid}"
    shm.write_bytes(b"nccl")
    os.chown(shm, uid, uid)
    pid = linger_as(uid)
    try:
        assert processes_by_uid([uid]) == {uid: [pid]}
        # held by nobody's record, but a process has it: never handed out
        p.claims.unclaim(uid)
        assert p.allocate(job_at(p, 0, "next"), 1, set()) == uid + 1
        with pytest.raises(PoolExhausted, match=rf"1 by processes still running \(uids \[{uid}\]"):
            p.allocate(job_at(p, 0, "third"), 1, {uid + 1})
        p.claims.claim(uid, "job#1")
        assert p.release(uid, p.busy()) is False, "a process of it lives"
        wait_until(lambda: not processes_by_uid([uid]), timeout=10, what="the daemon killed")
        assert home.exists() and shm.exists(), "nothing removed while it lived"
        assert p.release(uid, p.busy()) is True
        assert not home.exists() and not shm.exists()
        assert not list((tmp_path / "claims").glob(f"{uid}.*"))
        assert p.allocate(job_at(p, 0, "again"), 1, {uid + 1}) == uid, "free again"
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        shm.unlink(missing_ok=True)


@root_only
def test_agents_sharing_an_attempt_s_uid_kill_what_it_left_only_once_both_let_go(tmp_path):
    """The attempt's ranks on one simulated node end while those on the other
    run on: that agent lets go of the uid and kills nothing; the last one to
    let go kills what is left, and the uid is free."""
    a, b = pool(tmp_path, state="a"), pool(tmp_path, state="b")
    job = job_at(a, 0)
    uid = a.allocate(job, 1, set())
    assert b.allocate(job, 1, set()) == uid
    pid = linger_as(uid)  # b's rank, running on
    try:
        assert a.release(uid, a.busy()) is True
        assert processes_by_uid([uid]) == {uid: [pid]}, "b's rank untouched"
        assert b.release(uid, b.busy()) is False, "the last holder kills what is left"
        wait_until(lambda: not processes_by_uid([uid]), timeout=10, what="the rank killed")
        assert b.release(uid, b.busy()) is True
        assert not list((tmp_path / "claims").glob(f"{uid}.*"))
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


@pytest.fixture
def home():
    """A state folder a pool's uid can pass through (pytest's are 0700)."""
    where = Path(tempfile.mkdtemp(prefix="gpujobs-uids-"))
    os.chmod(where, 0o711)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


WHO = ("import os; print('uid', os.getuid(), os.getgid(), os.getgroups(), os.environ['HOME'], "
       "flush=True)")


@root_only
def test_two_jobs_run_as_two_uids_and_a_full_pool_starts_no_rank_saying_why(home):
    world = World(home)
    try:
        p = UidPool(UidRange(FIRST, FIRST + 1), world.paths.state_dir, claims=home / "claims")
        agent = world.agent(launcher=RecordingLauncher(), base_env={"PATH": "/usr/bin:/bin"},
                            pool=p)
        python = rank_python(PY)
        for n, job in enumerate(("job_a", "job_b", "job_c")):
            agent.handle(message(launch(job, ranks=(0, 1),
                                        command=[python, "-c", WHO + "; import time; time.sleep(600)"]), n))
        uids = {k: a["uid"] for k, a in world.state()["attempts"].items()}
        assert {uids["job_a/1"], uids["job_b/1"]} == {FIRST, FIRST + 1}, uids
        assert uids["job_c/1"] is None, uids
        for job, uid in (("job_a", uids["job_a/1"]), ("job_b", uids["job_b/1"])):
            for r in (0, 1):  # both ranks of a job share its uid
                log = world.paths.log_file(job, 1, r)
                wait_until(lambda log=log: log.exists() and lines_of(log.read_bytes()),
                           timeout=30, what=f"{job} rank {r} says who it is")
                assert lines_of(log.read_bytes()) == [
                    f"uid {uid} {uid} [] {world.paths.state_dir}/homes/{uid}"]
        # no uid left: job_c's ranks never ran, each log says why, exit 127
        run_until(agent, lambda: world.api.of("EXITED"), what="job_c's EXITED")
        assert world.api.of("EXITED") == [{"type": "EXITED", "ranks": [0, 1], "exit_code": 127,
                                           "node_id": "node-1"}]
        said = lines_of(world.paths.log_file("job_c", 1, 0).read_bytes())
        assert said == [f"gpujobs-agent: no free rank uid in --rank-uids {FIRST}-{FIRST + 1}: "
                        "2 held by attempts on this node: the attempt's ranks on this node "
                        "were not started (exit code 127)"]

        # a restart adopts the running ranks and keeps their uids: never handed out twice
        again = Agent(node_id="node-1", gpus=8, api=world.api, inbox=world.inbox,
                      paths=world.paths, launcher=RecordingLauncher(), pool=p,
                      base_env={"PATH": "/usr/bin:/bin"})
        again.recover()
        assert again.state.held_uids() == {FIRST, FIRST + 1}
        with pytest.raises(PoolExhausted):
            p.allocate("job_d", 1, again.state.held_uids())
    finally:
        world.cleanup()


@root_only
def test_a_uid_goes_back_to_the_pool_once_its_attempts_processes_are_all_gone(home, caplog):
    """The attempt's ranks end, a daemon it left (out of their group) keeps
    the uid: the agent kills it, then frees the uid for the next job."""
    world = World(home)
    try:
        p = UidPool(UidRange(FIRST, FIRST), world.paths.state_dir, claims=home / "claims")
        agent = world.agent(launcher=RecordingLauncher(), base_env={"PATH": "/usr/bin:/bin"},
                            pool=p)
        escape = ("import os, sys, time\n"
                  "if os.fork() == 0:\n"
                  "    os.setsid()\n"
                  "    if os.fork() == 0:\n"
                  "        os.closerange(0, 1024); time.sleep(600)\n"
                  "    os._exit(0)\n"
                  "os.wait()\n")
        agent.handle(message(launch("job_a", command=[rank_python(PY), "-c", escape]), 1))
        run_until(agent, lambda: world.state()["attempts"]["job_a/1"]["uid_freed"],
                  timeout=30, what="the uid freed")
        [killed] = [r.getMessage() for r in caplog.records if "were left" in r.getMessage()]
        assert killed.startswith(f"uid {FIRST}: its attempt's ranks ended, 1 process(es) of it "
                                 "were left (pids [")
        assert killed.endswith("]): SIGKILLed; the uid returns to the pool once none is left")
        assert not processes_by_uid([FIRST]), "the daemon was killed"
        agent.handle(message(launch("job_b", command=[rank_python(PY), "-c", WHO]), 2))
        assert StateFile(world.paths.state_file).load().attempts["job_b/1"].uid == FIRST
    finally:
        world.cleanup()
        for pid in processes_by_uid([FIRST]).get(FIRST, []):
            os.kill(pid, 9)
