"""The order of a job's log lines, its page tokens as positions, and ``tail``
(LogsService over FakeLogReader, which answers in time order, ties in the
order the events were put, as moto does stream by stream): lines come by
(time, rank, seq), a token resumes exactly after the last line sent whatever
was appended meanwhile, and ``tail=N`` is the newest N across the ranks."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from chalicelib.domain.clock import iso
from chalicelib.domain.errors import InvalidArgument, ServiceUnavailable
from chalicelib.service import limits, logs as logs_module
from chalicelib.service.logs import LogsService, epoch_ms
from tests.fakes import FakeLogReader

from .test_logs import ENVELOPE, KEY, LAMBDA_BYTES, RecordingReader, placed_job


def msg(text: str, seq: int | None = None, stream: str = "stdout") -> str:
    body: dict = {"stream": stream, "line": text}
    if seq is not None:
        body["seq"] = seq
    return json.dumps(body)


class Ranks:
    """A job's streams in a fake store: ``put(rank, t, text)`` ships one line
    of that rank at ``t`` ms, its seq the rank's next offset."""

    def __init__(self, svc, clock, ranks: int, reader: FakeLogReader | None = None) -> None:
        self.job = placed_job(svc, "globex", ranks)
        self.reader = reader if reader is not None else FakeLogReader()
        self.offset: dict[int, int] = {}
        self.service = LogsService(svc.jobs, self.reader, page_token_key=KEY, clock=clock)
        self.t0 = epoch_ms(clock()) - 3_600_000  # an hour ago

    def put(self, rank: int, dt: int, text: str, *, seq: bool = True) -> None:
        at = self.offset.get(rank, 0)
        self.offset[rank] = at + len(text) + 1
        self.reader.put(f"{self.job.job_id}/1/rank-{rank}", self.t0 + dt,
                        msg(text, at if seq else None))

    def read(self, **q) -> dict:
        return self.service.read("globex", self.job.job_id, **q)

    def pages(self, token=None, **q) -> tuple[list[dict], str | None]:
        """Every page from ``token`` to the end: the lines, and the follow token."""
        lines = []
        for _ in range(10_000):
            page = self.read(page_token=token, **q)
            lines += page["lines"]
            assert page["follow_token"], "every page hands out a position"
            if page["next_page_token"] is None:
                return lines, page["follow_token"]
            assert page["next_page_token"] == page["follow_token"]
            token = page["next_page_token"]
        raise AssertionError("the pages never ended")


def said(lines: list[dict]) -> list[str]:
    """What a person reads: rank and line."""
    return [f"[{x['rank']}] {x['line']}" for x in lines]


@pytest.fixture
def job(svc, clock):
    return Ranks(svc, clock, 3)


def test_lines_come_by_time_then_rank_then_seq_whatever_order_the_store_has(job):
    """Invariant: ties of one millisecond across ranks come by rank, within a
    rank by seq; the store's own order of ties (here: the order put, rank 2
    first) is not what is shown; lines without a seq (shipped before it) come
    after those with one at their time and rank, by event id (a number)."""
    job.put(2, 0, "r2 a")
    job.put(1, 0, "r1 a")
    job.put(0, 0, "r0 a")
    job.put(0, 0, "r0 b")
    job.put(1, 1, "r1 b")
    job.put(0, 2, "r0 old", seq=False)
    job.put(0, 2, "r0 c")
    job.put(2, 2, "r2 b")
    job.put(0, 3, "r0 d")
    want = ["[0] r0 a", "[0] r0 b", "[1] r1 a", "[2] r2 a", "[1] r1 b", "[0] r0 c",
            "[0] r0 old", "[2] r2 b", "[0] r0 d"]
    page = job.read()
    assert said(page["lines"]) == want and page["next_page_token"] is None
    assert [x["seq"] for x in page["lines"]][:2] == [0, 5]
    assert page["lines"][6]["seq"] is None
    for size in (1, 2, 4):
        lines, _ = job.pages(page_size=size)
        assert said(lines) == want, size


