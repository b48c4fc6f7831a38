"""One entry of a heartbeat post becomes the collector's Beat (domain/stall.py
``received``): every time on the collector's clock, never the sender's."""
from datetime import datetime, timedelta, timezone

from hypothesis import given, strategies as st

from chalicelib.domain.stall import BUSY_IO_BPS, received

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return NOW + timedelta(seconds=s)


@given(skew_s=st.floats(-1e6, 1e6), age_s=st.floats(0, 3600))
def test_a_beat_is_stamped_with_the_receive_time_whatever_the_sender_clock(skew_s, age_s):
    """Invariant 1: liveness is the collector's receive time; the sender's
    clock is kept beside it and decides nothing."""
    b = received({"rank": 3, "step": 7, "age_s": age_s}, node_id="n", now=NOW,
                 sent_at=at(skew_s))
    assert (b.heard_at, b.sent_at, b.active_at) == (NOW, at(skew_s), NOW)
    assert b.beat_at == at(-age_s) and b.beat_at <= b.heard_at, "never later than received"


def test_a_bare_entry_is_a_beat_and_a_pause_or_sample_alone_is_not():
    assert received({"rank": 0}, node_id="n", now=NOW).heard_at == NOW
    pause = received({"rank": 0, "pause": {"remaining_s": 90}}, node_id="n", now=NOW)
    assert (pause.heard_at, pause.paused_until, pause.pause_reason) == (None, at(90), "paused")
    sample = received({"rank": 0, "proc": {"cpu": 0.0}}, node_id="n", now=NOW)
    assert (sample.heard_at, sample.sampled_at, sample.active_at) == (None, NOW, None)
    both = received({"rank": 0, "step": 1, "pause": {"remaining_s": 5, "reason": "eval"}},
                    node_id="n", now=NOW)
    assert (both.heard_at, both.paused_until, both.pause_reason) == (NOW, at(5), "eval")


def test_a_sample_s_evidence_is_timed_by_what_it_shows():
    idle = received({"rank": 0, "proc": {"cpu": 0.0, "io_bps": 0}}, node_id="n", now=NOW)
    assert (idle.io_at, idle.wrote_at, idle.active_at) == (None, None, None)
    reads = received({"rank": 0, "proc": {"io_bps": BUSY_IO_BPS, "write_bps": 0}},
                     node_id="n", now=NOW)
    assert (reads.io_at, reads.wrote_at, reads.active_at) == (NOW, None, NOW)
    writes = received({"rank": 0, "proc": {"io_bps": BUSY_IO_BPS, "write_bps": BUSY_IO_BPS}},
                      node_id="n", now=NOW)
    assert (writes.io_at, writes.wrote_at, writes.proc) == (
        NOW, NOW, {"io_bps": BUSY_IO_BPS, "write_bps": BUSY_IO_BPS})


def test_a_silence_and_a_collective_are_kept_on_the_collector_clock():
    b = received({"rank": 1, "step": 2, "resumed": {"age_s": 4, "gap_s": 30.5},
                  "collective": {"seq": 9, "name": "all_reduce"}}, node_id="n2", now=NOW)
    assert (b.rank, b.node_id, b.resumed_at, b.resumed_gap_s) == (1, "n2", at(-4), 30.5)
    assert (b.arrived_seq, b.arrived_name) == (9, "all_reduce")
