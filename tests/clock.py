"""A clock the test moves by hand, handed to ``bootstrap.build(clock=...)``."""
from __future__ import annotations

from datetime import datetime, timedelta

from chalicelib.domain.clock import utcnow


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.t = start or utcnow()

    def __call__(self) -> datetime:
        return self.t

    def advance(self, seconds: float) -> datetime:
        self.t += timedelta(seconds=seconds)
        return self.t


class ShiftedClock:
    """Real time, moved forward by ``advance`` (for code that also reads the
    wall clock elsewhere, such as the store's own timestamps)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return utcnow() + self.offset

    def advance(self, seconds: float) -> datetime:
        self.offset += timedelta(seconds=seconds)
        return self()
