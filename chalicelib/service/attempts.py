"""Attempt events from agents: STARTED, EXITED, STOPPED.

Each report first adds to the attempt's per-rank progress (idempotent set
additions), gives a node its GPUs back once all its ranks are done (exactly
once), and acknowledges the node's intents; then the job moves as that progress
says, by a conditional write on the state it leaves. Racing reports converge:
the loser of a conditional write re-reads and finds the work done.
"""
from __future__ import annotations

import logging
from typing import Protocol

from ..domain import deadlines, intents, retry
from ..domain.attempts import LOST, PORT_TAKEN, Attempt, exit_info, outcome
from ..domain.clock import Clock, utcnow
from ..domain.errors import Forbidden, InvalidArgument, StaleAttempt
from ..domain.happened import AttemptEnded, JobEnded, RankFailed
from ..domain.ids import is_job_id
from ..domain.jobs import Job
from ..domain.principal import Principal
from ..domain.states import PLACED, Event, JobState, next_state
from .bus import Publish, nowhere
from .dispatch import Dispatcher
from .heartbeats import not_placed_here
from .ports import Attempts, JobReads, JobWrites, Nudge, Outbox, StateChanged, Transitions

_RACE_RETRIES = 3
#: the CANCEL's reason, as the agents log it, by the attempt's end reason
_STOP_REASONS = {"stalled": "the attempt stalled", "timeout": "the attempt timed out"}
#: an agent's report that the attempt passed its max_runtime_s there
TIMED_OUT = "TIMED_OUT"
log = logging.getLogger(__name__)


class AttemptsServicePorts(JobReads, JobWrites, Attempts, Outbox, Transitions, Protocol):
    """What the attempts service calls: the job and its attempt, the ranks'
    reports, acknowledgements, releases, and the attempt's start and end."""


