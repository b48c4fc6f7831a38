"""The log shipper: every record of a rank's log file reaches CloudWatch Logs
(moto) exactly once, with its own time and its offset as ``seq``, within
PutLogEvents' limits, across agent restarts, failing calls and a store that
lost events, reading the files from the agent's side."""
from __future__ import annotations

import json
import sys
import time
import uuid

import pytest

from agent import core, logship
from agent.logship import Shipper
from agent.records import agent_record
from tests.support.waits import wait_until

from .harness import launch, message, run_until


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def job():
    return "job_" + uuid.uuid4().hex[:20]


def events(logs, group, stream):
    try:
        out = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)
    except logs.exceptions.ResourceNotFoundException:
        return []
    return out["events"]


def lines(logs, group, stream):
    """The stream's messages without their seq and next (checked apart:
    seqs(), and the test of next)."""
    got = [json.loads(e["message"]) for e in events(logs, group, stream)]
    return [{k: v for k, v in g.items() if k not in ("seq", "next")} for g in got]


def seqs(logs, group, stream):
    return [json.loads(e["message"])["seq"] for e in events(logs, group, stream)]


T0 = (time.time_ns() // 10**9 - 3600) * 10**9  # an hour ago, in ns, a whole second


def write(tmp_path, job, rank, text, stream="stdout", attempt=1, time_ns=None):
    """``text``'s lines as records (the shim's), at ``time_ns`` (default: now);
    a last line without its newline is a record cut short (a shim killed
    while writing)."""
    d = tmp_path / "logs" / job / str(attempt)
    d.mkdir(parents=True, exist_ok=True)
    out = b"".join(agent_record(stream, line, time_ns) for line in text.splitlines())
    if text and not text.endswith("\n"):
        out = out[:-1]
    with open(d / f"rank-{rank}.log", "ab") as f:
        f.write(out)
    return d / f"rank-{rank}.log"


def shipper(tmp_path, group, logs, clock=None, client=None):
    return Shipper(tmp_path / "logs", tmp_path / "state", group,
                   client_factory=lambda: client or logs, clock=clock or Clock(),
                   backoff_base=0.0, backoff_cap=0.0)


def test_stdout_and_stderr_of_every_rank_arrive_once_in_their_streams(tmp_path, group, logs,
                                                                      job):
    write(tmp_path, job, 0, "hello from 0\n")
    write(tmp_path, job, 0, "warning 0\n", "stderr")
    write(tmp_path, job, 1, "hello from 1\nsecond\n")
    s = shipper(tmp_path, group, logs)
    assert s.tick() == 4
    assert s.tick() == 0, "nothing new: nothing sent again"
    assert lines(logs, group, f"{job}/1/rank-0") == [
        {"stream": "stdout", "line": "hello from 0"}, {"stream": "stderr", "line": "warning 0"}]
    assert lines(logs, group, f"{job}/1/rank-1") == [
        {"stream": "stdout", "line": "hello from 1"}, {"stream": "stdout", "line": "second"}]
    # seq: each record's offset in its file
    first = len(agent_record("stdout", "hello from 0"))
    assert seqs(logs, group, f"{job}/1/rank-0") == [0, first]


def test_each_event_has_its_records_time_not_the_shipping_time(tmp_path, group, logs, job):
    """Invariant: an event's timestamp is the time the shim read its line
    (ms), also for lines shipped in one batch long after; the events of a
    batch are in chronological order."""
    write(tmp_path, job, 0, "one\n", time_ns=T0)
    write(tmp_path, job, 0, "a second later\n", "stderr", time_ns=T0 + 1_000_000_000)
    write(tmp_path, job, 0, "same ms\n", time_ns=T0 + 1_000_400_000)
    s = shipper(tmp_path, group, logs)
    assert s.tick() == 3  # one batch
    got = events(logs, group, f"{job}/1/rank-0")
    assert [e["timestamp"] for e in got] == [T0 // 10**6, T0 // 10**6 + 1000,
                                            T0 // 10**6 + 1000]
    assert [json.loads(e["message"])["line"] for e in got] == [
        "one", "a second later", "same ms"]


def test_a_record_cut_short_waits_for_its_newline_or_for_quiet(tmp_path, group, logs, job):
    clock = Clock()
    s = shipper(tmp_path, group, logs, clock)
    write(tmp_path, job, 0, "step 1\nstep 2 (no newline yet)")
    clock.now = time.time()  # the file was just written: not quiet
    s.tick()
    assert [e["line"] for e in lines(logs, group, f"{job}/1/rank-0")] == ["step 1"]
    clock.now += logship.PARTIAL_AFTER_S + 1
    s.tick()
    assert [e["line"] for e in lines(logs, group, f"{job}/1/rank-0")] == [
        "step 1", "step 2 (no newline yet)"]


def test_a_line_that_is_no_record_is_shipped_as_stdout(tmp_path, group, logs, job):
    path = write(tmp_path, job, 0, "a record\n", time_ns=T0)
    with open(path, "ab") as f:
        f.write(b"Traceback (not a record)\n")
    clock = Clock()
    s = shipper(tmp_path, group, logs, clock)
    assert s.tick() == 2
    got = events(logs, group, f"{job}/1/rank-0")
    assert [json.loads(e["message"])["line"] for e in got] == [
        "a record", "Traceback (not a record)"]
    assert got[1]["timestamp"] == int(clock.now * 1000)


class CrashAfterPut:
    """PutLogEvents reaches the service, then the agent dies before recording it."""

    def __init__(self, real) -> None:
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def put_log_events(self, **kw):
        self.real.put_log_events(**kw)
        raise KeyboardInterrupt("agent killed")


class CrashBeforePut(CrashAfterPut):
    def put_log_events(self, **kw):
        raise KeyboardInterrupt("agent killed")


@pytest.mark.parametrize("crash", [CrashAfterPut, CrashBeforePut])
def test_a_restarted_agent_resumes_from_its_offset_without_loss_or_repeat(tmp_path, group, logs,
                                                                         job, crash):
    write(tmp_path, job, 0, "one\ntwo\n")
    first = shipper(tmp_path, group, logs)
    first.tick()
    write(tmp_path, job, 0, "three\n")
    dying = shipper(tmp_path, group, logs, client=crash(logs))
    with pytest.raises(KeyboardInterrupt):
        dying.tick()
    write(tmp_path, job, 0, "four\n")
    again = shipper(tmp_path, group, logs)  # a new agent process: state from the file
    again.tick()
    assert [e["line"] for e in lines(logs, group, f"{job}/1/rank-0")] == [
        "one", "two", "three", "four"]


def test_batches_stay_within_put_log_events_limits(tmp_path, group, logs, job, monkeypatch):
    monkeypatch.setattr(logship, "MAX_BATCH_EVENTS", 100)
    sizes = []

    class Counting(CrashAfterPut):
        def put_log_events(self, **kw):
            events = kw["logEvents"]
            sizes.append((len(events), sum(len(e["message"].encode()) + 26 for e in events)))
            return self.real.put_log_events(**kw)

    long_line = "x" * (logship.MAX_LINE_BYTES + 10)  # no shim cuts this one short
    write(tmp_path, job, 0, "".join(f"line {i}\n" for i in range(250)) + long_line + "\n")
    s = shipper(tmp_path, group, logs, client=Counting(logs))
    while s.tick():
        pass
    assert all(n <= 100 and size <= 1_048_576 for n, size in sizes), sizes
    got = [e["line"] for e in lines(logs, group, f"{job}/1/rank-0")]
    assert got[:250] == [f"line {i}" for i in range(250)]
    assert "".join(got[250:]) == long_line, "a line over the event limit is cut, not lost"
    assert all(len(g.encode()) <= logship.MAX_LINE_BYTES for g in got)


@pytest.mark.parametrize("newline", ["\n", ""])
def test_a_long_line_is_cut_between_characters_never_inside_one(tmp_path, group, logs, job,
                                                                newline):
    """Invariant (issue 25): the cut of a line over the event limit falls on
    a UTF-8 character boundary, so the pieces joined are the line, with no
    U+FFFD; also for a line with no newline yet (cut at the limit)."""
    long_line = "a" + "é" * logship.MAX_LINE_BYTES  # the limit falls inside an é
    assert long_line.encode()[logship.MAX_LINE_BYTES] & 0xC0 == 0x80
    write(tmp_path, job, 0, long_line + newline)
    s = shipper(tmp_path, group, logs)
    while s.tick():
        pass
    got = [e["line"] for e in lines(logs, group, f"{job}/1/rank-0")]
    assert len(got) >= 2 and "\ufffd" not in "".join(got)
    if newline:
        assert "".join(got) == long_line
    else:  # the tail waits for its newline, or for the file to be quiet
        assert long_line.startswith("".join(got))
    assert all(len(g.encode()) <= logship.MAX_LINE_BYTES for g in got)


def test_a_failing_service_is_retried_and_nothing_is_lost(tmp_path, group, logs, job):
    class Flaky(CrashAfterPut):
        fails = 3

        def put_log_events(self, **kw):
            if Flaky.fails:
                Flaky.fails -= 1
                raise ConnectionError("endpoint unreachable")
            return self.real.put_log_events(**kw)

    write(tmp_path, job, 2, "a\nb\n")
    s = shipper(tmp_path, group, logs, client=Flaky(logs))
    for _ in range(6):
        s.tick()
    assert [e["line"] for e in lines(logs, group, f"{job}/1/rank-2")] == ["a", "b"]


@pytest.mark.parametrize("inbox, environ, expected", [
    # the local stack: moto serves every service where the inbox is
    ("http://127.0.0.1:5000", {}, "http://127.0.0.1:5000"),
    # AWS: the regional endpoint botocore picks
    ("https://sqs.eu-west-1.amazonaws.com", {}, None),
    # told where logs go: botocore's own variables win
    ("http://127.0.0.1:5000", {"AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": "http://h:1"}, None),
    ("http://127.0.0.1:5000", {"AWS_ENDPOINT_URL": "http://h:1"}, None),
])
def test_logs_go_where_the_inbox_is_served_by_an_emulator(inbox, environ, expected):
    assert logship.emulator_endpoint(inbox, environ) == expected


def store_only(logs, group, stream, keep):
    """The stream re-created holding only its first ``keep`` events (moto
    restored from an older snapshot)."""
    old = events(logs, group, stream)[:keep]
    logs.delete_log_stream(logGroupName=group, logStreamName=stream)
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    if old:
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
            {"timestamp": e["timestamp"], "message": e["message"]} for e in old])


