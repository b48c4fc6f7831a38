"""The SQS partial batch protocol (chalicelib/api/batch.py): only the messages
that failed are named, so only they are received again (then dead-lettered)."""
from __future__ import annotations

from chalicelib.api import batch


class Record:
    """What Chalice's SQSRecord offers the protocol: a body and its message id."""

    def __init__(self, message_id: str, body: str) -> None:
        self.body = body
        self._id = message_id

    def to_dict(self) -> dict:
        return {"messageId": self._id, "body": self.body}


def test_a_batch_of_nudges_runs_once_and_names_only_what_is_no_nudge():
    runs = []
    event = [Record("m-1", '{"type":"PLACE"}'), Record("m-2", "not json"),
             Record("m-3", '{"type": "PLACE"}'), Record("m-4", '{"type":"CANCEL"}')]
    assert batch.nudged(event, lambda: runs.append(1)) == {
        "batchItemFailures": [{"itemIdentifier": "m-2"}, {"itemIdentifier": "m-4"}]}
    assert runs == [1]


def test_each_message_fails_alone_and_the_others_stand():
    handled = []

    def handle(body: str) -> None:
        if body == "bad":
            raise RuntimeError("this one")
        handled.append(body)
    event = [Record("m-1", "a"), Record("m-2", "bad"), Record("m-3", "c")]
    assert batch.each(event, handle, "shard") == {
        "batchItemFailures": [{"itemIdentifier": "m-2"}]}
    assert handled == ["a", "c"]
    assert batch.each([], handle, "shard") == {"batchItemFailures": []}
