"""The LAUNCH/CANCEL wire contract: what the control plane builds, the agent parses.

Messages are built with the control plane's builders (domain/intents.py), sent
as the inbox sends them (JSON), and parsed with the agent's parser
(agent/messages.py); both use the one schema of chalicelib/domain/wire.py.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timezone

from hypothesis import given, settings, strategies as st

from agent.messages import Cancel, Launch, MessageError, parse
from chalicelib.domain import intents, wire
from chalicelib.domain.health import initial_health
from chalicelib.domain.ids import new_job_id
from chalicelib.domain.intents import cancel_intent, launch_intent
from chalicelib.domain.jobs import Job
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.states import JobState
from chalicelib.domain.wire import master_port
from chalicelib.service.dispatch import Dispatcher

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
JOB_ID = "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"


def job_of(body: dict, job_id: str = JOB_ID, **fields) -> Job:
    spec = JobSpec.parse(body)
    return Job(job_id=job_id, tenant="acme", state=fields.pop("state", JobState.PENDING),
               spec=spec, created_at=NOW, updated_at=NOW, name=None,
               health=initial_health(spec, 60.0), **fields)


def sent(message: dict) -> str:
    """The SQS body, as the inbox adapter writes it."""
    return json.dumps(message, separators=(",", ":"))


def expected_launch(job: Job, attempt: int, ranks: list[int], addr: str, port: int) -> Launch:
    """The agent's reading of a LAUNCH, field by field from the job's spec."""
    spec = job.spec
    return Launch(job_id=job.job_id, attempt=attempt, world_size=spec.ranks,
                  command=tuple(spec.command), env=dict(spec.env),
                  gpus_per_rank=spec.gpus_per_rank, master_addr=addr, master_port=port,
                  heartbeat_interval_s=float(spec.heartbeat.interval_s),
                  working_dir=spec.working_dir, max_runtime_s=spec.max_runtime_s,
                  warn_before_s=spec.warn_before_s,
                  warn_signal=spec.warn_signal if spec.warn_before_s else None,
                  checkpoint_dir=(f"{spec.checkpoint_dir}/{job.job_id}"
                                  if spec.checkpoint_dir else None),
                  ranks=tuple(sorted(ranks)))


def test_importing_the_agent_s_parser_pulls_in_no_aws_library():
    code = ("import json, sys\nimport agent.messages\n"
            "print(json.dumps(sorted(m for m in sys.modules"
            " if m.split('.')[0] in ('boto3', 'botocore', 'pynamodb', 'chalicelib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == ["chalicelib", "chalicelib.domain", "chalicelib.domain.wire"]


def test_every_node_parses_the_launch_with_its_own_ranks():
    job = job_of({"command": ["python", "train.py", "--lr", "3e-4"], "ranks": 5,
                  "gpus_per_rank": 2, "env": {"A": "1", "NCCL_DEBUG": "INFO"},
                  "heartbeat": {"interval_s": 2.5}, "working_dir": "/data/runs/7",
                  "max_runtime_s": 3600, "warn_before_s": 120, "warn_signal": "SIGUSR2",
                  "checkpoint_dir": "/shared/ckpt"})
    by_node = {"node-1": [0, 1, 2], "node-2": [3, 4]}
    intent = launch_intent(job, 3, by_node, {"node-1": "q/1", "node-2": "q/2"},
                           master_addr="10.0.0.7", master_port=29511)
    for node_id, ranks in by_node.items():
        message = intent.message_for(node_id)
        parsed = parse(sent(message))
        assert parsed == expected_launch(job, 3, ranks, "10.0.0.7", 29511)
        # no field of the message is left unread, none of the schema unsent
        assert set(message) - {"type"} == {f.name for f in dataclasses.fields(Launch)}
        # and the agent's own copy (its state file) reads back the same
        assert parse(sent(parsed.to_message())) == parsed


def test_every_cancel_builder_parses_to_the_cancel_it_names():
    job = job_of({"command": ["x"], "ranks": 2}, state=JobState.RUNNING, attempt=4,
                 inboxes={"node-1": "q/1", "node-2": "q/2"})
    for reason in (None, "user", "superseded by run 42"):
        for intent in (cancel_intent(job, reason),
                       intents.cancel(job.job_id, 4, reason, {"node-3": "q/3"})):
            for node_id in intent.targets:
                message = intent.message_for(node_id)
                assert parse(sent(message)) == Cancel(job.job_id, 4, reason)
                assert message == Cancel(job.job_id, 4, reason).to_message()


def test_the_messages_are_byte_for_byte_those_sent_before_the_shared_schema():
    """Outbox items already stored hold this shape (API.md, "Nodes"); these
    bytes are what the control plane sent before domain/wire.py existed, but for
    the port, which issue 23 moved below the ephemeral range (20000..32767)."""
    job = job_of({"command": ["python", "train.py"], "ranks": 3, "gpus_per_rank": 2,
                  "env": {"A": "1"}})
    intent = launch_intent(job, 1, {"node-1": [0, 1], "node-2": [2]},
                           {"node-1": "q/1", "node-2": "q/2"}, master_addr="10.0.0.7",
                           master_port=master_port(job.job_id, 1))
    assert sent(intent.message) == (
        '{"type":"LAUNCH","job_id":"job_01ARZ3NDEKTSV4RRFFQ69G5FAV","attempt":1,'
        '"world_size":3,"command":["python","train.py"],"env":{"A":"1"},"gpus_per_rank":2,'
        '"master_addr":"10.0.0.7","master_port":25720,"heartbeat_interval_s":10}')
    assert sent(intent.message_for("node-2")) == sent(intent.message)[:-1] + ',"ranks":[2]}'
    assert sent(intents.cancel(job.job_id, 2, None, {"n": "q"}).message_for("n")) == (
        '{"type":"CANCEL","job_id":"job_01ARZ3NDEKTSV4RRFFQ69G5FAV","attempt":2,"reason":null}')


def test_a_launch_built_on_the_agent_s_side_is_the_control_plane_s_message():
    job = job_of({"command": ["python", "train.py"], "ranks": 2, "env": {"B": "2"}})
    intent = launch_intent(job, 1, {"n": [0, 1]}, {"n": "q"}, master_addr="h0",
                           master_port=master_port(job.job_id, 1))
    built = Launch(job_id=job.job_id, attempt=1, world_size=2,
                   command=("python", "train.py"), env={"B": "2"}, gpus_per_rank=1,
                   master_addr="h0", master_port=master_port(job.job_id, 1),
                   heartbeat_interval_s=job.spec.heartbeat.interval_s, ranks=(0, 1))
    assert sent(built.to_message()) == sent(intent.message_for("n"))


def test_a_launch_without_a_port_takes_the_port_the_control_plane_would_send():
    job = job_of({"command": ["x"], "ranks": 1})
    for attempt in (1, 2, 7):
        message = launch_intent(job, attempt, {"n": [0]}, {"n": "q"}, master_addr="h",
                                master_port=master_port(job.job_id, attempt)).message_for("n")
        del message["master_port"]
        assert parse(sent(message)).master_port == master_port(job.job_id, attempt)


def test_every_job_id_the_control_plane_makes_is_one_the_agent_accepts():
    for _ in range(200):
        assert wire.JOB_ID_RE.fullmatch(new_job_id())


def test_a_launch_the_agent_cannot_act_on_is_refused_not_guessed():
    job = job_of({"command": ["x"], "ranks": 2})
    message = launch_intent(job, 1, {"n": [0, 1]}, {"n": "q"}, master_addr="h",
                            master_port=29500).message_for("n")
    for broken in ({"ranks": [0, 2]}, {"world_size": 1}, {"attempt": 0}, {"command": []},
                   {"working_dir": "relative"}, {"working_dir": 7}):
        try:
            parse(sent({**message, **broken}))
        except MessageError:
            continue
        raise AssertionError(f"{broken} was accepted")


# -- any spec the API accepts ------------------------------------------------------
_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@st.composite
def _placed(draw):
    """A job spec within the API's bounds, and its ranks cut into nodes in order."""
    ranks = draw(st.integers(1, 40))
    body = {"command": [draw(_text.filter(bool)), *draw(st.lists(_text, max_size=4))],
            "ranks": ranks, "env": draw(st.dictionaries(_name, _text, max_size=4)),
            "gpus_per_rank": draw(st.integers(1, 64))}
    if draw(st.booleans()):
        body["working_dir"] = "/" + draw(_text.filter(lambda t: "\x00" not in t))
    if draw(st.booleans()):
        body["heartbeat"] = {"interval_s": draw(st.one_of(
            st.integers(1, 600), st.floats(0.5, 600, allow_nan=False)))}
    cuts = sorted(draw(st.sets(st.integers(1, ranks - 1), max_size=5)) if ranks > 1 else [])
    bounds = [0, *cuts, ranks]
    by_node = {f"node-{i}": list(range(a, b)) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))}
    return body, by_node, draw(st.integers(1, 100))


