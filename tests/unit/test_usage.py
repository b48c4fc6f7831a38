"""A job's usage (domain/usage.py): what its GPU time bought, by cause."""
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings, strategies as st

from chalicelib.domain.clock import iso
from chalicelib.domain.usage import Span, spans_of, usage

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_job_never_placed_held_nothing():
    assert usage([], at(100)) == {"gpu_seconds": 0, "productive_gpu_seconds": 0,
                                  "lost_gpu_seconds": {}, "goodput": None, "estimated": False}


def test_an_uninstrumented_success_is_startup_then_productive_and_estimated():
    u = usage([Span(1, 8, at(0), at(100), "succeeded", started_at=at(10))], at(500))
    assert u == {"gpu_seconds": 800, "productive_gpu_seconds": 720,
                 "lost_gpu_seconds": {"startup": 80}, "goodput": 0.9, "estimated": True}


def test_a_failed_attempt_is_lost_after_its_startup_and_the_retry_is_productive():
    spans = [Span(1, 4, at(0), at(100), "rank_failed", started_at=at(10)),
             Span(2, 4, at(110), at(310), "succeeded", started_at=at(120))]
    u = usage(spans, at(1000))
    assert u["gpu_seconds"] == 4 * 300
    assert u["lost_gpu_seconds"] == {"failed_attempt": 4 * 90, "startup": 4 * 20}
    assert u["productive_gpu_seconds"] == 4 * 190
    assert u["goodput"] == round(190 / 300, 4)


def test_an_attempt_ended_before_any_rank_started_is_lost_whole_to_its_cause():
    u = usage([Span(1, 2, at(0), at(30), "node_lost")], at(100))
    assert u["lost_gpu_seconds"] == {"node_lost": 60} and u["productive_gpu_seconds"] == 0


def test_each_end_reason_has_its_cause():
    for reason, cause in [("preempted", "preempted"), ("node_lost", "node_lost"),
                          ("agent_lost", "node_lost"), ("cancelled", "cancelled"),
                          ("stalled", "stalled"), ("timeout", "timeout"),
                          ("rank_failed", "failed_attempt"), ("port_in_use", "failed_attempt"),
                          ("something_new", "failed_attempt")]:
        u = usage([Span(1, 1, at(0), at(10), reason, started_at=at(0))], at(10))
        assert u["lost_gpu_seconds"] == {cause: 10}, reason


def test_a_running_attempt_counts_up_to_now_and_a_stall_from_the_last_beat():
    span = Span(1, 2, at(0), None, None, started_at=at(5),
                stalls=((at(40), at(70)),))  # last beat at 40, recovered at 70
    u = usage([span], at(100))
    assert u["gpu_seconds"] == 200
    assert u["lost_gpu_seconds"] == {"stalled": 60, "startup": 10}
    assert u["productive_gpu_seconds"] == 130


def test_an_open_stall_runs_to_the_attempts_end_and_overlaps_count_once():
    span = Span(1, 1, at(0), at(100), "stalled", started_at=at(0),
                stalls=((at(50), None), (at(60), at(70))))
    u = usage([span], at(100))
    # the stall: 50 -> 100; the rest (0 -> 50) is lost to the stall restart too
    assert u["lost_gpu_seconds"] == {"stalled": 100}


def test_a_running_attempt_that_has_not_started_is_all_startup():
    u = usage([Span(1, 8, at(0), None, None)], at(25))
    assert u["lost_gpu_seconds"] == {"startup": 200} and not u["estimated"]


def test_steps_show_a_resume_and_the_resumed_share_of_a_failed_attempt_is_productive():
    first = Span(1, 1, at(0), at(110), "preempted", started_at=at(5), first_step=0,
                 first_step_at=at(10), last_step=1000)
    second = Span(2, 1, at(120), at(220), "succeeded", started_at=at(125), first_step=800,
                  first_step_at=at(130), last_step=2000)
    u = usage([first, second], at(500))
    # attempt 1: startup 10, then 100 s of progress of which 80 % was resumed
    assert u["lost_gpu_seconds"] == {"preempted": 20, "startup": 20}
    assert u["productive_gpu_seconds"] == 80 + 90
    assert not u["estimated"]


def test_without_steps_nothing_of_a_failed_attempt_is_resumed():
    first = Span(1, 1, at(0), at(110), "preempted", started_at=at(10))
    second = Span(2, 1, at(120), at(220), "succeeded", started_at=at(130))
    assert usage([first, second], at(500))["lost_gpu_seconds"]["preempted"] == 100


