"""Times are written as RFC 3339 UTC with milliseconds and a ``Z``, and read
back to the same instant (chalicelib/domain/clock.py)."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from hypothesis import given, strategies as st

from chalicelib.domain.clock import iso, parse_iso

RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@given(st.datetimes(timezones=st.just(timezone.utc)), st.integers(-14 * 60, 14 * 60))
def test_iso_is_utc_milliseconds_and_reads_back_as_the_same_instant(t, offset_min):
    local = t.astimezone(timezone(timedelta(minutes=offset_min))) if 1 < t.year < 9999 else t
    text = iso(local)
    assert RFC3339_MS.match(text), text
    assert parse_iso(text) == t.replace(microsecond=t.microsecond // 1000 * 1000)


def test_a_known_instant():
    t = datetime(2026, 12, 1, 2, 3, 4, 567891, tzinfo=timezone(timedelta(hours=5)))
    assert iso(t) == "2026-11-30T21:03:04.567Z"