def test_a_token_resumes_right_after_its_last_line_while_lines_are_appended(job):
    """Invariant: between pages, lines appended after the position (in its
    millisecond, on a rank before the position's or after it) are in the
    next pages, each once; a line appended with a time before the position
    (an agent shipping its backlog late) is not: those only a read from an
    earlier ``since`` (or ``logs -f``'s lookback) shows. The last page hands
    out a follow token, and polling with it returns only what is new."""
    for i in range(6):
        job.put(i % 2, 10 * i, f"l{i}")
    first = job.read(page_size=3)
    assert said(first["lines"]) == ["[0] l0", "[1] l1", "[0] l2"]
    job.put(2, 20, "same ms, later rank")   # after the position (20 ms, rank 0)
    job.put(1, 20, "same ms, rank 1")
    job.put(0, 20, "same ms, rank 0, later seq")
    job.put(1, 5, "late and older")         # before the position: not in these pages
    job.put(1, 100, "new")
    lines, follow = job.pages(first["next_page_token"], page_size=2)
    assert said(lines) == ["[0] same ms, rank 0, later seq", "[1] same ms, rank 1",
                           "[2] same ms, later rank", "[1] l3", "[0] l4", "[1] l5", "[1] new"]
    assert job.read(page_token=follow)["lines"] == []
    job.put(2, 100, "after the end")
    job.put(0, 99, "before the end")
    polled = job.read(page_token=follow)
    assert said(polled["lines"]) == ["[2] after the end"]
    assert polled["next_page_token"] is None and polled["follow_token"] != follow
    assert job.read(page_token=polled["follow_token"])["lines"] == []
    every, _ = job.pages()
    assert len(every) == 13 and "[1] late and older" in said(every)


@pytest.mark.slow
def test_more_lines_in_one_millisecond_than_a_page_still_make_progress(svc, clock):
    """Invariant: 2,500 lines in one millisecond over 2 ranks (more than a
    page) come page by page, each once, in (rank, seq) order: each page
    reads the millisecond whole (the store orders its ties as it likes), its
    first read asking for the lines of it already sent, the page and one."""
    reader = RecordingReader()
    job = Ranks(svc, clock, 2, reader)
    for i in range(2_500):
        job.put(1 - i % 2, 7, f"x{i}")
    job.put(0, 8, "after")
    lines, _ = job.pages(page_size=1000)
    assert len(lines) == 2501 and len({x["id"] for x in lines}) == 2501
    assert said(lines)[:2] == ["[0] x1", "[0] x3"] and said(lines)[-1] == "[0] after"
    assert [x["rank"] for x in lines[:2500]] == [0] * 1250 + [1] * 1250
    assert all(a["seq"] < b["seq"] for a, b in zip(lines, lines[1:1250]))
    # each page reads its millisecond whole (the sent ones, the page and one, then
    # reads twice as large) until the store answers with a later time
    assert reader.asked == [1001, 2002, 2001, 4002, 3001], reader.asked
    assert len(job.pages(page_size=7)[0]) == 2501


def test_a_millisecond_of_more_lines_than_max_reads_can_read_is_a_503(svc, clock,
                                                                      monkeypatch):
    """Invariant: the store reads a page may take stay bounded, ties or not."""
    monkeypatch.setattr(logs_module, "MAX_PAGE_SIZE", 10)
    monkeypatch.setattr(logs_module, "MAX_READS", 3)
    job = Ranks(svc, clock, 1)
    for i in range(40):
        job.put(0, 0, f"x{i}")
    with pytest.raises(ServiceUnavailable):
        job.read(page_size=5)


