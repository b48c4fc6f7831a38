"""The heartbeat store's writes (adapters/heartbeat_store.py), as requests: a
host's post is one UpdateItem of the host's item (the floor of docs/deploy.md:
one item per host per beat), a beat replaces its rank's record, an entry that
is not a beat sets only what it has, a host's first write makes its item
with a record for each of its ranks, and no request or item outgrows
DynamoDB's limits on the biggest host."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from botocore.exceptions import ClientError

from chalicelib.adapters.heartbeat_store import RANKS_PER_ITEM, DynamoHeartbeatStore
from chalicelib.domain.stall import Beat, received

T0 = datetime(2026, 12, 1, 3, 4, 5, 678000, tzinfo=timezone.utc)


class _Connection:
    """Records every request; the first ``missing`` conditional updates fail
    as DynamoDB answers when the host's item does not exist yet."""

    def __init__(self, missing: int = 0) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.missing = missing

    def dispatch(self, operation: str, request: dict) -> dict:
        self.requests.append((operation, request))
        if self.missing and "ConditionExpression" in request:
            self.missing -= 1
            raise ClientError({"Error": {"Code": "ConditionalCheckFailedException"}},
                              operation)
        return {}


def _records(request: dict) -> dict[int, dict]:
    """The rank records a request SETs whole (one by one, or the whole map of
    the item's ranks): rank -> raw map."""
    names, values = request["ExpressionAttributeNames"], request["ExpressionAttributeValues"]
    out = {}
    for clause in request["UpdateExpression"].removeprefix("SET ").split(", "):
        path, value = clause.split(" = ")
        parts = path.split(".")
        if parts == ["#ranks"]:
            out.update((int(rank), record["M"]) for rank, record in values[value]["M"].items())
        elif parts[0] == "#ranks" and len(parts) == 2:
            out[int(names[parts[1]])] = values[value]["M"]
    return out


def _set(request: dict) -> dict[str, dict]:
    """Every field a request SETs in a rank's record, whole or one by one:
    ``<code><rank>`` -> raw value."""
    names, values = request["ExpressionAttributeNames"], request["ExpressionAttributeValues"]
    assert " REMOVE " not in request["UpdateExpression"]
    out = {f"{code}{rank}": v for rank, record in _records(request).items()
           for code, v in record.items()}
    for clause in request["UpdateExpression"].removeprefix("SET ").split(", "):
        path, value = clause.split(" = ")
        parts = path.split(".")
        if parts[0] == "#ranks" and len(parts) == 3:
            out[f"{names[parts[2]]}{names[parts[1]]}"] = values[value]
    return out


def test_a_hosts_post_of_8_ranks_is_one_update_of_its_one_item():
    """A beat of every rank of the item sets the whole map: one clause, no
    condition (it makes the item too), whatever the host's size."""
    conn = _Connection()
    node_of = {r: "n1" if r < 8 else "n2" for r in range(16)}
    beats = [Beat(r, node_of[r], heard_at=T0, step=r) for r in range(8)]
    DynamoHeartbeatStore(conn).record("j", 1, beats, T0, node_of)
    [(op, request)] = conn.requests
    assert op == "UpdateItem" and request["Key"] == {"shard_key": {"S": "j#1#0"},
                                                     "rank": {"N": "0"}}
    assert {k: v for k, v in _set(request).items() if k.startswith("s")} == {
        f"s{r}": {"N": str(r)} for r in range(8)}
    assert "#ranks = :ranks" in request["UpdateExpression"]
    assert "ConditionExpression" not in request


def test_a_post_of_some_of_an_items_ranks_keeps_the_others_records():
    """A rank that did not beat (its process hung) keeps its last record: the
    beats that came set their own records, one clause each."""
    conn = _Connection()
    node_of = {r: "n1" for r in range(8)}
    DynamoHeartbeatStore(conn).record("j", 1, [Beat(r, "n1", heard_at=T0, step=r)
                                               for r in range(7)], T0, node_of)
    [(_, request)] = conn.requests
    assert "#ranks = :ranks" not in request["UpdateExpression"]
    assert sorted(_records(request)) == list(range(7))
    assert request["ConditionExpression"] == "attribute_exists(#ranks)"


def test_a_host_of_more_ranks_holds_them_in_items_of_32_in_rank_order():
    conn = _Connection()
    node_of = {r: "big" if r % 2 else "other" for r in range(140)}  # "big": the odd ranks
    beats = [Beat(r, "big", heard_at=T0, step=r) for r in range(1, 140, 2)]
    DynamoHeartbeatStore(conn).record("j", 1, beats, T0, node_of)
    keys = [int(r["Key"]["rank"]["N"]) for _, r in conn.requests]
    assert keys == [1, 65, 129] and RANKS_PER_ITEM == 32
    written = [sorted(int(k[1:]) for k in _set(r) if k.startswith("s")) for _, r in conn.requests]
    assert written[0] == list(range(1, 65, 2)) and written[-1] == list(range(129, 140, 2))


