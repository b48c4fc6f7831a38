"""The Pipelines port on DynamoDB: who waits on whom, and an array's children.

A job's dependents are a string set on its own item (ADD, bounded by
dependencies.MAX_DEPENDENTS), so its end reads them with the item it
already reads. A waiting job sits in the ``WAITING`` partition of the
active-state index, out of the placement queue; each change of what it waits
for is conditioned on what was read (optimistic: a racer reads again).

An array sits in the ``ARRAY`` partition while it is open. Its children are
put in transactions with the parent's ``array_materialized`` counter,
conditioned on the count read, so a child is made once; each child's
transitions move the parent's other counters in their own transactions
(job_store, transitions).
"""
from __future__ import annotations

import dataclasses
from datetime import datetime
from itertools import islice
from typing import Sequence

from pynamodb.exceptions import TransactWriteError

from ..domain import events as ev
from ..domain.arrays import Counts
from ..domain.clock import iso
from ..domain.jobs import Job
from ..domain.states import ARRAY_ENDS, Event, JobState, next_state
from ..service.views import JobView
from .dynamo import Changes
from .dynamo_errors import tx_lost
from .jobs_table import (
    ARRAY,
    JOBS,
    WAITING,
    OnDynamo,
    active_partition,
    count_pending,
    expire_key,
    in_index,
    job_from_item,
    leaving,
    moved,
    new_job_item,
    tenant_state,
    view_from_item,
)
from .models import JobModel

_BY_PARENT = JobModel.by_parent.Meta.index_name
#: Query pages read at most for one filtered page of children
_CHILD_READS = 10


def _still_waiting_for(job: Job) -> tuple[str, dict]:
    """The condition that the job is PENDING and waits for exactly what was
    read (the stored JSON text of ``waiting_for``): any racer's change fails it."""
    return ("#state = :pending AND #waiting_for = :read",
            {":pending": {"S": JobState.PENDING.value},
             ":read": JOBS.value("waiting_for", job.waiting_for)})


def children_request(parent_id: str, state: str | None, page_size: int,
                     after: str | None) -> dict:
    """The Query of ``children``: the parent's partition in index order."""
    values = {":parent": {"S": parent_id}}
    filter_ = None
    if state:
        filter_, values[":state"] = "#state = :state", {"S": state}
    start = {**JOBS.key(after), "parent_id": {"S": parent_id}} if after else None
    return JOBS.query(_BY_PARENT, "#parent_id = :parent", values, limit=page_size + 1,
                      start=start, filter=filter_)


