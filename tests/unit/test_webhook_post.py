"""The delivery's POST (adapters/webhook_delivery.Urllib3Poster) against a
real receiver on 127.0.0.1: it connects to the address that was checked,
never resolving the host again (so DNS rebinding cannot move it), names the
host in ``Host``, follows no redirect, and gives up at its timeout."""
from __future__ import annotations

import time

import pytest
import urllib3

from chalicelib.adapters.webhook_delivery import Urllib3Poster
from chalicelib.domain.webhooks import Target
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def target(receiver: Receiver, path: str, host: str = "hooks.example.invalid") -> Target:
    port = int(receiver.url("/").rsplit(":", 1)[1].split("/")[0])
    return Target(f"http://{host}:{port}{path}?a=1", "http", host, port, ("127.0.0.1",))


def test_it_posts_to_the_checked_address_without_resolving_the_host(receiver):
    status = Urllib3Poster().post(target(receiver, "/in"), {"webhook-id": "evt_1"},
                                  b'{"id":"evt_1"}', 10)
    assert status == 204
    [got] = receiver.at("/in?a=1")
    assert got.body == b'{"id":"evt_1"}' and got.headers["webhook-id"] == "evt_1"
    assert got.headers["host"].startswith("hooks.example.invalid:")


def test_a_redirect_is_not_followed_and_counts_as_a_failure(receiver):
    receiver.behaviour["/moved?a=1"] = [302]
    assert Urllib3Poster().post(target(receiver, "/moved"), {}, b"{}", 10) == 302
    assert len(receiver.received) == 1


def test_an_endpoint_that_never_answers_is_given_up_at_the_timeout(receiver):
    receiver.behaviour["/dead?a=1"] = None
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.TimeoutError):
        Urllib3Poster().post(target(receiver, "/dead"), {}, b"{}", 0.5)
    assert time.monotonic() - started < 5
