"""The NodeStore port on DynamoDB: node registry, fleet totals, READY candidates."""
from __future__ import annotations

from datetime import datetime
from typing import Iterator

from pynamodb.connection import Connection
from pynamodb.exceptions import DoesNotExist, TransactWriteError, UpdateError
from pynamodb.expressions.update import Action

from ..domain.clock import iso, parse_iso
from ..domain.errors import ServiceUnavailable
from ..domain.nodes import Node, NodeState
from ..service.ports import FleetSummary
from .dynamo_errors import lost_condition, tx_lost
from .fleet import ALL_TYPES, room_bump, room_types
from .job_store import new_transaction
from .models import FleetModel, NodeModel

#: nodes read per query page while looking for room
CANDIDATE_PAGE = 50


def node_from_model(m: NodeModel) -> Node:
    return Node(node_id=m.node_id, gpus=int(m.gpus), gpus_free=int(m.gpus_free),
                gpu_type=m.gpu_type, state=NodeState(m.state),
                inbox_queue_url=m.inbox_queue_url, last_seen_at=parse_iso(m.last_seen_at),
                registered_at=parse_iso(m.registered_at), labels=m.labels or {},
                address=m.address or m.node_id, isolation=m.isolation or "none",
                attempts=frozenset(m.attempts or ()), lost=frozenset(m.lost or ()))


def _t(value: str | None) -> datetime | None:
    return parse_iso(value) if value else None


class NodeRaced(Exception):
    """The node changed between reading and writing it; read it again."""