@pytest.mark.parametrize("keep", [None, 0, 3, 9])
def test_a_restarted_shipper_takes_its_offsets_from_what_the_stream_holds(tmp_path, group,
                                                                         logs, job, keep):
    """Invariant: after a restart the offset is where the stream's last event
    ends (its seq), not what logship.json says: a stream deleted (None), or
    holding only its first ``keep`` events, ends with every line exactly once."""
    stream = f"{job}/1/rank-0"
    write(tmp_path, job, 0, "".join(f"line {i}\n" for i in range(10)))
    shipper(tmp_path, group, logs).flush()
    assert len(events(logs, group, stream)) == 10
    if keep is None:
        logs.delete_log_stream(logGroupName=group, logStreamName=stream)
    else:
        store_only(logs, group, stream, keep)
    write(tmp_path, job, 0, "line 10\n", "stderr")
    again = shipper(tmp_path, group, logs)
    again.flush()
    got = lines(logs, group, stream)
    assert [g["line"] for g in got] == [f"line {i}" for i in range(11)]
    assert got[-1]["stream"] == "stderr"
    assert seqs(logs, group, stream) == sorted(set(seqs(logs, group, stream)))


def test_a_stream_deleted_while_shipping_is_shipped_again_whole(tmp_path, group, logs, job):
    stream = f"{job}/1/rank-0"
    write(tmp_path, job, 0, "one\ntwo\n")
    s = shipper(tmp_path, group, logs)
    s.flush()
    logs.delete_log_stream(logGroupName=group, logStreamName=stream)
    write(tmp_path, job, 0, "three\n")
    s.flush()
    assert [g["line"] for g in lines(logs, group, stream)] == ["one", "two", "three"]


