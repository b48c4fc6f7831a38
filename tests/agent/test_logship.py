"""The log shipper: every rank's stdout and stderr reaches CloudWatch Logs
(moto) exactly once, within PutLogEvents' limits, across agent restarts and
failing calls, reading the files from the agent's side."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from agent import logship
from agent.logship import Shipper


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def job():
    return "job_" + uuid.uuid4().hex[:20]


def lines(logs, group, stream):
    try:
        out = logs.get_log_events(logGroupName=group, logStreamName=stream, startFromHead=True)
    except logs.exceptions.ResourceNotFoundException:
        return []
    return [json.loads(e["message"]) for e in out["events"]]


def write(tmp_path, job, rank, text, suffix=".log", attempt=1):
    d = tmp_path / "logs" / job / str(attempt)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"rank-{rank}{suffix}", "a") as f:
        f.write(text)


def shipper(tmp_path, group, logs, clock=None, client=None):
    return Shipper(tmp_path / "logs", tmp_path / "state", group,
                   client_factory=lambda: client or logs, clock=clock or Clock(),
                   backoff_base=0.0, backoff_cap=0.0)


def test_stdout_and_stderr_of_every_rank_arrive_once_in_their_streams(tmp_path, group, logs,
                                                                      job):
    write(tmp_path, job, 0, "hello from 0\n")
    write(tmp_path, job, 0, "warning 0\n", ".err")
    write(tmp_path, job, 1, "hello from 1\nsecond\n")
    s = shipper(tmp_path, group, logs)
    assert s.tick() == 4
    assert s.tick() == 0, "nothing new: nothing sent again"
    got0 = lines(logs, group, f"{job}/1/rank-0")
    assert sorted((e["stream"], e["line"]) for e in got0) == [
        ("stderr", "warning 0"), ("stdout", "hello from 0")]
    assert lines(logs, group, f"{job}/1/rank-1") == [
        {"stream": "stdout", "line": "hello from 1"}, {"stream": "stdout", "line": "second"}]


def test_a_partial_line_waits_for_its_newline_or_for_quiet(tmp_path, group, logs, job):
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

    long_line = "x" * (logship.MAX_LINE_BYTES + 10)
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
