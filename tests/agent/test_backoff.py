"""Capped exponential backoff with full jitter, Retry-After, and the retry loop."""
from __future__ import annotations

import email.utils
import random

import pytest
from hypothesis import given, strategies as st

from agent.backoff import MAX_RETRY_AFTER_S, ceiling, full_jitter, parse_retry_after, retry_delay


def test_ceiling_doubles_from_base_up_to_the_cap():
    assert [ceiling(n, 0.5, 30) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_ceiling_of_a_huge_attempt_is_the_cap_without_overflow():
    assert ceiling(10_000, 0.5, 30) == 30


def test_attempts_count_from_one():
    with pytest.raises(ValueError):
        ceiling(0, 0.5, 30)


@given(attempt=st.integers(1, 200), base=st.floats(0.001, 10), cap=st.floats(0.001, 600),
       seed=st.integers(0, 2**32))
def test_full_jitter_stays_within_zero_and_the_capped_ceiling(attempt, base, cap, seed):
    delay = full_jitter(attempt, base, cap, random.Random(seed))
    assert 0.0 <= delay <= min(cap, ceiling(attempt, base, cap))


def test_full_jitter_is_reproducible_with_a_seeded_random():
    a = [full_jitter(n, 0.5, 30, random.Random(7)) for n in range(1, 10)]
    b = [full_jitter(n, 0.5, 30, random.Random(7)) for n in range(1, 10)]
    assert a == b


def test_full_jitter_spreads_over_the_whole_range_not_just_near_the_ceiling():
    rng = random.Random(42)
    delays = [full_jitter(6, 0.5, 30, rng) for _ in range(2000)]  # ceiling 16
    assert min(delays) < 1.0 and max(delays) > 15.0  # from near 0 to near the ceiling
    assert 7.0 < sum(delays) / len(delays) < 9.0      # uniform: mean half the ceiling
    assert len(set(delays)) == len(delays)            # jittered, not a fixed step


def test_capped_jitter_never_exceeds_the_cap_however_many_failures():
    rng = random.Random(1)
    assert max(full_jitter(n, 1.0, 5.0, rng) for n in range(1, 500)) <= 5.0


@pytest.mark.parametrize("header,expected", [
    ("3", 3.0), ("0", 0.0), (" 2 ", 2.0), ("-5", 0.0), ("1.5", 1.5),
    ("99999", MAX_RETRY_AFTER_S), (None, None), ("", None), ("soon", None), ("nan", None),
])
def test_retry_after_in_seconds(header, expected):
    assert parse_retry_after(header) == expected


def test_retry_after_as_an_http_date():
    now = 1_700_000_000.0
    header = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry_after(header, now=now) == pytest.approx(12.0)
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now=now) == 0.0


def test_retry_delay_is_full_jitter_when_the_server_names_no_time():
    assert retry_delay(3, 0.5, 30, random.Random(5)) == full_jitter(3, 0.5, 30, random.Random(5))


def test_retry_delay_honours_retry_after_as_a_floor():
    assert retry_delay(1, 0.1, 1, random.Random(0), retry_after=7.0) == 7.0
    # a Retry-After shorter than the jitter does not shorten the wait
    jitter = full_jitter(8, 1, 60, random.Random(2))
    assert jitter > 1 and retry_delay(8, 1, 60, random.Random(2), retry_after=1.0) == jitter
