"""The scan's read of an attempt's heartbeats (adapters/heartbeat_store.py):
raw items through the codec, each a host's ranks, every page of every shard,
strongly consistent."""
from __future__ import annotations

from datetime import datetime, timezone

from chalicelib.adapters.heartbeat_store import SHARD_RANKS, DynamoHeartbeatStore
from chalicelib.adapters.models import HeartbeatModel

T0 = datetime(2026, 12, 1, 3, 4, 5, 678000, tzinfo=timezone.utc)


def _item(rank: int, proc: dict | None = None) -> dict:
    """A host holding one rank (here: each rank its own host, so the pages cut
    between hosts), its record as the store writes it."""
    record = {"h": "2026-12-01T03:04:05.678Z", "s": rank}
    if proc is not None:
        record["c"] = proc
    ranks = {str(rank): record}
    return HeartbeatModel(shard_key=f"j#1#{rank // SHARD_RANKS}", rank=rank, node_id="n",
                          ranks=ranks).serialize()


class _Pages:
    """A connection whose Query answers each shard in pages of two items."""

    def __init__(self, items: list[dict]) -> None:
        self.items, self.requests = items, []

    def dispatch(self, operation: str, request: dict) -> dict:
        self.requests.append((operation, request))
        key = request["ExpressionAttributeValues"][":key"]["S"]
        mine = [i for i in self.items if i["shard_key"]["S"] == key]
        start = request.get("ExclusiveStartKey")
        at = 0 if start is None else next(
            n for n, i in enumerate(mine) if i["rank"] == start["rank"]) + 1
        page = mine[at:at + 2]
        more = at + 2 < len(mine)
        return {"Items": page, **({"LastEvaluatedKey": {
            "shard_key": page[-1]["shard_key"], "rank": page[-1]["rank"]}} if more else {})}


def test_every_page_of_every_shard_is_read_strongly_consistent():
    """A shard past DynamoDB's 1 MB page comes in several pages: a rank on a
    later page missed would be judged never heard, a false stall."""
    ranks = [0, 1, 2, 3, 4, SHARD_RANKS, SHARD_RANKS + 1]
    world = SHARD_RANKS + 3
    conn = _Pages([_item(r, proc={"cpu": 0.5} if r == 4 else None) for r in ranks])
    beats = DynamoHeartbeatStore(conn).read("j", 1, {r: f"n{r % 2}" for r in range(world)})
    assert [b.rank for b in beats if b.heard_at is not None] == ranks
    assert all(b.heard_at == T0 for b in beats if b.rank in ranks)
    assert [b.step for b in beats if b.step is not None] == ranks
    assert beats[4].proc == {"cpu": 0.5} and beats[3].proc is None
    assert beats[SHARD_RANKS + 2].heard_at is None and beats[7].node_id == "n1"
    assert all(op == "Query" and r["ConsistentRead"] is True for op, r in conn.requests)
    assert len(conn.requests) == 3 + 1, "three pages of shard 0, one of shard 1"


def test_a_rank_held_by_an_older_item_too_is_read_as_its_later_beat_says():
    """Invariant: an attempt that beat under items of 8 ranks and, after a
    deploy, under items of 32 (the item of ranks 0-31 shares its key with the
    old one of 0-7, those of 8-15, ... stay) reads each rank's latest record:
    the stale items read last must not make ranks 8-31 look silent."""
    old = {str(r): {"h": "2026-12-01T03:00:00.000Z", "s": 1} for r in range(8, 16)}
    new = {str(r): {"h": "2026-12-01T03:04:05.678Z", "s": 9} for r in range(32)}
    items = [HeartbeatModel(shard_key="j#1#0", rank=first, node_id="n", ranks=ranks).serialize()
             for first, ranks in ((0, new), (8, old))]
    beats = DynamoHeartbeatStore(_Pages(items)).read("j", 1, {r: "n" for r in range(32)})
    assert {b.heard_at for b in beats} == {T0} and {b.step for b in beats} == {9}
