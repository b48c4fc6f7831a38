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
