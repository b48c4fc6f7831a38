"""Reading rank logs on fakes (LogsService over FakeLogReader): whatever the
store returns, a read shows only the streams of the job, attempt and rank it
reads, and hands out no page token positioned among anyone else's lines;
``since`` takes only its documented forms, in a range that makes sense."""
from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest

from chalicelib.domain import cursor
from chalicelib.domain.errors import InvalidArgument, InvalidPageToken, ServiceUnavailable
from chalicelib.service import logs as logs_module
from chalicelib.service.logs import LogScope, LogsService, parse_since
from tests.fakes import FakeLogReader

from .helpers import register, submit

KEY = b"fake-page-key"


def placed_job(svc, tenant: str, ranks: int):
    """A job of ``ranks`` ranks placed on nodes of its own GPU type (attempt 1)."""
    gpu = f"gpu-{tenant}"
    for n in range(-(-ranks // 1024)):
        register(svc, f"{tenant}-n{n}", gpus=1024, gpu_type=gpu)
    job = submit(svc, tenant=tenant, ranks=ranks, gpu_type=gpu)
    assert job.job_id in svc.placer.run().placed
    return svc.store.get(job.job_id)


def message(text: str, stream: str = "stdout") -> str:
    return json.dumps({"stream": stream, "line": text})


def payload(token: str) -> str:
    """What a page token carries, as anyone holding it can read it."""
    body = token.split(".")[0]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


def every_page(service, tenant, job_id, **q):
    """Every page of a read, followed to the end: (lines, tokens handed out)."""
    lines, tokens, token = [], [], None
    for _ in range(10_000):
        page = service.read(tenant, job_id, page_token=token, **q)
        lines += page["lines"]
        token = page["next_page_token"]
        if token is None:
            return lines, tokens
        tokens.append(token)
    raise AssertionError("the pages never ended")


@pytest.fixture
def world_of_streams(svc, clock):
    """A globex job of 4,096 ranks beside an acme job, in one log group whose
    store ignores every stream filter, with streams that look like the big
    job's but are not: its attempt 2 and 10, rank 4096 (out of range), rank
    ``01`` (not how a rank is written), a job id it is a prefix of."""
    big = placed_job(svc, "globex", 4096)
    other = placed_job(svc, "acme", 2)
    reader = FakeLogReader(ignores_filter=True)
    t0 = 1_800_000_000_000
    ours, foreign = [], []
    b, o = big.job_id, other.job_id
    streams = [(f"{b}/1/rank-0", True), (f"{o}/1/rank-0", False), (f"{b}/1/rank-4095", True),
               (f"{o}/1/rank-1", False), (f"{b}/2/rank-0", False), (f"{b}/10/rank-3", False),
               (f"{b}/1/rank-4096", False), (f"{b}/1/rank-01", False), (f"{b}x/1/rank-0", False),
               (f"{b}/1/rank-7", True), (f"{b}/1/rank-7\n", False), ("unrelated", False)]
    for i in range(60):  # interleaved in time, runs of foreign lines between ours
        stream, mine = streams[(i * 7) % len(streams)]
        reader.put(stream, t0 + i, message(f"{'ours' if mine else 'secret'} {i}"))
        (ours if mine else foreign).append((stream, f"{'ours' if mine else 'secret'} {i}"))
    for i in range(25_000):  # another job's long run of output, after all of ours
        reader.put(f"{o}/1/rank-0", t0 + 1000 + i, message(f"secret tail {i}"))
    service = LogsService(svc.jobs, reader, page_token_key=KEY, clock=clock)
    return service, reader, big, other, ours


@pytest.mark.parametrize("page_size", [1, 3, 1000, 10_000])
def test_a_store_that_ignores_the_filter_shows_nothing_of_other_jobs(world_of_streams,
                                                                     page_size):
    """Invariant: every line of a read is of the job, attempt and rank range
    read, whatever streams the store answers with; followed page to page,
    the job's own lines come each once, in order, and no page token carries
    anything of another stream (its position always follows one of ours)."""
    service, reader, big, other, ours = world_of_streams
    lines, tokens = every_page(service, "globex", big.job_id, page_size=page_size)
    assert [x["line"] for x in lines] == [text for _, text in ours]
    assert {x["rank"] for x in lines} == {0, 4095, 7}
    assert not any("secret" in x["line"] for x in lines)
    for token in tokens:
        carried = payload(token)
        assert other.job_id not in carried and "unrelated" not in carried, carried
        assert json.loads(json.loads(carried)["k"])["p"][1] in (0, 4095, 7), carried


def test_one_rank_read_shows_that_rank_only(world_of_streams):
    """Invariant: a read of one rank shows that rank's stream only, even from
    a store that answers with every stream."""
    service, _, big, _, ours = world_of_streams
    lines, _ = every_page(service, "globex", big.job_id, rank=7, page_size=2)
    assert [x["line"] for x in lines] == [t for s, t in ours if s.endswith("/rank-7")]
    assert {x["rank"] for x in lines} == {7}


def test_a_token_positioned_on_another_rank_is_an_invalid_page_token(world_of_streams):
    """Invariant: a page token whose position is on a rank not of the read
    (out of range, or not the rank asked for) is 400 invalid_page_token, even
    when signed with the right key for the right filter; so is one of the
    store's tokens (the cursor before positions) or a malformed position;
    one of ours resumes."""
    service, _, big, other, _ = world_of_streams
    b = big.job_id

    def token_at(pos, rank=None, **more):
        filter_key = f"logs:{b}:1:{'' if rank is None else rank}:"
        return cursor.encode(json.dumps({"s": None, "p": pos, "d": 1, **more}),
                             tenant="globex", filter_key=filter_key, secret=KEY)

    t = 1_800_000_000_000
    for pos, rank in (([t, 4096, 1, None], None), ([t, -1, 1, None], None),
                      ([t, 0, 1, None], 7), ([t, 7, None, None], None),
                      ([t, 7, -1, None], None), ([t, 7, 1.5, None], None),
                      ([t, True, 1, None], None), ([-1, 7, 1, None], None),
                      ([str(t), 7, 1, None], None), ([t, 7, 1], None), ("x", None)):
        with pytest.raises(InvalidPageToken) as refused:
            service.read("globex", b, rank=rank, page_token=token_at(pos, rank))
        assert refused.value.field == "page_token", pos
    assert service.read("globex", b, page_token=token_at([t, 7, 3, None]))["job_id"] == b
    assert service.read("globex", b, page_token=token_at([t, 7, None, "e1"]))["job_id"] == b
    legacy = cursor.encode(json.dumps({"t": "3", "s": None, "a": f"{b}/1/rank-7"}),
                           tenant="globex", filter_key=f"logs:{b}:1::", secret=KEY)
    with pytest.raises(InvalidPageToken):
        service.read("globex", b, page_token=legacy)  # the store's token: not a position
    with pytest.raises(InvalidPageToken):
        service.read("globex", b, page_token=token_at([t, 7, 3, None], d=-1))


def test_a_store_that_honours_the_filter_is_read_once_a_page(svc, clock):
    """Invariant: the stream check costs a store that filters (CloudWatch)
    nothing: one read a page, the store's token handed on."""
    job = placed_job(svc, "globex", 3)
    reader = FakeLogReader()
    for i in range(7):
        reader.put(f"{job.job_id}/1/rank-{i % 3}", 1_800_000_000_000 + i, message(f"l{i}"))
    service = LogsService(svc.jobs, reader, page_token_key=KEY, clock=clock)
    lines, tokens = every_page(service, "globex", job.job_id, page_size=3)
    assert [x["line"] for x in lines] == [f"l{i}" for i in range(7)]
    assert (reader.reads, len(tokens)) == (3, 2)


def test_a_store_answering_only_other_streams_ends_in_503_not_a_leak(svc, clock, monkeypatch):
    """Invariant: when the store keeps answering with other streams' lines past
    the read budget, the answer is 503 unavailable (retry), never a token
    positioned among them nor a silently cut listing."""
    monkeypatch.setattr(logs_module, "MAX_READS", 2)
    job = placed_job(svc, "globex", 200)
    reader = FakeLogReader(ignores_filter=True)
    for i in range(40_000):
        reader.put(f"job_other/1/rank-{i % 3}", 1_800_000_000_000 + i, message("secret"))
    reader.put(f"{job.job_id}/1/rank-5", 1_800_000_100_000, message("ours"))
    service = LogsService(svc.jobs, reader, page_token_key=KEY, clock=clock)
    with pytest.raises(ServiceUnavailable):
        service.read("globex", job.job_id)
    monkeypatch.setattr(logs_module, "MAX_READS", 100)
    page = service.read("globex", job.job_id)
    assert ([x["line"] for x in page["lines"]], page["next_page_token"]) == (["ours"], None)


def test_the_scope_accepts_exactly_the_names_the_agent_writes():
    """Invariant: one rule decides which stream names a read may show: the
    agent's ``<job>/<attempt>/rank-<r>``, ASCII digits without a leading
    zero, ``r`` in range (and the rank asked for, if one was)."""
    every, one = LogScope("job_A", 2, 300, None), LogScope("job_A", 2, 300, 12)
    assert all(every.owns(f"job_A/2/rank-{r}") for r in (0, 12, 299))
    for name in ("job_A/2/rank-300", "job_A/2/rank-012", "job_A/2/rank--1", "job_A/2/rank-",
                 "job_A/2/rank-1\n", "job_A/2/rank-\uff11", "job_A/02/rank-1", "job_A/3/rank-1",
                 "job_AB/2/rank-1", "job/2/rank-1", "job_A/2/rank-1/x", "", None, 5):
        assert not every.owns(name), name
    assert one.owns("job_A/2/rank-12") and not one.owns("job_A/2/rank-13")


# -- since ----------------------------------------------------------------------------------
NOW = datetime(2025, 1, 31, 12, 0, 0, tzinfo=timezone.utc)

BAD_SINCE = [
    "739000d",                       # OverflowError before
    "0001-01-01T00:00:00Z",          # a negative startTime before
    "800000d", "20120d", "482869h",  # before 1970
    "1969-12-31T23:59:59.999Z",
    "\uff11\uff10m",                 # fullwidth digits
    "\u0663m", "1\u0660s",           # Arabic-Indic digits
    "", " ", "-5m", "+5m", "1e3m", "1.5h", "10", "m", "10M", "10 m", " 10m", "10m ", "10m\n",
    "1h30m", "1234567890s", "10w", "10y",
    "9999-12-31T23:59:59Z",          # far future
    "2025-02-01T12:00:00.001Z",      # just over a day ahead
    "2025-01-31T12:00:00",           # no offset
    "2025-01-31 12:00:00Z",          # a space for the T
    "2025-01-31T12:00Z", "2025-01-31", "20250131T120000Z", "2025-1-31T12:00:00Z",
    "2025-02-30T00:00:00Z", "2025-13-01T00:00:00Z", "2025-01-31T24:00:00Z",
    "2025-01-31T12:60:00Z", "2025-01-31T12:00:60Z", "2025-01-31T12:00:00+24:00",
    "2025-01-31T12:00:00+01:60", "2025-01-31T12:00:00.Z", "2025-01-31T12:00:00.1234567890Z",
    "2025-01-31T12:00:00Z\n", "\uff12025-01-31T12:00:00Z", "2025-01-31T12:00:00+0100",
    "yesterday", "now",
]


@pytest.mark.parametrize("value", BAD_SINCE)
def test_since_outside_its_documented_forms_is_invalid_argument_naming_since(value):
    """Invariant: any ``since`` that is not a duration ago of ASCII digits and
    s/m/h/d, or an RFC 3339 time with its offset from 1970 to a day ahead, is
    400 invalid_argument naming ``since`` (never an overflow, never a 500)."""
    with pytest.raises(InvalidArgument) as refused:
        parse_since(value, NOW)
    assert refused.value.field == "since"


@pytest.mark.parametrize("value, expected", [
    ("30s", NOW - timedelta(seconds=30)), ("10m", NOW - timedelta(minutes=10)),
    ("2h", NOW - timedelta(hours=2)), ("3d", NOW - timedelta(days=3)), ("0s", NOW),
    ("010m", NOW - timedelta(minutes=10)),
    ("20119d", datetime(1970, 1, 1, 12, tzinfo=timezone.utc)),
    ("482868h", datetime(1970, 1, 1, tzinfo=timezone.utc)),  # the epoch itself
    ("2025-01-31T11:00:00Z", datetime(2025, 1, 31, 11, tzinfo=timezone.utc)),
    ("2025-01-31t11:00:00.120z", datetime(2025, 1, 31, 11, 0, 0, 120000, tzinfo=timezone.utc)),
    ("2025-01-31T13:00:00.5+01:00", datetime(2025, 1, 31, 12, 0, 0, 500000,
                                            tzinfo=timezone.utc)),
    ("2025-01-31T06:30:00-05:30", datetime(2025, 1, 31, 12, tzinfo=timezone.utc)),
    ("2025-01-31T12:00:00.123456789Z", datetime(2025, 1, 31, 12, 0, 0, 123456,
                                               tzinfo=timezone.utc)),
    ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=timezone.utc)),
    ("2025-02-01T12:00:00Z", NOW + timedelta(days=1)),
])
def test_since_in_its_documented_forms_names_that_time(value, expected):
    """Invariant: each documented form of ``since`` names the time it says,
    in UTC, the bounds themselves included."""
    assert parse_since(value, NOW) == expected


