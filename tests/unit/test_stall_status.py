"""What each rank is: only live ranks judged, heartbeat modes, host evidence, the culprit."""
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chalicelib.domain.clock import iso
from chalicelib.domain.stall import Beat, judge, sample_is_writing, signature, view

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


def test_auto_mode_waits_for_the_first_beat_through_the_grace_then_says_not_instrumented():
    """Invariant (issue 47): no beat yet is "awaiting the first beat" while
    the attempt is within startup_grace_s (60 s here, inclusive), "not
    instrumented" only after it; nobody is convicted by silence either way."""
    beats = [Beat(0, "n"), Beat(1, "n")]
    for now in (at(1), at(60)):
        v = judge(beats, mode="auto", **kw(now=now))
        assert v.first is None and v.instrumented is None
        assert {r.status for r in v.ranks} == {"awaiting_first_beat"}
    v = judge(beats, mode="auto", **kw(now=at(60.001)))
    assert v.first is None and v.instrumented is False
    assert {r.status for r in v.ranks} == {"not_instrumented"}
    heard = judge([Beat(0, "n", heard_at=at(1)), Beat(1, "n")], mode="auto", **kw(now=at(2)))
    assert heard.instrumented is True
    assert judge(beats, mode="beats", **kw(now=at(1))).instrumented is True


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
    ev = v.culprit["evidence"]
    assert ev["collective"] == {"seq": 7, "name": "allreduce", "waiting": 3, "missing": [1]}
    assert ev["arrived_seq"] == 6 and ev["receive_time"] == iso(at(152))
    assert v.culprit["text"] == "rank 1 on n never reached allreduce #7, where ranks 0,2-3 wait"
    assert v.culprit["confidence"] == "high" and v.culprit["ranks"] == [1]


def test_without_markers_the_culprit_is_the_earliest_last_beat():
    beats = [Beat(0, "n", heard_at=at(150), beat_at=at(146), step=5),
             Beat(1, "n", heard_at=at(152), beat_at=at(145), step=4),
             Beat(2, "n", heard_at=at(190), beat_at=at(189), step=9)]
    v = judge(beats, **kw())
    # rank 1's last beat() came a second before rank 0's: outside the band
    assert v.first.rank == 0 and v.culprit["rank"] == 1 and v.culprit["by"] == "silence"
    assert v.culprit["text"] == "rank 1 on n went quiet first"


def test_exited_ranks_are_no_culprit_and_no_rival():
    beats = [Beat(0, "n", heard_at=at(100), beat_at=at(90), ended="exited"),
             Beat(1, "n", heard_at=at(150), beat_at=at(149))]
    v = judge(beats, **kw())
    assert v.first.rank == 1 and v.co_first == [] and v.culprit["rank"] == 1


def test_after_a_rank_stops_only_its_writes_keep_excusing_it_not_its_loaders_reads():
    # the sample splits reads from writes: 10 s-old I/O that was reads excuses
    # nothing beyond two intervals (a data loader prefetching after a hang) ...
    reading = Beat(0, "n", heard_at=at(100), io_at=at(175), wrote_at=None,
                   proc={"cpu": 1.0, "io_bps": 5e7, "write_bps": 0}, sampled_at=at(195))
    v = judge([reading], max_busy_s=300.0, **kw())
    assert v.first.rank == 0 and v.ranks[0].status == "stalled"
    # ... while reading *now* it is busy, like any real I/O
    assert status([replace(reading, io_at=at(195))], max_busy_s=300.0) == {0: "busy"}
    # writes (a checkpoint shard) excuse it until they are threshold_s old
    writing = replace(reading, wrote_at=at(175))
    assert status([writing], max_busy_s=300.0) == {0: "silent"}
    assert judge([writing], max_busy_s=300.0, **kw(now=at(205.001))).first.rank == 0
    # an agent that does not split reads from writes: all its I/O counts as writes
    old = Beat(0, "n", heard_at=at(100), io_at=at(175), proc={"io_bps": 5e7})
    assert status([old], max_busy_s=300.0) == {0: "silent"}


def test_sample_is_writing_reads_write_bps_and_falls_back_to_all_io():
    assert sample_is_writing({"io_bps": 5e7, "write_bps": 2e6})
    assert not sample_is_writing({"io_bps": 5e7, "write_bps": 0})
    assert sample_is_writing({"io_bps": 5e7}) and not sample_is_writing({"io_bps": 10})


