"""The SQS inbox against the moto server, and the poller thread with a fake inbox."""
from __future__ import annotations

import json
import threading

import pytest

from agent.inbox import InboxMessage, Poller, SqsInbox, endpoint_from_queue_url
from tests.support.waits import wait_until


@pytest.mark.parametrize("url,endpoint", [
    ("https://sqs.eu-west-1.amazonaws.com/123456789012/gpujobs-prod-inbox-node-1",
     "https://sqs.eu-west-1.amazonaws.com"),
    ("http://127.0.0.1:40123/123456789012/q", "http://127.0.0.1:40123"),
])
def test_the_endpoint_comes_from_the_queue_url(url, endpoint):
    assert endpoint_from_queue_url(url) == endpoint


def test_a_queue_name_is_not_a_queue_url():
    with pytest.raises(ValueError):
        endpoint_from_queue_url("gpujobs-inbox-node-1")


@pytest.mark.parametrize("sqs", [1], indirect=True)
def test_receive_delete_and_defer_on_sqs(sqs):
    client, url = sqs
    inbox = SqsInbox(url, wait_s=1)  # its own client, from the URL alone
    for n in range(2):
        client.send_message(QueueUrl=url, MessageBody=json.dumps({"n": n}))
    got: list[InboxMessage] = []
    wait_until(lambda: got.extend(inbox.receive()) or len(got) == 2, what="both messages")
    assert sorted(json.loads(m.body)["n"] for m in got) == [0, 1]
    assert all(m.receive_count == 1 for m in got)
    first, second = got
    inbox.delete(first)
    inbox.defer(second, 0)  # visible again at once, received a second time
    again = wait_until(lambda: inbox.receive() or None, what="the deferred message")
    assert [m.body for m in again] == [second.body] and again[0].receive_count == 2
    inbox.delete(again[0])
    assert inbox.receive() == []


class ScriptedInbox:
    """Returns the scripted batches (an exception is raised), then waits for the stop."""

    def __init__(self, batches, stop: threading.Event) -> None:
        self.batches, self.stop = list(batches), stop
        self.receives = 0
        self.deferred: list[tuple[str, int]] = []

    def receive(self):
        self.receives += 1
        if self.batches:
            batch = self.batches.pop(0)
            if isinstance(batch, Exception):
                raise batch
            return batch
        self.stop.wait(5)
        return []

    def defer(self, message, seconds):
        self.deferred.append((message.message_id, seconds))


def msgs(*ids):
    return [InboxMessage(body="{}", receipt_handle=f"rh-{i}", message_id=i) for i in ids]


@pytest.fixture
def poller_for():
    started = []

    def make(batches):
        stop = threading.Event()
        inbox = ScriptedInbox(batches, stop)
        poller = Poller(inbox, stop, backoff_base=0.01, backoff_cap=0.02)
        poller.start()
        started.append((poller, stop))
        return poller, inbox, stop

    try:
        yield make
    finally:
        for poller, stop in started:
            stop.set()
            poller.join(10)


def test_the_next_receive_waits_until_the_batch_was_handled(poller_for):
    poller, inbox, _ = poller_for([msgs("a", "b"), msgs("c")])
    assert poller.get(5).message_id == "a"
    poller.done()
    assert poller.get(5).message_id == "b"
    assert inbox.receives == 1  # "b" is still being handled
    poller.done()
    assert poller.get(5).message_id == "c"
    assert inbox.receives == 2
    poller.done()


def test_receive_errors_are_retried(poller_for):
    poller, inbox, _ = poller_for([RuntimeError("endpoint down"), msgs("a")])
    assert poller.get(5).message_id == "a"
    assert inbox.receives == 2
    poller.done()


def test_messages_not_handled_at_the_stop_are_handed_back_at_once(poller_for):
    poller, inbox, stop = poller_for([msgs("a", "b", "c")])
    assert poller.get(5).message_id == "a"
    poller.done()
    stop.set()
    poller.join(10)
    assert not poller.is_alive()
    assert inbox.deferred == [("b", 0), ("c", 0)]


def test_a_batch_that_arrives_after_the_stop_is_handed_back(poller_for):
    arrived = threading.Event()

    class LateInbox(ScriptedInbox):
        def receive(self):
            self.stop.wait(5)  # the stop comes while the long poll is open
            arrived.set()
            return msgs("late")

    stop = threading.Event()
    inbox = LateInbox([], stop)
    poller = Poller(inbox, stop)
    poller.start()
    try:
        stop.set()
        poller.join(10)
        assert arrived.is_set() and inbox.deferred == [("late", 0)]
    finally:
        stop.set()
        poller.join(10)