def test_a_record_cut_into_events_resumes_at_the_rest_of_it(tmp_path, group, logs, job):
    """A record over the event limit is several events, each with the offset
    its bytes start at; a store holding only the first of them is completed
    from the rest of that record, not from the record after it."""
    stream = f"{job}/1/rank-0"
    big = "\x01" * 60_000  # 360 KB as JSON: two events
    write(tmp_path, job, 0, big + "\nafter\n")
    shipper(tmp_path, group, logs).flush()
    first = events(logs, group, stream)
    assert len(first) == 3
    offsets = [json.loads(e["message"])["seq"] for e in first]
    assert offsets[0] == 0 and 0 < offsets[1] < offsets[2] == len(agent_record("stdout", big))
    store_only(logs, group, stream, 1)
    shipper(tmp_path, group, logs).flush()
    assert [(e["timestamp"], e["message"]) for e in events(logs, group, stream)] == [
        (e["timestamp"], e["message"]) for e in first]


def test_each_event_says_where_the_next_one_starts(tmp_path, group, logs, job):
    """Invariant: an event's ``next`` is the ``seq`` of the stream's next
    event (the last one's, the file's end), records cut into several events
    and batches across agent restarts included: so a reader that meets a
    ``seq`` past the ``next`` it holds knows lines came between."""
    stream = f"{job}/1/rank-0"
    path = write(tmp_path, job, 0, "one\n" + "\x01" * 60_000 + "\ntwo\n")
    shipper(tmp_path, group, logs).flush()
    write(tmp_path, job, 0, "three\nfour\n", "stderr")
    shipper(tmp_path, group, logs).flush()
    got = [json.loads(e["message"]) for e in events(logs, group, stream)]
    assert len(got) == 6, [g["line"][:10] for g in got]
    assert [g["next"] for g in got] == [g["seq"] for g in got[1:]] + [path.stat().st_size]


