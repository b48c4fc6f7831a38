"""Issue 26 on the agent's side, with real rank processes and a clock moved by
hand: a LAUNCH's max_runtime_s (the warning warn_before_s ahead of it, then
TIMED_OUT and the stop at it, surviving a restart) and its checkpoint_dir."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agent.isolation import RankIdentity, give_checkpoint_dir
from agent.records import lines_of
from agent.shim import read_exit_file
from agent.uidpool import UidPool, UidRange
from tests.hostile_ranks import TEST_UID, bare_identity
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import (
    PY,
    RecordingLauncher,
    World,
    cancel,
    group_commands,
    launch,
    message,
    run_until,
)
from .test_core import DUMP_ENV, read_envs

NODE = {"node_id": "node-1"}
T0 = 1000.0  # the agent's clock at the launch

#: a rank that notes each SIGUSR1 in <out>/<RANK>.warned and keeps running,
#: notes SIGTERM in <out>/<RANK>.term and exits 0; <out>/<RANK>.ready once
#: both handlers are in place
WARNED_RANK = textwrap.dedent("""
    import os, signal, sys, time
    out, rank = sys.argv[1], os.environ["RANK"]
    def note(what):
        with open(os.path.join(out, rank + "." + what), "a") as f:
            f.write(what + "\\n")
    def on_term(*_):
        note("term")
        sys.exit(0)
    signal.signal(signal.SIGUSR1, lambda *_: note("warned"))
    signal.signal(signal.SIGTERM, on_term)
    note("ready")
    while True:
        time.sleep(0.02)
