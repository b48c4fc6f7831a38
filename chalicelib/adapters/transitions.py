"""The Transitions port on DynamoDB: the transitions that open, stop or close
an attempt. Each is ONE transaction across the jobs, attempts, outbox, nodes
and tenants tables (half of any of them would lose an intent or leak
capacity), conditioned on the states domain/states.py's table says it leaves.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime

from pynamodb.exceptions import TransactWriteError

from ..domain import events as ev
from ..domain.arrays import ENDED_COUNTER
from ..domain.attempts import Attempt, rank_runs
from ..domain.clock import iso, parse_iso
from ..domain.health import clear_incident, frozen_health
from ..domain.intents import LAUNCH, Intent, intent_id
from ..domain.jobs import Job
from ..domain.placement import Plan
from ..domain.states import ENDS_ATTEMPT, PLACED, Event, JobState
from ..service.ports import CapacityChanged, Contended, StateChanged
from .attempt_store import ATTEMPTS, NODES, read_attempt
from .dynamo import Changes
from .dynamo_errors import tx_lost
from .jobs_table import (
    JOBS,
    OnDynamo,
    count_pending,
    expire_key,
    leaving,
    moved,
    parent_counts,
    state_in,
)
from .outbox_store import OUTBOX, outbox_item, retire
from .usage_store import due_put


def place_writes(job: Job, plan: Plan, intent: Intent, now: datetime,
                 resend_at: datetime | None = None,
                 node_types: dict[str, str] | None = None) -> list[dict]:
    """The transaction of ``place``, in the order of its cancellation
    reasons: [0] the attempt, [1] the LAUNCH intent (puts), [2] the job,
    [3:3+n] the n nodes (sorted), [its array's counters,] then the
    tenant's PENDING count, last."""
    attempt = job.attempt + 1
    gpus = plan.gpus_by_node()
    held = f"{job.job_id}#{attempt}"
    nodes = sorted(gpus)
    scheduled = JobState.SCHEDULED
    changes = moved(Changes(JOBS), job, scheduled).set("attempt", attempt) \
        .set("inboxes", intent.targets).remove("pending_reason", "waiting_on", "pending_since", "preempting") \
        .set("health", clear_incident(job.health)).set("updated_at", iso(now)) \
        .event(f"placed#{attempt}", ev.placed(now, attempt, plan.ranks_by_node))
    condition, values = leaving(Event.PLACE, attempt=job.attempt)
    new_attempt = ATTEMPTS.item(dict(
        job_id=job.job_id, attempt=attempt, state=scheduled.value,
        node_ranks={n: rank_runs(r) for n, r in plan.ranks_by_node.items()}, node_gpus=gpus,
        world_size=job.spec.ranks, created_at=iso(now), node_types=node_types or None))
    items = [{"Put": ATTEMPTS.put_new(new_attempt)},
             {"Put": OUTBOX.put_new(outbox_item(intent, now, resend_at or now))},
             {"Update": changes.update(JOBS.key(job.job_id), condition=condition,
                                       values=values)}]
    for node_id in nodes:
        items.append({"Update": Changes(NODES).add("gpus_free", -gpus[node_id])
                      .add("attempts", {held}).update(
                          NODES.key(node_id), condition="#gpus_free >= :gpus AND #state = :ready",
                          values={":gpus": {"N": str(gpus[node_id])}, ":ready": {"S": "READY"}})})
    if job.parent_id is not None:  # an index placed: its array counts it running
        items.append({"Update": parent_counts(job.parent_id, placed=+1)})
    items.append({"Update": count_pending(job.tenant, -1)})  # last: node reasons stay at [3:]
    return items


def request_cancel_writes(job: Job, now: datetime, reason: str | None, intent: Intent,
                          due_at: datetime) -> list[dict]:
    """The transaction of ``request_cancel``: the job's cancel request
    (conditioned on the placed attempt, not cancelled yet), the CANCEL
    intent, and the retired LAUNCH."""
    condition, values = state_in(PLACED, attempt=job.attempt)
    condition += " AND attribute_not_exists(#cancel_requested_at)"
    changes = Changes(JOBS).set("cancel_requested_at", iso(now)).set("updated_at", iso(now)) \
        .event("cancel_requested", ev.event(
            "cancel_requested", now, attempt=job.attempt, reason=reason,
            by=job.tenant, nodes=sorted(intent.targets)))
    if reason is not None:
        changes.set("cancel_reason", reason)
    return [{"Update": changes.update(JOBS.key(job.job_id), condition=condition,
                                      values=values)},
            {"Put": OUTBOX.put_new(outbox_item(intent, now, due_at))},
            {"Update": retire(job.job_id, intent_id(LAUNCH, job.attempt))}]


class DynamoTransitions(OnDynamo):
    def place(self, job: Job, plan: Plan, intent: Intent, now: datetime,
              resend_at: datetime | None = None,
              node_types: dict[str, str] | None = None) -> Job:
        """Reserve every node's GPUs, move the job to SCHEDULED, write the attempt
        and its LAUNCH intent: one transaction, so all of it happens or none.

        Raises StateChanged when the job is no longer the PENDING job that was
        read (placed by another placer, or cancelled), CapacityChanged naming
        the nodes that no longer have room, Contended when only the tenant's
        counter was contended.

        The cancellation reasons come in DynamoDB's order, puts before
        updates: [0] the attempt, [1] the intent, [2] the job, [3:] the nodes,
        then the tenant's counter, last.
        """
        attempt = job.attempt + 1
        nodes = sorted(plan.gpus_by_node())
        try:
            with self._dynamo.transaction() as tx:
                tx.add(place_writes(job, plan, intent, now, resend_at, node_types))
        except TransactWriteError as e:
            reasons = list(e.cancellation_reasons or [])
            if not tx_lost(e):
                raise
            if reasons and reasons[0] is not None:
                mine = self._mine(job.job_id, lambda j: j.attempt == attempt
                                  and j.state is JobState.SCHEDULED
                                  and j.updated_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            full = [n for n, r in zip(nodes, reasons[3:3 + len(nodes)]) if r is not None]
            if not full and len(reasons) > 3 + len(nodes) and reasons[-1] is not None:
                raise Contended(job.tenant) from None
            raise CapacityChanged(full or nodes) from None
        return dataclasses.replace(job, state=JobState.SCHEDULED, attempt=attempt,
                                   inboxes=intent.targets, pending_reason=None, pending_since=None,
                                   preempting=None, updated_at=now)

    def request_cancel(self, job: Job, now: datetime, reason: str | None,
                       intent: Intent, due_at: datetime) -> Job:
        """Record the cancel request of a placed job, with its CANCEL intent in
        the outbox, and stop resending the attempt's LAUNCH: one transaction."""
        try:
            # the intent is recorded with the request, before anything is sent;
            # and the attempt's LAUNCH is no longer resent
            with self._dynamo.transaction() as tx:
                tx.add(request_cancel_writes(job, now, reason, intent, due_at))
        except TransactWriteError as e:
            if tx_lost(e):
                mine = self._mine(job.job_id,
                                  lambda j: j.cancel_requested_at == parse_iso(iso(now)))
                if mine is not None:
                    return mine
                raise StateChanged(job.job_id) from None
            raise
        return dataclasses.replace(job, cancel_requested_at=now, cancel_reason=reason,
                                   updated_at=now)

    def end_attempt(self, job: Job, attempt: Attempt, to: JobState, exit_: dict,
                    now: datetime, stop: Intent | None = None, *,
                    uncounted: bool = False) -> Job:
        """End the current attempt: the job becomes ``to`` (terminal, or PENDING
        for a new attempt, ``uncounted`` when its retry rules do not count
        it), conditioned on the placed state and attempt it leaves; the
        attempt records its end; ``stop`` (CANCEL to the nodes still running
        ranks) is recorded in the same transaction."""
        changes = moved(Changes(JOBS), job, to).set("updated_at", iso(now)) \
            .set("health", frozen_health(job.health, iso(now), to.terminal, exit_,
                                         _node_of(attempt, (exit_ or {}).get("rank"))))
        # (nothing is judged once the attempt ended: no stale health)
        changes.event(*ev.attempt_end(now, attempt.attempt, to.value, exit_, job.state.value))
        if to.terminal:
            changes.set("exit", exit_).set("finished_at", iso(now))
        else:
            changes.set("pending_since", iso(now)).remove("inboxes")
            if uncounted:
                changes.add("uncounted_retries", 1)
        condition, values = leaving(*ENDS_ATTEMPT, attempt=attempt.attempt)
        if not to.terminal:
            # a cancel recorded meanwhile wins: no new attempt for a cancelled job
            condition += " AND attribute_not_exists(#cancel_requested_at)"
        ended = Changes(ATTEMPTS) \
            .set("state", to.value if to.terminal else JobState.FAILED.value) \
            .set("finished_at", iso(now)).set("exit", exit_)
        try:
            with self._dynamo.transaction() as tx:
                tx.update(changes.update(JOBS.key(job.job_id), condition=condition,
                                         values=values))
                tx.update(ended.update(ATTEMPTS.key(attempt.job_id, attempt.attempt)))
                tx.update(retire(job.job_id, intent_id(LAUNCH, attempt.attempt)))
                if stop is not None and stop.targets:
                    tx.put(OUTBOX.put_new(outbox_item(stop, now, now)))
                if to.terminal and job.idem_id:
                    tx.update(expire_key(job, now))
                if to is JobState.PENDING:
                    tx.update(count_pending(job.tenant, +1))  # a retry is counted, never refused
                tx.put(due_put(job.job_id, attempt.attempt, now))  # its usage to roll up
                if job.parent_id is not None:  # its array counts the index's move
                    tx.update(parent_counts(job.parent_id, placed=-1, **(
                        {ENDED_COUNTER[to]: 1} if to.terminal else {})))
        except TransactWriteError as e:
            if tx_lost(e):
                done = read_attempt(self._dynamo, job.job_id, attempt.attempt)
                mine = self._read_job(job.job_id) if done is not None and \
                    done.finished_at == parse_iso(iso(now)) and done.exit == exit_ else None
                if mine is not None:
                    return mine  # our own end, retried
                raise StateChanged(job.job_id) from None
            raise
        finished = self._read_job(job.job_id)
        if finished is None:  # never: jobs are not deleted
            raise StateChanged(job.job_id)
        return finished


def _node_of(attempt: Attempt, rank: int | None) -> str | None:
    """The node rank ``rank`` of the attempt ran on (None: no rank, or unknown)."""
    return None if rank is None else attempt.rank_nodes().get(rank)
