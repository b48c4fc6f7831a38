"""`iter_logs(follow=True)` against a fake server whose ranks' lines arrive
late and out of time order (an agent killed and restarted ships a batch of
older lines seconds later, or a minute later, or while a read pages through
the lines): every line once, each rank's in order, and the follow ends soon
after the job does."""
from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

from gpujobs_client import Client

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
_ids = itertools.count(1)


def at(ms: int) -> str:
    return (T0 + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")[:-6] + "Z"


class Rank:
    def __init__(self, rank: int) -> None:
        self.rank, self.offset = rank, 0

    def line(self, ms: int, text: str) -> dict:
        """The rank's next line, as the API shows it (made in the order the
        rank writes: ``seq`` and ``next_seq`` are its bytes in the file)."""
        d = {"rank": self.rank, "stream": "stdout", "time": at(ms), "line": text,
             "seq": self.offset, "next_seq": self.offset + len(text) + 1,
             "id": f"{next(_ids):056d}", "attempt": 1}
        self.offset = d["next_seq"]
        return d


def test_follow_yields_every_late_line_once_each_rank_in_order_and_ends_soon(fake):
    job = fake.add_job(ranks=3)
    fake.place(job["id"], ["n1"])
    r0, r1, r2 = Rank(0), Rank(1), Rank(2)
    lines = fake.logs[job["id"]] = [r0.line(0, "r0 start"), r1.line(0, "r1 start")]
    script = {
        1: [r0.line(2_000, "r0 a"), r0.line(2_000, "r0 b"), r2.line(2_000, "r2 a")],
        2: [r0.line(4_000, "r0 c")],
        # rank 1's agent restarted: its backlog, older than rank 0's newest
        3: [r1.line(1_500, "r1 backlog 1"), r1.line(2_000, "r1 backlog 2"),
            r1.line(3_999, "r1 backlog 3"), r0.line(5_000, "r0 d")],
        4: [r2.line(4_500, "r2 late"), r0.line(70_000, "r0 a minute on")],
        # rank 1's agent down again, for over a minute: a line older than the
        # lookback, found when rank 1's next line shows it was skipped
        5: [r1.line(5_000, "r1 shipped a minute late"), r0.line(70_001, "r0 e")],
        6: [r2.line(69_000, "r2 within the lookback"), r1.line(70_001, "r1 end")],
    }
    ended_at = []

    def sleep(_):
        n = sleep.polls = getattr(sleep, "polls", 0) + 1
        lines.extend(script.get(n, []))
        if n == 7:  # the agents ship a rank's last lines, then report its exit
            lines.extend([r0.line(70_002, "r0 last"), r2.line(70_002, "r2 last")])
            fake.update_job(job["id"], state="SUCCEEDED")
            ended_at.append(time.monotonic())
        time.sleep(0.05)

    with Client(fake.url, "t1") as c:
        got = list(c.iter_logs(job["id"], follow=True, interval_s=0.05, sleep=sleep))
        returned = time.monotonic()
        plain = list(c.iter_logs(job["id"]))
    said = [f"[{x.rank}] {x.line}" for x in got]
    every = {f"[{x['rank']}] {x['line']}" for x in lines}
    assert Counter(said) == Counter(every), "each line once, a minute late or not"
    for r in range(3):
        seqs = [x.seq for x in got if x.rank == r]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (r, seqs)
    assert said.index("[1] r1 backlog 1") > said.index("[0] r0 c"), "shown when it arrived"
    assert {f"[{x.rank}] {x.line}" for x in plain} == every, "a plain read has it all"
    assert returned - ended_at[0] < 2.0, "the follow ends within ~2 s of the job's end"
    assert sleep.polls == 7, "no fixed drain after the job ended"


def test_follow_from_the_tail_of_a_finished_job_returns_at_once(fake):
    job = fake.add_job(ranks=2)
    fake.place(job["id"], ["n1"])
    r0, r1 = Rank(0), Rank(1)
    fake.logs[job["id"]] = [r0.line(i, f"r0 {i}") for i in range(5)] + [r1.line(2, "r1")]
    fake.update_job(job["id"], state="FAILED")
    with Client(fake.url, "t1") as c:
        started = time.monotonic()
        got = [x.line for x in c.iter_logs(job["id"], follow=True, tail=3,
                                          sleep=lambda s: None)]
        assert time.monotonic() - started < 2.0
        assert got == ["r1", "r0 3", "r0 4"]
        assert [x.line for x in c.iter_logs(job["id"], tail=0)] == []


def test_lines_that_land_between_two_pages_of_one_read_are_not_skipped(fake):
    """Invariant: a rank's batch that lands while a read pages on, with lines
    older than where the next page starts and lines after it, is yielded
    whole and in order. (Run 12 of the suite lost 36 of a rank's lines so:
    the page after showed the batch's newer lines, and its older ones were
    behind the rank's last line for good.)"""
    job = fake.add_job(ranks=2)
    fake.place(job["id"], ["n1"])
    r0, r1 = Rank(0), Rank(1)
    lines = fake.logs[job["id"]] = [r0.line(0, "r0 0"), r1.line(0, "r1 0")] + [
        r1.line(100 * i, f"r1 {i}") for i in range(1, 6)]
    # rank 0's agent ships its next batch while the first page is being read
    batch = [r0.line(50, "r0 1"), r0.line(60, "r0 2"), r0.line(450, "r0 3")]

    def sleep(_):
        fake.update_job(job["id"], state="SUCCEEDED")

    with Client(fake.url, "t1") as c:
        read = c.get_logs
        pages = []

        def get_logs(*args, **kwargs):
            page = read(*args, **kwargs)
            pages.append(kwargs.get("page_token"))
            if len(pages) == 1:
                lines.extend(batch)
            return page

        c.get_logs = get_logs  # type: ignore[method-assign]
        got = [f"{x.rank}: {x.line}" for x in c.iter_logs(
            job["id"], follow=True, page_size=3, interval_s=0, sleep=sleep)]
    assert len(pages) > 2 and pages[1] is not None, "the read paged on after the batch landed"
    assert Counter(got) == Counter(f"{x['rank']}: {x['line']}" for x in lines), got
    assert [x for x in got if x.startswith("0:")] == ["0: r0 0", "0: r0 1", "0: r0 2",
                                                     "0: r0 3"]
