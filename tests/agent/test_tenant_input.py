"""Nothing a tenant controls is run, entered or followed with privilege
(issue 41, item 1 and its three attacks), with real processes, as root, each
rank as a bare uid of its own (tests/hostile_ranks.py):

- the job's environment reaches the rank's command only, never the root
  shim: a library named in ``LD_PRELOAD`` (one an earlier job of the same
  tenant dropped in /tmp) runs in the rank as the rank's uid, never as root;
- the working directory is entered as the rank's uid, after the drop: a
  folder another tenant keeps 0700 is a rank that cannot start, with the
  reason in its log, not a way into that folder;
- the command runs with no new privileges (no setuid binary raises it);
- a job's ``checkpoint_dir`` is made by the agent only under a root the
  operator allows, walked without following a link, never in the agent's
  state; elsewhere the rank makes it as its own uid. So a checkpoint
  directory set to the agent's heartbeat folder never becomes the rank's,
  and a link planted where the agent makes a folder is never followed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.isolation import give_checkpoint_dir, give_rank_dir
from agent.ranks import Launcher, ProcTable, Rank
from agent.records import lines_of
from tests.hostile_ranks import TEST_UID, bare_identity
from tests.support.waits import wait_until

from .harness import launch, message, pooled_agent, run_until

#: a library whose constructor appends the effective uid of every process
#: that loads it to the file compiled in (%s)
PRELOAD_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void who(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "%%d\n", (int)geteuid()); fclose(f); }
}
"""


@pytest.fixture
def identity():
    identity = bare_identity()
    assert identity is not None, "these tests run ranks as a uid of their own: run them as root"
    return identity


def start(launched: list[Rank], where: Path, command: list[str], identity, *,
          env: dict[str, str] | None = None, cwd: str | None = None) -> Rank:
    rank = Launcher().launch(command, {"PATH": "/usr/bin:/bin", **(env or {})},
                             str(where / "r.log"), str(where / "r.exit"), cwd=cwd,
                             identity=identity)
    launched.append(rank)
    return rank


def ended(rank: Rank) -> int:
    return wait_until(lambda: rank.exit_code() is not None and (rank.exit_code(),),
                      what="the rank's exit")[0]


def test_a_library_the_job_preloads_runs_only_in_the_rank_as_its_uid(
        launched, shared_dir, identity):
    """The attack of issue 41, item 1: ``"env": {"LD_PRELOAD": ...}`` ran the
    library's constructor in the shim, as uid 0."""
    who = shared_dir / "who"
    who.touch()
    os.chmod(who, 0o666)
    source = shared_dir / "who.c"
    source.write_text(PRELOAD_C % who)
    library = shared_dir / "who.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    os.chmod(library, 0o755)
    rank = start(launched, shared_dir, ["/bin/true"], identity, env={"LD_PRELOAD": str(library)})
    assert ended(rank) == 0
    uids = who.read_text().split()
    assert uids, "the rank never loaded the library: the job's LD_PRELOAD did not reach it"
    assert set(uids) == {str(TEST_UID)}, f"the library ran as uids {uids} (0 is root)"


def test_the_shim_has_none_of_the_jobs_environment_and_the_command_all_of_it(
        launched, shared_dir, identity):
    rank = start(launched, shared_dir, ["sleep", "30"], identity,
                 env={"GPUJOBS_TEST_SECRET": "s3cret", "LD_LIBRARY_PATH": "/tmp/lib"})
    command = wait_until(lambda: [p for p in rank.members(ProcTable.read()) if p != rank.pid],
                         what="the command started")[0]
    shim_env = Path(f"/proc/{rank.pid}/environ").read_bytes().split(b"\0")
    command_env = Path(f"/proc/{command}/environ").read_bytes().split(b"\0")
    assert not any(b"s3cret" in v or v.startswith(b"LD_") for v in shim_env), shim_env
    assert b"GPUJOBS_TEST_SECRET=s3cret" in command_env
    assert b"LD_LIBRARY_PATH=/tmp/lib" in command_env
    status = Path(f"/proc/{command}/status").read_text()
    assert "NoNewPrivs:\t1" in status, "the command may gain privileges (setuid binaries)"
    assert os.stat(f"/proc/{command}").st_uid == TEST_UID


def test_a_working_dir_the_ranks_uid_cannot_enter_is_a_rank_that_cannot_start(
        launched, shared_dir, identity):
    """The attack of issue 41, item 3: chdir ran as root, before the drop, so
    a rank started inside another tenant's 0700 folder and read what an
    absolute path refused it."""
    private = shared_dir / "tenant-a"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("tenant a's secret\n")
    os.chmod(private / "secret", 0o644)  # the shim's umask 022 makes such files common
    rank = start(launched, shared_dir, ["cat", "secret"], identity, cwd=str(private))
    assert ended(rank) == 127
    said = lines_of((shared_dir / "r.log").read_bytes(), "stderr")
    text = "\n".join(lines_of((shared_dir / "r.log").read_bytes(), "stdout") + said)
    assert "tenant a's secret" not in text
    assert said and "cannot start" in said[0] and "Permission denied" in said[0], said


