"""Parsing inbox messages, and the state file's atomic round trip."""
from __future__ import annotations

import json
import os
import stat

import pytest

from agent.messages import Cancel, Launch, MessageError, master_port, parse
from agent.state import (
    DONE,
    RUNNING,
    AgentState,
    AttemptRecord,
    PendingReport,
    RankRecord,
    StateError,
    StateFile,
)


def body(**fields) -> str:
    base = {"type": "LAUNCH", "job_id": "job_01", "attempt": 1, "ranks": [3, 1],
            "world_size": 4, "command": ["python", "train.py"], "env": {"A": "1"}}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def test_launch_defaults_for_the_agreed_extensions():
    m = parse(body())
    assert isinstance(m, Launch)
    assert m.ranks == (1, 3)  # ascending, so LOCAL_RANK follows the global order
    assert (m.gpus_per_rank, m.master_addr) == (1, "127.0.0.1")
    assert m.master_port == master_port("job_01", 1)
    assert 20000 <= m.master_port <= 32767


def test_the_default_port_is_the_same_on_every_node_and_differs_between_attempts():
    ports = {master_port("job_01", a) for a in range(1, 50)}
    assert master_port("job_01", 1) == master_port("job_01", 1)
    assert len(ports) > 40 and all(20000 <= p <= 32767 for p in ports)


def test_launch_extensions_when_given():
    m = parse(body(gpus_per_rank=2, master_addr="10.0.0.5", master_port=29500))
    assert (m.gpus_per_rank, m.master_addr, m.master_port) == (2, "10.0.0.5", 29500)


def test_cancel():
    assert parse(json.dumps({"type": "CANCEL", "job_id": "job_01", "attempt": 2,
                             "reason": "user"})) == Cancel("job_01", 2, "user")


@pytest.mark.parametrize("text", [
    "not json", "[]", json.dumps({"type": "REBOOT"}),
    body(job_id="../../etc"), body(job_id=""), body(job_id=7),
    body(attempt=0), body(attempt=True), body(ranks=[]), body(ranks=[4]), body(ranks=[1, 1]),
    body(ranks=[-1]), body(command=[]), body(command="python train.py"), body(command=[""]),
    body(env=["A=1"]), body(env={"A": {"nested": 1}}), body(world_size=0),
    body(master_port=70000), body(gpus_per_rank=-1),
    json.dumps({"type": "CANCEL", "job_id": "job_01"}),
])
def test_messages_that_cannot_be_acted_on(text):
    with pytest.raises(MessageError):
        parse(text)


def sample_state() -> AgentState:
    rec = AttemptRecord(job_id="job_01", attempt=2, phase=RUNNING, ranks=[0, 1], created_at=1.5)
    rec.procs[0] = RankRecord(rank=0, local_rank=0, slots=[0, 1], exit_file="/e0",
                              log_file="/l0", heartbeat_file="/h0", pid=10, pgid=10,
                              start_time=99)
    tomb = AttemptRecord(job_id="job_02", attempt=1, phase=DONE, cancelled=True)
    return AgentState(attempts={rec.key: rec, tomb.key: tomb},
                      pending=[PendingReport("job_01", 2, {"type": "STARTED", "ranks": [0, 1]},
                                             2.0)])


def test_state_round_trips_through_the_file(tmp_path):
    f = StateFile(tmp_path / "state.json")
    assert f.load() == AgentState()  # no file yet: nothing known
    f.save(sample_state())
    loaded = f.load()
    assert loaded == sample_state()
    assert loaded.attempts["job_02/1"].is_tombstone
    assert not loaded.attempts["job_01/2"].is_tombstone


def test_state_file_is_private_and_leaves_no_temporary_files(tmp_path):
    f = StateFile(tmp_path / "state.json")
    f.save(sample_state())
    f.save(AgentState())
    assert os.listdir(tmp_path) == ["state.json"]
    assert stat.S_IMODE(os.stat(tmp_path / "state.json").st_mode) == 0o600


def test_a_failed_save_keeps_the_previous_state(tmp_path, monkeypatch):
    f = StateFile(tmp_path / "state.json")
    f.save(sample_state())

    def broken_replace(*_):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        f.save(AgentState())
    monkeypatch.undo()
    assert f.load() == sample_state()
    assert os.listdir(tmp_path) == ["state.json"]


@pytest.mark.parametrize("content", ["{", '{"version": 99, "attempts": {}, "pending": []}',
                                     '{"version": 1}'])
def test_an_unreadable_state_file_stops_the_agent_instead_of_starting_empty(tmp_path, content):
    (tmp_path / "state.json").write_text(content)
    with pytest.raises(StateError):
        StateFile(tmp_path / "state.json").load()
