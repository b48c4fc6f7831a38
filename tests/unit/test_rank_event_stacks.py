"""domain/events.rank_event: a stop carries the ranks' stacks, by rank."""
from datetime import datetime, timezone

from chalicelib.domain.events import rank_event

AT = datetime(2026, 1, 1, tzinfo=timezone.utc)
STACKS = [{"rank": 3, "frames": ["forward (train.py:88)", "<module> (train.py:120)"]},
          {"rank": 1, "where": "w.py:10 in <module> → time.sleep(3600)",
           "frames": ["<module> (w.py:10)"]}]


def test_a_stop_carries_its_stacks_by_rank_with_a_where_for_each():
    """Invariant: sorted by rank; a stack the report gave no ``where`` gets
    domain/stacks.where's line of its frames."""
    e = rank_event("stopped", AT, 1, [1, 3], None, "n1", STACKS)
    assert e["stacks"] == [
        {"rank": 1, "where": "w.py:10 in <module> → time.sleep(3600)",
         "frames": ["<module> (w.py:10)"]},
        {"rank": 3, "where": "train.py:88 in forward",
         "frames": ["forward (train.py:88)", "<module> (train.py:120)"]}]


def test_only_a_stop_carries_stacks_and_none_means_no_member():
    """Invariant: started and exited events never carry stacks; a stop without
    any has no ``stacks`` member at all (events stored before this read alike)."""
    assert "stacks" not in rank_event("exited", AT, 1, [1], 1, "n1", STACKS)
    assert "stacks" not in rank_event("started", AT, 1, [1], None, "n1", STACKS)
    assert "stacks" not in rank_event("stopped", AT, 1, [1], None, "n1", None)
    assert "stacks" not in rank_event("stopped", AT, 1, [1], None, "n1", [])


def test_ranks_lost_with_their_node_read_as_such_not_as_an_exit_code():
    """Invariant: the LOST code (-1000) is not an exit status, and the reason
    says what happened; the event still records the code, as stored before."""
    from chalicelib.domain.attempts import LOST
    e = rank_event("exited", AT, 2, [3, 2], LOST, "local-2")
    assert e["reason"] == "ranks 2-3 lost with node local-2"
    assert e["exit_code"] == LOST and e["ranks"] == [[2, 3]] and e["node_id"] == "local-2"
    assert rank_event("exited", AT, 2, [1], LOST)["reason"] == "rank 1 lost with their node"
    assert "-1000" not in rank_event("exited", AT, 2, [1], LOST, "n1")["reason"]


def test_a_real_exit_still_says_its_code():
    assert rank_event("exited", AT, 1, [0, 1], 137, "n1")["reason"] == \
        "ranks 0-1 exited with code 137"
    assert rank_event("exited", AT, 1, [4], 1, "n1")["reason"] == "rank 4 exited with code 1"
