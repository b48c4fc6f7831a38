"""The FeedLog port on DynamoDB (domain/feed.py): the tenants' feeds in the
events table, fed from the unfed story events of the jobs table.

A feed's partition is ``t#<tenant>``: its head at ``sk`` 0, its events at
their numbers. Numbering is one transaction: a marker per story event fed
(put if absent), the events, and the head (conditioned on the number read).
"""
from __future__ import annotations

import zlib
from typing import Collection, Sequence

from pynamodb.exceptions import TransactWriteError

from ..domain import feed
from ..service.ports import AlreadyFed, Contended, FeedHead
from .dynamo import Changes, ConditionFailed, Table
from .dynamo_errors import tx_lost
from .jobs_table import JOBS, OnDynamo, events_from_item
from .models import FeedModel, JobModel

FEEDS = Table(FeedModel)
_UNFED_INDEX = JobModel.by_unfed.Meta.index_name
_PUSH_INDEX = FeedModel.by_push_due.Meta.index_name
_HEAD = 0


def partition(tenant: str) -> str:
    return f"t#{tenant}"


def tenant_tag(tenant: str) -> int:
    """The tenant's part of its events' ids (domain/feed.event_id)."""
    return zlib.crc32(tenant.encode()) & 0xFFFFF


def _marker(job_id: str, key: str) -> str:
    return f"fed#{job_id}#{key}"


