"""`gpujobs webhooks` as a user runs it (a subprocess) against the real local
stack, whose concurrent consumer delivers to a real receiver on 127.0.0.1
(the local stack takes http and loopback); the receiver checks the signature
with `standardwebhooks`, the spec's library. What the commands print is
what a person reads, so the assertions are on it."""
from __future__ import annotations

import json
import re

import pytest
from standardwebhooks.webhooks import Webhook

from tests.support.cli import cli_runner
from tests.support.waits import wait_until
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpujobs(stack, tmp_path):
    return cli_runner(stack.api, tmp_path / "xdg")


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def test_add_list_test_deliveries_rm(gpujobs, receiver):
    url = receiver.url("/gpujobs")
    r = gpujobs("webhooks", "add", url, "--type", "job.stalled", "--type", "job.state_changed",
                "--description", "pager")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    made = re.fullmatch(r"Webhook (wh_\w+) created: (\S+)", lines[0])
    assert made and made.group(2) == url, r.stdout
    webhook_id = made.group(1)
    assert lines[1] == "Types: job.stalled, job.state_changed"
    secret = re.fullmatch(r"Secret \(shown only now, keep it\): (whsec_\S+)", lines[2]).group(1)
    try:
        listed = gpujobs("webhooks", "list")
        assert listed.returncode == 0, listed.stderr
        assert f"{webhook_id}  enabled   {url}  (job.stalled, job.state_changed)  pager" in \
            listed.stdout.splitlines()
        assert "whsec_" not in listed.stdout

        sent = gpujobs("webhooks", "test", webhook_id)
        assert sent.returncode == 0, sent.stderr
        event_id = re.match(r"Test event (evt_\w+) queued for " + webhook_id, sent.stdout)
        assert event_id, sent.stdout
        [got] = wait_until(lambda: receiver.at("/gpujobs"), 60, what="the test delivery")
        event = Webhook(secret).verify(got.body, got.headers)
        assert event["id"] == event_id.group(1) == got.headers["webhook-id"]
        assert event["type"] == "webhook.test"

        def delivered():
            out = gpujobs("webhooks", "deliveries", webhook_id).stdout
            return "delivered (204)" in out and out
        out = wait_until(delivered, 60, 0.5, what="the delivery in the log")
        [line] = out.splitlines()
        assert f"  {event_id.group(1)}  attempt 1  delivered (204)" in line
        as_json = json.loads(gpujobs("webhooks", "deliveries", webhook_id, "-o", "json").stdout)
        assert as_json["deliveries"][0]["status_code"] == 204
    finally:
        rm = gpujobs("webhooks", "rm", webhook_id)
    assert rm.returncode == 0 and rm.stdout.strip() == f"Webhook {webhook_id} deleted."
    assert f"{webhook_id}" not in gpujobs("webhooks", "list").stdout
    gone = gpujobs("webhooks", "deliveries", webhook_id)
    assert gone.returncode == 3 and "no webhook" in gone.stderr


@pytest.mark.parametrize("url, says", [
    ("ftp://93.184.216.34/x", "url must use https or http"),
    ("http://10.0.0.1/x", "private address (10.0.0.1)"),
    ("http://169.254.169.254/latest", "cloud metadata address"),
])
def test_a_refused_url_says_why_and_exits_1(gpujobs, url, says):
    r = gpujobs("webhooks", "add", url)
    assert r.returncode == 1 and r.stdout == ""
    assert says in r.stderr and "url" in r.stderr, r.stderr


def test_an_unknown_type_is_refused_before_any_request(gpujobs):
    r = gpujobs("webhooks", "add", "https://93.184.216.34/x", "--type", "job.nope")
    assert r.returncode == 2 and "job.nope" in r.stderr


def test_on_the_local_stack_a_dead_endpoint_does_not_hold_back_a_healthy_one(gpujobs, receiver):
    """The local stack's consumer runs deliveries side by side, as Lambda
    would: test events to a receiver that never answers (each attempt held
    until its 10 s timeout) do not delay those to a healthy one."""
    import time

    receiver.behaviour["/dead"] = None
    ids = []
    try:
        for path in ("/dead", "/healthy"):
            r = gpujobs("webhooks", "add", receiver.url(path), "-o", "json")
            assert r.returncode == 0, r.stderr
            ids.append(json.loads(r.stdout)["id"])
        dead, healthy = ids
        for _ in range(3):
            assert gpujobs("webhooks", "test", dead).returncode == 0
        started = time.monotonic()
        for _ in range(3):
            assert gpujobs("webhooks", "test", healthy).returncode == 0
        wait_until(lambda: len(receiver.at("/healthy")) == 3, 30, what="the healthy deliveries")
        took = time.monotonic() - started
        assert took < 8, f"the healthy endpoint waited {took:.1f}s behind the dead one"
        wait_until(lambda: receiver.at("/dead"), 30, what="the dead endpoint's first attempt")
        wait_until(lambda: gpujobs("webhooks", "deliveries", healthy).stdout.count(
            "delivered (204)") == 3, 30, 0.5, what="the healthy deliveries' records")
    finally:
        for webhook_id in ids:
            gpujobs("webhooks", "rm", webhook_id)
