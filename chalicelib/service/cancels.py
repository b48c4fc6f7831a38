"""Cancelling one job, the one way: a job no agent holds ends at once; a
placed job records the request with its CANCEL intent, which is then sent
(the agents stop the ranks and confirm). Used by the jobs service for a
tenant's cancel and by the pipelines service for an array's children."""
from __future__ import annotations

from typing import Protocol

from ..domain.clock import Clock, plus
from ..domain.errors import RequestInProgress
from ..domain.intents import cancel_intent
from ..domain.jobs import Job
from ..domain.states import JobState
from .dispatch import Dispatcher
from .ports import JobReads, JobWrites, StateChanged, Telemetry, Transitions

_RACE_RETRIES = 3


class CancelPorts(JobReads, JobWrites, Transitions, Protocol):
    """What a cancel writes: the unplaced end, or the request with its intent."""


class Canceller:
    def __init__(self, store: CancelPorts, dispatcher: Dispatcher, *, resend_after_s: float,
                 telemetry: Telemetry, clock: Clock) -> None:
        self.store, self.dispatcher, self.telemetry = store, dispatcher, telemetry
        self._resend_after_s, self._clock = resend_after_s, clock

    def cancel(self, job: Job, reason: str | None) -> tuple[Job, bool]:
        """Record the cancel of ``job`` (re-read on a lost race); the job as
        it is now, and whether it ended here (it was never placed). A repeat
        records nothing new; a finished job is returned as it is, and so is
        an array that is open (PipelinesService.cancel_array cancels it)."""
        for _ in range(_RACE_RETRIES):
            if job.state.terminal or (job.cancel_requested_at is not None
                                      and job.state is not JobState.PENDING):
                return job, False
            now = self._clock()
            try:
                if job.state is JobState.PENDING:
                    job = self.store.cancel_unplaced(job, now, reason)
                    self.telemetry.count("CancelsRequested")
                    return job, True
                intent = cancel_intent(job, reason)
                job = self.store.request_cancel(job, now, reason, intent,
                                                due_at=plus(now, self._resend_after_s))
            except StateChanged:
                fresh = self.store.get(job.job_id)
                if fresh is None:  # never: jobs are not deleted
                    break
                job = fresh
                if job.is_array and not job.waiting_for and not job.state.terminal:
                    return job, False  # released meanwhile: an open array's cancel is its own
                continue  # placed, started or finished meanwhile: decide again
            self.telemetry.count("CancelsRequested")
            self.dispatcher.send(intent)
            return job, False
        raise RequestInProgress(f"job {job.job_id} is changing state; retry")