def _widest_sample(rank: int) -> dict:
    """A heartbeat entry of a silent rank at the schema's every limit, in
    four-byte characters where the schema allows any (a rank's own code
    names its frames)."""
    wide = "\U0001F600"
    return {"rank": rank, "pause": {"reason": wide * 128, "remaining_s": 60},
            "collective": {"seq": 2**63 - 1, "name": wide * 32},
            "proc": {"cpu": 65536, "io_bps": 1e13, "write_bps": 1e13, "state": wide * 8,
                     "procs": 1000000, "gpu_util": 100, "gpu_mem_b": 2**63 - 1,
                     "wchan": wide * 64,
                     "stack": {"frames": [f"{wide * 180} ({wide * 10}:1)"] * 16,
                               "code": wide * 200, "age_s": 3600}}}


def test_no_request_or_item_outgrows_dynamodbs_limits_on_the_biggest_host():
    """Invariant: on a host of 1,024 GPUs whose every rank is silent and sends
    the widest sample the API takes, after a beat of every rank, each
    UpdateExpression stays under DynamoDB's 4 KB and each item (every field
    of its ranks' records, counted as UTF-8 JSON, more than DynamoDB counts)
    under 400 KB."""
    conn = _Connection()
    node_of = {r: "big" for r in range(1024)}
    store = DynamoHeartbeatStore(conn)
    store.record("j", 1, [Beat(r, "big", heard_at=T0, step=2**63 - 1, beat_at=T0,
                               sent_at=T0 + timedelta(days=1)) for r in range(1024)],
                 T0, node_of)
    store.record("j", 1, [received(_widest_sample(r), node_id="big", now=T0)
                          for r in range(1024)], T0, node_of)
    items: dict[str, dict[int, dict]] = {}
    for _, request in conn.requests:
        assert len(request["UpdateExpression"].encode()) < 4096, request["UpdateExpression"]
        records = items.setdefault(request["Key"]["rank"]["N"], {})
        for rank, record in _records(request).items():
            records[rank] = dict(record)
        for field, value in _set(request).items():
            code, rank = field.rstrip("0123456789"), int(field[len(field.rstrip("0123456789")):])
            records.setdefault(rank, {})[code] = value
    assert len(items) == 1024 // RANKS_PER_ITEM
    sizes = [len(json.dumps(records, ensure_ascii=False).encode()) for records in items.values()]
    assert max(sizes) < 400 * 1024, max(sizes)
    assert all(len(r) == RANKS_PER_ITEM for r in items.values())


def test_a_beat_holds_the_receive_time_and_the_sender_offset_and_keys_by_the_hosts_rank():
    conn = _Connection()
    sent = T0 + timedelta(seconds=2.5)
    DynamoHeartbeatStore(conn).record("j", 1, [Beat(600, "n7", heard_at=T0, sent_at=sent)],
                                      T0, {**{r: "n7" for r in range(520, 527)}, 600: "n7"})
    [(_, request)] = conn.requests
    assert request["Key"] == {"shard_key": {"S": "j#1#1"}, "rank": {"N": "520"}}
    written = _set(request)
    assert (written["h600"], written["o600"]) == ({"S": "2026-12-01T03:04:05.678Z"},
                                                  {"N": "2.5"})
    values = request["ExpressionAttributeValues"]
    assert (values[":node_id"], values[":ttl_epoch"]) == (
        {"S": "n7"}, {"N": str(int((T0 + timedelta(days=7)).timestamp()))})
    assert "p600" not in written and 600 in _records(request), \
        "a beat replaces the rank's whole record: its pause ends"


def test_an_entry_that_is_not_a_beat_sets_only_what_it_has():
    conn = _Connection()
    DynamoHeartbeatStore(conn).record("j", 1, [
        Beat(0, "n", paused_until=T0, pause_reason="ckpt"),
        Beat(1, "n", proc={"cpu": 1.0}, sampled_at=T0, active_at=T0)], T0, {0: "n", 1: "n"})
    [(_, request)] = conn.requests
    assert set(_set(request)) == {"p0", "pr0", "c1", "sa1", "a1"}
    assert not _records(request), "the last beat stands"


def test_a_hosts_first_write_makes_its_item_then_writes():
    """A field's path needs its rank's record: the made item holds an empty
    one for each rank of the host, so a sample before any beat lands."""
    conn = _Connection(missing=1)
    DynamoHeartbeatStore(conn).record("j", 1, [Beat(3, "n", proc={"cpu": 1.0}, sampled_at=T0)],
                                      T0, {r: "n" for r in range(2, 6)})
    (_, first), (_, make), (_, again) = conn.requests
    assert make["UpdateExpression"] == "SET #ranks = if_not_exists(#ranks, :empty)"
    assert make["ExpressionAttributeValues"][":empty"] == {
        "M": {str(r): {"M": {}} for r in range(2, 6)}}
    assert first == again and make["Key"] == first["Key"]
    assert set(_set(first)) == {"c3", "sa3"}