def test_since_becomes_a_start_in_whole_milliseconds_rounded_up():
    """Invariant: the store's start time keeps no line before ``since``: whole
    milliseconds, rounded up, computed without float error."""
    assert logs_module.epoch_ms(datetime(2025, 1, 31, 12, 0, 3, 120000,
                                         tzinfo=timezone.utc)) == 1738324803120
    assert logs_module.epoch_ms(datetime(2025, 1, 31, 12, 0, 3, 120001,
                                         tzinfo=timezone.utc)) == 1738324803121
    assert logs_module.epoch_ms(datetime(1970, 1, 1, tzinfo=timezone.utc)) == 0


# -- size: every page fits Lambda's 6 MB, whatever the lines hold ---------------------------
#: Lambda's response limit, the proxy payload (service/limits.py)
LAMBDA_BYTES = 6_291_456
#: what a proxy payload holds beside the body (status code, headers), generously
ENVELOPE = 16_384


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


class RecordingReader(FakeLogReader):
    """FakeLogReader that remembers how many events each read asked for."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.asked: list[int] = []

    def read(self, streams, prefix, *, start_ms, token, limit):
        self.asked.append(limit)
        return super().read(streams, prefix, start_ms=start_ms, token=token, limit=limit)


@pytest.fixture(params=[False, True], ids=["filtering store", "store ignoring the filter"])
def heavy_logs(request, svc, clock):
    """A 3-rank job whose ranks wrote what once made 120 MB and 10.5 MB
    bodies: rank 0 20 MB of \\x01 (as the agent ships it now: 43,000 a
    256 KB event, six bytes each in the message, seven in the proxy
    payload), rank 1 a 10 MB line of euro signs (200,000 bytes an event;
    six bytes each in the proxy payload), rank 2 what an agent before
    issue 25 shipped (200,000 \\x01 an event, 1.2 MB messages: moto took
    them) and one event no agent writes and only a store enforcing no limit
    holds (5,000,000 characters); small lines between them, in time order,
    and with ``ignores_filter`` another job's lines interleaved."""
    job = placed_job(svc, "globex", 3)
    reader = RecordingReader(ignores_filter=request.param)
    j = job.job_id
    expected: dict[int, list[str]] = {0: [], 1: [], 2: []}
    streams = {0: pieces("\x01" * 20_000_000, 43_000), 1: pieces("\u20ac" * 3_333_333, 66_666),
               2: pieces("\x01" * 1_000_000, 200_000) + ["tick"] * 3}
    t = 1_800_000_000_000
    for i in range(max(len(v) for v in streams.values())):
        for r, texts in streams.items():
            if i < len(texts):
                t += 1
                reader.put(f"{j}/1/rank-{r}", t, message(texts[i]))
                expected[r].append(texts[i])
                if request.param:
                    reader.put(f"job_other/1/rank-{r}", t, message("secret " * 1000))
        if i % 50 == 0:
            t += 1
            reader.put(f"{j}/1/rank-2", t, message(f"small {i}"))
            expected[2].append(f"small {i}")
    t += 1
    reader.put(f"{j}/1/rank-2", t, "\x01" * 5_000_000)  # not our agent's: shown as it is, cut
    expected[2].append("\x01" * 262_144)  # CloudWatch's largest event: the most a line shows
    t += 1
    reader.put(f"{j}/1/rank-2", t, message("the end"))
    expected[2].append("the end")
    service = LogsService(svc.jobs, reader, page_token_key=KEY, clock=clock)
    return service, reader, job, expected


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1000, 10_000])
def test_every_page_fits_lambdas_6_mb_and_the_pages_resume_without_loss_or_repeat(
        heavy_logs, page_size):
    """Invariant: whatever the lines hold, each page of /logs takes under 6 MB
    of Lambda's proxy payload (these lines made 120 MB and 10.5 MB bodies);
    followed by its tokens, every line of the job comes exactly once, in
    order (a page cut by size resumes right after its last line); a line
    longer than CloudWatch's largest event is shown cut, and says so."""
    from chalicelib.service import limits

    service, _, job, expected = heavy_logs
    lines, token, pages = [], None, 0
    for _ in range(1000):
        page = service.read("globex", job.job_id, page_token=token, page_size=page_size)
        assert limits.proxy_bytes(page) + ENVELOPE <= LAMBDA_BYTES, (pages, len(page["lines"]))
        assert page["lines"] or page["next_page_token"] is None, "no empty page before the end"
        lines += page["lines"]
        pages += 1
        token = page["next_page_token"]
        if token is None:
            break
    assert pages > 28, "120 MB of proxy payload in pages of at most 6 MB"
    for r in expected:
        assert [x["line"] for x in lines if x["rank"] == r] == expected[r], r
    assert len({x["id"] for x in lines}) == len(lines) == sum(map(len, expected.values()))
    assert [x["time"] for x in lines] == sorted(x["time"] for x in lines)
    cut = [x for x in lines if x.get("cut")]
    assert [len(x["line"]) for x in cut] == [262_144]


