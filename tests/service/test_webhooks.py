"""The webhooks service on fakes (chalicelib/service/webhooks.py), time driven
by a clock of the test's own: long waits go in hops of at most 900 s, the
schedule ends in a failed record, an endpoint failing for 5 days is
disabled with a note, and the URL is checked again at each delivery."""
from __future__ import annotations

import json

import pytest

from chalicelib.domain import webhooks as wh
from chalicelib.service.webhooks import WebhooksService
from tests.clock import FakeClock
from tests.fakes import FakeWebhookQueue, FakeWebhookStore

PUBLIC = "93.184.216.34"


class Poster:
    """Answers each POST with the next status (an exception: raised)."""

    def __init__(self, *answers) -> None:
        self.answers, self.posts = list(answers), []

    def post(self, target, headers, body, timeout_s):
        self.posts.append((target, dict(headers), body))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


class World:
    def __init__(self, *answers, schedule=(0, 3600)) -> None:
        self.clock = FakeClock()
        self.store, self.queue, self.poster = FakeWebhookStore(), FakeWebhookQueue(), \
            Poster(*answers)
        self.addresses = [PUBLIC]
        self.service = WebhooksService(self.store, self.queue, self.poster,
                                       page_token_key=b"k", schedule=schedule,
                                       resolver=lambda host, port: list(self.addresses),
                                       rand=lambda: 0.5, clock=self.clock)
        self.hook = self.service.create("acme", {"url": "https://hooks.example.com/in"})

    def send(self, type_="job.created") -> dict:
        e = {"id": "evt_1", "type": type_, "time": "2026-12-01T00:00:00.000Z",
             "job_id": "job_1", "data": {}}
        self.service.fan_out("acme", [e])
        return e

    def run(self) -> list[int]:
        """Deliver what is queued; the delays it was sent with."""
        delays = [d for _, d in self.queue.sent]
        self.queue.deliver(self.service.deliver)
        return delays

    def log(self):
        return self.service.deliveries("acme", self.hook.webhook_id, page_size=100)[0]


def test_a_wait_longer_than_sqs_holds_goes_in_hops_and_posts_once_due():
    w = World(500, 204)
    w.send()
    assert w.run() == [0] and len(w.poster.posts) == 1
    [(msg, delay)] = w.queue.sent
    assert delay == 900 and msg["attempt"] == 2
    for _ in range(3):  # 3 hops of 900 s: not due yet, sent on
        w.clock.advance(900)
        assert w.run() == [900]
        assert len(w.poster.posts) == 1
    w.clock.advance(900)
    w.run()
    assert len(w.poster.posts) == 2 and w.queue.sent == []
    assert [(d.attempt, d.status_code) for d in w.log()] == [(2, 204), (1, 500)]
    assert w.store.get("acme", w.hook.webhook_id).failing_since is None


def test_every_attempt_carries_the_same_id_and_a_fresh_signature():
    w = World(ConnectionRefusedError("refused"), 200, schedule=(0, 10))
    e = w.send()
    w.run()
    w.clock.advance(10)
    w.run()
    (_, first, body1), (_, second, body2) = w.poster.posts
    assert first["webhook-id"] == second["webhook-id"] == e["id"] and body1 == body2
    assert int(second["webhook-timestamp"]) - int(first["webhook-timestamp"]) == 10
    assert json.loads(body1) == e
    assert w.log()[1].error == "ConnectionRefusedError: refused"


def test_the_schedule_exhausted_is_recorded_failed():
    w = World(500, schedule=(0, 5))
    w.send()
    w.run()
    w.clock.advance(5)
    w.run()
    assert w.queue.sent == []
    last, first = w.log()
    assert first.next_retry_at is not None
    assert last.next_retry_at is None and last.error == \
        "answered 500; failed: no retry after 2 attempts"


def test_an_endpoint_failing_for_5_days_is_disabled_with_a_note_and_gets_nothing_more():
    w = World(500, schedule=(0, 86400, 86400, 86400, 86400, 86400, 86400))
    told = []
    w.service.on_disabled = lambda hook, at: told.append((hook.webhook_id, at))
    w.send()
    w.run()
    for day in range(1, 6):  # each day's attempt is due exactly then: no hop
        w.clock.advance(86400)
        assert w.store.get("acme", w.hook.webhook_id).state == "enabled", day
        w.run()
    hook = w.store.get("acme", w.hook.webhook_id)
    assert hook.state == "disabled"
    assert told == [(w.hook.webhook_id, w.clock())]
    note = w.log()[0]
    assert note.error.startswith("webhook.disabled: failing since ")
    assert w.queue.sent == []
    posts = len(w.poster.posts)
    w.send()
    assert w.queue.sent == []  # fan_out skips it
    assert len(w.poster.posts) == posts


def test_a_success_between_failures_restarts_the_count_of_days():
    w = World(500, 204, 500, schedule=(0, 4 * 86400))
    w.send()
    w.run()
    w.clock.advance(4 * 86400)
    while w.queue.sent:
        w.run()
    w.clock.advance(86400)
    w.send()
    w.run()
    assert w.store.get("acme", w.hook.webhook_id).state == "enabled"


def test_the_url_is_checked_again_at_each_delivery():
    w = World(204)
    w.addresses = ["10.0.0.5"]  # the host now resolves to a private address
    w.send()
    w.run()
    assert w.poster.posts == []
    [d] = w.log()
    assert d.status_code is None and "private address (10.0.0.5)" in d.error
    assert d.next_retry_at is not None


def test_the_post_goes_to_the_address_that_was_checked():
    w = World(204)
    w.send()
    w.run()
    [(target, headers, _)] = w.poster.posts
    assert target.addresses == (PUBLIC,) and target.host == "hooks.example.com"
    assert headers["webhook-signature"].startswith("v1,")


def test_fan_out_matches_types_and_skips_disabled_webhooks():
    w = World(204)
    only = w.service.create("acme", {"url": "https://b.example.com/", "types": ["job.stalled"]})
    w.send("job.created")
    assert [m["webhook_id"] for m, _ in w.queue.sent] == [w.hook.webhook_id]
    w.queue.sent.clear()
    w.send("job.stalled")
    assert len(w.queue.sent) == 2
    w.queue.sent.clear()
    w.store.disable("acme", only.webhook_id, w.clock())
    w.send("job.stalled")
    assert [m["webhook_id"] for m, _ in w.queue.sent] == [w.hook.webhook_id]
    w.service.fan_out("other", [{"id": "evt_2", "type": "job.stalled"}])
    assert len(w.queue.sent) == 1


def test_a_message_that_is_no_delivery_raises():
    w = World(204)
    for body in ("nope", "{}", json.dumps({"tenant": "a", "webhook_id": "wh_1", "event": {},
                                           "attempt": 1})):
        with pytest.raises(ValueError):
            w.service.deliver(body)


def test_a_deleted_webhook_gets_nothing():
    w = World(204)
    w.send()
    w.service.delete("acme", w.hook.webhook_id)
    w.run()
    assert w.poster.posts == []


def test_the_default_schedule_is_standard_webhooks():
    assert wh.RETRY_SCHEDULE_S == (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
