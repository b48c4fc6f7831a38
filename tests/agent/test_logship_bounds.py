"""What the log shipper sends is bounded (issue 25, item 4), whatever a rank
writes, with ranks run as real processes by the agent and shipped to
CloudWatch Logs (moto, wrapped to refuse what AWS refuses and moto takes):

- no event over 256 KB and no batch over 1,048,576 bytes or 10,000 events,
  each event counted as AWS counts it (its message's UTF-8 plus 26 bytes;
  a control byte is six in the JSON message, ``\\u0001``);
- nothing lost within the rank's quota, and UTF-8 kept whole where a line
  is cut;
- past the quota, one line says so, nothing more of the rank's output is
  sent, and once it is quiet one more line says how much was dropped; the
  offsets still move, exactly once across agent restarts."""
from __future__ import annotations

import json
import sys
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from agent import logship
from agent.logship import Shipper
from agent.records import agent_record
from tests.support.waits import wait_until

from .harness import launch, message, run_until

#: PutLogEvents' documented limits
AWS_EVENT_BYTES, AWS_BATCH_BYTES, AWS_BATCH_EVENTS, AWS_OVERHEAD = 262_144, 1_048_576, 10_000, 26


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class AwsLimits:
    """The moto client, refusing a PutLogEvents that AWS would refuse (moto
    takes anything), and recording every batch's event sizes as AWS counts
    them. ``crash``: a KeyboardInterrupt (the agent killed) before or after
    the call reaches the service, for the first batch ``crash_when`` picks."""

    def __init__(self, real, crash: str | None = None, crash_when=None) -> None:
        self.real, self.batches, self.refused = real, [], []
        self.crash, self.crash_when = crash, crash_when

    def __getattr__(self, name):
        return getattr(self.real, name)

    def put_log_events(self, **kw):
        sizes = [len(e["message"].encode("utf-8")) + AWS_OVERHEAD for e in kw["logEvents"]]
        self.batches.append(sizes)
        if max(sizes) > AWS_EVENT_BYTES or sum(sizes) > AWS_BATCH_BYTES \
                or len(sizes) > AWS_BATCH_EVENTS:
            self.refused.append(sizes)
            raise ClientError({"Error": {"Code": "InvalidParameterException",
                                         "Message": "over PutLogEvents' limits"}},
                              "PutLogEvents")
        crash = self.crash and self.crash_when(kw["logEvents"])
        if crash and self.crash == "before":
            self.crash = None
            raise KeyboardInterrupt("agent killed before the call")
        out = self.real.put_log_events(**kw)
        if crash:
            self.crash = None
            raise KeyboardInterrupt("agent killed after the call")
        return out


def stored(logs, group: str, stream: str) -> list[dict]:
    """Every event of ``stream``, oldest first, as the service keeps it."""
    events, token = [], None
    while True:
        kw = {"logGroupName": group, "logStreamName": stream, "startFromHead": True,
              "limit": 200}
        if token:
            kw["nextToken"] = token
        try:
            out = logs.get_log_events(**kw)
        except logs.exceptions.ResourceNotFoundException:
            return []
        events += out["events"]
        if not out["events"] or out.get("nextForwardToken") in (None, token):
            return events
        token = out["nextForwardToken"]


def cost(event: dict) -> int:
    return len(event["message"].encode("utf-8")) + AWS_OVERHEAD


def run_rank(world, job: str, script: str) -> None:
    """One rank of ``job`` (attempt 1) run by the agent as a real process,
    to its end: it writes its rank-0.log (records) as any rank does."""
    agent = world.agent()
    agent.handle(message(launch(job, command=[sys.executable, "-c", script]), 1))
    wait_until(lambda: world.paths.exit_file(job, 1, 0).exists(), timeout=60,
               what="the rank exited")
    run_until(agent, lambda: world.api.of("EXITED", job), what="EXITED")
    assert world.api.of("EXITED", job)[0]["exit_code"] == 0


