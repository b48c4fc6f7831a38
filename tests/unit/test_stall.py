"""Stall judgement: strict threshold, collector time, grace, pauses, ordering."""
from datetime import datetime, timedelta, timezone

from hypothesis import given, strategies as st

from chalicelib.domain.stall import Beat, judge, suppression, view

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def kw(**over):
    return {"now": at(100), "started_at": at(0), "threshold_s": 30.0,
            "startup_grace_s": 60.0, **over}


def test_a_rank_exactly_at_the_threshold_is_not_stalled():
    [r] = view([Beat(0, "n", heard_at=at(70))], **kw())
    assert r.silence_s == 30.0 and not r.stalled


def test_a_rank_just_past_the_threshold_is_stalled():
    [r] = view([Beat(0, "n", heard_at=at(69.999))], **kw())
    assert r.stalled


def test_a_never_heard_rank_counts_from_the_attempt_start_after_the_grace():
    [r] = view([Beat(0, "n")], **kw(now=at(59)))
    assert r.silence_s == 59 and not r.stalled, "within the startup grace"
    [r] = view([Beat(0, "n")], **kw(now=at(60)))
    assert not r.stalled, "exactly at the grace"
    [r] = view([Beat(0, "n")], **kw(now=at(60.5)))
    assert r.stalled and r.last_heard_at is None


def test_a_declared_pause_is_not_silence_until_its_bound():
    b = Beat(0, "n", heard_at=at(10), paused_until=at(100))
    [r] = view([b], **kw())
    assert not r.stalled and r.paused
    [r] = view([b], **kw(now=at(101)))
    assert r.stalled


def test_ranks_are_ordered_by_silence_then_rank():
    beats = [Beat(3, "b", heard_at=at(50)), Beat(1, "a", heard_at=at(40)),
             Beat(0, "a", heard_at=at(50)), Beat(2, "b", heard_at=at(90))]
    assert [r.rank for r in view(beats, **kw())] == [1, 0, 3, 2]


def test_the_first_stalled_rank_is_the_one_silent_longest_ties_by_rank():
    beats = [Beat(5, "b", heard_at=at(20)), Beat(2, "a", heard_at=at(20)),
             Beat(7, "b", heard_at=at(95))]
    v = judge(beats, interval_s=10, **kw())
    assert v.first.rank == 2
    assert [r.rank for r in v.stalled] == [2, 5]


def test_ranks_within_the_jitter_band_of_the_first_are_co_first_by_step():
    beats = [Beat(0, "a", heard_at=at(20), prev_heard_at=at(10), step=9),
             Beat(1, "a", heard_at=at(20.5), prev_heard_at=at(9.5), step=8),
             Beat(2, "b", heard_at=at(40), prev_heard_at=at(30), step=12),
             Beat(3, "b", heard_at=at(95), prev_heard_at=at(85), step=20)]
    v = judge(beats, interval_s=10, **kw())
    assert v.first.rank == 0
    assert 0.5 <= v.jitter_s < 20
    assert [r.rank for r in v.co_first] == [1], "rank 2 stopped 20 s later: not a tie"


def test_a_node_whose_ranks_all_went_quiet_together_is_the_suspect():
    beats = [Beat(0, "a", heard_at=at(20)), Beat(1, "a", heard_at=at(24)),
             Beat(2, "b", heard_at=at(95)), Beat(3, "b", heard_at=at(96))]
    assert judge(beats, interval_s=10, **kw()).suspect_node == "a"
    spread = [Beat(0, "a", heard_at=at(20)), Beat(1, "a", heard_at=at(50)),
              Beat(2, "b", heard_at=at(95))]
    assert judge(spread, interval_s=10, **kw()).suspect_node is None


@given(st.lists(st.one_of(st.none(), st.floats(0, 100)), min_size=1, max_size=30),
       st.floats(1, 80))
def test_stalled_means_strictly_more_silence_than_the_threshold(heard, threshold):
    beats = [Beat(i, "n", heard_at=None if h is None else at(h)) for i, h in enumerate(heard)]
    for r in view(beats, **kw(threshold_s=threshold, startup_grace_s=0)):
        assert r.stalled == (r.silence_s > threshold)


def test_a_late_scan_convicts_nobody():
    why = suppression(now=at(100), previous_scan_at=at(0), period_s=5,
                      latest_ingest_at=at(99), window_s=30)
    assert why and "collector paused" in why


def test_when_nothing_reaches_the_collector_nobody_is_convicted():
    why = suppression(now=at(100), previous_scan_at=at(95), period_s=5,
                      latest_ingest_at=at(60), window_s=30)
    assert why and "ingest" in why


def test_a_healthy_collector_suppresses_nothing():
    assert suppression(now=at(100), previous_scan_at=at(95), period_s=5,
                       latest_ingest_at=at(99), window_s=30) is None


def test_a_rank_whose_last_beat_came_earlier_is_a_rival_even_when_posted_later():
    # the culprit (rank 2) last beat at 19.0 but its agent posted at 21.0;
    # rank 0's agent posted at 20.0 a beat made at 19.9: receive time names 0
    beats = [Beat(0, "a", heard_at=at(20), beat_at=at(19.9), step=12),
             Beat(2, "b", heard_at=at(21), beat_at=at(19.0), step=11),
             Beat(3, "b", heard_at=at(95), beat_at=at(95), step=40)]
    v = judge(beats, interval_s=10, **kw())
    assert v.first.rank == 0, "the contract's first: silent longest by receive time"
    assert [r.rank for r in v.co_first] == [2], "the earlier beat() is listed as a rival"
