"""A node's call-in needs a write only when it changes something or its
lease (the recorded ``last_seen_at``) is no longer fresh (domain/nodes.py)."""
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from chalicelib.domain.nodes import Node, NodeState, fresh_call_in

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NODE = Node(node_id="n1", gpus=8, gpus_free=8, gpu_type="h100", state=NodeState.READY,
            inbox_queue_url="https://sqs/n1", last_seen_at=T0, registered_at=T0,
            labels={"zone": "a"}, address="10.0.0.1", isolation="user")
SAME = {"gpus": 8, "gpu_type": "h100", "labels": {"zone": "a"}, "address": "10.0.0.1",
        "inbox_queue_url": "https://sqs/n1", "isolation": "user"}


def call_in(node=NODE, after_s=10.0, fresh_s=15.0, **changed):
    return fresh_call_in(node, **{**SAME, **changed}, now=T0 + timedelta(seconds=after_s),
                         fresh_s=fresh_s)


def test_an_unchanged_call_in_inside_the_lease_needs_no_write_and_one_at_its_end_does():
    assert call_in(after_s=14.999)
    assert not call_in(after_s=15.0), "strictly inside the lease"
    assert not call_in(fresh_s=0), "no lease: every call-in is written"


def test_any_change_or_a_return_from_down_is_written_at_once():
    for change in ({"gpus": 4}, {"gpu_type": "a100"}, {"labels": {}}, {"address": "x"},
                   {"inbox_queue_url": "https://sqs/other"}, {"isolation": "none"}):
        assert not call_in(**change), change
    assert not call_in(node=replace(NODE, state=NodeState.DOWN))
    assert call_in(node=replace(NODE, state=NodeState.DRAINING)), "a cordon is not a change"
