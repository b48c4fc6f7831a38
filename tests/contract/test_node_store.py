"""The node store's contract (ports.NodeStore), held by tests/fakes.FakeNodeStore
and adapters/node_store.DynamoNodeStore alike."""
from __future__ import annotations

from datetime import timedelta

from chalicelib.domain.clock import iso, utcnow
from chalicelib.domain.nodes import NodeState, cordon_of, failure_entry


def totals(nodes, gpu_type: str | None) -> tuple[int, int]:
    """(GPUs registered, GPUs of the largest node) of a type's fleet (None: all types)."""
    fleet = nodes.fleet_of(gpu_type)
    return fleet.gpus, fleet.largest_node


def test_a_new_node_is_ready_with_every_gpu_free_and_counted_in_the_fleet(ports):
    gpu = ports.gpu_type()
    node = ports.node(0, gpus=8)
    assert (node.state, node.gpus, node.gpus_free, node.gpu_type, node.labels, node.address) == (
        NodeState.READY, 8, 8, gpu, {"zone": "a"}, "10.0.0.0")
    assert ports.nodes.get(node.node_id) == node
    assert ports.nodes.get(ports.node_id(9)) is None
    ports.node(1, gpus=4)
    summary = ports.nodes.fleet_of(gpu)
    assert (summary.gpus, summary.largest_node) == (12, 8)
    assert summary.room_version >= 2 and summary.room_at is not None
    assert ports.nodes.fleet_of(ports.gpu_type(1)).gpus == 0, "another type's"


def test_a_repeated_registration_only_refreshes_the_node(ports):
    first = ports.node(0)
    version = ports.nodes.fleet_of(ports.gpu_type()).room_version
    later = utcnow() + timedelta(seconds=5)
    again = ports.node(0, now=later)
    assert again.last_seen_at == later and again.registered_at == first.registered_at
    assert (again.gpus, again.gpus_free) == (8, 8)
    assert ports.nodes.fleet_of(ports.gpu_type()).gpus == 8
    assert ports.nodes.fleet_of(ports.gpu_type()).room_version == version, \
        "nothing changed: no room appeared"


def test_a_node_that_grows_frees_the_difference_and_moves_the_fleet(ports):
    ports.node(0, gpus=4)
    job = ports.created(ranks=2)
    ports.place(job, {ports.node_id(0): [0, 1]})
    grown = ports.node(0, gpus=8)
    assert (grown.gpus, grown.gpus_free) == (8, 6), "what the attempt holds stays held"
    assert totals(ports.nodes, ports.gpu_type()) == (8, 8)


def test_a_node_that_changes_type_moves_between_the_types_summaries(ports):
    ports.node(0, gpus=4)
    moved = ports.node(0, gpus=4, gpu_type=ports.gpu_type(1))
    assert moved.gpu_type == ports.gpu_type(1)
    assert ports.nodes.fleet_of(ports.gpu_type()).gpus == 0
    assert totals(ports.nodes, ports.gpu_type(1)) == (4, 4)


def test_ready_pages_list_ready_nodes_with_room_most_free_first(ports):
    ports.node(0, gpus=2)
    ports.node(1, gpus=8)
    ports.node(2, gpus=4)
    ports.node(3, gpus=1)
    pages = list(ports.nodes.ready_pages(ports.gpu_type(), 2))
    listed = [n.node_id for page in pages for n in page]
    assert listed == [ports.node_id(1), ports.node_id(2), ports.node_id(0)]
    assert list(ports.nodes.ready_pages(ports.gpu_type(7), 1)) == [], "no empty pages"


def test_a_node_marked_down_takes_no_placements_until_it_calls_in_again(ports):
    node = ports.node(0)
    stale = ports.node(0, now=node.last_seen_at + timedelta(seconds=1))
    assert ports.nodes.mark_down(node) is False, "it called in since it was read"
    assert ports.nodes.mark_down(stale) is True
    assert ports.nodes.get(node.node_id).state is NodeState.DOWN
    assert [n.node_id for p in ports.nodes.ready_pages(ports.gpu_type(), 1) for n in p] == []
    back = ports.node(0, now=stale.last_seen_at + timedelta(seconds=60))
    assert back.state is NodeState.READY
    assert [n.node_id for p in ports.nodes.ready_pages(ports.gpu_type(), 1) for n in p] == [
        node.node_id]


def test_an_attempt_lost_with_its_node_keeps_its_gpus_until_released(ports):
    job, attempt = ports.running()
    node_id = ports.node_id(0)
    key = f"{job.job_id}#1"
    assert ports.nodes.attempts_on(node_id) == [(job.job_id, 1)]
    assert ports.nodes.mark_lost(node_id, key) is True
    node = ports.nodes.get(node_id)
    assert (node.lost, node.live_attempts, node.gpus_free) == (frozenset({key}), [], 6)
    assert ports.nodes.mark_lost(node_id, f"{job.job_id}#2") is False, "it holds none here"
    ports.store.release(attempt, node_id)
    node = ports.nodes.get(node_id)
    assert (node.lost, node.attempts, node.gpus_free) == (frozenset(), frozenset(), 8)
    assert ports.nodes.attempts_on(node_id) == []
    assert ports.nodes.attempts_on(ports.node_id(9)) == []


