"""Sending the agent's reports (``POST /v1/jobs/{id}/attempts/{n}/events``).

The main loop (core.Agent) decides what goes and applies what came of it; a
:class:`ReportSender` does the requests. The runner's sender does them on a
thread of its own, so a report the server is slow to answer (an end that
releases many dependents took it 10 s) holds up no inbox message, no rank
exit, no grace period's SIGKILL (issue 41); an inline sender (``thread=False``,
the default, as unit tests use) does them in the call, the same way.

One batch is in flight at a time, its reports in the order they were queued,
so per attempt STARTED, EXITED..., STOPPED keep their order: a retryable
failure ends the batch (the main loop waits out a backoff, then sends what is
left), and a report held back holds back its attempt's later reports in the
batch. A report of ranks' ends (EXITED, STOPPED) first has their last beats
posted (``final``: beats.BeatPoster.final), so the server's view of a finished
job ends at its last step; when they cannot be posted yet it is held back, or
sent anyway once the main loop says it may wait no longer.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from .api import ApiError, AttemptGone
from .state import PendingReport

log = logging.getLogger("gpujobs.agent.reports")


@dataclass(frozen=True)
class Item:
    """A report to send; ``final``, when its ranks' last beats go first (a call
    that posts them, True once done), and ``may_wait`` whether it is held back
    when they cannot be posted yet."""
    report: PendingReport
    final: Callable[[], bool] | None = None
    may_wait: bool = True


@dataclass(frozen=True)
class Sent:
    """What came of sending ``report``: ``error`` None is answered 2xx;
    ``gone``: the server no longer cares about its attempt; ``held``: not
    sent (its last beats could not be posted yet, or an earlier report of
    its attempt was held)."""
    report: PendingReport
    error: ApiError | None = None
    gone: bool = False
    held: bool = False


class ReportSender:
    def __init__(self, api, *, thread: bool = False) -> None:
        self._api = api
        self._outcomes: "queue.SimpleQueue[Sent]" = queue.SimpleQueue()
        self._busy = threading.Event()
        self._work: "queue.SimpleQueue[list[Item] | None]" | None = None
        self._thread: threading.Thread | None = None
        if thread:
            self._work = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, name="reports", daemon=True)
            self._thread.start()

    def busy(self) -> bool:
        """Whether a batch is in flight (its outcomes not all out yet)."""
        return self._busy.is_set()

    def send(self, batch: list[Item]) -> None:
        """Send ``batch`` (only when not :meth:`busy`)."""
        if self._work is None:
            self._run(batch)
            return
        self._busy.set()
        self._work.put(batch)

    def outcomes(self) -> list[Sent]:
        """What came of what was sent, since the last call. Every outcome of
        a batch is out before :meth:`busy` turns False."""
        out = []
        while not self._outcomes.empty():
            out.append(self._outcomes.get())
        return out

    def close(self, timeout: float = 15.0) -> None:
        if self._work is not None and self._thread is not None:
            self._work.put(None)
            self._thread.join(timeout)

    def _serve(self) -> None:
        assert self._work is not None
        while (batch := self._work.get()) is not None:
            try:
                self._run(batch)
            except Exception:  # noqa: BLE001 - the reports stay pending: sent again
                log.exception("sending reports failed; they are sent again")
            finally:
                self._busy.clear()

    def _run(self, batch: list[Item]) -> None:
        held: set[tuple[str, int]] = set()
        for item in batch:
            report = item.report
            attempt = (report.job_id, report.attempt)
            if attempt in held or not self._last_beats(item):
                held.add(attempt)  # that attempt's later reports wait with it
                self._outcomes.put(Sent(report, held=True))
                continue
            try:
                self._api.post_event(report.job_id, report.attempt, report.event)
            except AttemptGone:
                self._outcomes.put(Sent(report, gone=True))
            except ApiError as e:
                self._outcomes.put(Sent(report, error=e))
                if e.retryable:
                    return  # the rest after a backoff, in order
            else:
                self._outcomes.put(Sent(report))

    @staticmethod
    def _last_beats(item: Item) -> bool:
        """Whether ``item`` may go as far as its ranks' last beats are concerned."""
        if item.final is None:
            return True
        try:
            if item.final():
                return True
        except Exception:  # noqa: BLE001 - beats are progress, never a held end
            log.exception("%s/%s: posting the last beats failed; reporting anyway",
                          item.report.job_id, item.report.attempt)
            return True
        return not item.may_wait
