"""The WebhookStore port's contract, held by tests/fakes.FakeWebhookStore and
adapters/webhook_store.DynamoWebhookStore alike: at most ``limit`` webhooks a
tenant (the count moves with the put, never half-written), a tenant sees
only its own, and the deliveries log reads newest first in keyset pages."""
from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest

from chalicelib.domain import webhooks as wh
from chalicelib.domain.clock import utcnow
from chalicelib.domain.webhooks import Delivery, Webhook
from tests.contract.ports import IMPLEMENTATIONS


@pytest.fixture(params=IMPLEMENTATIONS)
def store(request):
    """The fake, or the adapter on the session's shared stack."""
    if request.param == "fake":
        from tests.fakes import FakeWebhookStore
        return FakeWebhookStore()
    from chalicelib.adapters import models
    from chalicelib.adapters.dynamo import Dynamo
    from chalicelib.adapters.webhook_store import DynamoWebhookStore
    from chalicelib.config import Config

    env = request.getfixturevalue("aws_env")
    return DynamoWebhookStore(Dynamo(models.bind(Config.from_env(env))))


def tenant() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def hook(tenant_: str, n: int = 0, **kw) -> Webhook:
    values = dict(webhook_id=f"wh_{uuid.uuid4().hex[:12]}{n}", tenant=tenant_,
                  url=f"https://h{n}.example.com/in", types=("job.created",),
                  description=None, state=wh.ENABLED, created_at=utcnow() + timedelta(
                      milliseconds=n), secret=wh.new_secret())
    return Webhook(**{**values, **kw})


def test_a_webhook_reads_back_as_written_and_only_by_its_tenant(store):
    t, other = tenant(), tenant()
    w = hook(t, description="ops pager", types=("job.created", "job.stalled"))
    assert store.create(w, 20)
    assert store.get(t, w.webhook_id) == w
    assert store.webhooks_of(t) == [w]
    assert store.get(other, w.webhook_id) is None
    assert store.webhooks_of(other) == []
    assert not store.delete(other, w.webhook_id)
    assert store.delete(t, w.webhook_id)
    assert store.get(t, w.webhook_id) is None and not store.delete(t, w.webhook_id)


def test_the_limit_holds_and_a_delete_frees_a_place(store):
    t = tenant()
    made = [hook(t, n) for n in range(3)]
    assert all(store.create(w, 3) for w in made)
    extra = hook(t, 9)
    assert not store.create(extra, 3)
    assert store.get(t, extra.webhook_id) is None  # nothing half-written
    assert [w.webhook_id for w in store.webhooks_of(t)] == [w.webhook_id for w in made]
    assert store.delete(t, made[0].webhook_id)
    assert store.create(extra, 3)
    assert len(store.webhooks_of(t)) == 3


def test_racing_creates_never_pass_the_limit(store):
    t = tenant()
    results: list[bool] = []
    lock = threading.Lock()

    def create(n: int) -> None:
        ok = store.create(hook(t, n), 4)
        with lock:
            results.append(ok)

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(results) == 8
    assert len(store.webhooks_of(t)) == results.count(True) <= 4


def test_failing_since_is_the_first_failure_and_a_success_clears_it(store):
    t = tenant()
    w = hook(t)
    store.create(w, 20)
    t0 = utcnow()
    assert store.failed(t, w.webhook_id, t0) == store.failed(t, w.webhook_id,
                                                             t0 + timedelta(hours=1))
    assert store.get(t, w.webhook_id).failing_since is not None
    store.succeeded(t, w.webhook_id)
    assert store.get(t, w.webhook_id).failing_since is None
    assert store.failed(t, "wh_none", t0) is None


def test_disable_happens_once(store):
    t = tenant()
    w = hook(t)
    store.create(w, 20)
    at = utcnow()
    assert store.disable(t, w.webhook_id, at)
    assert not store.disable(t, w.webhook_id, at)
    got = store.get(t, w.webhook_id)
    assert got.state == wh.DISABLED and got.disabled_at is not None


def test_the_deliveries_log_reads_newest_first_in_keyset_pages(store):
    wid = "wh_" + uuid.uuid4().hex
    t0 = utcnow()
    written = [Delivery(f"evt_{n:03d}", 1 + n % 3, t0 + timedelta(seconds=n),
                        200 if n % 2 else None, None if n % 2 else "ConnectionRefusedError",
                        None if n % 2 else t0 + timedelta(minutes=n)) for n in range(7)]
    for d in written:
        store.record(wid, d)
    pages, after = [], None
    while True:
        page, after = store.deliveries(wid, 3, after)
        pages.append(page)
        if after is None:
            break
        store.record(wid, Delivery("evt_late", 1, t0 + timedelta(hours=1), 200, None, None))
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [d for p in pages for d in p] == list(reversed(written))
    assert store.deliveries("wh_none", 3, None) == ([], None)