# -- tail -------------------------------------------------------------------------------
def test_tail_is_the_newest_lines_across_the_ranks_oldest_first(job):
    """Invariant: ``tail=N`` is the last N lines of every rank together, in
    order: a rank that wrote long ago and one that writes now each show where
    they belong in time; its follow token continues after the newest."""
    job.put(0, 0, "rank 0 long ago")
    job.put(0, 1, "rank 0 last words")
    for i in range(3000):
        job.put(1, 1_800_000 + i * 100, f"rank 1 line {i}")
    job.put(2, 1_800_000 + 2998 * 100, "rank 2 now")
    page = job.read(tail=4)
    assert said(page["lines"]) == ["[1] rank 1 line 2997", "[1] rank 1 line 2998",
                                   "[2] rank 2 now", "[1] rank 1 line 2999"]
    assert page["next_page_token"] is None and page["follow_token"]
    job.put(0, 1_800_000 + 3000 * 100, "rank 0 again")
    assert said(job.read(page_token=page["follow_token"])["lines"]) == ["[0] rank 0 again"]
    few = job.read(tail=3, rank=0)
    assert said(few["lines"]) == ["[0] rank 0 long ago", "[0] rank 0 last words",
                                  "[0] rank 0 again"]
    assert said(job.read(tail=3003)["lines"])[:2] == ["[0] rank 0 last words",
                                                      "[1] rank 1 line 0"]


def test_tail_with_since_is_the_last_lines_at_or_after_it(job, clock):
    for i in range(10):
        job.put(0, i * 1000, f"l{i}")
    since = "2000-01-01T00:00:00Z"
    assert said(job.read(tail=3, since=since)["lines"]) == ["[0] l7", "[0] l8", "[0] l9"]
    at = iso(datetime.fromtimestamp((job.t0 + 8000) / 1000, tz=timezone.utc))
    page = job.read(tail=5, since=at)
    assert said(page["lines"]) == ["[0] l8", "[0] l9"]
    job.put(0, 10_000, "l10")
    assert said(job.read(since=at, page_token=page["follow_token"])["lines"]) == ["[0] l10"]


def test_tail_of_a_long_log_costs_a_few_bounded_probes(svc, clock):
    """Invariant: the tail of a log of 100,000 lines over three days reads
    O(N log) lines, not the log: every probe at most 2N+1 lines."""
    reader = RecordingReader()
    job = Ranks(svc, clock, 2, reader)
    job.t0 -= 3 * 86_400_000  # three days and an hour ago, to about 3.6 hours ago
    for i in range(100_000):
        job.put(i % 2, i * 2_500, f"l{i}")
    page = job.read(tail=100)
    assert [x["line"] for x in page["lines"]] == [f"l{i}" for i in range(99_900, 100_000)]
    assert max(reader.asked) <= 201 and sum(reader.asked) < 201 * 40, reader.asked


def test_tail_of_more_lines_in_one_millisecond_than_twice_n(svc, clock):
    job = Ranks(svc, clock, 2)
    for i in range(50):
        job.put(i % 2, 0, f"old {i}")
    for i in range(500):
        job.put(i % 2, 60_000, f"x{i}")
    got = job.read(tail=3)["lines"]
    assert said(got) == ["[1] x495", "[1] x497", "[1] x499"]


def test_tail_is_cut_to_the_newest_lines_that_fit_6_mb(job):
    for i in range(40):
        job.put(i % 3, i, f"{i:02d}" + "\u20ac" * 200_000)
    page = job.read(tail=40)
    assert limits.proxy_bytes(page) + ENVELOPE <= LAMBDA_BYTES
    kept = [x["line"][:2] for x in page["lines"]]
    assert 1 < len(kept) < 40 and kept == [f"{i:02d}" for i in range(40 - len(kept), 40)]


@pytest.mark.parametrize("tail", [0, -1, 10_001, 1_000_000])
def test_a_tail_out_of_range_is_invalid_argument_naming_tail(job, tail):
    with pytest.raises(InvalidArgument) as refused:
        job.read(tail=tail)
    assert refused.value.field == "tail"


def test_a_tail_with_a_page_token_is_invalid_argument_naming_tail(job):
    job.put(0, 0, "x")
    token = job.read()["follow_token"]
    with pytest.raises(InvalidArgument) as refused:
        job.read(tail=5, page_token=token)
    assert refused.value.field == "tail"
    assert job.read(tail=10_000)["lines"][0]["line"] == "x"
