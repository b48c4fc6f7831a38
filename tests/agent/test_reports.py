"""agent/reports.py: the reports' requests, in order, one batch at a time, on a
thread of their own or in the call, with what came of each handed back."""
from __future__ import annotations

import threading

import pytest

from agent.api import ApiError, AttemptGone
from agent.reports import Item, ReportSender
from agent.state import PendingReport
from tests.support.waits import wait_until


def report(job: str, kind: str) -> PendingReport:
    return PendingReport(job_id=job, attempt=1, event={"type": kind, "ranks": [0]},
                         queued_at=0.0)


class Api:
    """post_event answers as ``answers`` says per (job, type); ``gate`` holds
    every request until set."""

    def __init__(self, answers=None, gate: threading.Event | None = None) -> None:
        self.answers, self.gate, self.posted = answers or {}, gate, []

    def post_event(self, job_id, attempt, event):
        if self.gate is not None:
            assert self.gate.wait(10)
        self.posted.append((job_id, event["type"]))
        error = self.answers.get((job_id, event["type"]))
        if error is not None:
            raise error


def outcomes_of(sender: ReportSender) -> list[tuple[str, str, str]]:
    wait_until(lambda: not sender.busy(), 10, what="the batch done")
    out = []
    for o in sender.outcomes():
        what = "held" if o.held else "gone" if o.gone else \
            "sent" if o.error is None else "retry" if o.error.retryable else "refused"
        out.append((o.report.job_id, o.report.event["type"], what))
    return out


@pytest.mark.parametrize("thread", [False, True], ids=["inline", "thread"])
def test_a_batch_goes_in_order_and_stops_at_a_retryable_failure(thread):
    """Invariant: reports go in the order queued; a retryable failure ends the
    batch (what follows waits for the backoff, so no attempt's reports are
    reordered); a refusal or a gone attempt does not."""
    api = Api({("b", "STARTED"): AttemptGone("409"), ("c", "STARTED"): ApiError("400"),
               ("d", "STARTED"): ApiError("503", retryable=True)})
    sender = ReportSender(api, thread=thread)
    try:
        sender.send([Item(report(j, "STARTED")) for j in "abcde"])
        assert outcomes_of(sender) == [("a", "STARTED", "sent"), ("b", "STARTED", "gone"),
                                       ("c", "STARTED", "refused"), ("d", "STARTED", "retry")]
        assert api.posted == [(j, "STARTED") for j in "abcd"]
    finally:
        sender.close()


def test_an_end_whose_last_beats_cannot_be_posted_holds_back_its_attempt_only():
    """Invariant: an end report waits for its ranks' last beats while it may
    (its attempt's later reports wait with it; other attempts' go), and goes
    anyway once it may wait no longer."""
    api = Api()
    sender = ReportSender(api)
    sender.send([Item(report("a", "EXITED"), final=lambda: False),
                 Item(report("a", "STOPPED")), Item(report("b", "EXITED"))])
    assert outcomes_of(sender) == [("a", "EXITED", "held"), ("a", "STOPPED", "held"),
                                   ("b", "EXITED", "sent")]
    sender.send([Item(report("a", "EXITED"), final=lambda: False, may_wait=False)])
    assert outcomes_of(sender) == [("a", "EXITED", "sent")]


def test_a_threaded_sender_is_busy_until_every_outcome_is_out():
    """Invariant: while a batch is in flight the sender says so (the agent
    sends no second batch, which could send a report twice), and once it
    says it is idle every outcome of the batch can be read."""
    gate = threading.Event()
    sender = ReportSender(Api(gate=gate), thread=True)
    try:
        sender.send([Item(report("a", "STARTED")), Item(report("a", "EXITED"))])
        assert sender.busy() and sender.outcomes() == []
        gate.set()
        assert [x[1] for x in outcomes_of(sender)] == ["STARTED", "EXITED"]
    finally:
        gate.set()
        sender.close()
