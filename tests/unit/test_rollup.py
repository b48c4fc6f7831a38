"""Usage rolled up by hour (domain/rollup.py): exact integer splits that
sum, cell by cell and part by part, to the jobs' ``usage``."""
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings, strategies as st

from chalicelib.domain import rollup
from chalicelib.domain.usage import Span, usage

T0 = datetime(2026, 12, 1, 11, 30, tzinfo=timezone.utc)
H = rollup.HOUR_MS


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def hour(n: int) -> int:
    """The start (ms) of the n-th hour from T0's hour."""
    return round(datetime(2026, 12, 1, 11, tzinfo=timezone.utc).timestamp() * 1000) + n * H


def sums(cells: rollup.Cells) -> Counter:
    out: Counter = Counter()
    for (_, part), s in cells.items():
        out[part] += s
    return out


def as_usage(spans, now) -> Counter:
    u = usage(spans, now)
    return Counter({"productive": u["productive_gpu_seconds"], **u["lost_gpu_seconds"]})


def test_an_attempt_is_cut_at_the_hours_it_crosses():
    # placed 11:30, started 11:40, succeeded 13:10, 2 GPUs
    spans = [Span(1, 2, at(0), at(100 * 60), "succeeded", started_at=at(600))]
    assert rollup.cells(spans, at(10**6)) == {
        (hour(0), "startup"): 2 * 600, (hour(0), "productive"): 2 * 1200,
        (hour(1), "productive"): 2 * 3600, (hour(2), "productive"): 2 * 600}


def test_apportion_is_exact_and_ties_go_to_the_earlier_key():
    assert rollup.apportion(10, {1: 1, 2: 1, 3: 1}) == {1: 4, 2: 3, 3: 3}
    assert rollup.apportion(0, {1: 5}) == {1: 0}
    assert rollup.apportion(7, {}) == {}


def test_a_failed_then_retried_job_adds_up_attempt_by_attempt():
    spans = [Span(1, 4, at(0), at(4000.4), "rank_failed", started_at=at(10.3)),
             Span(2, 4, at(4010.2), at(8000.7), "succeeded", started_at=at(4020.9))]
    first, second = rollup.added(spans, 1), rollup.added(spans, 2)
    total = Counter()
    for a in (first, second):
        for k, v in a.cells.items():
            total[k] += v
    assert {k: v for k, v in total.items() if v} == rollup.cells(spans, at(0))
    assert sums(rollup.cells(spans, at(0))) == as_usage(spans, at(0))
    assert first.hours == {hour(0), hour(1)} and second.hours == {hour(2)}
    assert first.days == {hour(0) - hour(0) % rollup.DAY_MS} and not second.days


def test_an_attempt_not_ended_adds_nothing_yet():
    spans = [Span(1, 1, at(0), None)]
    with pytest.raises(ValueError):
        rollup.added(spans, 1)
    run = rollup.running(spans, at(7200))
    assert sum(run.cells.values()) == 7200 and run.hours == {hour(0), hour(1), hour(2)}


def test_increments_put_each_cell_under_every_group_and_days_sum_their_hours():
    spans = [Span(1, 1, at(0), at(3600), "cancelled", started_at=at(0))]
    inc = rollup.increments(rollup.added(spans, 1),
                            rollup.groups("job_1", None, {"team": "nlp"}))
    day = hour(0) - hour(0) % rollup.DAY_MS
    assert inc[("hour", hour(0), "gpu_type", "any")] == {"cancelled": 1800, "jobs": 1}
    assert inc[("hour", hour(1), "label:team", "any#nlp")] == {"cancelled": 1800, "jobs": 1}
    assert inc[("day", day, "job", "any#job_1")] == {"cancelled": 3600, "jobs": 1}
    assert rollup.unpack("label:team", rollup.pack("h#1%", "a#b")) == ("h#1%", "a#b")
    assert rollup.unpack("gpu_type", "h100") == ("h100", "h100")


times = st.floats(min_value=0, max_value=20000, allow_nan=False).map(lambda s: round(s, 3))
reasons = st.sampled_from(["succeeded", "rank_failed", "preempted", "node_lost", "cancelled"])


@st.composite
def stories(draw):
    n = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 16))
    bounds = sorted(draw(st.lists(times, min_size=2 * n, max_size=2 * n)))
    spans = []
    for i in range(n):
        placed, end = at(bounds[2 * i]), at(bounds[2 * i + 1])
        started = draw(st.one_of(st.none(), st.floats(0, 1).map(
            lambda f, p=placed, e=end: p + (e - p) * f)))
        last = i == n - 1
        spans.append(Span(i + 1, gpus, placed, None if last and draw(st.booleans()) else end,
                          draw(reasons) if last else "rank_failed", started_at=started,
                          first_step=draw(st.one_of(st.none(), st.integers(0, 100))),
                          last_step=200))
    return spans


@settings(max_examples=60, deadline=None)
@given(stories(), times)
def test_additions_and_the_running_part_always_sum_to_the_jobs_usage(spans, later):
    now = at(20000 + later)
    total: Counter = Counter()
    for n in rollup.ended_attempts(spans):
        for (_, part), s in rollup.added(spans, n).cells.items():
            total[part] += s
    for (_, part), s in rollup.running(spans, now).cells.items():
        total[part] += s
    assert +total == +as_usage(spans, now)
    jobs_hours = sum(len(rollup.added(spans, n).hours) for n in rollup.ended_attempts(spans)) \
        + len(rollup.running(spans, now).hours)
    assert jobs_hours == len(rollup.held_hours(spans, now))


@pytest.mark.parametrize("raw", ["nope", "[1]", '{"h100": -1}', '{"h100": true}',
                                 '{"h100": "2"}'])
def test_a_bad_price_book_is_refused_at_start_by_name(aws_env, raw):
    from chalicelib.config import Config, ConfigError
    with pytest.raises(ConfigError, match="GPUJOBS_PRICES"):
        Config.from_env({**aws_env, "GPUJOBS_PRICES": raw})


def test_a_price_book_is_read_and_none_is_the_default(aws_env):
    from chalicelib.config import Config
    assert Config.from_env({**aws_env, "GPUJOBS_PRICES": '{"h100": 2.5, "a100": 1}'}).prices \
        == (("a100", 1.0), ("h100", 2.5))
    assert Config.from_env({**aws_env, "GPUJOBS_PRICES": ""}).prices == ()
