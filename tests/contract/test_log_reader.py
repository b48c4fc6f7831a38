"""The contract of the log reader (ports.LogReader), held by FakeLogReader of
tests/fakes.py and by CloudWatchLogReader on moto alike: what the stream
check of chalicelib/service/logs.py relies on (a token continues right after
its page's last event, whatever limit the page was read with), and what it
guards against (a read by prefix answers with every stream of the group)."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from chalicelib.adapters.log_reader import MAX_STREAM_NAMES
from tests.contract.ports import IMPLEMENTATIONS


class Logs:
    """A log reader and a way to write to the log group it reads."""

    def __init__(self, reader, put) -> None:
        self.reader, self._put = reader, put
        self.tag = uuid.uuid4().hex[:10]
        self.t0 = int(time.time() * 1000) - 60_000  # moto takes the last 14 days only

    def write(self, events: list[tuple[str, int]]) -> None:
        """(stream, ms after t0) each, one line each, in the order given."""
        for stream, dt in events:
            self._put(stream, self.t0 + dt, json.dumps({"stream": "stdout", "line": f"{dt}"}))

    def read_all(self, streams, prefix, limit, token=None):
        got = []
        for _ in range(1000):
            page = self.reader.read(streams, prefix, start_ms=self.t0, token=token, limit=limit)
            got += page.events
            token = page.next_token
            if token is None:
                return got
        raise AssertionError("never ended")


@pytest.fixture(params=IMPLEMENTATIONS)
def logs(request) -> Logs:
    if request.param == "fake":
        from tests.fakes import FakeLogReader

        fake = FakeLogReader()
        return Logs(fake, fake.put)
    import boto3

    from chalicelib.adapters.log_reader import CloudWatchLogReader
    from chalicelib.config import Config

    env = request.getfixturevalue("aws_env")
    config = Config.from_env(env)
    client = boto3.client("logs", endpoint_url=env["GPUJOBS_AWS_ENDPOINT_URL"],
                          region_name="us-east-1")

    def put(stream: str, ts: int, message: str) -> None:
        try:
            client.create_log_stream(logGroupName=config.log_group, logStreamName=stream)
        except client.exceptions.ResourceAlreadyExistsException:
            pass
        client.put_log_events(logGroupName=config.log_group, logStreamName=stream,
                              logEvents=[{"timestamp": ts, "message": message}])
    return Logs(CloudWatchLogReader(config), put)


def _streams(logs: Logs, job: str, ranks: int) -> list[str]:
    return [f"{job}-{logs.tag}/1/rank-{r}" for r in range(ranks)]


def test_pages_continue_right_after_their_last_event(logs):
    """Invariant: followed token to token, a read by names returns each event
    of the streams named once, those streams only, oldest first, as one read."""
    mine = _streams(logs, "job", 3)
    logs.write([(mine[i % 3], i) for i in range(7)] + [(f"other-{logs.tag}/1/rank-0", 3)])
    whole = logs.read_all(mine, f"job-{logs.tag}/1/", limit=100)
    assert [(e[0], e[1] - logs.t0) for e in whole] == [(mine[i % 3], i) for i in range(7)]
    assert logs.read_all(mine, f"job-{logs.tag}/1/", limit=2) == whole
    assert len({e[3] for e in whole}) == 7, "each event has its own id"


def test_a_smaller_limit_from_the_same_token_reads_the_start_of_the_same_page(logs):
    """Invariant (the service cuts a page this way): from one token, a read of
    fewer events returns the first of those a larger read returns, and its
    token continues right after them."""
    mine = _streams(logs, "job", 2)
    logs.write([(mine[i % 2], i) for i in range(9)])
    first = logs.reader.read(mine, "", start_ms=logs.t0, token=None, limit=2)
    big = logs.reader.read(mine, "", start_ms=logs.t0, token=first.next_token, limit=5)
    small = logs.reader.read(mine, "", start_ms=logs.t0, token=first.next_token, limit=3)
    assert small.events == big.events[:3]
    rest = logs.reader.read(mine, "", start_ms=logs.t0, token=small.next_token, limit=2)
    assert rest.events == big.events[3:5]


def test_a_read_by_prefix_answers_with_other_streams_as_well(logs):
    """Invariant (why the service checks every stream): more than 100 streams
    are read by name prefix, and moto (so the fake) ignores the prefix,
    answering with streams of other jobs in the log group."""
    mine = _streams(logs, "big", MAX_STREAM_NAMES + 1)
    other = f"other-{logs.tag}/1/rank-0"
    logs.write([(mine[0], 0), (other, 1), (mine[-1], 2)])
    got = {e[0] for e in logs.read_all(mine, f"big-{logs.tag}/1/", limit=10_000)}
    assert {mine[0], mine[-1], other} <= got