def test_a_working_dir_the_ranks_uid_may_enter_is_where_the_command_runs(
        launched, shared_dir, identity):
    mine = shared_dir / "job"
    mine.mkdir()
    os.chown(mine, identity.uid, identity.gid)
    rank = start(launched, shared_dir, ["sh", "-c", "pwd; echo ok > made"], identity,
                 cwd=str(mine))
    assert ended(rank) == 0
    assert lines_of((shared_dir / "r.log").read_bytes(), "stdout") == [str(mine)]
    assert (mine / "made").stat().st_uid == TEST_UID


# -- paths a job names: checkpoint_dir ---------------------------------------------
def a_root_dir(where: Path) -> Path:
    """A folder of root's, 0755: what a link planted by a rank points at."""
    where.mkdir(mode=0o755)
    os.chmod(where, 0o755)
    return where


def test_a_link_below_the_root_is_never_followed_to_make_a_checkpoint_dir(shared_dir, identity):
    target = a_root_dir(shared_dir / "etc")
    (shared_dir / "ckpt").symlink_to(target)  # what a rank can do in shared storage
    with pytest.raises(OSError):
        give_checkpoint_dir(str(shared_dir / "ckpt" / "job_x"), "job_x", identity,
                            root=str(shared_dir), state_dir=a_root_dir(shared_dir / "state"))
    assert list(target.iterdir()) == []
    st = target.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)


def test_a_checkpoint_dir_in_the_agents_state_is_refused_even_under_a_root(
        shared_dir, identity):
    state = a_root_dir(shared_dir / "state")
    beats = a_root_dir(state / "heartbeats")
    with pytest.raises(OSError, match="state directory"):
        give_checkpoint_dir(str(beats / "job_x"), "job_x", identity, root=str(shared_dir),
                            state_dir=state)
    assert not (beats / "job_x").exists()


def test_a_link_planted_where_a_rank_dir_goes_is_never_followed(shared_dir, identity):
    """The second half of the attack: attempt 1 planted ``<job>/2 -> /root/dir``
    and attempt 2's heartbeat folder was made, chowned and chmodded through it."""
    state = a_root_dir(shared_dir / "state")
    job = state / "heartbeats" / "job_x"
    job.mkdir(parents=True)
    target = a_root_dir(shared_dir / "etc")
    (job / "2").symlink_to(target)
    with pytest.raises(OSError):
        give_rank_dir(job / "2", state, identity)
    st = target.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o755)


PLANT = """
import os, sys
where = os.environ["GPUJOBS_CHECKPOINT_DIR"]
try:
    os.symlink(sys.argv[1], os.path.join(where, "2"))
    print("planted", flush=True)
except OSError as e:
    print("refused:", e.strerror, flush=True)
"""


@pytest.mark.parametrize("roots", ["none", "one holding the state"])
def test_a_checkpoint_dir_set_to_the_agents_heartbeat_folder_never_becomes_the_ranks(
        shared_world, identity, roots):
    """The attack of issue 41, item 2, with a real agent's launch and a real
    rank: ``checkpoint_dir`` named ``<state>/heartbeats``, and the heartbeat
    folder became the rank's, where it planted a link for attempt 2."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    agent = pooled_agent(shared_world, identity,
                         job_roots=() if roots == "none" else (str(shared_world.tmp),))
    beats = shared_world.paths.state_dir / "heartbeats"
    target = a_root_dir(shared_world.tmp / "etc")
    agent.handle(message(launch("job_x", command=[python, "-c", PLANT, str(target)],
                                checkpoint_dir=str(beats / "job_x")), 1))
    run_until(agent, lambda: shared_world.api.of("EXITED"), timeout=30, what="the rank's end")
    said = lines_of(shared_world.paths.log_file("job_x", 1, 0).read_bytes(), "stdout")
    assert said == ["refused: Permission denied"], said
    assert (beats / "job_x").stat().st_uid == 0, "the heartbeat folder became the rank's"
    assert not (beats / "job_x" / "2").is_symlink()


def test_a_checkpoint_dir_outside_the_roots_is_made_by_the_rank_as_its_uid(shared_world, identity):
    python = shutil.which("python3", path="/usr/bin:/bin")
    agent = pooled_agent(shared_world, identity)
    ckpt = shared_world.tmp / "ckpt" / "job_y"
    write = "import os; open(os.environ['GPUJOBS_CHECKPOINT_DIR'] + '/step-1.pt', 'w')"
    agent.handle(message(launch("job_y", command=[python, "-c", write],
                                checkpoint_dir=str(ckpt)), 1))
    run_until(agent, lambda: shared_world.api.of("EXITED"), timeout=30, what="the rank's end")
    assert shared_world.api.of("EXITED")[0]["exit_code"] == 0
    assert ckpt.stat().st_uid == TEST_UID and (ckpt / "step-1.pt").stat().st_uid == TEST_UID
    assert ckpt.stat().st_mode & 0o777 == 0o700, "the job's alone"
