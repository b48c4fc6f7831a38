"""A job's health (domain/health.py): its members, a new one, what a verdict
makes of it, and how an incident is cleared and frozen."""
from datetime import datetime, timedelta, timezone

from chalicelib.domain import health
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.stall import Beat, judge

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
SPEC = JobSpec.parse({"command": ["x"], "ranks": 4})


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def verdict(heard: dict[int, float], now: float = 100.0):
    beats = [Beat(r, f"n{r % 2}", heard_at=at(heard[r]) if r in heard else None)
             for r in range(4)]
    return judge(beats, now=at(now), started_at=at(0), threshold_s=30.0,
                 startup_grace_s=60.0, interval_s=10.0)


def test_a_new_health_has_every_member_and_nothing_else():
    h = health.initial_health(SPEC, 60.0)
    assert tuple(sorted(h)) == tuple(sorted(health.FIELDS))
    assert (h["status"], h["false_alarms"], h["first_stalled_rank"]) == ("UNKNOWN", 0, None)


def test_a_conviction_names_the_first_stopped_rank_on_the_collector_clock():
    v = verdict({0: 95, 1: 60, 2: 95, 3: 95})
    judged = health.judged(health.initial_health(SPEC, 60.0), v, None)
    h = health.convicted(judged, v, at(100))
    assert (h["status"], h["first_stalled_rank"], h["stalled_ranks"]) == ("STALLED", 1, [1])
    assert (h["detected_at"], h["last_heard_at"], h["detection_s"]) == (
        "2026-12-01T12:01:40.000Z", "2026-12-01T12:01:00.000Z", 40.0)
    assert health.incident(h) == {"reason": "rank 1 on n1 went quiet first", "rank": 1,
                                  "node_id": "n1", "ranks": [1], "by": "silence", "stacks": None,
                                  "co_first": None,
                                  "suspect_node": None,
                                  "last_heard_at": "2026-12-01T12:01:00.000Z"}
    assert h["verdict"]["text"] == "rank 1 on n1 went quiet first"


def test_a_culprit_that_beats_again_is_a_counted_false_alarm_and_the_incident_clears():
    v = verdict({0: 95, 1: 60, 2: 95, 3: 95})
    h = health.convicted(health.judged(health.initial_health(SPEC, 60.0), v, None), v, at(100))
    still = verdict({0: 105, 1: 60, 2: 105, 3: 105}, now=110)
    assert not health.culprit_beat_again(h, still)
    assert health.followed(h, still)["status"] == "STALLED"
    back = verdict({0: 115, 1: 115, 2: 115, 3: 115}, now=120)
    cleared = health.followed(health.judged(h, back, None), back)
    assert (cleared["status"], cleared["false_alarms"], cleared["first_stalled_rank"]) == (
        "OK", 1, None)
    assert cleared["threshold_s"] == h["threshold_s"], "the threshold stays"


def test_a_finished_job_keeps_its_incident_as_history_and_a_retry_clears_it():
    v = verdict({0: 95, 1: 60, 2: 95, 3: 95})
    h = health.convicted(health.judged(health.initial_health(SPEC, 60.0), v, None), v, at(100))
    done = health.frozen_health(h, "2026-12-01T12:02:00.000Z", True, {"reason": "stalled"})
    assert (done["status"], done["first_stalled_rank"], done["frozen_at"]) == (
        "STALLED", 1, "2026-12-01T12:02:00.000Z")
    # a stalled job cancelled: it stalled, never UNKNOWN, its verdict kept
    other = health.frozen_health(h, "2026-12-01T12:02:00.000Z", True, {"reason": "cancelled"})
    assert other["status"] == "STALLED" and other["verdict"] == h["verdict"]
    # ... every rank finished its work after all: not hung
    ok = health.frozen_health(h, "2026-12-01T12:02:00.000Z", True, {"reason": "succeeded"})
    assert ok["status"] == "OK" and ok["first_stalled_rank"] == 1
    # a rank's failure with no stall named: the exit is the verdict
    calm = health.initial_health(SPEC, 60.0)
    failed = health.frozen_health(calm, "2026-12-01T12:02:00.000Z", True,
                                  {"reason": "rank_failed", "rank": 3, "exit_code": 1}, "n2")
    assert failed["verdict"]["text"] == "rank 3 on n2 exited with code 1"
    assert (failed["verdict"]["by"], failed["status"]) == ("exit", "UNKNOWN")
    retry = health.frozen_health(h, "2026-12-01T12:02:00.000Z", False, None)
    assert (retry["status"], retry["first_stalled_rank"], retry["frozen_at"]) == (
        "UNKNOWN", None, None)