class DynamoNodeStore:
    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def get(self, node_id: str) -> Node | None:
        try:
            return node_from_model(NodeModel.get(node_id, consistent_read=True))
        except DoesNotExist:
            return None

    def all(self) -> list[Node]:
        return sorted((node_from_model(m) for m in NodeModel.scan()), key=lambda n: n.node_id)

    def register(self, node_id: str, *, gpus: int, gpu_type: str, labels: dict,
                 address: str, inbox_queue_url: str, now: datetime,
                 current: Node | None, isolation: str = "none") -> Node:
        """Create or update a node; a repeat only refreshes ``last_seen_at``.

        ``current`` is the node as the caller just read it (None: not
        registered). Capacity changes move ``gpus_free`` by the same delta, and
        the fleet totals with them, in one transaction conditioned on that
        read; only a lost race reads the node again.
        """
        for attempt in range(5):
            if attempt:
                current = self.get(node_id)
            try:
                return self._register(current, node_id, gpus, gpu_type, labels, address,
                                      inbox_queue_url, now, isolation)
            except NodeRaced:
                continue
        raise ServiceUnavailable(f"node {node_id} is being registered concurrently; retry",
                                 headers={"Retry-After": "1"})

    def _register(self, current: Node | None, node_id, gpus, gpu_type, labels, address, url,
                  now, isolation="none") -> Node:
        ready = {"ready_type": gpu_type, "ready_any": "1"}
        with_fleet: list[tuple[str, int]] = []
        if current is None:
            item = NodeModel(node_id, gpus=gpus, gpus_free=gpus, gpu_type=gpu_type,
                             state=NodeState.READY.value, address=address, labels=labels,
                             inbox_queue_url=url, last_seen_at=iso(now),
                             registered_at=iso(now), isolation=isolation, **ready)
            with_fleet = [(gpu_type, gpus), (ALL_TYPES, gpus)]
            try:
                with new_transaction(self._conn) as tx:
                    tx.save(item, condition=NodeModel.node_id.does_not_exist())
                    for t, delta in with_fleet:
                        tx.update(FleetModel(t), actions=[FleetModel.gpus.add(delta),
                                                          *room_bump(iso(now))])
            except TransactWriteError as e:
                if tx_lost(e):
                    raise NodeRaced(node_id) from None
                raise
            self._raise_largest(gpu_type, gpus)
            return node_from_model(item)

        old_gpus, old_type, old_state = current.gpus, current.gpu_type, current.state
        delta = gpus - old_gpus
        actions: list[Action] = [
            NodeModel.last_seen_at.set(iso(now)), NodeModel.labels.set(labels),
            NodeModel.address.set(address), NodeModel.inbox_queue_url.set(url),
            NodeModel.isolation.set(isolation)]
        if old_state is NodeState.DOWN:
            # back from the dead: its attempts were failed and their GPUs returned
            actions += [NodeModel.state.set(NodeState.READY.value)]
        if delta or gpu_type != old_type:
            actions += [NodeModel.gpus.set(gpus), NodeModel.gpus_free.add(delta),
                        NodeModel.gpu_type.set(gpu_type)]
            deltas = {old_type: -old_gpus, ALL_TYPES: delta}
            deltas[gpu_type] = deltas.get(gpu_type, 0) + gpus
            with_fleet = [(t, d) for t, d in deltas.items() if d]
        if old_state in (NodeState.READY, NodeState.DOWN):  # READY from here on
            actions += [NodeModel.ready_type.set(gpu_type), NodeModel.ready_any.set("1")]
        if with_fleet or old_state is NodeState.DOWN:
            # room may have appeared: grown, retyped or back from DOWN
            with_fleet += [(t, 0) for t in room_types(gpu_type)
                           if t not in dict(with_fleet)]
        condition = (NodeModel.gpus == old_gpus) & (NodeModel.state == old_state.value)
        model = NodeModel(node_id)
        try:
            if with_fleet:
                with new_transaction(self._conn) as tx:
                    tx.update(model, actions=actions, condition=condition)
                    for t, d in with_fleet:
                        bump = room_bump(iso(now)) if t in room_types(gpu_type) else []
                        tx.update(FleetModel(t), actions=[
                            *([FleetModel.gpus.add(d)] if d else []), *bump])
                model.refresh(consistent_read=True)
                self._raise_largest(gpu_type, gpus)
            else:
                model.update(actions=actions, condition=condition)
        except (UpdateError, TransactWriteError) as e:
            if (isinstance(e, UpdateError) and lost_condition(e)) or \
                    (isinstance(e, TransactWriteError) and tx_lost(e)):
                raise NodeRaced(node_id) from None
            raise
        return node_from_model(model)

    def _raise_largest(self, gpu_type: str, gpus: int) -> None:
        for t in (gpu_type, ALL_TYPES):
            try:
                FleetModel(t).update(
                    actions=[FleetModel.largest_node.set(gpus)],
                    condition=FleetModel.largest_node.does_not_exist()
                    | (FleetModel.largest_node < gpus))
            except UpdateError as e:
                if not lost_condition(e):
                    raise

    def fleet(self, gpu_type: str | None) -> tuple[int, int]:
        """(GPUs registered, GPUs of the largest node) for a type, or all types."""
        f = self.fleet_summary(gpu_type)
        return f.gpus, f.largest_node

    def fleet_summary(self, gpu_type: str | None) -> FleetSummary:
        """The type's capacity summary, one strongly consistent read."""
        try:
            f = FleetModel.get(gpu_type or ALL_TYPES, consistent_read=True)
        except DoesNotExist:
            return FleetSummary(0, 0, 0, None)
        return FleetSummary(int(f.gpus or 0), int(f.largest_node or 0),
                            int(f.room_version or 0), _t(f.room_at))

    def ready_pages(self, gpu_type: str | None, min_free: int) -> Iterator[list[Node]]:
        """READY nodes with at least ``min_free`` GPUs, most free first, a page at a time.

        The index is eventually consistent: the conditional writes of a
        reservation are what decide, not this read.
        """
        if gpu_type:
            query = NodeModel.ready_by_type.query(
                gpu_type, NodeModel.gpus_free >= min_free, scan_index_forward=False,
                page_size=CANDIDATE_PAGE)
        else:
            query = NodeModel.ready_any_index.query(
                "1", NodeModel.gpus_free >= min_free, scan_index_forward=False,
                page_size=CANDIDATE_PAGE)
        pages = query.page_iter
        for raw in pages:
            yield [node_from_model(NodeModel.from_raw_data(i)) for i in raw["Items"]]

    def silent_since(self, before: datetime) -> list[Node]:
        """Nodes not DOWN that have not called in since ``before``."""
        return [node_from_model(m) for m in NodeModel.scan(
            (NodeModel.last_seen_at < iso(before)) & (NodeModel.state != NodeState.DOWN.value))]

    def down_holding_attempts(self) -> list[Node]:
        """DOWN nodes on which some attempt still holds GPUs."""
        return [node_from_model(m) for m in NodeModel.scan(
            (NodeModel.state == NodeState.DOWN.value) & NodeModel.attempts.exists(),
            consistent_read=True)]

    def mark_down(self, node: Node) -> bool:
        """DOWN, if it still has not called in since it was read; False if it has."""
        try:
            NodeModel(node.node_id).update(
                actions=[NodeModel.state.set(NodeState.DOWN.value),
                         NodeModel.ready_type.remove(), NodeModel.ready_any.remove()],
                condition=NodeModel.last_seen_at == iso(node.last_seen_at))
            return True
        except UpdateError as e:
            if lost_condition(e):
                return False
            raise

    def mark_lost(self, node_id: str, key: str) -> bool:
        """Record that the attempt ``key`` ("job_id#attempt") was lost with the
        node: it keeps its GPUs until the node's agent confirms its ranks gone.
        False if it holds none here any more (its ranks were all confirmed)."""
        try:
            NodeModel(node_id).update(actions=[NodeModel.lost.add({key})],
                                      condition=NodeModel.attempts.contains(key))
            return True
        except UpdateError as e:
            if lost_condition(e):
                return False
            raise

    def attempts_on(self, node_id: str) -> list[tuple[str, int]]:
        try:
            m = NodeModel.get(node_id, consistent_read=True, attributes_to_get=["attempts"])
        except DoesNotExist:
            return []
        out = []
        for key in m.attempts or ():
            job_id, _, attempt = key.rpartition("#")
            out.append((job_id, int(attempt)))
        return sorted(out)

