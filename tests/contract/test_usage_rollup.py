"""The UsageRollup port's contract, held by tests/fakes.FakeUsage and
adapters/usage_store.DynamoUsage alike: an attempt's increments are added
once (a repeat adds nothing and says so), cells read back summed by period
and value, hours and days apart, within the period asked, and a tenant's
cells are its own; the tenants of a day are those with usage on it."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from chalicelib.domain.rollup import DAY_MS, HOUR_MS
from chalicelib.service.ports import UsageCell
from tests.contract.ports import IMPLEMENTATIONS

DAY = 20_430 * DAY_MS  # 2025-12-08


@pytest.fixture(params=IMPLEMENTATIONS)
def both(request):
    """The fake, or the adapter on the session's shared stack; and how an
    attempt's end marks it due (the adapter's: the Put its end's transaction
    carries, adapters/usage_store.due_put)."""
    if request.param == "fake":
        from tests.fakes import FakeUsage
        fake = FakeUsage()
        return fake, fake.mark_due
    from chalicelib.adapters import models
    from chalicelib.adapters.dynamo import Dynamo
    from chalicelib.adapters.usage_store import DynamoUsage, due_put
    from chalicelib.config import Config

    env = request.getfixturevalue("aws_env")
    dynamo = Dynamo(models.bind(Config.from_env(env)))
    return DynamoUsage(dynamo), lambda job, n, at: dynamo.put(due_put(job, n, at))


@pytest.fixture
def store(both):
    return both[0]


def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def test_an_attempt_adds_once_and_cells_read_back_summed(store):
    t, other = tenant(), tenant()
    h = DAY + 5 * HOUR_MS
    first = {("hour", h, "gpu_type", "h100"): {"productive": 30, "startup": 6, "jobs": 1},
             ("hour", h + HOUR_MS, "gpu_type", "h100"): {"productive": 3600},
             ("day", DAY, "gpu_type", "h100"): {"productive": 3630, "startup": 6, "jobs": 1},
             ("hour", h, "label:team#x", "a#b"): {"productive": 30, "startup": 6, "jobs": 1}}
    assert store.add(t, "job_1", 1, first) is True
    assert store.add(t, "job_1", 1, first) is False  # a retry adds nothing
    second = {("hour", h, "gpu_type", "h100"): {"productive": -1, "failed_attempt": 1},
              ("hour", h, "gpu_type", "a100"): {"preempted": 7, "jobs": 1}}
    assert store.add(t, "job_1", 2, second) is True
    assert store.cells(t, "hour", "gpu_type", DAY, DAY + DAY_MS) == [
        UsageCell(h, "a100", {"preempted": 7}, 1),
        UsageCell(h, "h100", {"productive": 29, "startup": 6, "failed_attempt": 1}, 1),
        UsageCell(h + HOUR_MS, "h100", {"productive": 3600}, 0)]
    # only the periods that start within the range asked
    assert [c.at_ms for c in store.cells(t, "hour", "gpu_type", h + 1, DAY + DAY_MS)] == \
        [h + HOUR_MS]
    assert store.cells(t, "day", "gpu_type", DAY, DAY + DAY_MS) == [
        UsageCell(DAY, "h100", {"productive": 3630, "startup": 6}, 1)]
    assert store.cells(t, "hour", "label:team", DAY, DAY + DAY_MS) == []
    assert store.cells(t, "hour", "label:team#x", DAY, DAY + DAY_MS) == [
        UsageCell(h, "a#b", {"productive": 30, "startup": 6}, 1)]
    assert store.cells(other, "hour", "gpu_type", DAY, DAY + DAY_MS) == []
    assert t in store.tenants(DAY, DAY + DAY_MS)
    assert t not in store.tenants(DAY + DAY_MS, DAY + 2 * DAY_MS)


def test_an_attempt_of_many_cells_is_added_whole_and_once(store):
    t = tenant()
    many = {("hour", DAY + n * HOUR_MS, "job", f"job_{k}"): {"productive": n + 1, "jobs": 1}
            for n in range(24 * 5) for k in range(2)}
    assert store.add(t, "job_9", 1, many) is True
    assert store.add(t, "job_9", 1, many) is False
    cells = store.cells(t, "hour", "job", DAY, DAY + 5 * DAY_MS)
    assert len(cells) == 240 and sum(c.counts["productive"] for c in cells) == \
        2 * sum(range(1, 121))
    assert t in store.tenants(DAY + 4 * DAY_MS, DAY + 5 * DAY_MS)


def test_an_attempt_is_due_from_its_end_until_done(both):
    store, mark_due = both
    job = "job_" + uuid.uuid4().hex[:12]
    t0 = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    mark_due(job, 1, t0)
    mark_due(job, 2, t0 + timedelta(seconds=30))
    found = [d for d in store.due(t0 + timedelta(seconds=10), 10_000) if d[0] == job]
    assert found == [(job, 1)], "only what ended before"
    assert {d for d in store.due(t0 + timedelta(minutes=1), 10_000) if d[0] == job} == \
        {(job, 1), (job, 2)}
    store.done(job, 1)
    store.done(job, 1)  # harmless again
    assert [d for d in store.due(t0 + timedelta(minutes=1), 10_000) if d[0] == job] == \
        [(job, 2)]