class DynamoPipelines(OnDynamo):
    # -- dependencies ----------------------------------------------------------
    def add_dependent(self, job_id: str, dependent_id: str) -> None:
        """Record on ``job_id``'s item that ``dependent_id`` waits on it."""
        self._dynamo.update(Changes(JOBS).add("dependents", {dependent_id}).update(
            JOBS.key(job_id), condition="attribute_exists(#job_id)"))

    def states(self, job_ids: Sequence[str], *,
               count_dependents: bool = False) -> dict[str, tuple[str, JobState, int]]:
        """Each existing job's (tenant, state, how many dependents it has:
        0 unless counted), strongly consistent."""
        out: dict[str, tuple[str, JobState, int]] = {}
        ids = list(dict.fromkeys(job_ids))
        names = ("job_id", "tenant", "state") + (("dependents",) if count_dependents else ())
        for at in range(0, len(ids), 100):
            items = self._dynamo.get_all(JOBS, [JOBS.key(i) for i in ids[at:at + 100]],
                                         consistent=True, attributes=names)
            for item in items:
                out[item["job_id"]["S"]] = (item["tenant"]["S"], JobState(item["state"]["S"]),
                                            len(item.get("dependents", {}).get("SS", ())))
        return out

    def waiting(self, limit: int) -> list[Job]:
        return list(self._partition(WAITING, limit, 100))

    def wait_for(self, job: Job, waiting_for: Sequence[str], reason: str | None,
                 now: datetime) -> bool:
        """What the job still waits for; nothing left puts it where it goes
        next (the placement queue; an array's own partition). False: the
        job changed since it was read."""
        changes = Changes(JOBS).set("updated_at", iso(now))
        if waiting_for:
            changes.set("waiting_for", list(waiting_for)).set("pending_reason", reason)
        else:
            released = dataclasses.replace(job, waiting_for=None)
            in_index(changes.remove("waiting_for", "pending_reason"), active_partition(released)) \
                .event("dependencies_met", ev.event(
                    "dependencies_met", now, reason="every dependency was met"))
            if not job.is_array:  # its max_pending_s counts from now
                changes.set("pending_since", iso(now))
        return self._update_if(job.job_id, changes, *_still_waiting_for(job))

    # -- arrays ----------------------------------------------------------------
    def arrays(self, limit: int) -> list[Job]:
        return list(self._partition(ARRAY, limit, 100))

    def make_children(self, parent: Job, children: Sequence[Job], now: datetime) -> bool:
        """Put ``children`` (the next indexes) with the parent's count of made
        children, conditioned on the count read and the array open and not
        being cancelled: one transaction (at most arrays.FEED_BATCH children).
        False: another made them, or the array moved on."""
        made = Counts.of(parent.array_counts or {}).materialized
        changes = Changes(JOBS).add("array_materialized", len(children)) \
            .set("updated_at", iso(now))
        try:
            with self._dynamo.transaction() as tx:
                tx.update(changes.update(
                    JOBS.key(parent.job_id),
                    condition="#array_materialized = :made AND #active_state = :array"
                              " AND attribute_not_exists(#cancel_requested_at)",
                    values={":made": {"N": str(made)}, ":array": {"S": ARRAY}}))
                for child in children:
                    tx.put(JOBS.put_new(new_job_item(child)))
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    def mark_array_running(self, parent_id: str, tenant: str, now: datetime) -> bool:
        """PENDING -> RUNNING: its first index was placed."""
        running = next_state(JobState.PENDING, Event.INDEX_PLACED)
        changes = Changes(JOBS).set("state", running.value) \
            .set("tenant_state", tenant_state(tenant, running)) \
            .set("started_at", iso(now)).set("updated_at", iso(now)) \
            .event("started", ev.event("started", now, reason="its first index was placed",
                                       from_=JobState.PENDING.value))
        condition, values = leaving(Event.INDEX_PLACED)
        return self._update_if(parent_id, changes, condition + " AND #active_state = :array",
                               {**values, ":array": {"S": ARRAY}})

    def request_array_cancel(self, parent: Job, now: datetime, reason: str | None) -> bool:
        """Record the cancel of an open array (its children are cancelled
        by the pipelines service); False: it ended, or was cancelled already."""
        changes = Changes(JOBS).set("cancel_requested_at", iso(now)) \
            .set("cancel_reason", reason).set("updated_at", iso(now)) \
            .event("cancel_requested", ev.event("cancel_requested", now, reason=reason,
                                                by=parent.tenant))
        return self._update_if(
            parent.job_id, changes,
            "#active_state = :array AND attribute_not_exists(#cancel_requested_at)",
            {":array": {"S": ARRAY}})

    def finish_array(self, parent: Job, to: JobState, exit_: dict | None,
                     now: datetime) -> bool:
        """End an open array in ``to``, conditioned on its count of made
        children read (none made since); the indexes never made leave the
        tenant's PENDING count and are counted cancelled."""
        a = parent.spec.array
        assert a is not None
        c = Counts.of(parent.array_counts or {})
        never = a.size - c.materialized
        condition, values = leaving(ARRAY_ENDS[to])
        changes = moved(Changes(JOBS), parent, to) \
            .set("exit", exit_).set("finished_at", iso(now)).set("updated_at", iso(now)) \
            .remove("pending_reason") \
            .event("finished", ev.event("finished", now, state=to.value,
                                        reason=(exit_ or {}).get("reason") or "succeeded",
                                        detail=(exit_ or {}).get("detail"),
                                        from_=parent.state.value))
        if never:
            changes.add("array_cancelled", never)
        try:
            with self._dynamo.transaction() as tx:
                tx.update(changes.update(
                    JOBS.key(parent.job_id),
                    condition=condition + " AND #active_state = :array"
                                          " AND #array_materialized = :made",
                    values={**values, ":array": {"S": ARRAY}, ":made": {"N": str(c.materialized)}}))
                if never:
                    tx.update(count_pending(parent.tenant, -never))
                if parent.idem_id is not None:
                    tx.update(expire_key(parent, now))
        except TransactWriteError as e:
            if tx_lost(e):
                return False
            raise
        return True

    def children(self, parent_id: str, state: str | None, page_size: int,
                 after: str | None) -> tuple[list[JobView], str | None]:
        """Up to ``page_size`` children (in ``state``) after the index of
        ``after``, in index order, and the id to resume after. A state is a
        filter on the parent's partition: one page reads at most
        _CHILD_READS Query pages, and resumes where it stopped."""
        request = children_request(parent_id, state, page_size, after)
        items: list[dict] = []
        last: dict = {}
        for _ in range(_CHILD_READS):
            raw = self._dynamo.query(request)
            items += raw.get("Items", [])
            last = raw.get("LastEvaluatedKey") or {}
            if len(items) > page_size:
                items = items[:page_size]
                return [view_from_item(i) for i in items], items[-1]["job_id"]["S"]
            if not last:
                return [view_from_item(i) for i in items], None
            request = {**request, "ExclusiveStartKey": last}
        return [view_from_item(i) for i in items], last["job_id"]["S"]

    def open_children(self, parent_id: str, limit: int | None = None) -> list[Job]:
        """The children not ended, in index order; the first ``limit`` (no
        page is read past them)."""
        request = JOBS.query(_BY_PARENT, "#parent_id = :parent",
                             {":parent": {"S": parent_id}},
                             filter="attribute_exists(#active_state)")
        items = (i for page in self._dynamo.pages(request) for i in page)
        return [job_from_item(i) for i in islice(items, limit)]