def test_a_watched_job_is_ok_only_once_heard_and_instrumented():
    h = health.initial_health(SPEC, 60.0)
    assert health.watched(h, verdict({}, now=10))["status"] == "UNKNOWN"
    assert health.watched(h, verdict({0: 95, 1: 95, 2: 95, 3: 95}))["status"] == "OK"


def test_a_whole_job_hang_of_65536_ranks_keeps_the_record_a_few_kb():
    """Invariant (issue 30): the health record stays small whatever the
    world size. 65,536 ranks on 8,192 nodes go quiet within one band (every
    second rank 10 ms later): the record lists at most MAX_LISTED ranks
    per list and MAX_CO_FIRST rivals, counts the rest, and its sentences
    name runs, then count them."""
    import json

    from chalicelib.domain.verdict import MAX_LISTED
    world = 65_536
    beats = [Beat(r, f"n{r // 8}", heard_at=at(60 + (r % 2) * 0.01)) for r in range(world)]
    v = judge(beats, now=at(100), started_at=at(0), threshold_s=30.0, startup_grace_s=60.0,
              interval_s=10.0)
    spec = JobSpec.parse({"command": ["x"], "ranks": world})
    judged = health.judged(health.initial_health(spec, 60.0), v, None)
    h = health.convicted(judged, v, at(100))
    size = len(json.dumps(h))
    assert size < 8_000, f"a {size}-byte record for {world} ranks"
    assert (h["stalled_count"], len(h["stalled_ranks"])) == (world, MAX_LISTED)
    assert h["status_counts"] == {"stalled": world}
    assert len(h["ranks_by_status"]["stalled"]) == MAX_LISTED
    assert h["co_first_count"] > health.MAX_CO_FIRST == len(h["co_first"])
    named = h["verdict"]
    # the even ranks, the earliest, are the tie: too many runs to write out
    assert named["rank"] is None and named["ranks_count"] == world // 2
    assert len(named["ranks"]) == MAX_LISTED
    assert named["text"].startswith(
        "ranks 0,2,4,6,8,10,12,14 and 32,760 more went quiet together"), named["text"]
    event = health.incident(h)
    assert len(json.dumps(event)) < 4_000


def test_a_sentence_names_runs_then_counts_the_rest():
    from chalicelib.domain.verdict import span
    assert span([0, 1, 2, 3, 7]) == "0-3,7"
    assert span(list(range(0, 40, 2))) == "0,2,4,6,8,10,12,14 and 12 more"
    assert span(list(range(65_536))) == "0-65535"


def test_a_health_too_big_for_its_record_keeps_the_verdicts_words_and_counts():
    """What the scan records when even a bounded health does not fit (the
    job's item is full of other things): the incident and the sentence
    stay, the lists and stacks go."""
    v = verdict({0: 95, 1: 60, 2: 95, 3: 95})
    h = health.convicted(health.judged(health.initial_health(SPEC, 60.0), v, None), v, at(100))
    small = health.compacted(h)
    assert (small["status"], small["first_stalled_rank"], small["stalled_count"]) == (
        "STALLED", 1, 1)
    assert small["stalled_ranks"] == [] and small["co_first"] == []
    assert small["verdict"]["text"] == "rank 1 on n1 went quiet first"
    assert small["verdict"]["stacks"] == [] and small["verdict"]["ranks"] == [1]
    assert tuple(sorted(small)) == tuple(sorted(health.FIELDS))


def test_an_open_incidents_band_is_the_least_its_later_scans_judge_by():
    """Once a whole job is silent no rank is left to measure the jitter by:
    the band the incident's verdict was reached with stays the least, so
    ranks the scan could not order stay a tie."""
    beats = [Beat(r, f"n{r % 2}", heard_at=at(60 + r * 0.5)) for r in range(4)]
    kw = dict(now=at(100), started_at=at(0), threshold_s=30.0, startup_grace_s=60.0,
              interval_s=10.0)
    assert judge(beats, **kw).culprit["rank"] == 0, "no band: the first post is 'first'"
    tie = judge(beats, **kw, band_floor_s=1.2).culprit
    assert (tie["rank"], tie["ranks"], tie["evidence"]["band_s"]) == (None, [0, 1, 2], 1.2)
    v = judge(beats, **kw, band_floor_s=1.2)
    h = health.convicted(health.judged(health.initial_health(SPEC, 60.0), v, None), v, at(100))
    assert health.incident_band(h) == 1.2
    assert health.incident_band(health.compacted(h)) == 1.2, "kept by a compact record too"
    assert health.incident_band({**h, "status": "OK"}) is None
    assert health.incident_band({**h, "frozen_at": "2026-12-01T12:02:00.000Z"}) is None