def test_a_ranks_lines_are_in_the_store_when_its_exit_is_reported(world, group, logs, job):
    """Invariant (issue 25): the agent reports EXITED only once the shipper
    shipped the rank's file to its end, so a reader of the logs can stop as
    the job ends; the shipper is woken for it, not waited for a period."""
    s = Shipper(world.paths.log_dir, world.tmp / "shipper", group,
                client_factory=lambda: logs, backoff_base=0.0, backoff_cap=0.0)
    seen_at_exit: list[list[str]] = []
    post = world.api.post_event

    def post_event(job_id, attempt, event):
        if event["type"] == "EXITED":
            seen_at_exit.append([g["line"] for g in lines(logs, group, f"{job}/1/rank-0")])
        return post(job_id, attempt, event)

    world.api.post_event = post_event
    agent = world.agent()
    agent.logs = s
    s.start(period_s=3600)  # only a wake ships in time
    try:
        script = "import sys\nfor i in range(100): print(f'line {i}')\nprint('bye', file=sys.stderr)\n"
        agent.handle(message(launch(job, command=[sys.executable, "-u", "-c", script]), 1))
        run_until(agent, lambda: world.api.of("EXITED", job), what="EXITED")
    finally:
        s.stop()
    assert seen_at_exit == [[f"line {i}" for i in range(100)] + ["bye"]]


def test_an_exit_is_reported_within_its_wait_when_the_shipper_cannot_ship(world, job):
    class Down:
        def __getattr__(self, name):
            raise ConnectionError("no CloudWatch Logs")

    s = Shipper(world.paths.log_dir, world.tmp / "shipper", "group",
                client_factory=lambda: Down(), backoff_base=60.0, backoff_cap=60.0)
    world.now = time.time()
    agent = world.agent()
    agent.logs = s
    agent.handle(message(launch(job, command=["sh", "-c", "echo hi"]), 1))
    wait_until(lambda: world.paths.exit_file(job, 1, 0).exists(), what="the rank exited")
    run_until(agent, lambda: agent.state.pending and all(
        p.event["type"] != "STARTED" for p in agent.state.pending), what="EXITED queued")
    assert not world.api.of("EXITED", job), "held: its log is not shipped yet"
    world.now += core.LOG_WAIT_S
    run_until(agent, lambda: world.api.of("EXITED", job), what="EXITED after the wait")
    s.tick()  # a failing shipper: nothing to wait for at all
    assert s.settled(world.paths.log_file(job, 1, 0))