def shipper(world, group, client, clock=None, **kw) -> Shipper:
    return Shipper(world.paths.log_dir, world.tmp / "shipper", group,
                   client_factory=lambda: client, clock=clock or Clock(),
                   backoff_base=0.0, backoff_cap=0.0, **kw)


def drain(s: Shipper, ticks: int = 10_000) -> None:
    for _ in range(ticks):
        if s.tick() == 0:
            return
    raise AssertionError("still shipping")


def file_size(world, job: str, suffix: str = ".log") -> int:
    return world.paths.log_file(job, 1, 0).with_suffix(suffix).stat().st_size


@pytest.fixture
def job():
    return "job_" + uuid.uuid4().hex[:20]


def assert_within_aws_limits(client: AwsLimits) -> None:
    assert client.batches and not client.refused, client.refused[:1]
    assert max(max(b) for b in client.batches) <= AWS_EVENT_BYTES
    assert max(sum(b) for b in client.batches) <= AWS_BATCH_BYTES
    assert max(len(b) for b in client.batches) <= AWS_BATCH_EVENTS


# -- what any rank writes fits PutLogEvents ----------------------------------------------
def test_20_mb_of_control_bytes_arrive_whole_in_events_within_aws_limits(world, group, logs,
                                                                         job):
    """Invariant: a rank's 20 MB line of \\x01 (six bytes each in the JSON
    message: 120 MB as AWS counts it) reaches the service whole, in events
    of at most 256 KB and batches of at most 1,048,576 bytes (each 200 KB
    piece used to be one 1.2 MB event, over the batch limit); the line after
    it follows it."""
    run_rank(world, job, "import sys; sys.stdout.buffer.write(b'\\x01' * 20_000_000 + "
                         "b'\\nafter\\n')")
    client = AwsLimits(logs)
    drain(shipper(world, group, client))
    assert_within_aws_limits(client)
    got = [json.loads(e["message"]) for e in stored(logs, group, f"{job}/1/rank-0")]
    assert {g["stream"] for g in got} == {"stdout"}
    lines = [g["line"] for g in got]
    assert lines[-1] == "after"
    assert len(lines[:-1]) >= 120_000_000 // AWS_EVENT_BYTES, "cut by size as encoded"
    assert "".join(lines[:-1]) == "\x01" * 20_000_000, "nothing lost, nothing added"


