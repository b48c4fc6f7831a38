"""What an attempt's per-rank progress means for its job."""
from datetime import datetime, timezone

from hypothesis import given, strategies as st

from chalicelib.domain.attempts import (
    LOST,
    Attempt,
    exit_info,
    from_runs,
    outcome,
    rank_runs,
    reported,
)
from chalicelib.domain.clock import parse_iso
from chalicelib.domain.events import rank_event, served
from chalicelib.domain.states import Event


def attempt(**kw):
    base = dict(job_id="job_x", attempt=1, state="RUNNING", placement=[],
                node_ranks={"a": [0, 1], "b": [2, 3]}, node_gpus={"a": 2, "b": 2},
                world_size=4, created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    return Attempt(**{**base, **kw})


def test_all_exited_zero_succeeds():
    a = attempt(exited={0, 1, 2, 3}, exit_codes={0: 0, 1: 0, 2: 0, 3: 0})
    assert outcome(a, cancel_requested=False) is Event.ALL_EXITED_OK


def test_some_exited_zero_runs_on():
    a = attempt(exited={0, 1}, exit_codes={0: 0, 1: 0})
    assert outcome(a, cancel_requested=False) is None


def test_the_first_failure_ends_the_attempt_at_once():
    a = attempt(exited={2}, exit_codes={2: 1})
    # a failure, whatever attempts are left: the retry rules decide the rest
    assert outcome(a, cancel_requested=False) is Event.RANK_FAILED
    assert exit_info(a, Event.RANK_FAILED) == {"reason": "rank_failed", "exit_code": 1,
                                               "rank": 2, "node_id": "b"}


def test_a_requested_cancel_wins_over_exit_codes_and_waits_for_every_rank():
    a = attempt(exited={0}, exit_codes={0: 143}, stopped={2, 3})
    assert outcome(a, cancel_requested=True) is None
    a.stopped.add(1)
    assert outcome(a, cancel_requested=True) is Event.STOPPED


def test_a_lost_node_reads_as_node_lost():
    a = attempt(exited={0, 1}, exit_codes={0: LOST, 1: LOST})
    assert exit_info(a, Event.RETRY)["reason"] == "node_lost"


def test_a_node_is_done_when_all_its_ranks_are():
    a = attempt(exited={0}, stopped={1})
    assert a.node_done("a") and not a.node_done("b")


def test_ranks_lost_with_their_node_are_done_but_not_confirmed_gone():
    a = attempt(exited={0, 1}, exit_codes={0: LOST, 1: LOST})
    assert a.node_done("a") and not a.node_confirmed("a")
    a.exit_codes[0] = 0          # the returning agent reports rank 0's real exit
    assert not a.node_confirmed("a")
    a.stopped.add(1)             # and rank 1 stopped
    assert a.node_confirmed("a")


def test_ranks_that_exited_or_stopped_as_reported_are_confirmed_gone():
    assert attempt(exited={0}, exit_codes={0: 3}, stopped={1}).node_confirmed("a")
    assert not attempt(exited={0}, exit_codes={0: 0}).node_confirmed("a")


def test_a_nodes_ranks_are_stored_as_runs():
    assert rank_runs([7, 0, 1, 2, 3]) == [[0, 3], [7, 7]]
    assert rank_runs(range(1024, 2048)) == [[1024, 2047]]
    assert from_runs([[0, 3], [7, 7]]) == [0, 1, 2, 3, 7]
    assert from_runs([0, 1, 5]) == [0, 1, 5], "an item written before runs: plain ranks"


@given(st.sets(st.integers(0, 65535), max_size=300))
def test_runs_give_back_the_ranks_they_were_made_of(ranks):
    assert from_runs(rank_runs(ranks)) == sorted(ranks)


def _report(kind: str, at: str, ranks: list[int], code: int | None = None) -> dict:
    return rank_event(kind, parse_iso(at), 1, ranks, code, "n1")


def test_progress_is_the_union_of_the_reports_ranks():
    """Invariant: an attempt's progress is what its rank events say, whatever
    their order; other events add nothing."""
    events = [_report("started", "2026-01-01T00:00:01.000Z", [0, 1, 2, 3]),
              _report("exited", "2026-01-01T00:00:05.000Z", [2, 3], 0),
              _report("stopped", "2026-01-01T00:00:06.000Z", [0]),
              {"type": "started", "time": "2026-01-01T00:00:01.000Z"}]
    for order in (events, events[::-1]):
        got = reported(order)
        assert (got["started"], got["exited"], got["stopped"]) == ({0, 1, 2, 3}, {2, 3}, {0})
        assert got["exit_codes"] == {2: 0, 3: 0}


def test_a_later_exit_code_wins_and_a_real_one_wins_a_tie_with_lost():
    lost = _report("exited", "2026-01-01T00:00:05.000Z", [1], LOST)
    real_then = _report("exited", "2026-01-01T00:00:04.000Z", [1], 137)
    real_same = _report("exited", "2026-01-01T00:00:05.000Z", [1], 137)
    assert reported([lost, real_then])["exit_codes"] == {1: LOST}, "the later report wins"
    assert reported([real_same, lost])["exit_codes"] == {1: 137}, "the agent's word wins a tie"


def test_a_report_of_a_whole_node_is_one_run_however_many_ranks():
    e = rank_event("started", parse_iso("2026-01-01T00:00:01.000Z"), 1, list(range(1024, 2048)),
                   None, "n1")
    assert e["ranks"] == [[1024, 2047]]
    assert served(e)["ranks"] == list(range(1024, 2048))
    assert reported([{"type": "rank_started", "time": e["time"], "ranks": [5, 6]}])["started"] \
        == {5, 6}, "an event stored before runs (plain ranks) reads alike"
    # a stored exit without its code still reads: the rank exited, no code is made up
    got = reported([{"type": "rank_exited", "time": e["time"], "ranks": [[1, 2]]}])
    assert (got["exited"], got["exit_codes"]) == ({1, 2}, {})
