"""A quiet terminal for the local stack: a warning repeated word for word (a
stall scan on a loaded machine says "convicts nobody this time: recovering..."
every few seconds) prints once; the repeats are counted and said in one line,
``<the message> (repeated N times)``, when a different message comes, when a
while (``every_s``) has passed since the last line printed, or at shutdown.
N counts the lines not printed, as syslogd's "last message repeated N times".

It is a filter on the stack's log handlers, not a change to what the service
logs: on Lambda every line still goes to CloudWatch, where repeats are data.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

#: what the summary line adds to the repeated message
SUFFIX = " (repeated %d time%s)"


class RepeatFilter(logging.Filter):
    """Drops a record identical to the one before it (same logger, level and
    message) at ``min_level`` or above, and hands ``emit`` (the handler's
    ``handle``) one summary line for the dropped ones. Thread-safe: the
    stack's timers, queue consumers and API threads log through one handler."""

    def __init__(self, emit: Callable[[logging.LogRecord], object], *,
                 every_s: float = 60.0, min_level: int = logging.WARNING,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._emit = emit
        self.every_s = every_s
        self.min_level = min_level
        self._clock = clock
        self._lock = threading.Lock()
        self._last: logging.LogRecord | None = None  # the last record printed
        self._last_key: tuple[str, int, str] | None = None
        self._printed_at = 0.0
        self._repeats = 0
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(self._local, "emitting", False):
            return True  # our own summary line, on its way through the handler
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock()
        with self._lock:
            if key == self._last_key and record.levelno >= self.min_level:
                self._repeats += 1
                if now - self._printed_at < self.every_s:
                    return False
                summary = self._take_summary(now)  # a while has passed: say so
                self._printed_at = now
                drop = True
            else:
                summary = self._take_summary(now)
                self._last, self._last_key = record, key
                self._printed_at = now
                drop = False
        if summary is not None:
            self._say(summary)
        return not drop

    def flush(self) -> None:
        """Say the repeats not yet said (at shutdown)."""
        with self._lock:
            summary = self._take_summary(self._clock())
        if summary is not None:
            self._say(summary)

    def _take_summary(self, now: float) -> logging.LogRecord | None:
        """The summary of the repeats so far (None without any); resets the
        count. Called with the lock held."""
        if self._last is None or not self._repeats:
            return None
        last, n = self._last, self._repeats
        self._repeats = 0
        summary = logging.makeLogRecord({
            **last.__dict__, "msg": "%s" + SUFFIX, "args": (last.getMessage(), n, "" if n == 1 else "s"),
            "exc_info": None, "exc_text": None, "stack_info": None,
            "created": now, "msecs": (now - int(now)) * 1000,
            "relativeCreated": (now - logging._startTime) * 1000})  # type: ignore[attr-defined]
        return summary

    def _say(self, summary: logging.LogRecord) -> None:
        self._local.emitting = True
        try:
            self._emit(summary)
        finally:
            self._local.emitting = False


def quiet_repeats(*names: str, every_s: float = 60.0) -> list[RepeatFilter]:
    """Put a RepeatFilter on every handler of the loggers ``names`` ("" is
    the root) that has none yet; returns every such filter, for ``flush``.
    Call it again once the service has installed its own handlers (on the
    ``gpujobs`` and ``chalicelib`` loggers, when its services are built)."""
    filters: list[RepeatFilter] = []
    for name in names:
        for handler in logging.getLogger(name or None).handlers:
            found = [f for f in handler.filters if isinstance(f, RepeatFilter)]
            if not found:
                found = [RepeatFilter(handler.handle, every_s=every_s)]
                handler.addFilter(found[0])
            filters += [f for f in found if f not in filters]
    return filters
