"""Restart safety: a new agent on the same state directory adopts what the old one left."""
from __future__ import annotations

import json

import pytest

from agent.api import ApiError
from agent.ranks import find_shims
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import FakeApi, RecordingLauncher, cancel, group_commands, launch, message, run_until

NODE = {"node_id": "node-1"}


def test_a_restarted_agent_adopts_running_ranks_reports_exits_and_can_cancel(world, tmp_path):
    gate = tmp_path / "gate"
    # rank 1 waits for the gate and exits 3; rank 0 runs until cancelled
    cmd = ["sh", "-c", f'if [ "$RANK" = 1 ]; then while [ ! -e "{gate}" ]; do sleep 0.02; done; '
                       f'exit 3; fi; exec sleep 30']
    down = FakeApi()
    down.fail_with = ApiError("no answer", retryable=True)
    a = world.agent(api=down)
    a.handle(message(launch(ranks=[0, 1], command=cmd), 1))
    a.tick()
    rank0, rank1 = world.launchers[0].launched
    assert down.events == []  # STARTED is still pending in the state file
    del a  # agent A is gone; its ranks were not touched

    gate.touch()  # rank 1 ends while no agent is running
    wait_until(lambda: world.paths.exit_file("job_a", 1, 1).exists(), what="rank 1 exit file")
    assert alive(rank0.pid)

    b = world.agent()  # agent B, same state directory, the API is back
    b.recover()
    b.handle(message(launch(ranks=[0, 1], command=cmd), 2))  # redelivered LAUNCH
    assert world.launchers[1].launched == []  # adopted, not launched again
    run_until(b, lambda: world.api.of("EXITED"), what="EXITED from B")
    assert [e for _, _, e in world.api.events] == [
        {"type": "STARTED", "ranks": [0, 1], **NODE},
        {"type": "EXITED", "ranks": [1], "exit_code": 3, **NODE}]
    assert alive(rank0.pid)

    b.handle(message(cancel(), 3))
    run_until(b, lambda: world.api.of("STOPPED"), what="STOPPED from B")
    assert world.api.of("STOPPED") == [{"type": "STOPPED", "ranks": [0, 1], **NODE}]
    assert not alive(rank0.pid)
    assert world.inbox.deleted == ["m-1", "m-2", "m-3"]


def test_a_restart_during_the_grace_period_still_kills_at_the_deadline(world):
    a = world.agent(grace_s=0.5)
    a.handle(message(launch(command=["sh", "-c", 'trap "" TERM; exec sleep 30']), 1))
    rank = world.launchers[0].launched[0]
    # once sh has exec'd sleep, the ignored SIGTERM is in place
    wait_until(lambda: "sleep" in group_commands(rank), what="sleep running")
    a.handle(message(cancel(), 2))
    del a
    b = world.agent(grace_s=0.5)
    b.recover()
    run_until(b, lambda: world.api.of("STOPPED"), what="STOPPED after restart")
    assert not alive(rank.pid)


class CrashAfterFirstLaunch(RecordingLauncher):
    """Dies (as the agent process would) right after starting the first rank."""

    class Crash(BaseException):
        pass

    def launch(self, *args, **kwargs):
        super().launch(*args, **kwargs)
        raise self.Crash()


def test_a_crash_in_the_middle_of_a_launch_is_finished_without_launching_twice(world):
    crashing = CrashAfterFirstLaunch()
    a = world.agent(launcher=crashing)
    with pytest.raises(CrashAfterFirstLaunch.Crash):
        a.handle(message(launch(ranks=[0, 1]), 1))
    assert world.inbox.deleted == []  # the message was not deleted: it will come back
    assert world.state()["attempts"]["job_a/1"]["phase"] == "LAUNCHING"
    first = crashing.launched[0]
    wait_until(lambda: first.exit_file in find_shims(), what="the orphaned shim")

    b = world.agent()
    b.recover()  # adopts rank 0 from /proc, launches only rank 1
    b.handle(message(launch(ranks=[0, 1]), 2))  # the redelivered LAUNCH is a duplicate now
    assert len(world.launchers[-1].launched) == 1
    procs = world.state()["attempts"]["job_a/1"]["procs"]
    assert procs["0"]["pid"] == first.pid
    assert world.api.events == [("job_a", 1, {"type": "STARTED", "ranks": [0, 1], **NODE})]
    shims = find_shims()
    assert sorted(p for f, p in shims.items() if "job_a" in f) == \
        sorted([procs["0"]["pid"], procs["1"]["pid"]])


def test_a_launch_recorded_without_the_optional_fields_is_finished_with_their_defaults(world):
    """The state file keeps the LAUNCH message; reading it back is parsing it,
    so a record from an agent that knew fewer fields still launches."""
    crashing = CrashAfterFirstLaunch()
    a = world.agent(launcher=crashing)
    with pytest.raises(CrashAfterFirstLaunch.Crash):
        a.handle(message(launch(ranks=[0, 1]), 1))
    state = world.state()
    record = state["attempts"]["job_a/1"]["launch"]
    for optional in ("gpus_per_rank", "master_addr", "master_port", "heartbeat_interval_s"):
        del record[optional]
    world.paths.state_file.write_text(json.dumps(state))

    b = world.agent()
    b.recover()  # launches rank 1 from the record
    [second] = world.launchers[-1].launched
    run_until(b, lambda: world.api.events, what="STARTED after restart")
    assert world.api.events == [("job_a", 1, {"type": "STARTED", "ranks": [0, 1], **NODE})]
    assert world.state()["attempts"]["job_a/1"]["procs"]["1"]["pid"] == second.pid


def test_a_cancel_recorded_just_before_a_crash_is_carried_out_after_the_restart(world,
                                                                               monkeypatch):
    # the margin: the grace (the recorded deadline) is 300 s, the wait for the
    # stop 60 s; a stop seen within it came from B's own SIGTERM, not the deadline
    a = world.agent(grace_s=300)
    a.handle(message(launch(command=["sleep", "600"]), 1))
    rank = world.launchers[0].launched[0]
    monkeypatch.setattr(a, "_terminate", lambda rec: None)  # dies between recording and signalling
    a.handle(message(cancel(), 2))
    assert world.state()["attempts"]["job_a/1"]["phase"] == "STOPPING" and alive(rank.pid)
    del a
    b = world.agent(grace_s=300)
    b.recover()
    # well before the recorded 300 s deadline: B sent SIGTERM itself
    run_until(b, lambda: world.api.of("STOPPED"), timeout=60, what="STOPPED after restart")
    assert not alive(rank.pid)
