"""The tenant's event feed (domain/feed.py): numbering the events the jobs'
stories tell, reading them by cursor (with a long poll), and pushing each
numbered event to the bus and the webhooks, at least once."""
from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Callable, Sequence

from ..domain import cursor, feed
from ..domain.clock import Clock, iso, utcnow
from ..domain.errors import InvalidArgument, InvalidPageToken
from .ports import AlreadyFed, Contended, EventSink, FeedLog

log = logging.getLogger(__name__)

#: jobs read per numbering round (each job's unfed events: a handful)
_JOBS_PER_ROUND = 10
_ROUNDS = 20
_TENANTS_PER_SWEEP = 200
#: how often a long poll looks again (each look: an index Query and two reads)
_POLL_S = 1.0

Push = Callable[[str, Sequence[dict]], None]


class FeedService:
    def __init__(self, feeds: FeedLog, *, page_token_key: bytes, tenant_tag: Callable[[str], int],
                 sinks: Sequence[EventSink] = (), webhooks: Push | None = None,
                 clock: Clock = utcnow, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._log = feeds
        self._key = page_token_key
        self._tag = tenant_tag
        self._sinks = list(sinks)
        self._webhooks = webhooks
        self._clock, self._sleep, self._monotonic = clock, sleep, monotonic

    # -- numbering ---------------------------------------------------------
    def number(self, tenant: str) -> int:
        """Number the tenant's unfed story events (as the index shows them
        now); how many feed events that gave."""
        given = 0
        for _ in range(_ROUNDS):
            jobs = self._log.unfed_jobs(tenant, _JOBS_PER_ROUND)
            this_round = self._number_jobs(tenant, jobs) if jobs else 0
            if not this_round:  # none left, or the index lags behind what was fed
                return given
            given += this_round
        return given

    def _number_jobs(self, tenant: str, jobs: list[str]) -> int:
        """Number the unfed story events of ``jobs`` (up to a batch)."""
        told: dict[tuple[str, str], list[dict]] = {}  # (job, key) -> its feed events
        for job_id in jobs:
            story = self._log.unfed(job_id)
            if not story:
                self._log.mark_fed(job_id, ())  # nothing left: out of the index
            gone = [key for key, stored in story.items() if stored is None]
            if gone:  # (marked, but its story does not hold it: nothing to tell)
                self._log.mark_fed(job_id, gone)
            for key, stored in story.items():
                if stored is not None and len(told) < feed.BATCH:
                    told[(job_id, key)] = feed.tell(job_id, key, stored)
        for _ in range(5):
            if not told:
                return 0
            head = self._log.head(tenant)
            events, ms = feed.numbered(feed.in_order([e for t in told.values() for e in t]),
                                       tenant_tag=self._tag(tenant), head_seq=head.seq,
                                       head_ms=head.ms, now=self._clock())
            try:
                self._log.append(tenant, head, ms, events, list(told))
            except Contended:
                continue  # another numbered meanwhile: number after it
            except AlreadyFed as e:  # by another, or before a crash: not again
                for job_id, key in e.fed:
                    told.pop((job_id, key), None)
                    self._log.mark_fed(job_id, [key])
                continue
            by_job: dict[str, list[str]] = {}
            for job_id, key in told:
                by_job.setdefault(job_id, []).append(key)
            for job_id, keys in by_job.items():
                self._log.mark_fed(job_id, keys)
            return len(events)
        return 0  # others keep numbering this tenant: what was asked is being done

    def record(self, tenant: str, type_: str, data: dict, at: datetime,
               job_id: str | None = None) -> None:
        """Number an event no job's story tells (an endpoint disabled), at once."""
        told = {"type": type_, "time": iso(at), "job_id": job_id, "data": data}
        while True:
            head = self._log.head(tenant)
            events, ms = feed.numbered([told], tenant_tag=self._tag(tenant), head_seq=head.seq,
                                       head_ms=head.ms, now=self._clock())
            try:
                self._log.append(tenant, head, ms, events, [])
                return
            except Contended:
                continue  # numbered after the one that got there first

    def webhook_disabled(self, webhook: Any, at: datetime) -> None:
        """WebhooksService.on_disabled: the tenant is told, on the feed (so on
        the bus, and to its other webhooks), that an endpoint was disabled."""
        self.record(webhook.tenant, "webhook.disabled", {
            "webhook_id": webhook.webhook_id, "url": webhook.url,
            "text": f"webhook {webhook.webhook_id} ({webhook.url}) was disabled: its "
                    "deliveries failed for days"}, at)

    # -- reading -----------------------------------------------------------
    def read(self, tenant: str, *, after: str | None, type_: str | None,
             job_id: str | None, page_size: int, wait_s: float) -> dict:
        """A page of the tenant's feed after the cursor ``after`` (None: the
        oldest kept), oldest first, with the cursor that follows it."""
        if type_ is not None and type_ not in feed.TYPES:
            raise InvalidArgument(f"type must be one of {', '.join(feed.TYPES)}", field="type")
        if not 1 <= page_size <= feed.PAGE_MAX:
            raise InvalidArgument(f"page_size must be 1 to {feed.PAGE_MAX}", field="page_size")
        if not 0 <= wait_s <= feed.WAIT_MAX_S:
            raise InvalidArgument(f"wait_s must be 0 to {feed.WAIT_MAX_S}", field="wait_s")
        bound = feed.filter_key(type_, job_id)
        last = 0
        if after is not None:
            try:
                last = int(cursor.decode(after, tenant=tenant, filter_key=bound, secret=self._key))
            except (InvalidPageToken, ValueError):
                raise InvalidPageToken("after is malformed, was tampered with, or belongs "
                                       "to another tenant or filter", field="after") from None
        deadline = self._monotonic() + wait_s
        while True:
            self.number(tenant)
            events, last = self._page(tenant, last, type_, job_id, page_size)
            if events or self._monotonic() >= deadline:
                break
            self._sleep(min(_POLL_S, max(0.0, deadline - self._monotonic())))
        return {"events": events,
                "next_cursor": cursor.encode(str(last), tenant=tenant, filter_key=bound,
                                             secret=self._key)}

    def _page(self, tenant: str, last: int, type_: str | None, job_id: str | None,
              page_size: int) -> tuple[list[dict], int]:
        """Up to ``page_size`` events after number ``last`` that pass the
        filter, and the number read up to (past those filtered out)."""
        head = self._log.head(tenant)  # first: every number up to it is written
        now = self._clock()
        out: list[dict] = []
        while last < head.seq and len(out) < page_size:
            rows = self._log.events(tenant, last, head.seq, max(page_size, 100))
            if not rows:
                break
            for seq, e in rows:
                if feed.matches(e, type_=type_, job_id=job_id) and feed.kept(e["time"], now):
                    out.append(e)
                last = seq
                if len(out) == page_size:
                    break
        return out, last

    # -- pushing -----------------------------------------------------------
    def push(self, tenant: str) -> int:
        """Put the tenant's numbered events not pushed yet on every sink and
        hand them to its webhooks; then record them pushed. A failure leaves
        them due: pushed again by the next sweep (at least once)."""
        head = self._log.head(tenant)
        done = head.pushed
        while done < head.seq:
            rows = self._log.events(tenant, done, head.seq, 100)
            if not rows:
                break
            events = [e for _, e in rows]
            for sink in self._sinks:
                sink.put(events)
            if self._webhooks is not None:
                self._webhooks(tenant, events)
            done = rows[-1][0]
        self._log.pushed(tenant, head, done)  # (also clears a due mark left stale)
        return done - head.pushed

    def sweep(self) -> dict:
        """The feed timer: number every tenant's unfed events, then push
        every feed with events due. A tenant whose push fails (the bus
        refused) stays due for the next sweep and delays no other tenant."""
        numbered = pushed = failed = 0
        for tenant in self._log.unfed_tenants(_TENANTS_PER_SWEEP):
            numbered += self.number(tenant)
        for tenant in self._log.push_due(_TENANTS_PER_SWEEP):
            try:
                pushed += self.push(tenant)
            except Exception:  # noqa: BLE001 - still due: the next sweep pushes it again
                log.exception("pushing the feed of %s failed; it stays due", tenant)
                failed += 1
        return {"numbered": numbered, "pushed": pushed, "failed": failed}


__all__ = ["FeedService"]