class AttemptsService:
    def __init__(self, store: AttemptsServicePorts, dispatcher: Dispatcher, nudge: Nudge,
                 clock: Clock = utcnow, publish: Publish = nowhere) -> None:
        self.store, self.dispatcher, self.nudge, self._clock = store, dispatcher, nudge, clock
        #: tells what happened (domain/happened.py): a job's end, a rank's failure
        self._publish = publish

    def report(self, principal: Principal, job_id: str, attempt_no: int, body: dict) -> Job:
        kind = body["type"]
        if kind == "EXITED" and "exit_code" not in body:
            raise InvalidArgument("EXITED needs exit_code", field="exit_code")
        if "not_started" in body and kind != "EXITED":
            raise InvalidArgument("not_started goes only with EXITED", field="not_started")
        if principal.kind != "agent":
            raise Forbidden("attempt events take an agent token", field="Authorization")
        if kind == TIMED_OUT:
            return self._timed_out_report(principal, job_id, attempt_no, body)
        job, attempt = self._placed_here(principal, job_id, attempt_no)
        node_id = self._node(principal, body.get("node_id"), attempt)
        ranks = sorted(set(body.get("ranks", [])))
        held = attempt.ranks_on(node_id)
        if not held:
            raise not_placed_here(principal, job_id, attempt_no)
        if not set(ranks) <= set(held):
            raise Forbidden(f"ranks {sorted(set(ranks) - set(held))} are not placed on "
                            f"node {node_id}", field="ranks")
        if kind == "STOPPED" and not ranks:
            ranks = held  # stopped before, or instead of, launching: all of them
        # ranks not started for a taken rendezvous port: no exit of the job's
        code = PORT_TAKEN if body.get("not_started") == "port_in_use" else body.get("exit_code")
        attempt = self.store.record_ranks(job_id, attempt_no,
                                          {"STARTED": "started", "EXITED": "exited",
                                           "STOPPED": "stopped"}[kind],
                                          ranks, code, node_id,
                                          body.get("stacks") if kind == "STOPPED" else None)
        self._acknowledge(attempt, node_id)
        try:
            if attempt_no != job.attempt:
                raise StaleAttempt(f"attempt {attempt_no} of job {job_id} is no longer "
                                   f"current (current: {job.attempt})", field="attempt")
            return self.advance(job, attempt, started=kind == "STARTED")
        finally:
            # the GPUs go back once the job has moved on its ranks' end, so a
            # job placed on them never reads as placed before that job ended
            self.settle_node(attempt, node_id, heard=True)

    def _timed_out_report(self, principal: Principal, job_id: str, attempt_no: int,
                          body: dict) -> Job:
        """An agent saw the attempt pass its max_runtime_s and is stopping its
        ranks there (STOPPED follows): the attempt ends now, as ``timeout``,
        and the other nodes' ranks get a CANCEL."""
        job, attempt = self._placed_here(principal, job_id, attempt_no)
        node_id = self._node(principal, body.get("node_id"), attempt)
        if not attempt.ranks_on(node_id):
            raise not_placed_here(principal, job_id, attempt_no)
        if job.spec.max_runtime_s is None:  # its LAUNCH carried no limit
            raise InvalidArgument(f"job {job_id} has no max_runtime_s: nothing times out",
                                  field="type")
        self.store.ack_intent(job_id, intents.intent_id(intents.LAUNCH, attempt_no), node_id)
        if attempt_no != job.attempt:
            raise StaleAttempt(f"attempt {attempt_no} of job {job_id} is no longer "
                               f"current (current: {job.attempt})", field="attempt")
        log.info("job %s attempt %d: node %s reports it over its max_runtime_s", job_id,
                 attempt_no, node_id)
        return self.time_out(job, attempt)

    def _placed_here(self, principal: Principal, job_id: str,
                     attempt_no: int) -> tuple[Job, Attempt]:
        job = self.store.get(job_id) if is_job_id(job_id) else None
        attempt = self.store.attempt(job_id, attempt_no) if job is not None else None
        if job is None or (attempt is None and principal.name != "*"):
            # one answer whether or not the job exists (docs/security.md)
            raise not_placed_here(principal, job_id, attempt_no)
        if attempt is None:
            raise StaleAttempt(f"job {job_id} has no attempt {attempt_no}; its current "
                               f"attempt is {job.attempt}", field="attempt")
        return job, attempt

    def _node(self, principal: Principal, claimed: str | None, attempt: Attempt) -> str:
        if principal.kind != "agent":
            raise Forbidden("attempt events take an agent token", field="Authorization")
        if principal.name != "*":
            if claimed is not None and claimed != principal.name:
                raise Forbidden(f"this token acts for node {principal.name}, not {claimed}",
                                field="node_id")
            return principal.name
        if claimed is None:
            nodes = sorted(attempt.node_ranks)
            if len(nodes) != 1:
                raise InvalidArgument("node_id is required with a token for all nodes",
                                      field="node_id")
            return nodes[0]
        return claimed

    def _acknowledge(self, attempt: Attempt, node_id: str) -> None:
        """Any report from a node shows it got its LAUNCH; a node whose ranks are
        all done needs no CANCEL resent, however they ended."""
        self.store.ack_intent(attempt.job_id, intents.intent_id(intents.LAUNCH, attempt.attempt), node_id)
        if attempt.node_done(node_id):
            self.store.ack_intent(attempt.job_id, intents.intent_id(intents.CANCEL, attempt.attempt), node_id)

    def settle_node(self, attempt: Attempt, node_id: str, *, heard: bool) -> None:
        """Once every rank on the node is known gone, its GPUs go back, exactly
        once. ``heard``: the node's agent said so just now (a report or a
        call-in), which shows it alive as a call-in does: the node's last
        seen time moves with the release, so a node whose beats kept it up
        is not taken for silent the moment its last attempt ends (issue 41)."""
        if attempt.node_confirmed(node_id) and node_id not in attempt.released:
            if self.store.release(attempt, node_id,
                                  heard_at=self._clock() if heard else None):
                self.nudge()

    def confirm_gone(self, job_id: str, attempt_no: int, node_id: str) -> None:
        """The node's agent registered without this attempt among those it runs:
        its ranks there are gone (stopped, or never launched), so its GPUs go
        back. Counted as STOPPED, which adds nothing to the job's progress
        (those ranks were already lost)."""
        attempt = self.store.attempt(job_id, attempt_no)
        if attempt is None or not attempt.ranks_on(node_id):
            return
        attempt = self.store.record_ranks(job_id, attempt_no, "stopped",
                                          attempt.ranks_on(node_id))
        self._acknowledge(attempt, node_id)
        self.settle_node(attempt, node_id, heard=True)

    def node_lost(self, job: Job, attempt: Attempt, node_id: str) -> Job:
        """The node went DOWN: its ranks count as failed. Its GPUs stay held
        until its agent confirms the ranks gone (a STOPPED or EXITED report,
        or a registration that no longer lists the attempt): ranks of a paused
        or cut-off node may still run. A node that stays DOWN takes no
        placements, so the GPUs it holds keep nothing else waiting."""
        lost = [r for r in attempt.ranks_on(node_id) if r not in attempt.done]
        attempt = self.store.record_ranks(job.job_id, attempt.attempt, "exited", lost, LOST,
                                          node_id)
        self._acknowledge(attempt, node_id)
        try:
            return job if attempt.attempt != job.attempt else self.advance(job, attempt)
        finally:
            # after the move, as in report(); the server, not the agent, says it
            self.settle_node(attempt, node_id, heard=False)

    def advance(self, job: Job, attempt: Attempt, *, started: bool = False) -> Job:
        """Move the job as the attempt's progress says; safe against racing reports."""
        for _ in range(_RACE_RETRIES):
            if job.attempt != attempt.attempt or job.state not in PLACED:
                return job
            try:
                if started and job.state is JobState.SCHEDULED:
                    job = self.store.start(job, self._clock())
                event = outcome(attempt, cancel_requested=job.cancel_requested_at is not None)
                if event is None:
                    return job
                return self._end(job, attempt, event)
            except StateChanged:
                fresh = self.store.get(job.job_id)
                again = self.store.attempt(job.job_id, attempt.attempt)
                if fresh is None or again is None:  # never: neither is ever deleted
                    return job
                job, attempt = fresh, again
        return job

    def abandon(self, job: Job, exit_: dict, attempt: Attempt | None = None) -> Job:
        """End the current attempt although no rank failed (a stall, with
        ``on_stall: restart``; a time-out): stop its ranks through the normal
        CANCEL intent path; the retry rules decide what follows."""
        attempt = attempt or self.store.attempt(job.job_id, job.attempt)
        if attempt is None or job.state not in PLACED or attempt.attempt != job.attempt \
                or job.cancel_requested_at is not None:
            return job
        try:
            return self._end(job, attempt, Event.RANK_FAILED, exit_)
        except StateChanged:
            return self.store.get(job.job_id) or job

    def time_out(self, job: Job, attempt: Attempt | None = None) -> Job:
        """The attempt ran past its max_runtime_s: it ends as ``timeout``."""
        return self.abandon(job, dict(deadlines.TIMEOUT_EXIT), attempt)

    def _end(self, job: Job, attempt: Attempt, event: Event, exit_: dict | None = None) -> Job:
        exit_ = exit_ or exit_info(attempt, event)
        if exit_.get("rank") is not None and "node_id" not in exit_:  # a stall's rank
            exit_ = {**exit_, "node_id": attempt.rank_nodes().get(exit_["rank"])}
        uncounted = False
        if event is Event.RANK_FAILED:  # the retry rules decide what follows
            decision = retry.decide(job.spec, exit_, attempt=attempt.attempt,
                                    uncounted=job.uncounted_retries)
            exit_ = {**exit_, "decision": decision.text}
            event = Event.RETRY if decision.retry else Event.RANK_FAILED
            uncounted = decision.action == "retry_uncounted"
        to = next_state(job.state, event)
        still_running = {n for n in attempt.node_ranks if not attempt.node_done(n)}
        stop = None
        if event in (Event.RANK_FAILED, Event.RETRY) and still_running:
            reason = _STOP_REASONS.get(exit_.get("reason") or "",
                                       "another rank of the attempt failed")
            stop = intents.cancel(job.job_id, attempt.attempt, reason,
                                  {n: u for n, u in job.inboxes.items() if n in still_running})
        job = self.store.end_attempt(job, attempt, to, exit_, self._clock(), stop,
                                     uncounted=uncounted)
        self._publish(AttemptEnded(job.tenant, job.job_id, attempt.attempt))
        if exit_.get("reason") == "rank_failed" and exit_.get("node_id"):
            self._publish(RankFailed(exit_["node_id"], job.job_id, attempt.attempt, job.tenant))
        if stop is not None:
            self.dispatcher.send(stop)
        if to is JobState.PENDING:
            self.nudge()
        elif to.terminal:
            self._publish(JobEnded(job))
        return job