@settings(max_examples=150, deadline=None)
@given(_placed(), st.from_regex(r"[a-z0-9.-]{1,30}", fullmatch=True))
def test_any_placed_spec_reaches_every_node_as_built(placed, addr):
    body, by_node, attempt = placed
    job = job_of(body, job_id=new_job_id())
    port = master_port(job.job_id, attempt)
    intent = launch_intent(job, attempt, by_node, {n: f"q/{n}" for n in by_node},
                           master_addr=addr, master_port=port)
    for node_id, ranks in by_node.items():
        assert parse(sent(intent.message_for(node_id))) == expected_launch(
            job, attempt, ranks, addr, port)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 100), st.none() | st.text(max_size=1024))
def test_any_cancel_reaches_every_node_as_built(attempt, reason):
    job_id = new_job_id()
    intent = intents.cancel(job_id, attempt, reason, {"a": "q/a", "b": "q/b"})
    for node_id in intent.targets:
        assert parse(sent(intent.message_for(node_id))) == Cancel(job_id, attempt, reason)


# -- through the real inbox --------------------------------------------------------
def test_a_dispatched_launch_reaches_each_inbox_as_the_agent_reads_it(ports):
    a, b = ports.node(0), ports.node(1)
    job = ports.created(ranks=3, gpus_per_rank=1)
    placed, intent = ports.place(job, {a.node_id: [0, 1], b.node_id: [2]})
    assert Dispatcher(ports.inbox).send(intent) == 2
    for node, ranks in ((a, [0, 1]), (b, [2])):
        [message] = ports.drain(node.inbox_queue_url)
        assert parse(sent(message)) == expected_launch(job, placed.attempt, ranks,
                                                        "10.0.0.1", 29500)
