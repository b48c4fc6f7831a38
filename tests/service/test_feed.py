"""The feed service on the fakes: each story event fed once however the
numbering is interrupted or raced, reads bounded by the head, a long poll
driven by an injected clock, events past their keeping not served, and
pushes at least once, a failing bus delaying no other tenant."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from chalicelib.adapters.feed_store import tenant_tag
from chalicelib.domain.clock import utcnow
from chalicelib.domain.errors import InvalidPageToken
from chalicelib.service.feed import FeedService
from chalicelib.service.ports import AlreadyFed
from tests.clock import ShiftedClock
from tests.contract.ports import fake_ports
from tests.fakes import FakeFeeds, RecordingSink

KEY = b"feed-test-key"


@pytest.fixture
def world():
    return fake_ports()


def service(feeds, **kw) -> FeedService:
    return FeedService(feeds, page_token_key=KEY, tenant_tag=tenant_tag, **kw)


def read_all(svc: FeedService, tenant: str, after: str | None = None) -> tuple[list[dict], str]:
    got: list[dict] = []
    while True:
        page = svc.read(tenant, after=after, type_=None, job_id=None, page_size=7, wait_s=0)
        got += page["events"]
        after = page["next_cursor"]
        if not page["events"]:
            return got, after


class CrashAfterAppend(FakeFeeds):
    """A sequencer that dies after its transaction, before it marks the story
    events fed (as a Lambda timed out there would)."""

    def __init__(self, tables, crashes: int) -> None:
        super().__init__(tables)
        self.crashes = crashes

    def mark_fed(self, job_id, keys):
        if self.crashes and keys:
            self.crashes -= 1
            raise TimeoutError("the sequencer died here")
        super().mark_fed(job_id, keys)


def test_a_sequencer_that_dies_after_numbering_feeds_nothing_twice(world):
    """Invariant: a story event is fed once, even when its sequencer dies
    between the numbering and marking it fed (the marker decides)."""
    feeds = CrashAfterAppend(world.store.t, crashes=1)
    jobs = [world.created() for _ in range(3)]
    svc = service(feeds)
    with pytest.raises(TimeoutError):
        svc.number(jobs[0].tenant)
    svc.number(jobs[0].tenant)
    events, _ = read_all(svc, jobs[0].tenant)
    assert sorted(e["job_id"] for e in events) == sorted(j.job_id for j in jobs)
    assert feeds.unfed_jobs(jobs[0].tenant, 10) == []


def test_sequencers_racing_on_one_tenant_give_each_event_one_number(world):
    """Invariant: numbers are handed out once each, none skipped, however many
    sequencers race (the head's condition), while jobs are being created."""
    tenant = world.tenant()
    feeds = FakeFeeds(world.store.t)
    made: list[str] = []
    stop = threading.Event()

    def create() -> None:
        for _ in range(60):
            made.append(world.created(tenant=tenant).job_id)
        stop.set()

    errors: list[BaseException] = []

    def sequence() -> None:
        svc = service(feeds)
        try:
            while not stop.is_set():
                svc.number(tenant)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=create)] + [threading.Thread(target=sequence)
                                                   for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    events, _ = read_all(service(feeds), tenant)
    assert sorted(e["job_id"] for e in events) == sorted(made), "each once"
    assert sorted(feeds.feeds[tenant]) == list(range(1, len(made) + 1)), "no number skipped"
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_an_already_fed_event_named_by_the_store_is_dropped_not_repeated(world):
    job = world.created()
    feeds = FakeFeeds(world.store.t)
    feeds.fed.add((job.job_id, "created"))  # fed by a sequencer that died before marking
    svc = service(feeds)
    assert svc.number(job.tenant) == 0
    assert feeds.unfed(job.job_id) == {}
    with pytest.raises(AlreadyFed):
        feeds.append(job.tenant, feeds.head(job.tenant), 0, [], [(job.job_id, "created")])


def test_a_long_poll_returns_as_soon_as_an_event_is_recorded(world):
    """wait_s holds an empty answer until the next event (the injected sleep
    records one on its second look), and no longer."""
    tenant = world.tenant()
    feeds = FakeFeeds(world.store.t)
    now = [0.0]
    looks: list[float] = []

    def sleep(s: float) -> None:
        looks.append(s)
        now[0] += s
        if len(looks) == 2:
            world.created(tenant=tenant)

    svc = service(feeds, sleep=sleep, monotonic=lambda: now[0])
    page = svc.read(tenant, after=None, type_=None, job_id=None, page_size=10, wait_s=20)
    assert [e["type"] for e in page["events"]] == ["job.created"]
    assert len(looks) == 2 and now[0] <= 2, "answered at the look after it was recorded"
    empty = svc.read(tenant, after=page["next_cursor"], type_=None, job_id=None,
                     page_size=10, wait_s=3)
    assert empty["events"] == [] and 3 <= now[0] - sum(looks[:2]) <= 3, "held wait_s, no longer"


def test_events_past_their_keeping_are_not_served_and_the_cursor_passes_them(world):
    clock = ShiftedClock()
    job = world.created()
    feeds = FakeFeeds(world.store.t)
    svc = service(feeds, clock=clock)
    assert len(read_all(svc, job.tenant)[0]) == 1
    clock.advance(timedelta(days=8, seconds=1).total_seconds())
    events, cursor = read_all(svc, job.tenant)
    assert events == []
    clock.advance(-timedelta(days=8, seconds=1).total_seconds())  # (kept again, then)
    assert read_all(svc, job.tenant, cursor)[0] == [], "the cursor passed it"
    assert len(read_all(svc, job.tenant)[0]) == 1


def test_a_cursor_of_another_tenant_or_filter_is_refused(world):
    job = world.created()
    svc = service(FakeFeeds(world.store.t))
    page = svc.read(job.tenant, after=None, type_=None, job_id=None, page_size=10, wait_s=0)
    for tenant, type_ in ((world.tenant(5), None), (job.tenant, "job.created")):
        with pytest.raises(InvalidPageToken) as e:
            svc.read(tenant, after=page["next_cursor"], type_=type_, job_id=None,
                     page_size=10, wait_s=0)
        assert e.value.field == "after"


def test_pushes_are_at_least_once_and_a_failing_push_delays_no_other_tenant(world):
    """Invariant: an event is pushed after it is numbered, again if the push
    failed (recorded pushed only after the put); one tenant's failure leaves
    the others' pushes done."""
    a, b = world.created(tenant=world.tenant(1)), world.created(tenant=world.tenant(2))
    feeds, sink = FakeFeeds(world.store.t), RecordingSink()
    hooks: list[tuple[str, list]] = []
    svc = service(feeds, sinks=[sink], webhooks=lambda t, es: hooks.append((t, list(es))))

    class Flaky(RecordingSink):
        def put(self, events):
            if any(e["job_id"] == a.job_id for e in events):
                raise ConnectionError("the bus refused")
            super().put(events)

    flaky = Flaky()
    svc._sinks = [flaky]
    out = svc.sweep()
    assert out == {"numbered": 2, "pushed": 1, "failed": 1}
    assert [e["job_id"] for e in flaky.put_events] == [b.job_id]
    assert a.tenant in feeds.push_due(10) and b.tenant not in feeds.push_due(10)
    svc._sinks = [sink]
    assert svc.sweep() == {"numbered": 0, "pushed": 1, "failed": 0}
    assert [e["job_id"] for e in sink.put_events] == [a.job_id]
    assert [t for t, _ in hooks] == [b.tenant, a.tenant], "webhooks get each tenant's events"
    assert svc.sweep() == {"numbered": 0, "pushed": 0, "failed": 0}


def test_events_are_numbered_in_time_order_across_jobs(world):
    tenant = world.tenant()
    feeds = FakeFeeds(world.store.t)
    first = world.created(tenant=tenant)
    second = world.created(tenant=tenant)
    events, _ = read_all(service(feeds, clock=lambda: utcnow()), tenant)
    assert [e["job_id"] for e in events] == [first.job_id, second.job_id]


def test_a_key_marked_unfed_without_its_event_is_let_go_not_read_for_ever(world):
    """A story that does not hold an event its unfed mark names (none should)
    costs one sweep, not every sweep after it."""
    job = world.created()

    class Dangling(FakeFeeds):
        def unfed(self, job_id):
            story = super().unfed(job_id)
            return {**story, "placed#7": None} if ("x", "placed#7") not in self.marked \
                and job_id == job.job_id else story

        def mark_fed(self, job_id, keys):
            if "placed#7" in keys:
                self.marked.add(("x", "placed#7"))
            super().mark_fed(job_id, keys)

    feeds = Dangling(world.store.t)
    svc = service(feeds)
    assert svc.number(job.tenant) == 1  # its creation; the dangling key let go
    assert feeds.unfed_jobs(job.tenant, 10) == []


def test_an_endpoint_disabled_is_an_event_on_the_tenants_feed(world):
    """Issue 45: "an endpoint failing for days is disabled, with an event
    saying so": WebhooksService.on_disabled is the feed's webhook_disabled,
    which numbers a webhook.disabled event at once (pushed like any other)."""
    from types import SimpleNamespace

    from chalicelib.domain.clock import utcnow

    tenant = world.tenant()
    feeds, sink = FakeFeeds(world.store.t), RecordingSink()
    svc = service(feeds, sinks=[sink])
    hook = SimpleNamespace(tenant=tenant, webhook_id="wh_1", url="https://hooks.example.com/x")
    svc.webhook_disabled(hook, utcnow())
    [event] = read_all(svc, tenant)[0]
    assert (event["type"], event["job_id"], event["data"]["webhook_id"]) == \
        ("webhook.disabled", None, "wh_1")
    assert "was disabled: its deliveries failed for days" in event["data"]["text"]
    svc.sweep()
    assert [e["type"] for e in sink.put_events] == ["webhook.disabled"]
    page = svc.read(tenant, after=None, type_="webhook.disabled", job_id=None, page_size=5,
                    wait_s=0)
    assert [e["id"] for e in page["events"]] == [event["id"]]


def test_an_index_that_lags_behind_what_was_fed_costs_one_round_not_twenty(world):
    """DynamoDB's index may still list a job fed a moment ago: numbering reads
    it once, finds nothing to tell, and stops (a read's long poll numbers on
    every look)."""
    job = world.created()

    class Lagging(FakeFeeds):
        asked = 0

        def unfed_jobs(self, tenant, limit):
            self.asked += 1
            return [job.job_id]  # listed still, though fed

    feeds = Lagging(world.store.t)
    svc = service(feeds)
    assert svc.number(job.tenant) == 1
    feeds.asked = 0
    assert svc.number(job.tenant) == 0
    assert feeds.asked == 1