def _ready_ids(ports) -> list[str]:
    return [n.node_id for p in ports.nodes.ready_pages(ports.gpu_type(), 1) for n in p]


def test_a_cordoned_node_leaves_the_ready_pages_and_uncordoned_comes_back_with_room(ports):
    node = ports.node(0)
    cordon = cordon_of("bad ECC", "ops", iso(utcnow()))
    cordoned = ports.nodes.cordon(node.node_id, cordon, utcnow())
    assert (cordoned.state, cordoned.cordon) == (NodeState.DRAINING, cordon)
    assert ports.nodes.get(node.node_id) == cordoned
    assert _ready_ids(ports) == []
    again = ports.node(0, now=utcnow() + timedelta(seconds=1))
    assert (again.state, again.cordon) == (NodeState.DRAINING, cordon), "a call-in keeps it"
    assert _ready_ids(ports) == []
    version = ports.nodes.fleet_of(ports.gpu_type()).room_version
    back = ports.nodes.uncordon(node.node_id, utcnow())
    assert (back.state, back.cordon) == (NodeState.READY, None)
    assert _ready_ids(ports) == [node.node_id]
    assert ports.nodes.fleet_of(ports.gpu_type()).room_version > version, "room appeared"
    assert ports.nodes.uncordon(node.node_id, utcnow()) == back, "no cordon: nothing to do"
    assert ports.nodes.cordon(ports.node_id(9), cordon, utcnow()) is None
    assert ports.nodes.uncordon(ports.node_id(9), utcnow()) is None


def test_a_cordon_holds_across_down_and_back(ports):
    node = ports.node(0)
    assert ports.nodes.mark_down(node)
    cordon = cordon_of("reboot", "ops", iso(utcnow()))
    assert ports.nodes.cordon(node.node_id, cordon, utcnow()).state is NodeState.DOWN
    back = ports.node(0, now=node.last_seen_at + timedelta(seconds=60))
    assert (back.state, back.cordon) == (NodeState.DRAINING, cordon)
    assert _ready_ids(ports) == []


def test_recent_failures_are_kept_and_old_ones_dropped(ports):
    node = ports.node(0)
    t0 = utcnow()
    at = [iso(t0 + timedelta(minutes=m)) for m in (0, 30, 90)]
    first = failure_entry(at[0], "j#1", "acme")
    assert ports.nodes.record_failure(node.node_id, first, at[0]) == [first]
    assert len(ports.nodes.record_failure(node.node_id, failure_entry(at[1], "j#2", "acme"),
                                          at[0])) == 2
    since = iso(t0 + timedelta(minutes=31))
    last = failure_entry(at[2], "j#3", "acme")
    assert ports.nodes.record_failure(node.node_id, last, since) == [last]
    assert ports.nodes.get(node.node_id).failures == {last}
    assert ports.nodes.record_failure(ports.node_id(9), failure_entry(at[0], "j#1", "acme"),
                                      at[0]) == []


# -- whole tables --------------------------------------------------------------
def test_all_lists_every_node_by_id(whole):
    for n in (2, 0, 1):
        whole.node(n)
    assert [n.node_id for n in whole.nodes.all()] == [whole.node_id(n) for n in range(3)]


def test_silent_nodes_are_those_not_down_and_not_heard_since(whole):
    now = utcnow()
    quiet = whole.node(0, now=now - timedelta(seconds=120))
    whole.node(1, now=now)
    gone = whole.node(2, now=now - timedelta(seconds=300))
    whole.nodes.mark_down(gone)
    assert [n.node_id for n in whole.nodes.silent_since(now - timedelta(seconds=60))] == [
        quiet.node_id]


def test_silent_nodes_are_listed_by_id_whatever_the_order_they_came_in(whole):
    """Both stores list a whole-table read in one order (the real one scans)."""
    then = utcnow() - timedelta(seconds=120)
    for n in (2, 0, 1):
        whole.node(n, now=then)
    assert [n.node_id for n in whole.nodes.silent_since(utcnow())] == [
        whole.node_id(n) for n in range(3)]


def test_the_all_types_summary_counts_every_type(whole):
    whole.node(0, gpus=8)
    whole.node(1, gpus=2, gpu_type=whole.gpu_type(1))
    assert totals(whole.nodes, None) == (10, 8)
    listed = [n.node_id for p in whole.nodes.ready_pages(None, 1) for n in p]
    assert listed == [whole.node_id(0), whole.node_id(1)]


def test_down_nodes_holding_attempts_are_listed_until_released(whole):
    job, attempt = whole.running()
    holder = whole.nodes.get(whole.node_id(0))
    idle = whole.node(1)
    assert whole.nodes.down_holding_attempts() == []
    whole.nodes.mark_down(holder)
    whole.nodes.mark_down(idle)
    assert [n.node_id for n in whole.nodes.down_holding_attempts()] == [holder.node_id]
    whole.store.release(attempt, holder.node_id)
    assert whole.nodes.down_holding_attempts() == []