def test_a_store_that_caps_no_answer_is_asked_for_twice_what_fitted_not_page_size(heavy_logs):
    """Invariant: after a page cut by size, the store is asked for at most
    twice the lines that fitted (growing back by doubling), not page_size
    again: moto answers a read of 10,000 such events with gigabytes."""
    service, reader, job, _ = heavy_logs
    first = service.read("globex", job.job_id, page_size=10_000)
    fitted = len(first["lines"])
    assert 1 < fitted < 100
    reader.asked.clear()
    page = service.read("globex", job.job_id, page_size=10_000,
                        page_token=first["next_page_token"])
    # twice what fitted, and the lines of the last millisecond sent (read again) and one
    assert reader.asked[0] == 2 * fitted + 2 and max(reader.asked) <= 10_000, reader.asked
    assert page["lines"][0]["id"] != first["lines"][-1]["id"]


@pytest.mark.parametrize("fitted", [0, -1, 10_001, "5", 2.5, True])
def test_a_token_carrying_a_bad_count_is_an_invalid_page_token(svc, clock, fitted):
    """Invariant: the count of lines that fitted, carried by a page token, is
    checked as the rest of it is (1 to 10,000)."""
    job = placed_job(svc, "globex", 1)
    service = LogsService(svc.jobs, FakeLogReader(), page_token_key=KEY, clock=clock)
    b = job.job_id
    token = cursor.encode(json.dumps({"s": None, "p": [1, 0, 1, None], "d": 1, "n": fitted}),
                          tenant="globex", filter_key=f"logs:{b}:1::", secret=KEY)
    with pytest.raises(InvalidPageToken):
        service.read("globex", b, page_token=token)


@pytest.mark.parametrize("body, seq, next_seq", [
    ({"seq": 10, "next": 42}, 10, 42),
    ({"seq": 10}, 10, None),                      # an agent that wrote no next
    ({"seq": 10, "next": 10}, 10, None),          # not after the line
    ({"seq": 10, "next": True}, 10, None),
    ({"seq": 10, "next": "42"}, 10, None),
    ({"next": 42}, None, None),                   # a next without a seq says nothing
    ({"seq": 10, "next": logs_module.MAX_SEQ + 1}, 10, None),
])
def test_a_line_shows_where_its_ranks_next_line_starts(body, seq, next_seq):
    """Invariant: ``next_seq`` is the agent's ``next`` when it is a whole
    number after the line's ``seq``, else null: a reader compares it with the
    rank's next ``seq`` to know whether lines came between."""
    line = logs_module.line_json(3, 1_800_000_000_000,
                                 json.dumps({"stream": "stdout", "line": "x", **body}), "e1")
    assert (line["seq"], line["next_seq"]) == (seq, next_seq)