def test_a_10_mb_line_of_mixed_text_arrives_whole_and_no_character_is_split(world, group,
                                                                            logs, job):
    """Invariant: a 10 MB line mixing ASCII, two-, three- and four-byte UTF-8,
    control bytes, quotes and backslashes is cut into events within AWS's
    limits, every cut between characters (no U+FFFD), and joined back it is
    the line; stderr is bounded the same way."""
    unit = "ab\u00e9\u20ac\U0001f600\x01\"\\\t"
    script = ("import sys\nunit = %r\nline = (unit * (10_000_000 // len(unit.encode())))\n"
              "sys.stdout.write(line + '\\n'); sys.stderr.write(line[:3_000_000])\n" % unit)
    run_rank(world, job, script)
    line = unit * (10_000_000 // len(unit.encode()))
    client = AwsLimits(logs)
    drain(shipper(world, group, client, clock=Clock()))
    drain(shipper(world, group, client, clock=lambda: time.time() + 10))  # the tail is quiet
    assert_within_aws_limits(client)
    got = [json.loads(e["message"]) for e in stored(logs, group, f"{job}/1/rank-0")]
    out = [g["line"] for g in got if g["stream"] == "stdout"]
    err = [g["line"] for g in got if g["stream"] == "stderr"]
    assert not any("\ufffd" in piece for piece in out + err)
    assert "".join(out) == line and "".join(err) == line[:3_000_000]
    assert len(out) > 1 and all(len(p.encode()) <= logship.MAX_LINE_BYTES for p in out)


# -- the quota ------------------------------------------------------------------------
QUOTA = 50_000
#: a rank's output: a few lines on stderr (written first: stderr is line
#: buffered, and the loop ends before stdout's first block), then stdout far
#: past the quota
RANK = ("import sys\n"
        "for i in range(10): print(f'warming {i}', file=sys.stderr)\n"
        "for i in range(3000): print(f'step {i:05d} ' + 'x' * 40)\n")
STDOUT = "".join(f"step {i:05d} " + "x" * 40 + "\n" for i in range(3000))
#: the smallest event that could still come: one character on stdout
SMALLEST = len(logship.encode("stdout", "x", 100_000).encode()) + AWS_OVERHEAD


#: more output, from a rank over its quota
LATE = b"".join(agent_record("stdout", "late") for _ in range(1000))


def records(text: str, stream: str = "stdout") -> bytes:
    """``text``'s lines as the shim's records."""
    return b"".join(agent_record(stream, line) for line in text.splitlines())


def over_seq(events: list[dict]) -> int:
    """Where the line saying the quota is reached stands: where the shipped bytes end."""
    return next(json.loads(e["message"])["seq"] for e in events
                if json.loads(e["message"])["line"] == over_line())


def agents_lines(events: list[dict]) -> list[str]:
    return [json.loads(e["message"])["line"] for e in events
            if json.loads(e["message"])["line"].startswith("[truncated:")]


def ranks_events(events: list[dict]) -> list[dict]:
    return [e for e in events if not json.loads(e["message"])["line"].startswith("[truncated:")]


def count_line(dropped: int) -> str:
    return (f"[truncated: {logship.size_text(dropped)} ({dropped:,} bytes) over this rank's "
            f"log quota of {logship.size_text(QUOTA)}]")


def over_line() -> str:
    return (f"[truncated: over this rank's log quota of {logship.size_text(QUOTA)}; the rest "
            "of its output in this attempt is not shipped]")


def assert_shipped_within_the_quota(events: list[dict]) -> str:
    """The rank's events: within the quota and filling it (not one more
    character would have fitted), stderr whole, stdout a prefix of what it
    wrote, nothing repeated; returns the stdout shipped."""
    mine = ranks_events(events)
    used = sum(cost(e) for e in mine)
    assert QUOTA - SMALLEST < used <= QUOTA, used
    got = [json.loads(e["message"]) for e in mine]
    assert [g["line"] for g in got if g["stream"] == "stderr"] == [f"warming {i}"
                                                                  for i in range(10)]
    out = [g["line"] for g in got if g["stream"] == "stdout"]
    text = "\n".join(out)
    assert STDOUT.startswith(text), "a prefix of what the rank wrote: no loss, no repeat"
    return text


def test_past_its_quota_a_rank_ships_one_line_saying_so_then_how_much_was_dropped(
        world, group, logs, job):
    """Invariant: a rank ships up to its quota (stdout and stderr together,
    counted as AWS counts them) and not a byte past it, nothing lost within
    it; then one line says the quota is reached, its files' offsets move to
    their ends without reading them, and once it has been quiet for
    QUOTA_SETTLE_S one more line says exactly how much it dropped; more
    output later is counted and said again after the next quiet spell."""
    run_rank(world, job, RANK)
    clock = Clock()
    client = AwsLimits(logs)
    s = shipper(world, group, client, clock=clock, quota_bytes=QUOTA)
    drain(s)
    assert_within_aws_limits(client)
    events = stored(logs, group, f"{job}/1/rank-0")
    assert_shipped_within_the_quota(events)
    assert agents_lines(events) == [over_line()]
    last = json.loads(events[-1]["message"])
    assert {"stream": last["stream"], "line": last["line"]} == {"stream": "stderr",
                                                               "line": over_line()}
    # past it: the offset at the file's end, what was passed counted; the
    # line saying so stands where the shipped bytes end
    out_size = file_size(world, job)
    assert s.offset(f"{job}/1/rank-0.log") == out_size
    before = json.loads(events[-2]["message"])["seq"]
    assert before < last["seq"] < out_size
    dropped = out_size - last["seq"]
    assert s.usage(f"{job}/1/rank-0")["dropped"] == dropped
    assert s.tick() == 0 and len(stored(logs, group, f"{job}/1/rank-0")) == len(events)
    # quiet for long enough: the count, once
    clock.now += logship.QUOTA_SETTLE_S + 1
    assert s.tick() == 1 and s.tick() == 0
    assert agents_lines(stored(logs, group, f"{job}/1/rank-0")) == [over_line(),
                                                                    count_line(dropped)]
    # more output: counted, not shipped, said again once quiet
    with world.paths.log_file(job, 1, 0).open("ab") as f:
        f.write(LATE)
    clock.now = time.time()  # just written: not quiet
    assert s.tick() == 0
    assert s.usage(f"{job}/1/rank-0")["dropped"] == dropped + len(LATE)
    clock.now = time.time() + logship.QUOTA_SETTLE_S + 1
    assert s.tick() == 1
    final = stored(logs, group, f"{job}/1/rank-0")
    assert agents_lines(final) == [over_line(), count_line(dropped),
                                   count_line(dropped + len(LATE))]
    assert ranks_events(final) == ranks_events(events), "nothing more of the rank's shipped"


@pytest.mark.parametrize("crash", ["before", "after"])
@pytest.mark.parametrize("batch", ["over", "count"])
def test_an_agent_killed_around_the_quota_ships_each_line_once_and_no_more(
        world, group, logs, job, crash, batch):
    """Invariant: an agent killed just before or just after the call that
    carries the quota's line (or the count's) reaches the service, and
    restarted from logship.json, ships what it would have without the kill:
    the rank's output up to the quota, each byte once, one line saying the
    quota is reached, one count of what was dropped; no more of the rank's
    output (the quota's state is committed with the offsets)."""
    run_rank(world, job, RANK)
    clock = Clock()
    marker = "[truncated: over" if batch == "over" else "bytes) over"
    dying = AwsLimits(logs, crash=crash,
                      crash_when=lambda events: marker in events[-1]["message"])
    s = shipper(world, group, dying, clock=clock, quota_bytes=QUOTA)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(20):
            s.tick()
            clock.now += logship.QUOTA_SETTLE_S + 1
    for _ in range(3):  # restarted, and again: each starts from the state file
        again = shipper(world, group, AwsLimits(logs), clock=clock, quota_bytes=QUOTA)
        drain(again)
        clock.now += logship.QUOTA_SETTLE_S + 1
        drain(again)
    events = stored(logs, group, f"{job}/1/rank-0")
    assert_shipped_within_the_quota(events)
    dropped = file_size(world, job) - over_seq(events)
    assert agents_lines(events) == [over_line(), count_line(dropped)]
    assert again.usage(f"{job}/1/rank-0") == {
        "shipped": sum(cost(e) for e in ranks_events(events)), "over": True,
        "dropped": dropped, "reported": dropped, "lines": 1}


def test_the_quota_counts_across_a_restart_and_a_rank_over_it_stays_over(world, group, logs,
                                                                         job):
    """Invariant: what a rank shipped before an agent restart counts toward
    its quota after it (the restarted agent stops at the same byte), and a
    rank found over its quota by a restarted agent ships nothing more."""
    d = world.paths.log_file(job, 1, 0).parent
    d.mkdir(parents=True)
    half = STDOUT[:len(STDOUT) // 100]
    (d / "rank-0.log").write_bytes(records("".join(f"warming {i}\n" for i in range(10)),
                                           "stderr") + records(half))
    drain(shipper(world, group, AwsLimits(logs), quota_bytes=QUOTA))
    with (d / "rank-0.log").open("ab") as f:
        f.write(records(STDOUT[len(half):]))
    drain(shipper(world, group, AwsLimits(logs), quota_bytes=QUOTA))
    events = stored(logs, group, f"{job}/1/rank-0")
    assert_shipped_within_the_quota(events)
    with (d / "rank-0.log").open("ab") as f:
        f.write(records("after the restart\n"))
    later = shipper(world, group, AwsLimits(logs), quota_bytes=QUOTA)
    drain(later)
    assert stored(logs, group, f"{job}/1/rank-0") == events
    assert later.offset(f"{job}/1/rank-0.log") == file_size(world, job)
