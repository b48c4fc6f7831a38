"""Pure gang planning: whole gangs, fewest nodes, contiguous ranks."""
from hypothesis import given, strategies as st

from chalicelib.domain.placement import (
    MAX_NODES_PER_GANG,
    Candidate,
    never_fits,
    new_master_port,
    plan,
    queue_key,
)


def test_ranks_fill_the_most_free_nodes_first_contiguously():
    p = plan(6, 2, [Candidate("a", 8), Candidate("b", 4), Candidate("c", 8)])
    assert p.ranks_by_node == {"a": [0, 1, 2, 3], "b": [4, 5]}
    assert p.gpus_by_node() == {"a": 8, "b": 4}


def test_no_partial_gang():
    assert plan(5, 2, [Candidate("a", 4), Candidate("b", 4)]) is None


def test_planning_stops_reading_once_the_gang_fits():
    read = []

    def lazy():
        for i in range(1000):
            read.append(i)
            yield Candidate(f"n{i}", 8)

    assert plan(16, 1, lazy()) is not None
    assert len(read) == 2


@given(st.integers(1, 64), st.integers(1, 8),
       st.lists(st.integers(0, 16), min_size=0, max_size=30))
def test_a_plan_places_every_rank_once_within_each_nodes_room(ranks, g, frees):
    cands = [Candidate(f"n{i}", f) for i, f in enumerate(frees)]
    p = plan(ranks, g, cands)
    fits = sum(f // g for f in frees)
    if p is None:
        assert fits < ranks or len([f for f in frees if f >= g]) > MAX_NODES_PER_GANG
        return
    placed = sorted(r for rs in p.ranks_by_node.values() for r in rs)
    assert placed == list(range(ranks))
    room = {c.node_id: c.gpus_free for c in cands}
    assert all(len(rs) * g <= room[n] for n, rs in p.ranks_by_node.items())


def test_never_fits_names_the_reason():
    assert "largest" in never_fits(1, 16, 64, 8, "h100")
    assert "needs 72" in never_fits(9, 8, 64, 8, "h100")
    assert never_fits(8, 8, 64, 8, "h100") is None
    assert "span" in never_fits(MAX_NODES_PER_GANG + 1, 8, 10**6, 8, None)


def test_queue_key_orders_by_priority_then_age():
    keys = [queue_key(0, "job_B"), queue_key(5, "job_C"), queue_key(5, "job_A"),
            queue_key(-3, "job_0")]
    assert sorted(keys) == [queue_key(5, "job_A"), queue_key(5, "job_C"),
                            queue_key(0, "job_B"), queue_key(-3, "job_0")]


def test_a_new_attempts_rendezvous_port_is_drawn_over_the_whole_range():
    """Invariant: the port is in 20000..32767, both ends included, and drawn
    from the source of randomness, not from anything a tenant can read."""
    assert new_master_port(lambda n: 0) == 20000
    assert new_master_port(lambda n: n - 1) == 32767
    drawn = {new_master_port() for _ in range(64)}
    assert all(20000 <= p <= 32767 for p in drawn) and len(drawn) > 32


# -- issue 9: fairness between tenants --------------------------------------------
from chalicelib.domain.placement import fair_order  # noqa: E402


def _run(queues, usage, fits):
    """Drive fair_order; ``fits(job)`` says whether a job is placed."""
    order, out, sent = fair_order(queues, usage, lambda j: j[1]), [], None
    while True:
        try:
            job = order.send(sent)
        except StopIteration:
            return out
        out.append(job[0])
        sent = job[1] if fits(job) else 0


def test_a_flooding_tenant_at_top_priority_does_not_go_before_a_small_job():
    queues = {"b": [(f"b{i}", 16) for i in range(200)], "a": [("a0", 1)]}
    assert _run(queues, {}, lambda j: False)[0] == "a0"


def test_usage_decides_between_tenants_and_grows_with_each_placement():
    queues = {"a": [("a0", 2), ("a1", 2), ("a2", 2)], "b": [("b0", 2), ("b1", 2)]}
    assert _run(queues, {"a": 4}, lambda j: True) == ["b0", "b1", "a0", "a1", "a2"]
    assert _run(queues, {}, lambda j: True) == ["a0", "b0", "a1", "b1", "a2"]


def test_a_tenants_own_order_is_kept():
    queues = {"a": [("hi", 1), ("lo", 1)], "b": [("x", 1)]}
    order = _run(queues, {}, lambda j: True)
    assert order.index("hi") < order.index("lo")


def test_a_waiting_mark_holds_while_the_summary_stands_and_not_past_the_recheck_bound():
    from datetime import datetime, timedelta, timezone

    from chalicelib.domain.placement import INDEX_LAG_S, RECHECK_S, still_waiting, waiting_mark

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    mark = waiting_mark(7, now - timedelta(seconds=INDEX_LAG_S + 1), now)
    assert still_waiting(mark, 7, now + timedelta(seconds=RECHECK_S - 1))
    assert not still_waiting(mark, 8, now), "room appeared since"
    assert not still_waiting(mark, 7, now + timedelta(seconds=RECHECK_S))
    assert waiting_mark(7, now - timedelta(seconds=INDEX_LAG_S - 1), now) is None, \
        "room too recent for the index read to be trusted"
    assert not still_waiting(None, 7, now) and not still_waiting("junk", 7, now)