class DynamoFeeds(OnDynamo):
    def unfed_jobs(self, tenant: str, limit: int) -> list[str]:
        request = JOBS.query(_UNFED_INDEX, "#unfed = :t", {":t": {"S": tenant}}, limit=limit)
        items = self._dynamo.query(request).get("Items", [])
        return [i["job_id"]["S"] for i in items]

    def unfed_tenants(self, limit: int) -> list[str]:
        tenants: list[str] = []
        request = {"TableName": JOBS.name, "IndexName": _UNFED_INDEX, "Limit": 100,
                   "ProjectionExpression": "#unfed", "ExpressionAttributeNames":
                   JOBS.names("#unfed")}
        for page in self._dynamo.pages(request, "Scan"):
            for item in page:
                t = item.get("unfed", {}).get("S")
                if t and t not in tenants:
                    tenants.append(t)
            if len(tenants) >= limit:
                break
        return tenants[:limit]

    def unfed(self, job_id: str) -> dict[str, dict | None]:
        item = self._dynamo.get(JOBS.get(JOBS.key(job_id), attributes=("events", "unfed_keys")))
        if not item:
            return {}
        keys = JOBS.values({"unfed_keys": item["unfed_keys"]})["unfed_keys"] \
            if "unfed_keys" in item else set()
        events = events_from_item(item)
        return {k: events.get(k) for k in sorted(keys)}

    def head(self, tenant: str) -> FeedHead:
        item = self._dynamo.get(FEEDS.get(FEEDS.key(partition(tenant), _HEAD)))
        if not item:
            return FeedHead()
        v = FEEDS.values(item)
        return FeedHead(int(v["head_seq"] or 0), int(v["head_ms"] or 0),
                        int(v["pushed_seq"] or 0))

    def append(self, tenant: str, read: FeedHead, ms: int,
               events: Sequence[tuple[int, dict]], fed: Sequence[tuple[str, str]]) -> None:
        if not events and not fed:
            return
        pk = partition(tenant)
        expires = max((feed.expires_epoch(e["time"]) for _, e in events), default=None)
        top = events[-1][0] if events else read.seq
        head = Changes(FEEDS).set("head_seq", top).set("head_ms", ms) \
            .set("push_due", tenant if top > read.pushed else None)
        if read.seq == 0:
            condition, values = "attribute_not_exists(#head_seq) OR #head_seq = :read", \
                {":read": {"N": "0"}}
        else:
            condition, values = "#head_seq = :read", {":read": {"N": str(read.seq)}}
        try:
            with self._dynamo.transaction() as tx:
                for job_id, key in fed:
                    tx.put(FEEDS.put_new(FEEDS.item(dict(
                        pk=_marker(job_id, key), sk=_HEAD, expires_epoch=expires))))
                for seq, e in events:
                    tx.put(FEEDS.put_new(FEEDS.item(dict(
                        pk=pk, sk=seq, event=e, type=e["type"], job_id=e["job_id"],
                        expires_epoch=feed.expires_epoch(e["time"])))))
                tx.update(head.update(FEEDS.key(pk, _HEAD), condition=condition,
                                      values=values))
        except TransactWriteError as e:
            if not tx_lost(e):
                raise
            reasons = list(e.cancellation_reasons or [])
            gone = [fed[i] for i, r in enumerate(reasons[:len(fed)])
                    if r is not None and r.code == "ConditionalCheckFailed"]
            if gone:
                raise AlreadyFed(gone) from None
            raise Contended(tenant) from None

    def mark_fed(self, job_id: str, keys: Collection[str]) -> None:
        """One write of the job's item (some 4 KB: each write of it costs):
        when ``keys`` are all its unfed keys, as they are unless its story
        went on since they were read, the job leaves the index with them;
        otherwise only they go, and the job stays for the rest."""
        keys = sorted(set(keys))
        values = {f":k{i}": {"S": k} for i, k in enumerate(keys)}
        # (attribute_exists first: moto's size() of a missing attribute is a 500)
        exact = " AND ".join(["attribute_exists(#unfed_keys)", "size(#unfed_keys) = :n"] + [
            f"contains(#unfed_keys, :k{i})" for i in range(len(keys))])
        try:
            self._dynamo.update(Changes(JOBS).remove("unfed", "unfed_keys").update(
                JOBS.key(job_id), condition=exact if keys else
                "attribute_exists(#job_id) AND attribute_not_exists(#unfed_keys)",
                values={**values, ":n": {"N": str(len(keys))}} if keys else None))
            return
        except ConditionFailed:
            if not keys:
                return  # told more meanwhile: it stays for them
        self._dynamo.update(Changes(JOBS).delete("unfed_keys", set(keys)).update(
            JOBS.key(job_id), condition="attribute_exists(#job_id)"))

    def events(self, tenant: str, after: int, upto: int, limit: int) -> list[tuple[int, dict]]:
        if upto <= after:
            return []
        request = FEEDS.query(None, "#pk = :pk AND #sk BETWEEN :lo AND :hi",
                              {":pk": {"S": partition(tenant)}, ":lo": {"N": str(after + 1)},
                               ":hi": {"N": str(upto)}},
                              limit=limit, consistent=True, attributes=("sk", "event"))
        items = self._dynamo.query(request).get("Items", [])
        return [(int(i["sk"]["N"]), FEEDS.values(i)["event"]) for i in items]

    def pushed(self, tenant: str, read: FeedHead, upto: int) -> None:
        changes = Changes(FEEDS).set("pushed_seq", upto)
        condition = "#head_seq >= :upto AND (attribute_not_exists(#pushed_seq) " \
                    "OR #pushed_seq <= :upto)"
        if upto >= read.seq:
            changes.remove("push_due")
            condition += " AND #head_seq = :upto"
        try:
            self._dynamo.update(changes.update(FEEDS.key(partition(tenant), _HEAD),
                                               condition=condition,
                                               values={":upto": {"N": str(upto)}}))
        except ConditionFailed:
            pass  # numbered further meanwhile (still due), or pushed by another

    def push_due(self, limit: int) -> list[str]:
        request = {"TableName": FEEDS.name, "IndexName": _PUSH_INDEX, "Limit": limit,
                   "ProjectionExpression": "#push_due",
                   "ExpressionAttributeNames": FEEDS.names("#push_due")}
        items = self._dynamo.call("Scan", request).get("Items", [])
        return [i["push_due"]["S"] for i in items]