def test_a_straggler_of_a_whole_job_pause_is_excused_while_its_peers_resume():
    # every rank went quiet at ~100 (an undeclared checkpoint); ranks 0 and 1
    # came back at 190 after a 90 s silence; rank 2's first post is late
    peers = [Beat(r, "n", heard_at=at(195), beat_at=at(190), resumed_at=at(190),
                  resumed_gap_s=90.0) for r in (0, 1)]
    straggler = Beat(2, "n", heard_at=at(100.5), beat_at=at(100))
    v = judge([*peers, straggler], **kw())
    assert v.first is None and v.ranks[0].rank == 2 and v.ranks[0].status == "silent"
    # bounded: two intervals after the peers came back it is a stall
    v = judge([*[replace(p, heard_at=at(210)) for p in peers], straggler], **kw(now=at(210.001)))
    assert v.first.rank == 2
    # a silence that began after the straggler's last beat (plus an interval) is
    # no excuse: the straggler stopped on its own before the others paused
    late = [replace(p, resumed_gap_s=70.0) for p in peers]   # began at 120
    assert judge([*late, straggler], **kw()).first.rank == 2
    # a peer's short gap (a lost post or two) is no whole-job silence
    short = [replace(p, resumed_gap_s=20.0, resumed_at=at(190)) for p in peers]
    assert judge([*short, straggler], **kw()).first.rank == 2


def test_a_hang_while_every_peer_steps_is_not_excused_by_an_old_resumption():
    # the peers' last long silence ended long ago: no excuse for a hang now
    peers = [Beat(r, "n", heard_at=at(195), beat_at=at(194), resumed_at=at(60),
                  resumed_gap_s=40.0) for r in (0, 1)]
    v = judge([*peers, Beat(2, "n", heard_at=at(150), beat_at=at(149))], **kw())
    assert v.first.rank == 2


def _ranks(sigs: dict, first_beat: float = 149.5) -> list:
    procs = {"spin": {"cpu": 1.0, "state": "R"}, "sleep": {"cpu": 0.0, "state": "S"},
             "io": {"cpu": 0.0, "state": "D"}}
    return [Beat(r, "n", heard_at=at(150 + r * 0.1), beat_at=at(first_beat + r * 0.01), step=7,
                 proc=procs[s], sampled_at=at(195)) for r, s in sigs.items()]


def test_without_markers_the_tied_rank_that_looks_unlike_its_waiting_peers_is_the_culprit():
    # ranks 0-3 stopped in the same step; the NCCL peers spin, rank 2 sleeps
    v = judge(_ranks({0: "spin", 1: "spin", 2: "sleep", 3: "spin"}), **kw())
    assert v.first.rank == 0, "first_stalled_rank keeps the contract"
    assert v.culprit["rank"] == 2 and v.culprit["by"] == "process"
    assert v.culprit["evidence"]["signature"] == "sleeping"
    assert v.culprit["evidence"]["peers"] == "spinning"
    assert v.culprit["text"] == "rank 2 on n looks unlike its peers: sleeping while they are spinning"
    # gloo peers sleep: a rank in a hung filesystem read (D) stands out
    v = judge(_ranks({0: "sleep", 1: "io", 2: "sleep", 3: "sleep"}), **kw())
    assert v.culprit["rank"] == 1 and v.culprit["evidence"]["signature"] == "io_wait"


def test_the_process_signature_says_nothing_when_everyone_looks_alike_or_no_majority():
    # a GPU hang spins like its NCCL peers, and their last beats lie within
    # 0.03 s of each other: a tie, said as one, not the lowest rank named
    v = judge(_ranks({0: "spin", 1: "spin", 2: "spin"}), **kw())
    assert v.culprit["rank"] is None and v.culprit["by"] == "silence"
    assert v.culprit["ranks"] == [0, 1, 2]
    assert v.culprit["text"].startswith("ranks 0-2 went quiet together (within 0.")
    assert v.first.rank == 0, "first_stalled_rank keeps the contract"
    # two against two: no majority, no odd one out
    v = judge(_ranks({0: "spin", 1: "sleep", 2: "spin", 3: "sleep"}), **kw())
    assert v.culprit["by"] == "silence" and v.culprit["rank"] is None
    # no samples: the beat order, a tie again
    beats = [replace(b, proc=None) for b in _ranks({0: "spin", 1: "sleep", 2: "spin"})]
    assert judge(beats, **kw()).culprit["ranks"] == [0, 1, 2]


def test_the_process_signature_only_breaks_ties_beats_cannot():
    # rank 3 sleeps but it beat long after the first's last beat: not a rival
    beats = _ranks({0: "spin", 1: "spin", 2: "spin"})
    beats.append(Beat(3, "n", heard_at=at(195), beat_at=at(194), step=60,
                      proc={"cpu": 0.0, "state": "S"}, sampled_at=at(195)))
    assert judge(beats, **kw()).culprit["ranks"] == [0, 1, 2], "rank 3 is no rival"


def test_signature_of_a_sample():
    assert signature({"cpu": 1.0, "state": "R"}) == "spinning"
    assert signature({"cpu": 0.0, "state": "S"}) == "sleeping"
    assert signature({"cpu": 0.0, "state": "D"}) == "io_wait"
    assert signature({"cpu": 0.3, "state": "R"}) is None and signature(None) is None