def test_declared_checkpoints_count_apart_from_stalls():
    span = Span(1, 1, at(0), at(100), "succeeded", started_at=at(0), first_step=0,
                first_step_at=at(0), last_step=10, stalls=((at(20), at(40)),),
                checkpoints=((at(30), at(50)),))
    u = usage([span], at(100))
    assert u["lost_gpu_seconds"] == {"checkpoint": 10, "stalled": 20}
    assert u["productive_gpu_seconds"] == 70


def test_spans_come_from_the_jobs_own_story():
    def e(kind, t, attempt, **more):
        return {"type": kind, "time": iso(at(t)), "attempt": attempt, **more}
    events = [e("created", 0, None),
              e("placed", 0, 1), e("started", 10, 1),
              e("stalled", 60, 1, last_heard_at=iso(at(30))), e("recovered", 70, 1),
              e("stalled", 80, 1),
              e("retried", 100, 1, reason="rank_failed"),
              e("placed", 120, 2), e("started", 130, 2),
              e("cancel_requested", 140, 2)]
    spans = spans_of(list(reversed(events)), 4)  # in any order
    assert spans == [Span(1, 4, at(0), at(100), "rank_failed", started_at=at(10),
                          stalls=((at(30), at(70)), (at(80), None))),
                     Span(2, 4, at(120), None, None, started_at=at(130))]
    # an attempt ends at its first end: a cancel of the job waiting after a retry
    # is the job's end, not the attempt's
    ended = spans_of(events[:7] + [e("finished", 150, 1, reason="cancelled")], 4)
    assert [(s.ended_at, s.reason) for s in ended] == [(at(100), "rank_failed")]
    # a job never placed has no attempt, whatever its story says
    assert spans_of([e("created", 0, None), e("finished", 5, 0, reason="cancelled")], 4) == []


moments = st.integers(min_value=0, max_value=10_000_000)  # ms


@st.composite
def histories(draw):
    """Random attempt histories: placements, ends, starts, steps, stalls,
    checkpoints, any reason, in any (even inconsistent) order."""
    spans = []
    for n in range(1, draw(st.integers(0, 5)) + 1):
        placed = draw(moments)
        ended = draw(st.one_of(st.none(), moments))
        def t(ms):
            return T0 + timedelta(milliseconds=ms)
        stalls = tuple((t(a), draw(st.one_of(st.none(), moments.map(t))))
                       for a in draw(st.lists(moments, max_size=3)))
        checkpoints = tuple((t(a), t(b)) for a, b in draw(st.lists(st.tuples(moments, moments),
                                                                    max_size=2)))
        steps = draw(st.one_of(st.none(), st.tuples(st.integers(0, 100), st.integers(0, 100),
                                                    moments)))
        spans.append(Span(
            n, draw(st.integers(0, 64)), t(placed), None if ended is None else t(ended),
            draw(st.sampled_from([None, "succeeded", "rank_failed", "preempted", "node_lost",
                                  "cancelled", "stalled", "timeout", "other"])),
            started_at=draw(st.one_of(st.none(), moments.map(t))),
            first_step=None if steps is None else steps[0],
            last_step=None if steps is None else steps[1],
            first_step_at=None if steps is None else t(steps[2]),
            stalls=stalls, checkpoints=checkpoints))
    return spans, T0 + timedelta(milliseconds=draw(moments))


@settings(max_examples=60, deadline=None)
@given(histories())
def test_the_parts_sum_exactly_to_the_gpu_time_held(history):
    spans, now = history
    u = usage(spans, now)
    assert u["productive_gpu_seconds"] + sum(u["lost_gpu_seconds"].values()) == u["gpu_seconds"]
    assert u["productive_gpu_seconds"] >= 0 and all(v > 0 for v in u["lost_gpu_seconds"].values())
    # the time held is GPUs x (placement -> end or now), to the GPU-second
    held_ms = sum(s.gpus * max(0, ((s.ended_at or now) - s.placed_at) // timedelta(milliseconds=1))
                  for s in spans)
    assert u["gpu_seconds"] == round(held_ms / 1000)
    assert u["goodput"] is None if u["gpu_seconds"] == 0 else 0 <= u["goodput"] <= 1
