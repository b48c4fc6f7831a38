"""The bus of domain events (chalicelib/service/bus.py): each event reaches
its handlers in the order they were subscribed; a handler's failure reaches
the publisher (a dependency's failure: 503 on a request), unless it was
subscribed second, when it is logged and the others still run."""
from __future__ import annotations

import logging

import pytest

from chalicelib.domain.happened import JobEnded, RanksGone
from chalicelib.service.bus import Bus


def test_an_event_reaches_its_handlers_in_order_and_no_other_types():
    bus, seen = Bus(), []
    bus.subscribe(RanksGone, lambda e: seen.append(("first", e.job_id)))
    bus.subscribe(RanksGone, lambda e: seen.append(("second", e.node_id)))
    bus.subscribe(JobEnded, lambda e: seen.append(("ended", e)))
    bus.publish(RanksGone("job_1", 2, "node-1"))
    assert seen == [("first", "job_1"), ("second", "node-1")]


def broken(event):
    raise RuntimeError("DynamoDB is down")


def test_a_failing_handler_reaches_the_publisher():
    bus = Bus()
    bus.subscribe(RanksGone, broken)
    with pytest.raises(RuntimeError, match="DynamoDB is down"):
        bus.publish(RanksGone("job_1", 2, "node-1"))


def test_a_failing_second_handler_is_logged_and_the_others_still_run(caplog):
    bus, seen = Bus(), []
    bus.subscribe(RanksGone, broken, second=True)
    bus.subscribe(RanksGone, lambda e: seen.append(e.attempt))
    with caplog.at_level(logging.ERROR, logger="chalicelib.service.bus"):
        bus.publish(RanksGone("job_1", 2, "node-1"))  # does not raise
    assert seen == [2]
    assert "a handler of RanksGone failed; its sweep follows up" in caplog.text
    assert "DynamoDB is down" in caplog.text
