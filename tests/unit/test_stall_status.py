"""What each rank is: only live ranks judged, heartbeat modes, host evidence, the culprit."""
from datetime import datetime, timedelta, timezone

from chalicelib.domain.clock import iso
from chalicelib.domain.stall import Beat, judge, view

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def kw(**over):
    return {"now": at(200), "started_at": at(0), "threshold_s": 30.0,
            "startup_grace_s": 60.0, "interval_s": 10.0, **over}


def status(beats, **over):
    return {r.rank: r.status for r in view(beats, **{k: v for k, v in kw(**over).items()})}


def test_an_exited_or_stopped_rank_is_never_stalled_and_says_what_it_is():
    beats = [Beat(0, "n", heard_at=at(10), ended="exited"),
             Beat(1, "n", heard_at=at(10), ended="stopped"),
             Beat(2, "n", heard_at=at(195))]
    v = judge(beats, **kw())
    assert v.first is None and not v.stalled
    assert {r.rank: r.status for r in v.ranks} == {0: "exited", 1: "stopped", 2: "live"}


def test_auto_mode_never_convicts_a_job_that_never_beat():
    beats = [Beat(0, "n"), Beat(1, "n")]
    v = judge(beats, mode="auto", **kw())
    assert v.first is None and not v.instrumented
    assert {r.status for r in v.ranks} == {"not_instrumented"}
    # beats mode: today's behaviour, every rank must beat
    assert judge(beats, mode="beats", **kw()).first.rank == 0


def test_auto_mode_once_any_rank_beat_convicts_a_rank_that_never_did():
    beats = [Beat(0, "n", heard_at=at(195)), Beat(1, "n")]
    v = judge(beats, mode="auto", **kw(now=at(59)))
    assert v.first is None, "within the startup grace"
    v = judge(beats, mode="auto", **kw())
    assert v.instrumented and v.first.rank == 1 and v.ranks[0].status == "stalled"


def test_process_mode_convicts_after_idle_s_without_cpu_or_io():
    busy = Beat(0, "n", sampled_at=at(195), active_at=at(195))
    idle = Beat(1, "n", sampled_at=at(195), active_at=at(100))
    v = judge([busy, idle], mode="process", idle_s=90.0, **kw())
    assert v.first.rank == 1 and {r.rank: r.stalled for r in v.ranks} == {0: False, 1: True}
    v = judge([busy, idle], mode="process", idle_s=100.0, **kw())
    assert v.first is None, "exactly idle_s is not stalled"


def test_off_mode_never_convicts():
    assert judge([Beat(0, "n", heard_at=at(0))], mode="off", **kw()).first is None


def test_a_silent_rank_writing_at_a_real_rate_is_busy_up_to_max_busy_s():
    writing = Beat(0, "n", heard_at=at(100), io_at=at(195), sampled_at=at(195))
    assert status([writing], max_busy_s=300.0) == {0: "busy"}
    assert judge([writing], max_busy_s=300.0, **kw()).first is None
    # the excuse is bounded: past threshold + max_busy_s it is a stall again
    assert judge([writing], max_busy_s=60.0, **kw()).first.rank == 0
    # I/O is a sign of life: its silence must pass the threshold too
    quiet = Beat(0, "n", heard_at=at(100), io_at=at(175), sampled_at=at(195))
    assert status([quiet], max_busy_s=300.0) == {0: "silent"}
    assert judge([quiet], max_busy_s=300.0, **kw(now=at(205))).first is None
    assert judge([quiet], max_busy_s=300.0, **kw(now=at(205.001))).first.rank == 0


def test_a_rank_waiting_for_a_peer_still_writing_its_checkpoint_is_not_convicted():
    beats = [Beat(0, "n", heard_at=at(100), io_at=at(195)),
             Beat(1, "n", heard_at=at(100), io_at=at(120)),
             Beat(2, "n", heard_at=at(100))]
    v = judge(beats, max_busy_s=300.0, **kw())
    assert v.first is None
    assert {r.rank: r.status for r in v.ranks} == {0: "busy", 1: "silent", 2: "silent"}


def test_a_beating_peers_background_io_excuses_nobody():
    beats = [Beat(0, "n", heard_at=at(195), io_at=at(195)), Beat(1, "n", heard_at=at(100))]
    assert judge(beats, max_busy_s=300.0, **kw()).first.rank == 1


def test_the_culprit_is_the_rank_that_never_arrived_at_the_collective_the_others_wait_in():
    # rank 3 stopped first by receive time, but it arrived at collective 7; rank 1
    # never did: it is the culprit, whatever the receive times say
    beats = [Beat(0, "n", heard_at=at(150), beat_at=at(149.5), step=7, arrived_seq=7,
                  arrived_name="allreduce"),
             Beat(1, "n", heard_at=at(152), beat_at=at(149.5), step=7, arrived_seq=6,
                  arrived_name="allreduce"),
             Beat(2, "n", heard_at=at(151), beat_at=at(149.5), step=7, arrived_seq=7,
                  arrived_name="allreduce"),
             Beat(3, "n", heard_at=at(149), beat_at=at(149.5), step=7, arrived_seq=7,
                  arrived_name="allreduce")]
    v = judge(beats, **kw())
    assert v.first.rank == 3, "first_stalled_rank keeps the contract: silent longest"
    assert v.culprit["rank"] == 1 and v.culprit["by"] == "collective"
    assert v.culprit["collective"] == {"seq": 7, "name": "allreduce", "waiting": 3,
                                       "missing": [1]}
    assert v.culprit["arrived_seq"] == 6 and v.culprit["receive_time"] == iso(at(152))


def test_without_markers_the_culprit_is_the_earliest_last_beat():
    beats = [Beat(0, "n", heard_at=at(150), beat_at=at(146), step=5),
             Beat(1, "n", heard_at=at(152), beat_at=at(145), step=4),
             Beat(2, "n", heard_at=at(190), beat_at=at(189), step=9)]
    v = judge(beats, **kw())
    assert v.first.rank == 0 and v.culprit["rank"] == 1 and v.culprit["by"] == "beat_at"


def test_exited_ranks_are_no_culprit_and_no_rival():
    beats = [Beat(0, "n", heard_at=at(100), beat_at=at(90), ended="exited"),
             Beat(1, "n", heard_at=at(150), beat_at=at(149))]
    v = judge(beats, **kw())
    assert v.first.rank == 1 and v.co_first == [] and v.culprit["rank"] == 1
