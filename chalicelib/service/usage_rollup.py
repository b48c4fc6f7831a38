"""Usage by tenant, label, GPU type or job: ``GET /v1/usage`` (API.md,
"Usage and goodput"), and the rollup it reads (domain/rollup.py).

Written as attempts end: when an attempt ends (domain/happened.py
``AttemptEnded``), ``roll`` adds what it adds to the usage table, once
(adapters/usage_store.py). Read: the rolled-up cells of the periods asked
(a month reads at most 31 partitions per tenant, however many jobs ran),
plus, worked out on read, what the tenant's attempts still running add up
to now (one read per SCHEDULED or RUNNING job: bounded by the GPUs held,
not by the jobs run). Rows are exact: they sum to the jobs' ``usage`` to the
GPU-second.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping, Protocol, Sequence

from ..domain import rollup, usage
from ..domain.clock import Clock, iso, utcnow
from ..domain.errors import Forbidden, InvalidArgument
from ..domain.principal import Principal
from ..domain.states import JobState
from .ports import UsageRollup
from .views import JobView

#: the longest range one read may ask (API.md: over it is a 400 naming ``end``)
MAX_RANGE_DAYS = 400
GRANULARITY_MS = {"hour": rollup.HOUR_MS, "day": rollup.DAY_MS}
#: the states in which a job holds an attempt not rolled up yet
OPEN = (JobState.SCHEDULED, JobState.RUNNING)
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
#: how many open jobs one listing page reads
_PAGE = 500
#: an attempt still due this long after its end lost its follow-up: the sweep rolls it
SWEEP_AFTER_S = 60
log = logging.getLogger(__name__)


class UsageJobReads(Protocol):
    def view_with_story(self, job_id: str) -> tuple[JobView, list[dict]] | None: ...

    def page(self, tenant: str, state: str | None, page_size: int,
             after: str | None) -> tuple[list[JobView], str | None]: ...

    def active(self, state: JobState, limit: int) -> list: ...


def parse_time(raw: str | None, name: str) -> datetime:
    """An RFC 3339 time (``Z`` or an offset), else 400 naming ``name``."""
    if raw is None or not _TIME.match(raw):
        raise InvalidArgument(f"{name} must be an RFC 3339 time such as 2026-12-01T00:00:00Z",
                              field=name)
    text = re.sub(r"\.(\d{6})\d+", r".\1", raw.replace("Z", "+00:00"))
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except (ValueError, OverflowError):
        raise InvalidArgument(f"{name} is not a valid time: {raw}", field=name) from None


def parse_group_by(raw: str | None) -> str | None:
    """``gpu_type``, ``job`` or ``label:<key>`` (key 1 to 128 characters),
    or None (one group: all); else 400 naming ``group_by``."""
    if raw is None or raw == "":
        return None
    if raw in ("gpu_type", "job"):
        return raw
    if raw.startswith("label:") and 1 <= len(raw) - len("label:") <= 128:
        return raw
    raise InvalidArgument("group_by must be gpu_type, job or label:<key>", field="group_by")


@dataclass(frozen=True)
class Query:
    start: datetime
    end: datetime
    granularity: str
    group_by: str | None
    tenant: str | None  # None: every tenant (an operator's)


def _ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


class UsageService:
    def __init__(self, rollups: UsageRollup, store: UsageJobReads, *,
                 prices: Iterable[tuple[str, float]] = (), clock: Clock = utcnow) -> None:
        self.rollups, self.store, self._clock = rollups, store, clock
        self.prices = dict(prices)

    # -- the rollup's writes ----------------------------------------------------
    def roll(self, job_id: str, attempt: int | None = None) -> int:
        """Add what the job's ended attempts add (``attempt``: that one
        only), each once, and mark them no longer due: how many were added
        now (0: added before)."""
        found = self.store.view_with_story(job_id)
        added = 0
        rolled: set[int] = set()
        if found is not None:
            view, story = found
            spans, groups_ = _job(view, story)
            for n in rollup.ended_attempts(spans):
                if attempt is not None and n != attempt:
                    continue
                increments = rollup.increments(rollup.added(spans, n), groups_)
                added += bool(self.rollups.add(view["tenant"], job_id, n, increments))
                rolled.add(n)
        if attempt is not None and attempt not in rolled:
            # never: its end and its story are one write; not due forever
            log.warning("attempt %s of %s is due but its story shows no end", attempt, job_id)
        for n in rolled | ({attempt} if attempt is not None else set()):
            self.rollups.done(job_id, n)
        return added

    def sweep(self, limit: int = 200) -> int:
        """Roll up the attempts that ended over ``SWEEP_AFTER_S`` ago and are
        still due (their follow-up on the bus failed or was lost): run by
        the reconcile timer. How many were added."""
        before = self._clock() - timedelta(seconds=SWEEP_AFTER_S)
        return sum(self.roll(job_id, n) for job_id, n in self.rollups.due(before, limit))

    # -- GET /v1/usage ----------------------------------------------------------
    def query(self, principal: Principal, params: Mapping[str, str]) -> Query:
        """The request's query, checked: 400 naming the field, 403 for a
        tenant asking for another tenant (or an agent asking at all)."""
        start = parse_time(params.get("start"), "start")
        end = parse_time(params["end"], "end") if "end" in params else self._clock()
        if end <= start:
            raise InvalidArgument("end must be after start", field="end")
        if end - start > timedelta(days=MAX_RANGE_DAYS):
            raise InvalidArgument(f"the range from start to end must be at most "
                                  f"{MAX_RANGE_DAYS} days", field="end")
        granularity = params.get("granularity") or "day"
        if granularity not in GRANULARITY_MS:
            raise InvalidArgument("granularity must be hour or day", field="granularity")
        group_by = parse_group_by(params.get("group_by"))
        asked = params.get("tenant")
        if principal.is_operator:
            tenant = asked or None
        elif principal.is_tenant:
            if asked not in (None, principal.name):
                raise Forbidden("a tenant reads only its own usage", field="tenant")
            tenant = principal.name
        else:
            raise Forbidden("this endpoint takes a tenant or an operator token",
                            field="Authorization")
        return Query(start, end, granularity, group_by, tenant)

    def read(self, q: Query) -> dict:
        """``{"rows": [...]}``: by period, tenant, then group."""
        step = GRANULARITY_MS[q.granularity]
        lo = _ms(q.start) - _ms(q.start) % step
        hi = _ms(q.end)
        now = self._clock()
        tenants = [q.tenant] if q.tenant is not None else None
        opened = self._open_jobs(q.tenant)
        if tenants is None:
            tenants = sorted(set(self.rollups.tenants(lo, hi)) | {v["tenant"] for v, _ in opened})
        dim = q.group_by or "gpu_type"
        rows: list[dict] = []
        for tenant in tenants:
            cells = self._cells(tenant, q.granularity, dim, lo, hi,
                                [o for o in opened if o[0]["tenant"] == tenant], now)
            totals = None
            if q.group_by is not None and q.group_by.startswith("label:"):
                totals = self._cells(tenant, q.granularity, "gpu_type", lo, hi,
                                     [o for o in opened if o[0]["tenant"] == tenant], now)
            rows.extend(self._rows(tenant, q, dim, step, cells, totals))
        rows.sort(key=_row_order)
        return {"rows": rows}

    def _open_jobs(self, tenant: str | None) -> list[tuple[JobView, list[dict]]]:
        ids: list[str] = []
        for state in OPEN:
            if tenant is None:
                ids.extend(j.job_id for j in self.store.active(state, 100_000))
                continue
            after = None
            while True:
                page, after = self.store.page(tenant, state.value, _PAGE, after)
                ids.extend(v["job_id"] for v in page)
                if after is None:
                    break
        out = []
        for job_id in dict.fromkeys(ids):
            found = self.store.view_with_story(job_id)
            if found is not None:
                out.append(found)
        return out

    def _cells(self, tenant: str, granularity: str, dim: str, lo: int, hi: int,
               opened: Sequence[tuple[JobView, list[dict]]],
               now: datetime) -> dict[tuple[int, str], dict[str, int]]:
        out: dict[tuple[int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for c in self.rollups.cells(tenant, granularity, dim, lo, hi):
            row = out[(c.at_ms, c.value)]
            for k, v in c.counts.items():
                row[k] += v
            row["jobs"] += c.jobs
        for view, story in opened:  # what running attempts add, up to now
            spans, groups_ = _job(view, story)
            for (gran, at, d, value), counts in rollup.increments(
                    rollup.running(spans, now), groups_).items():
                if gran == granularity and d == dim and lo <= at < hi:
                    row = out[(at, value)]
                    for k, v in counts.items():
                        row[k] += v
        return out

    def _rows(self, tenant: str, q: Query, dim: str, step: int,
              cells: Mapping[tuple[int, str], Mapping[str, int]],
              totals: Mapping[tuple[int, str], Mapping[str, int]] | None) -> list[dict]:
        grouped: dict[tuple[int, str | None], dict[str, dict[str, int]]] = \
            defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
        for (at, stored), counts in cells.items():
            gpu, shown = rollup.unpack(dim, stored)
            key = (at, None if q.group_by is None else shown)
            for k, v in counts.items():
                grouped[key][gpu][k] += v
        if totals is not None:  # the jobs without the label: the rest of the total
            labelled = list(grouped.items())
            for (t_at, t_gpu), t_counts in totals.items():
                rest = grouped[(t_at, None)][t_gpu]
                for k, v in t_counts.items():
                    rest[k] += v
                for (l_at, _value), l_by_gpu in labelled:
                    if l_at == t_at and t_gpu in l_by_gpu:
                        for k, v in l_by_gpu[t_gpu].items():
                            rest[k] -= v
        out = []
        for (at, value), by_gpu in sorted(grouped.items(),
                                          key=lambda kv: (kv[0][0], kv[0][1] is None,
                                                          kv[0][1] or "")):
            row = self._row(tenant, q, at, step, value, by_gpu)
            if row is not None:
                out.append(row)
        return out

    def _row(self, tenant: str, q: Query, at: int, step: int, value: str | None,
             by_gpu: Mapping[str, Mapping[str, int]]) -> dict | None:
        parts: dict[str, int] = defaultdict(int)
        jobs = 0
        cost = 0.0
        priced = bool(self.prices)
        for gpu, counts in by_gpu.items():
            held = sum(v for k, v in counts.items() if k != "jobs")
            for k, v in counts.items():
                if k != "jobs":
                    parts[k] += v
            jobs += counts.get("jobs", 0)
            if priced:
                if gpu in self.prices:
                    cost += held / 3600 * self.prices[gpu]
                elif held:
                    priced = False  # a GPU type the price book does not name
        held = sum(parts.values())
        if held == 0 and jobs == 0:
            return None
        productive = parts.pop("productive", 0)
        lost = {k: v for k, v in sorted(parts.items()) if v}
        group: dict[str, str | None] = {} if q.group_by is None else {q.group_by: value}
        row: dict = {"start": iso(_at(at)), "end": iso(_at(at + step)), "tenant": tenant,
                     "group": group, "gpu_hours": _hours(held),
                     "productive_gpu_hours": _hours(productive),
                     "lost_gpu_hours": {k: _hours(v) for k, v in lost.items()},
                     "jobs": jobs, "gpu_seconds": held, "productive_gpu_seconds": productive,
                     "lost_gpu_seconds": lost}
        if self.prices:
            row["cost"] = round(cost, 2) if priced else None
        return row


def _row_order(row: dict) -> tuple:
    """By period, tenant, then group (a label's null last)."""
    value = next(iter(row["group"].values()), None)
    return row["start"], row["tenant"], value is None, value or ""


def _hours(seconds: int) -> float:
    return round(seconds / 3600, 6)


def _job(view: JobView, story: list[dict]) -> tuple[list[usage.Span], list[tuple[str, str]]]:
    """The job's spans (as ``look`` reads them: service/jobs.py) and its groups."""
    spec = view["spec"].value()
    gpus = int(spec["ranks"]) * int(spec.get("gpus_per_rank") or 1) if view["attempt"] else 0
    return usage.spans_of(story, gpus), rollup.groups(
        view["job_id"], spec.get("gpu_type"), spec.get("labels") or {})
