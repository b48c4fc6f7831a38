"""The UsageRollup port on DynamoDB (domain/rollup.py): usage rolled up by
hour and day in the usage table (models.UsageModel).

An attempt's increments are written in chunks of at most ``CHUNK`` cells,
each chunk ONE transaction: a marker ``rolled#<job>`` / ``<attempt>#<chunk>``
put if absent, and the chunk's ADDs. A retried chunk (after a lost answer, a
crash between chunks, or a second roll of the same attempt) loses its
marker's condition and adds nothing: no attempt ever counts twice. The chunks
are a pure function of the job's story, so a retry cuts them the same way.
"""
from __future__ import annotations

import zlib
from datetime import datetime, timezone
from typing import Iterable, Mapping

from pynamodb.exceptions import TransactWriteError

from ..domain.clock import iso
from ..domain.rollup import DAY_MS, Key, escape
from ..service.ports import UsageCell
from .dynamo import Table
from .jobs_table import OnDynamo
from .models import UsageModel

USAGE = Table(UsageModel)
#: items per transaction (DynamoDB's limit): the marker, the days' tenant
#: entries and the cells
TX_ITEMS = 100
_GRAN = {"hour": "h", "day": "d"}


#: partitions of the due items (an attempt's end each: spread, never hot)
DUE_SHARDS = 16


def _due_key(job_id: str, attempt: int) -> dict:
    return USAGE.key(f"due#{zlib.crc32(job_id.encode()) % DUE_SHARDS}", f"{job_id}#{attempt}")


def due_put(job_id: str, attempt: int, now: datetime) -> dict:
    """The Put, for the transaction that ends the attempt, saying that its
    usage is still to roll up (``DynamoUsage.done`` deletes it)."""
    return USAGE.put(USAGE.item(dict(**_key_values(_due_key(job_id, attempt)),
                                     due_at=iso(now))))


def _key_values(key: dict) -> dict:
    return {"pk": key["pk"]["S"], "sk": key["sk"]["S"]}


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms // 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def _partition(tenant: str, day_ms: int) -> str:
    return f"u#{tenant}#{day_of(day_ms)}"


def _sort_key(granularity: str, at_ms: int, dim: str, value: str) -> str:
    if granularity == "day":
        return f"d#{escape(dim)}#{value}"
    return f"h#{escape(dim)}#{(at_ms % DAY_MS) // 3_600_000:02d}#{value}"


def _days(start_ms: int, end_ms: int) -> Iterable[int]:
    d = start_ms - start_ms % DAY_MS
    while d < end_ms:
        yield d
        d += DAY_MS


def _days_of(cells: Iterable[tuple[Key, object]]) -> list[int]:
    return sorted({at - at % DAY_MS for (_, at, _, _), _ in cells})


def chunks(increments: Mapping[Key, Mapping[str, int]]) -> list[list[tuple[Key, Mapping[str, int]]]]:
    """The attempt's cells in transactions (in key order, each within
    TX_ITEMS with its marker and its days' tenant entries): always the same
    cut for the same increments."""
    out: list[list[tuple[Key, Mapping[str, int]]]] = [[]]
    for cell in sorted(increments.items()):
        if 1 + len(_days_of(out[-1] + [cell])) + len(out[-1]) + 1 > TX_ITEMS:
            out.append([])
        out[-1].append(cell)
    return out


class DynamoUsage(OnDynamo):
    def add(self, tenant: str, job_id: str, attempt: int,
            increments: Mapping[Key, Mapping[str, int]]) -> bool:
        wrote = False
        for n, chunk in enumerate(chunks(increments)):
            days = _days_of(chunk)
            try:
                with self._dynamo.transaction() as tx:
                    tx.put(USAGE.put_new(USAGE.item(
                        dict(pk=f"rolled#{job_id}", sk=f"{attempt}#{n}"))))
                    for d in days:  # the tenants with usage that day
                        tx.put(USAGE.put(USAGE.item(dict(pk=f"tenants#{day_of(d)}",
                                                         sk=tenant))))
                    for key, counts in chunk:
                        tx.update(self._cell(tenant, key, counts))
            except TransactWriteError as e:
                reasons = e.cancellation_reasons or []
                if reasons and reasons[0] is not None and reasons[0].code == "ConditionalCheckFailed":
                    continue  # this chunk was added before
                raise
            wrote = True
        return wrote

    @staticmethod
    def _cell(tenant: str, key: Key, counts: Mapping[str, int]) -> dict:
        granularity, at, dim, value = key
        clauses, names, values = [], {}, {}
        for i, (part, n) in enumerate(sorted(counts.items())):
            names[f"#c{i}"] = "jobs" if part == "jobs" else f"s_{part}"
            values[f":c{i}"] = {"N": str(n)}
            clauses.append(f"#c{i} :c{i}")
        return USAGE.update(USAGE.key(_partition(tenant, at), _sort_key(granularity, at, dim, value)),
                            "ADD " + ", ".join(clauses), values=values, keys=names)

    def cells(self, tenant: str, granularity: str, dim: str,
              start_ms: int, end_ms: int) -> list[UsageCell]:
        out: list[UsageCell] = []
        prefix = f"{_GRAN[granularity]}#{escape(dim)}#"
        for day in _days(start_ms, end_ms):
            request = USAGE.query(None, "#pk = :pk AND begins_with(#sk, :prefix)",
                                  {":pk": {"S": _partition(tenant, day)},
                                   ":prefix": {"S": prefix}})
            for page in self._dynamo.pages(request):
                for item in page:
                    rest = item["sk"]["S"][len(prefix):]
                    at = day
                    if granularity == "hour":
                        hh, _, rest = rest.partition("#")
                        at = day + int(hh) * 3_600_000
                    if not start_ms <= at < end_ms:
                        continue
                    counts = {k[2:]: int(v["N"]) for k, v in item.items()
                              if k.startswith("s_") and "N" in v}
                    out.append(UsageCell(at, rest, counts, int(item.get("jobs", {}).get("N", 0))))
        return sorted(out, key=lambda c: (c.at_ms, c.value))

    def tenants(self, start_ms: int, end_ms: int) -> list[str]:
        found: set[str] = set()
        for day in _days(start_ms, end_ms):
            request = USAGE.query(None, "#pk = :pk", {":pk": {"S": f"tenants#{day_of(day)}"}})
            for page in self._dynamo.pages(request):
                found.update(item["sk"]["S"] for item in page)
        return sorted(found)

    def done(self, job_id: str, attempt: int) -> None:
        self._dynamo.call("DeleteItem", {"TableName": USAGE.name,
                                         "Key": _due_key(job_id, attempt)})

    def due(self, before: datetime, limit: int) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for shard in range(DUE_SHARDS):
            request = USAGE.query(None, "#pk = :pk", {":pk": {"S": f"due#{shard}"},
                                                      ":before": {"S": iso(before)}},
                                  filter="#due_at < :before")
            for page in self._dynamo.pages(request):
                for item in page:
                    job_id, _, n = item["sk"]["S"].rpartition("#")
                    out.append((job_id, int(n)))
                if len(out) >= limit:
                    return out[:limit]
        return out