""")


def record(world, key="job_a/1") -> dict:
    return world.state()["attempts"][key]


def events(world) -> list[dict]:
    return [e for _, _, e in world.api.events]


def notes(out: Path, ranks, what: str) -> list[str]:
    """Each rank's notes of ``what`` (its file's text, "" if none)."""
    return [(out / f"{r}.{what}").read_text() if (out / f"{r}.{what}").exists() else ""
            for r in ranks]


def start_warned(world, tmp_path, agent, ranks=(0,), **limits) -> Path:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    agent.handle(message(launch(ranks=list(ranks), command=[PY, "-c", WARNED_RANK, str(out)],
                                **limits), 1))
    wait_until(lambda: all((out / f"{r}.ready").exists() for r in ranks),
               what="the ranks' handlers installed")
    return out


def test_a_rank_is_warned_ahead_of_its_limit_then_stopped_at_it(world, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpujobs.agent")
    world.now = T0
    agent = world.agent(grace_s=30)
    out = start_warned(world, tmp_path, agent, ranks=(0, 1), max_runtime_s=100,
                       warn_before_s=30, warn_signal="SIGUSR1")
    rec = record(world)
    assert (rec["runtime_deadline"], rec["warn_at"], rec["warn_signal"]) == \
        (T0 + 100, T0 + 70, "SIGUSR1")

    world.now = T0 + 69
    agent.tick()
    time.sleep(0.2)  # a negative check: time for a signal to land, if one were sent
    assert notes(out, (0, 1), "warned") == ["", ""]

    world.now = T0 + 70
    agent.tick()
    wait_until(lambda: notes(out, (0, 1), "warned") == ["warned\n"] * 2, what="both warned")
    for _ in range(3):
        agent.tick()
    time.sleep(0.2)  # a second warning would have landed by now
    assert notes(out, (0, 1), "warned") == ["warned\n"] * 2, "once"
    assert notes(out, (0, 1), "term") == ["", ""], "the warning does not stop a rank"
    assert record(world)["phase"] == "RUNNING" and record(world)["warned_at"] == T0 + 70
    assert "SIGUSR1 sent to ranks [0, 1]: 30 s left" in caplog.text
    assert events(world) == [{"type": "STARTED", "ranks": [0, 1], **NODE}]

    world.now = T0 + 100
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert events(world) == [{"type": "STARTED", "ranks": [0, 1], **NODE},
                             {"type": "TIMED_OUT", "ranks": [0, 1], **NODE},
                             {"type": "STOPPED", "ranks": [0, 1], **NODE}]
    assert notes(out, (0, 1), "term") == ["term\n"] * 2
    rec = record(world)
    assert (rec["phase"], rec["cancelled"], rec["cancel_reason"], rec["killed"]) == \
        ("DONE", True, "timeout", False)
    # the ranks' own exit code, which the shim (alive through the warning) recorded
    assert [read_exit_file(str(world.paths.exit_file("job_a", 1, r))) for r in (0, 1)] == [0, 0]
    assert not any(alive(r.pid) for r in world.launchers[0].launched)


def test_a_rank_that_ignores_sigterm_at_its_limit_is_killed_after_the_grace_period(
        world, monkeypatch):
    world.now = T0
    agent = world.agent(grace_s=5)
    agent.handle(message(launch(command=["sh", "-c", 'trap "" TERM; exec sleep 30'],
                                max_runtime_s=10), 1))
    rank = world.launchers[0].launched[0]
    # once sh has exec'd sleep, the ignored SIGTERM is in place
    wait_until(lambda: "sleep" in group_commands(rank), what="sleep running")
    world.now = T0 + 10
    agent.tick()
    assert world.api.of("TIMED_OUT") == [{"type": "TIMED_OUT", "ranks": [0], **NODE}]
    assert (record(world)["phase"], record(world)["stop_deadline"]) == ("STOPPING", T0 + 15)

    # the server's CANCEL for the timeout comes: no second stop
    stops = []
    monkeypatch.setattr(agent, "_terminate", lambda rec: stops.append(rec.key))
    agent.handle(message(cancel(reason="the attempt timed out"), 2))
    assert stops == []
    assert (record(world)["phase"], record(world)["stop_deadline"],
            record(world)["cancel_reason"]) == ("STOPPING", T0 + 15, "timeout")

    world.now = T0 + 14
    agent.tick()
    time.sleep(0.3)  # a negative check: SIGTERM has had time to (not) work
    agent.tick()
    assert alive(rank.pid) and world.api.of("STOPPED") == []
    world.now = T0 + 15
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED after SIGKILL")
    assert not alive(rank.pid) and record(world)["killed"] is True
    assert events(world) == [{"type": "STARTED", "ranks": [0], **NODE},
                             {"type": "TIMED_OUT", "ranks": [0], **NODE},
                             {"type": "STOPPED", "ranks": [0], **NODE}]


def test_a_timed_out_the_server_no_longer_wants_stops_the_ranks_quietly(world):
    """409 already_finished to TIMED_OUT (the attempt ended meanwhile, say by
    the control plane's backstop): its ranks are stopped all the same, and
    nothing more is reported for it."""
    world.now = T0
    agent = world.agent()
    agent.handle(message(launch(command=["sleep", "30"], max_runtime_s=10), 1))
    rank = world.launchers[0].launched[0]
    world.api.gone.add(("job_a", 1))  # every report of it answers 409 from now on
    world.now = T0 + 10
    run_until(agent, lambda: record(world)["phase"] == "DONE", what="attempt stopped")
    assert not alive(rank.pid)
    assert events(world) == [{"type": "STARTED", "ranks": [0], **NODE}]
    assert world.state()["pending"] == [] and record(world)["quiet"] is True


def test_no_warning_without_warn_before_s(world, tmp_path):
    world.now = T0
    agent = world.agent()
    out = start_warned(world, tmp_path, agent, max_runtime_s=100)
    assert (record(world)["warn_at"], record(world)["warn_signal"]) == (None, None)
    world.now = T0 + 99.9
    agent.tick()
    world.now = T0 + 100
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert notes(out, (0,), "warned") == [""] and notes(out, (0,), "term") == ["term\n"]
    assert [e["type"] for e in events(world)] == ["STARTED", "TIMED_OUT", "STOPPED"]


def test_no_limit_without_max_runtime_s(world, tmp_path):
    world.now = T0
    agent = world.agent()
    # a warning names no time without a limit to be ahead of
    out = start_warned(world, tmp_path, agent, warn_before_s=30)
    rec = record(world)
    assert (rec["max_runtime_s"], rec["runtime_deadline"], rec["warn_at"]) == (None, None, None)
    world.now = T0 + 10 ** 9
    for _ in range(3):
        agent.tick()
    time.sleep(0.2)  # a negative check: time for a signal to land, if one were sent
    agent.tick()
    assert notes(out, (0,), "warned") == [""] and notes(out, (0,), "term") == [""]
    assert record(world)["phase"] == "RUNNING" and alive(world.launchers[0].launched[0].pid)
    assert [e["type"] for e in events(world)] == ["STARTED"]


def test_the_deadlines_survive_a_restart(world, tmp_path):
    world.now = T0
    a = world.agent()
    out = start_warned(world, tmp_path, a, max_runtime_s=100, warn_before_s=30)
    a.close()

    world.now = T0 + 50
    b = world.agent()
    b.recover()  # adopts the rank, with the deadlines its record kept
    b.tick()
    world.now = T0 + 70
    run_until(b, lambda: notes(out, (0,), "warned") == ["warned\n"], what="warned by B")
    b.close()

    world.now = T0 + 99
    c = world.agent()
    c.recover()
    for _ in range(3):
        c.tick()
    time.sleep(0.2)  # a warning sent again would have landed by now
    assert notes(out, (0,), "warned") == ["warned\n"], "the warning is not sent twice"
    assert [e["type"] for e in events(world)] == ["STARTED"]
    world.now = T0 + 100
    run_until(c, lambda: world.api.of("STOPPED"), what="STOPPED from C")
    assert [e["type"] for e in events(world)] == ["STARTED", "TIMED_OUT", "STOPPED"]
    assert notes(out, (0,), "term") == ["term\n"]
    assert len(world.launchers[0].launched) == 1
    assert world.launchers[1].launched == [] and world.launchers[2].launched == []


def test_an_agent_back_after_the_limit_stops_the_attempt_without_a_late_warning(world,
                                                                              tmp_path):
    world.now = T0
    a = world.agent()
    out = start_warned(world, tmp_path, a, max_runtime_s=100, warn_before_s=30)
    a.close()
    world.now = T0 + 500  # down through the warning and the limit
    b = world.agent()
    b.recover()
    run_until(b, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert [e["type"] for e in events(world)] == ["STARTED", "TIMED_OUT", "STOPPED"]
    assert notes(out, (0,), "warned") == [""] and notes(out, (0,), "term") == ["term\n"]


def test_a_record_without_time_limits_from_an_older_agent_runs_without_any(world, tmp_path):
    world.now = T0
    a = world.agent()
    out = start_warned(world, tmp_path, a, max_runtime_s=100, warn_before_s=30)
    a.close()
    state = world.state()
    for name in ("max_runtime_s", "runtime_deadline", "warn_at", "warn_signal", "warned_at"):
        del state["attempts"]["job_a/1"][name]
    world.paths.state_file.write_text(json.dumps(state))
    world.now = T0 + 10 ** 6
    b = world.agent()
    b.recover()
    for _ in range(3):
        b.tick()
    time.sleep(0.2)  # a negative check
    b.tick()
    assert notes(out, (0,), "warned") == [""] and record(world)["phase"] == "RUNNING"
    assert record(world)["runtime_deadline"] is None


# -- the checkpoint directory ------------------------------------------------------
def test_a_rank_gets_its_jobs_checkpoint_dir_created(world, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    ckpt = tmp_path / "shared" / "ckpt" / "job_ck"
    agent = world.agent()
    agent.handle(message(launch("job_ck", attempt=2, command=[PY, "-c", DUMP_ENV, str(out)],
                                checkpoint_dir=str(ckpt)), 1))
    e = read_envs(out, [0])[0]
    assert e["GPUJOBS_CHECKPOINT_DIR"] == str(ckpt) and ckpt.is_dir()
    assert (e["GPUJOBS_ATTEMPT"], e["TORCHELASTIC_RESTART_COUNT"]) == ("2", "1")
    (ckpt / "step-10.pt").write_text("weights")
    # the next attempt finds it as the last one left it
    run_until(agent, lambda: record(world, "job_ck/2")["phase"] == "DONE", what="attempt 2 done")
    (out / "0.json").unlink()
    agent.handle(message(launch("job_ck", attempt=3, command=[PY, "-c", DUMP_ENV, str(out)],
                                checkpoint_dir=str(ckpt)), 2))
    assert read_envs(out, [0])[0]["GPUJOBS_CHECKPOINT_DIR"] == str(ckpt)
    assert (ckpt / "step-10.pt").read_text() == "weights"


@pytest.mark.parametrize("under_a_root", [True, False])
def test_a_checkpoint_dir_that_cannot_be_made_is_logged_and_the_rank_starts(
        world, tmp_path, caplog, under_a_root):
    """Under a root the operator allows, the agent makes it and logs its
    failure; elsewhere the rank's shim makes it, as the rank, and says so in
    the rank's log. Either way the rank starts."""
    out = tmp_path / "env"
    out.mkdir()
    (tmp_path / "not-a-dir").write_text("")
    ckpt = tmp_path / "not-a-dir" / "job_ck"
    agent = world.agent(job_roots=(str(tmp_path),) if under_a_root else ())
    agent.handle(message(launch("job_ck", command=[PY, "-c", DUMP_ENV, str(out)],
                                checkpoint_dir=str(ckpt)), 1))
    assert read_envs(out, [0])[0]["GPUJOBS_CHECKPOINT_DIR"] == str(ckpt)
    if under_a_root:
        assert f"cannot prepare the checkpoint directory {ckpt}" in caplog.text
    else:
        said = lines_of(world.paths.log_file("job_ck", 1, 0).read_bytes(), "stderr")
        assert said and said[0].startswith(f"gpujobs-shim: cannot make {ckpt}: "), said
        assert said[0].endswith("; starting anyway")


def rank_identity(uid: int = TEST_UID) -> RankIdentity:
    identity = bare_identity(uid)
    if identity is None:
        pytest.skip("giving a directory to a rank's uid takes root")
    return identity


def test_the_checkpoint_dir_is_given_to_the_ranks_uid_never_through_a_link(tmp_path):
    identity = rank_identity()
    ckpt = tmp_path / "shared" / "job_ck"
    state = tmp_path / "state"
    state.mkdir()
    within = {"root": str(tmp_path), "state_dir": state}
    umask = os.umask(0o077)  # the agent's (agent/__main__.py)
    try:
        give_checkpoint_dir(str(ckpt), "job_ck", identity, **within)
    finally:
        os.umask(umask)
    st = ckpt.stat()
    assert (st.st_uid, st.st_gid) == (identity.uid, identity.gid) and st.st_mode & 0o700 == 0o700
    assert st.st_mode & 0o777 == 0o700, "the job's alone: no other tenant reads a checkpoint"
    assert (tmp_path / "shared").stat().st_uid == 0, "only the job's own directory is given"
    assert (tmp_path / "shared").stat().st_mode & 0o777 == 0o755, \
        "a folder made on the way: the ranks pass through, whatever the agent's umask"
    give_checkpoint_dir(str(ckpt), "job_ck", identity, **within)  # there already: fine

    # a rank put a link where the job's directory goes: nothing is changed through it
    target = tmp_path / "etc"
    target.mkdir()
    (tmp_path / "shared" / "job_ln").symlink_to(target)
    with pytest.raises(OSError):
        give_checkpoint_dir(str(tmp_path / "shared" / "job_ln"), "job_ln", identity, **within)
    assert target.stat().st_uid == 0
    # nor a directory that is not the job's own (its last component is the job id)
    with pytest.raises(OSError):
        give_checkpoint_dir(str(tmp_path / "shared" / "job_ck" / ".."), "job_ck", identity,
                            **within)
    assert (tmp_path / "shared").stat().st_uid == 0


def test_a_rank_run_as_its_attempts_uid_writes_in_its_checkpoint_dir(tmp_path):
    identity = rank_identity()
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no python3 the rank user can run")
    # pytest's own directories are 0700: the rank user could not reach its heartbeat
    home = Path(tempfile.mkdtemp(prefix="gpujobs-ckpt-"))
    os.chmod(home, 0o711)
    world = World(home)
    try:
        pool = UidPool(UidRange(identity.uid, identity.uid), world.paths.state_dir,
                       claims=home / "claims")
        agent = world.agent(launcher=RecordingLauncher(), base_env={"PATH": os.environ["PATH"]},
                            pool=pool, job_roots=(str(home),))
        ckpt = home / "shared" / "job_ck"
        write = ("import os; open(os.path.join(os.environ['GPUJOBS_CHECKPOINT_DIR'], "
                 "'step-1.pt'), 'w').write(str(os.getuid()))")
        agent.handle(message(launch("job_ck", command=[python, "-c", write],
                                    checkpoint_dir=str(ckpt)), 1))
        run_until(agent, lambda: world.api.of("EXITED"), what="EXITED")
        assert world.api.of("EXITED") == [{"type": "EXITED", "ranks": [0], "exit_code": 0,
                                           **NODE}]
        assert (ckpt / "step-1.pt").read_text() == str(identity.uid)
        assert (ckpt / "step-1.pt").stat().st_uid == identity.uid
    finally:
        world.cleanup()
        shutil.rmtree(home, ignore_errors=True)

