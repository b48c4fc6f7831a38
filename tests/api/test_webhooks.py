"""Webhooks over the HTTP API (issue 45 items 2 and 4), with real parts: the
app in-process on the moto stack, its deliveries' queue on moto's SQS drained
by the local stack's concurrent consumer (devstack/queues.py) calling the
app's own ``deliver_webhook``, and real HTTP receivers on 127.0.0.1 whose
signatures are checked with ``standardwebhooks``, the spec's library."""
from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from standardwebhooks.webhooks import Webhook

from chalicelib.domain import feed
from chalicelib.domain.clock import iso, utcnow
from tests.support.waits import wait_until
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def hooks(make_services, aws_env):
    """Services that deliver to loopback (as the local stack), retrying at
    once (a schedule of zeros: no waiting in a test)."""
    return make_services({**aws_env, "GPUJOBS_WEBHOOK_ALLOW_LOCAL": "1",
                          "GPUJOBS_WEBHOOK_RETRY_SCHEDULE_S": "0,0,0"})


@pytest.fixture
def api(hooks):
    from chalice.test import Client

    import app

    with Client(app.app) as c:
        yield c


@pytest.fixture
def consumer(hooks, aws_env):
    """The local stack's consumer of the deliveries' queue, running deliveries
    concurrently as Lambda would; stopped after the test."""
    import app
    from devstack.queues import ConcurrentQueueConsumer

    stop = threading.Event()
    worker = ConcurrentQueueConsumer("deliver_webhook", aws_env["GPUJOBS_WEBHOOK_QUEUE_URL"],
                                     app.deliver_webhook, stop,
                                     endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"])
    worker.start()
    try:
        yield worker
    finally:
        stop.set()
        worker.join(timeout=15)


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def create(api, tenants, who="a", **body):
    r = api.http.post("/v1/webhooks", headers=tenants.headers(who), body=json.dumps(body))
    return r.status_code, r.json_body


def deliveries(api, tenants, webhook_id, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    r = api.http.get(f"/v1/webhooks/{webhook_id}/deliveries?{query}", headers=tenants.headers())
    assert r.status_code == 200, r.json_body
    return r.json_body


def event(type_="job.state_changed", **data) -> dict:
    return {"id": "evt_" + uuid.uuid4().hex, "type": type_, "time": iso(utcnow()),
            "job_id": "job_01J00000000000000000000000",
            "data": data or {"from": "PENDING", "to": "RUNNING", "attempt": 1, "reason": None}}


# -- create, read, delete ------------------------------------------------------------
def test_a_webhook_is_created_with_its_secret_shown_once_and_read_without_it(api, tenants):
    status, made = create(api, tenants, url="https://93.184.216.34/hooks",
                          types=["job.stalled"], description="pager")
    assert status == 201, made
    assert made["id"].startswith("wh_") and made["secret"].startswith("whsec_")
    assert {k: made[k] for k in ("url", "types", "description", "state")} == {
        "url": "https://93.184.216.34/hooks", "types": ["job.stalled"],
        "description": "pager", "state": "enabled"}
    shown = {k: v for k, v in made.items() if k != "secret"}
    got = api.http.get(f"/v1/webhooks/{made['id']}", headers=tenants.headers())
    assert got.status_code == 200 and got.json_body == shown
    listed = api.http.get("/v1/webhooks", headers=tenants.headers()).json_body
    assert listed == {"webhooks": [shown]}
    assert "whsec_" not in json.dumps(listed)
    status, all_types = create(api, tenants, url="https://93.184.216.34/all")
    assert status == 201 and set(all_types["types"]) == set(feed.TYPES) and all_types["description"] is None
    gone = api.http.delete(f"/v1/webhooks/{made['id']}", headers=tenants.headers())
    assert gone.status_code == 204
    again = api.http.get(f"/v1/webhooks/{made['id']}", headers=tenants.headers())
    assert again.status_code == 404 and again.json_body["code"] == "not_found"


def test_another_tenant_sees_no_webhook_of_ours(api, tenants):
    _, made = create(api, tenants, url="https://93.184.216.34/hooks")
    path = f"/v1/webhooks/{made['id']}"
    for method, p in (("GET", path), ("DELETE", path), ("GET", path + "/deliveries"),
                      ("POST", path + "/test")):
        r = api.http.request(method, p, headers=tenants.headers("b"), body=b"")
        assert (r.status_code, r.json_body["code"]) == (404, "not_found"), (method, p)
    assert api.http.get("/v1/webhooks", headers=tenants.headers("b")).json_body == {
        "webhooks": []}
    assert api.http.get(path, headers=tenants.headers()).status_code == 200


@pytest.mark.parametrize("body, field", [
    ({"url": "ftp://93.184.216.34/x"}, "url"),
    ({"url": "not a url"}, "url"),
    ({"url": "https://10.0.0.1/x"}, "url"),
    ({"url": "https://169.254.169.254/latest/meta-data"}, "url"),
    ({"url": "https://[fd00:ec2::254]/"}, "url"),
    ({"url": "https://[::ffff:192.168.0.1]/"}, "url"),
    ({"url": "https://localhost.invalid/"}, "url"),
    ({"types": ["job.created"]}, "url"),
    ({"url": 7}, "url"),
    ({"url": "https://93.184.216.34/", "types": ["job.nope"]}, "types"),
    ({"url": "https://93.184.216.34/", "types": []}, "types"),
    ({"url": "https://93.184.216.34/", "types": "job.created"}, "types"),
    ({"url": "https://93.184.216.34/", "description": "x" * 300}, "description"),
    ({"url": "https://93.184.216.34/", "secret": "whsec_mine"}, "secret"),
])
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(api, tenants, body, field):
    r = api.http.post("/v1/webhooks", headers=tenants.headers(), body=json.dumps(body))
    assert r.status_code == 400, r.json_body
    assert r.headers["Content-Type"] == "application/problem+json"
    assert (r.json_body["code"], r.json_body["field"]) == ("invalid_argument", field)
    assert api.http.get("/v1/webhooks", headers=tenants.headers()).json_body == {"webhooks": []}


def test_outside_the_local_stack_http_and_loopback_are_refused(make_services, aws_env, tenants):
    from chalice.test import Client

    import app

    make_services(aws_env)  # no GPUJOBS_WEBHOOK_ALLOW_LOCAL
    with Client(app.app) as c:
        for url in ("http://93.184.216.34/x", "https://127.0.0.1/x", "https://[::1]/x"):
            status, problem = create(c, tenants, url=url)
            assert (status, problem["field"]) == (400, "url"), (url, problem)


def test_a_21st_webhook_is_a_400_and_a_delete_makes_room(api, tenants):
    made = []
    for n in range(20):
        status, w = create(api, tenants, url=f"https://93.184.216.34/h{n}")
        assert status == 201, w
        made.append(w["id"])
    status, problem = create(api, tenants, url="https://93.184.216.34/h20")
    assert status == 400 and problem["code"] == "invalid_argument"
    assert problem["field"] == "url" and "at most 20" in problem["detail"]
    assert len(api.http.get("/v1/webhooks", headers=tenants.headers()).json_body[
        "webhooks"]) == 20
    assert api.http.delete(f"/v1/webhooks/{made[0]}", headers=tenants.headers()).status_code == 204
    assert create(api, tenants, url="https://93.184.216.34/h20")[0] == 201


# -- deliveries ---------------------------------------------------------------------------
def test_events_are_delivered_signed_as_standard_webhooks_verifies(
        api, hooks, tenants, receiver, consumer):
    _, made = create(api, tenants, url=receiver.url("/in"),
                     types=["job.state_changed", "job.stalled"])
    wanted, other = event(), event("job.created")
    hooks.webhooks.fan_out(tenants.a, [wanted, other])
    [got] = wait_until(lambda: receiver.at("/in"), 20, what="the delivery")
    assert Webhook(made["secret"]).verify(got.body, got.headers) == wanted
    assert got.headers["webhook-id"] == wanted["id"]
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 60
    log = wait_until(lambda: deliveries(api, tenants, made["id"])["deliveries"], 20,
                     what="the delivery's record")
    assert log == [{"event_id": wanted["id"], "attempt": 1, "at": log[0]["at"],
                    "status_code": 204, "error": None, "next_retry_at": None}]
    assert len(receiver.at("/in")) == 1  # the job.created event was not asked for


def test_a_receiver_answering_500_first_gets_a_retry_with_the_same_id(
        api, hooks, tenants, receiver, consumer):
    receiver.behaviour["/flaky"] = [500, 200]
    _, made = create(api, tenants, url=receiver.url("/flaky"))
    e = event()
    hooks.webhooks.fan_out(tenants.a, [e])
    first, second = wait_until(lambda: len(receiver.at("/flaky")) >= 2 and receiver.at("/flaky"),
                               20, what="the retry")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == e["id"]
    for got in (first, second):
        Webhook(made["secret"]).verify(got.body, got.headers)
    log = wait_until(lambda: len(d := deliveries(api, tenants, made["id"])["deliveries"]) == 2
                     and d, 20, what="both records")
    newest, oldest = log
    assert (newest["attempt"], newest["status_code"], newest["error"]) == (2, 200, None)
    assert (oldest["attempt"], oldest["status_code"]) == (1, 500)
    assert oldest["error"] == "answered 500" and oldest["next_retry_at"] is not None
    # keyset pages: one record a page, newest first, then no token
    page = deliveries(api, tenants, made["id"], page_size=1)
    assert page["deliveries"] == [newest] and page["next_page_token"]
    page2 = deliveries(api, tenants, made["id"], page_size=1,
                       page_token=page["next_page_token"])
    assert page2 == {"deliveries": [oldest], "next_page_token": None}
    bad = api.http.get(f"/v1/webhooks/{made['id']}/deliveries?page_token=x.y",
                       headers=tenants.headers())
    assert (bad.status_code, bad.json_body["code"]) == (400, "invalid_page_token")


def test_a_receiver_that_keeps_failing_is_recorded_failed_when_the_schedule_ends(
        api, hooks, tenants, receiver, consumer):
    receiver.behaviour["/down"] = [503]
    _, made = create(api, tenants, url=receiver.url("/down"))
    hooks.webhooks.fan_out(tenants.a, [event()])
    log = wait_until(lambda: len(d := deliveries(api, tenants, made["id"])["deliveries"]) == 3
                     and d, 30, what="three attempts")
    assert [d["attempt"] for d in log] == [3, 2, 1]
    assert log[0]["next_retry_at"] is None and "failed: no retry after 3 attempts" in \
        log[0]["error"]
    assert all(d["next_retry_at"] for d in log[1:])
    assert len(receiver.at("/down")) == 3  # the record of the last comes after its POST


def test_a_receiver_that_never_answers_does_not_delay_a_healthy_one(
        api, hooks, tenants, receiver, consumer):
    receiver.behaviour["/dead"] = None
    _, dead = create(api, tenants, url=receiver.url("/dead"))
    _, healthy = create(api, tenants, url=receiver.url("/healthy"))
    events = [event() for _ in range(3)]
    started = time.monotonic()
    hooks.webhooks.fan_out(tenants.a, events)
    wait_until(lambda: len(receiver.at("/healthy")) == 3, 20, what="the healthy deliveries")
    took = time.monotonic() - started
    assert took < 8, f"the healthy receiver waited {took:.1f}s behind the dead one"
    assert deliveries(api, tenants, dead["id"])["deliveries"] == []  # still hanging
    wait_until(lambda: len(receiver.at("/dead")) == 3, 20, what="the dead one's attempts")


def test_the_test_route_sends_a_signed_webhook_test_event(api, tenants, receiver, consumer):
    _, made = create(api, tenants, url=receiver.url("/t"), types=["job.created"])
    r = api.http.post(f"/v1/webhooks/{made['id']}/test", headers=tenants.headers())
    assert r.status_code == 202, r.json_body
    sent = r.json_body["event"]
    assert sent["type"] == "webhook.test" and sent["data"]["webhook_id"] == made["id"]
    [got] = wait_until(lambda: receiver.at("/t"), 20, what="the test event")
    assert Webhook(made["secret"]).verify(got.body, got.headers) == sent


def test_fan_out_never_posts_and_raises_when_the_queue_fails(api, hooks, tenants, receiver):
    from tests.fakes import FakeWebhookQueue

    create(api, tenants, url=receiver.url("/x"))
    hooks.webhooks._queue = queue = FakeWebhookQueue()
    hooks.webhooks.fan_out(tenants.a, [event(), event("job.created")])
    assert len(queue.sent) == 2 and receiver.received == []
    queue.failing = True
    with pytest.raises(ConnectionError):
        hooks.webhooks.fan_out(tenants.a, [event()])
