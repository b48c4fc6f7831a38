"""The heartbeat store's writes (adapters/heartbeat_store.py), as requests:
a post's beats in BatchWriteItems of 25 with what DynamoDB leaves unprocessed
sent again, and an entry that is not a beat as one update of what it has."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pynamodb.exceptions import PutError

from chalicelib.adapters.dynamo import BATCH_SENDS
from chalicelib.adapters.dynamo_errors import dependency_failure
from chalicelib.adapters.heartbeat_store import DynamoHeartbeatStore
from chalicelib.domain.stall import Beat

T0 = datetime(2026, 12, 1, 3, 4, 5, 678000, tzinfo=timezone.utc)


class _Unprocessed:
    """A connection whose BatchWriteItem leaves the last ``left[i]`` items of
    its i-th request unprocessed (none once the list is spent)."""

    def __init__(self, *left: int) -> None:
        self.left, self.requests = list(left), []

    def dispatch(self, operation: str, request: dict) -> dict:
        self.requests.append((operation, request))
        if operation != "BatchWriteItem":
            return {}
        [(table, puts)] = request["RequestItems"].items()
        n = self.left.pop(0) if self.left else 0
        return {"UnprocessedItems": {table: puts[len(puts) - n:]} if n else {}}


def _beats(n: int) -> list[Beat]:
    return [Beat(r, "n", heard_at=T0, step=r) for r in range(n)]


def _ranks(request: dict) -> list[int]:
    [puts] = request["RequestItems"].values()
    return [int(p["PutRequest"]["Item"]["rank"]["N"]) for p in puts]


def test_a_post_is_written_25_items_a_request_and_the_unprocessed_sent_again():
    conn = _Unprocessed(0, 3)
    DynamoHeartbeatStore(conn).record("j", 1, _beats(30), T0)
    sent = [_ranks(r) for _, r in conn.requests]
    assert sent == [list(range(25)), list(range(25, 30)), [27, 28, 29]]


def test_items_still_unprocessed_after_every_send_are_a_503_not_a_lost_beat():
    """A beat must never vanish silently: the agent is told to retry."""
    conn = _Unprocessed(*[1] * BATCH_SENDS)
    with pytest.raises(PutError) as e:
        DynamoHeartbeatStore(conn).record("j", 1, _beats(2), T0)
    assert len(conn.requests) == BATCH_SENDS
    assert dependency_failure(e.value)


def test_a_beat_item_holds_the_receive_time_and_the_sender_offset_beside_it():
    conn = _Unprocessed()
    sent = T0 + timedelta(seconds=2.5)
    DynamoHeartbeatStore(conn).record("j", 1, [Beat(600, "n7", heard_at=T0, sent_at=sent)], T0)
    [(_, request)] = conn.requests
    [puts] = request["RequestItems"].values()  # the one table, whatever name it is bound to
    [put] = puts
    item = put["PutRequest"]["Item"]
    assert (item["shard_key"], item["node_id"], item["heard_at"]) == (
        {"S": "j#1#1"}, {"S": "n7"}, {"S": "2026-12-01T03:04:05.678Z"})
    assert (item["offset_s"], item["ttl_epoch"]) == (
        {"N": "2.5"}, {"N": str(int((T0 + timedelta(days=7)).timestamp()))})


def test_an_entry_that_is_not_a_beat_updates_only_what_it_has():
    conn = _Unprocessed()
    DynamoHeartbeatStore(conn).record("j", 1, [
        Beat(0, "n", paused_until=T0, pause_reason="ckpt"),
        Beat(1, "n", proc={"cpu": 1.0}, sampled_at=T0, active_at=T0)], T0)
    (op0, pause), (op1, sample) = conn.requests
    assert op0 == op1 == "UpdateItem"
    assert pause["UpdateExpression"] == ("SET #node_id = :node_id, #ttl_epoch = :ttl_epoch, "
                                         "#paused_until = :paused_until, "
                                         "#pause_reason = :pause_reason")
    assert sample["UpdateExpression"] == ("SET #node_id = :node_id, #ttl_epoch = :ttl_epoch, "
                                          "#proc = :proc, #sampled_at = :sampled_at, "
                                          "#active_at = :active_at")
    assert "#heard_at" not in pause["ExpressionAttributeNames"], "the last beat stands"
    assert sample["Key"] == {"shard_key": {"S": "j#1#0"}, "rank": {"N": "1"}}
