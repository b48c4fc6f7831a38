"""The feed's pure rules (domain/feed.py): which story events it tells and
how, and ids that sort as the feed does, whatever the sequencers' clocks."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st

from chalicelib.domain import feed

T = "2026-12-07T10:00:00.000Z"


def test_the_feed_tells_job_moves_retries_and_stalls_not_rank_reports():
    assert all(feed.told(k) for k in ("created", "placed#1", "started#2", "retried#1",
                                      "finished", "stalled#abc"))
    assert not any(feed.told(k) for k in ("waiting#1#x", "cancel_requested", "recovered#a",
                                          "rank_exited#3#h", "dependencies_met"))


def test_each_story_event_becomes_the_contracts_event():
    assert feed.tell("j", "created", {"type": "created", "time": T, "reason": "submitted"}) == [
        {"type": "job.created", "time": T, "job_id": "j", "data": {"reason": "submitted"}}]
    [placed] = feed.tell("j", "placed#1", {"type": "placed", "time": T, "attempt": 1,
                                           "reason": "placed on 2 nodes",
                                           "nodes": {"b": "2-3", "a": "0-1"}})
    assert placed["data"] == {"from": "PENDING", "to": "SCHEDULED", "attempt": 1,
                              "reason": "placed on 2 nodes", "nodes": ["a", "b"]}
    retried = feed.tell("j", "retried#1", {"type": "retried", "time": T, "attempt": 1,
                                           "next_attempt": 2, "reason": "rank_failed",
                                           "from": "RUNNING", "rank": 3})
    assert [e["type"] for e in retried] == ["job.retried", "job.state_changed"]
    assert retried[1]["data"]["to"] == "PENDING" and retried[1]["data"]["from"] == "RUNNING"
    [done] = feed.tell("j", "finished", {"type": "finished", "time": T, "attempt": 2,
                                         "state": "FAILED", "reason": "rank_failed",
                                         "exit_code": 1, "rank": 3, "node_id": "n2",
                                         "from": "RUNNING"})
    assert done["data"]["exit"] == {"exit_code": 1, "rank": 3, "node_id": "n2"}
    assert (done["data"]["from"], done["data"]["to"]) == ("RUNNING", "FAILED")
    [stalled] = feed.tell("j", "stalled#i1", {"type": "stalled", "time": T, "attempt": 1,
                                              "reason": "rank 3 on n2 is stopped", "rank": 3,
                                              "node_id": "n2", "by": "stack"})
    assert stalled["data"] == {"attempt": 1, "rank": 3, "node_id": "n2",
                               "text": "rank 3 on n2 is stopped", "by": "stack"}
    with pytest.raises(ValueError):
        feed.tell("j", "waiting#1#x", {"type": "waiting", "time": T})


def test_a_slow_episode_is_one_rank_slow_event():
    assert feed.told("rank_slow#1#2")
    text = "rank 1 on local-2 is slow: its steps take 2.4× the fastest rank's"
    assert feed.tell("j", "rank_slow#1#2", {
        "type": "rank_slow", "time": T, "attempt": 1, "reason": text, "rank": 1,
        "node_id": "local-2", "score": 0.417, "step_time_s": 1.2, "fastest_s": 0.5,
        "episode": 2}) == [
        {"type": "job.rank_slow", "time": T, "job_id": "j",
         "data": {"attempt": 1, "rank": 1, "node_id": "local-2", "score": 0.417,
                  "text": text}}]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 50)), min_size=1, max_size=8),
       st.integers(0, 2**20 - 1))
def test_ids_grow_as_numbers_do_even_when_a_sequencers_clock_is_behind(runs, tag):
    """Invariant: within a tenant, a later number has a larger id, whatever
    time each sequencer's clock said (the head's ms is the floor)."""
    seq, ms, ids = 0, 0, []
    for clock_ms, count in runs:
        now = datetime.fromtimestamp(clock_ms / 1000, tz=timezone.utc)
        events = [{"type": "job.created", "time": T, "job_id": "j", "data": {}}] * count
        out, ms = feed.numbered(events, tenant_tag=tag, head_seq=seq, head_ms=ms, now=now)
        ids += [e["id"] for _, e in out]
        seq = out[-1][0]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(i) == 26 and i.startswith("evt_") for i in ids)


def test_a_cursor_filter_key_names_both_filters():
    assert feed.filter_key(None, None) != feed.filter_key("job.created", None) != \
        feed.filter_key(None, "job_1")


def test_a_huge_placement_names_its_first_hundred_nodes_and_counts_them_all():
    """An EventBridge event is at most 256 KB: a 65,536-rank job's 8,192
    nodes are counted, not listed."""
    nodes = {f"node-{i:05d}": "0-7" for i in range(8192)}
    [e] = feed.tell("j", "placed#1", {"type": "placed", "time": T, "attempt": 1, "nodes": nodes})
    assert len(e["data"]["nodes"]) == feed.NODES_SHOWN and e["data"]["nodes_count"] == 8192
