"""The NodeStore port on DynamoDB: node registry, fleet totals, READY candidates.

Every request is built by dynamo.Table (NODES here, adapters/fleet.FLEET for
the summaries) and sent by dynamo.Dynamo; the models are the schema only.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterator

from pynamodb.connection import Connection
from pynamodb.exceptions import TransactWriteError

from ..domain.clock import iso, parse_iso
from ..domain.errors import ServiceUnavailable
from ..domain.fleet import LINE_KEY, Fleet, fleet_key
from ..domain.nodes import Node, NodeState, failures_since, fresh_call_in
from ..domain.queue import Line
from .dynamo import Changes, ConditionFailed, Dynamo, Table
from .dynamo_errors import tx_lost
from .fleet import (
    ALL_TYPES,
    FLEET,
    fleet_from_item,
    fleet_update,
    room_types,
    room_update,
    swept_update,
)
from .models import NodeModel

#: nodes read per query page while looking for room
CANDIDATE_PAGE = 50

NODES = Table(NodeModel)
_READY_BY_TYPE = NodeModel.ready_by_type.Meta.index_name
_READY_ANY = NodeModel.ready_any_index.Meta.index_name
#: ready_any's one partition: every READY node. Written only when a node
#: enters or leaves READY or its free GPUs change (not by a call-in that only
#: proves liveness): a few writes a second at 100,000 GPUs, so one key is
#: enough (docs/deploy.md, "Node call-ins at 100,000 GPUs")
_ANY = "1"
#: what a placement candidate (candidate_from_item) has for the times the
#: indexes do not project
_UNPROJECTED_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)
_READY, _DOWN, _DRAINING = (NodeState.READY.value, NodeState.DOWN.value,
                            NodeState.DRAINING.value)
_TRIES = 5


def _cordon_is(cordoned: bool) -> str:
    """The condition that the node's cordon is (or is not) still as read."""
    return "attribute_exists(#cordon)" if cordoned else "attribute_not_exists(#cordon)"


def candidate_from_item(item: dict) -> Node:
    """A READY node as the placement indexes project it (models.READY_PROJECTED):
    what the placer reads. ``last_seen_at`` and ``registered_at`` are not
    projected (the epoch here), nor labels, isolation or attempts: read the
    node (get) for those."""
    v = NODES.values(item)
    return Node(node_id=v["node_id"], gpus=int(v["gpus"]), gpus_free=int(v["gpus_free"]),
                gpu_type=v["gpu_type"], state=NodeState.READY,
                inbox_queue_url=v["inbox_queue_url"], last_seen_at=_UNPROJECTED_TIME,
                registered_at=_UNPROJECTED_TIME, address=v["address"] or v["node_id"])


def node_from_item(item: dict) -> Node:
    """The node of a raw item."""
    v = NODES.values(item)
    return Node(node_id=v["node_id"], gpus=int(v["gpus"]), gpus_free=int(v["gpus_free"]),
                gpu_type=v["gpu_type"], state=NodeState(v["state"]),
                inbox_queue_url=v["inbox_queue_url"], last_seen_at=parse_iso(v["last_seen_at"]),
                registered_at=parse_iso(v["registered_at"]), labels=v["labels"] or {},
                address=v["address"] or v["node_id"], isolation=v["isolation"] or "none",
                attempts=frozenset(v["attempts"] or ()), lost=frozenset(v["lost"] or ()),
                cordon=v["cordon"], failures=frozenset(v["failures"] or ()))


class NodeRaced(Exception):
    """The node changed between reading and writing it; read it again."""


class DynamoNodeStore:
    def __init__(self, connection: Connection) -> None:
        self._dynamo = Dynamo(connection)

    def get(self, node_id: str) -> Node | None:
        item = self._dynamo.get(NODES.get(NODES.key(node_id)))
        return None if item is None else node_from_item(item)

    def all(self) -> list[Node]:
        return self._nodes()

    def _nodes(self, condition: str | None = None, values: dict | None = None, *,
               consistent: bool = False) -> list[Node]:
        """The nodes meeting the filter ``condition``, by id."""
        request = NODES.scan(condition, values, consistent=consistent)
        nodes = (node_from_item(i) for page in self._dynamo.pages(request, "Scan") for i in page)
        return sorted(nodes, key=lambda n: n.node_id)

    def register(self, node_id: str, *, gpus: int, gpu_type: str, labels: dict,
                 address: str, inbox_queue_url: str, now: datetime,
                 current: Node | None, isolation: str = "none",
                 fresh_s: float = 0.0) -> Node:
        """Create or update a node; a repeat only refreshes ``last_seen_at``,
        and not even that (no write at all) while the recorded one is less
        than ``fresh_s`` old.

        ``current`` is the node as the caller just read it (None: not
        registered). Capacity changes move ``gpus_free`` by the same delta, and
        the fleet totals with them, in one transaction conditioned on that
        read; only a lost race reads the node again.
        """
        for attempt in range(5):
            if attempt:
                current = self.get(node_id)
            try:
                if current is None:
                    return self._create(node_id, gpus, gpu_type, labels, address,
                                        inbox_queue_url, now, isolation)
                if fresh_call_in(current, gpus=gpus, gpu_type=gpu_type, labels=labels,
                                 address=address, inbox_queue_url=inbox_queue_url,
                                 isolation=isolation, now=now, fresh_s=fresh_s):
                    return current
                return self._update(current, gpus, gpu_type, labels, address,
                                    inbox_queue_url, now, isolation)
            except NodeRaced:
                continue
        raise ServiceUnavailable(f"node {node_id} is being registered concurrently; retry")

    def _create(self, node_id: str, gpus: int, gpu_type: str, labels: dict, address: str,
                url: str, now: datetime, isolation: str) -> Node:
        """A new node, READY with every GPU free, counted in its type's and
        every type's summary (a new generation, room appeared) in one transaction."""
        item = NODES.item({
            "node_id": node_id, "gpus": gpus, "gpus_free": gpus, "gpu_type": gpu_type,
            "state": _READY, "address": address, "labels": labels, "inbox_queue_url": url,
            "last_seen_at": iso(now), "registered_at": iso(now), "isolation": isolation,
            "ready_type": gpu_type, "ready_any": _ANY})
        try:
            with self._dynamo.transaction() as tx:
                tx.put(NODES.put_new(item))
                for t in (gpu_type, ALL_TYPES):
                    tx.update(fleet_update(t, gpus=gpus, room_at=iso(now), changed_at=iso(now)))
        except TransactWriteError as e:
            if tx_lost(e):
                raise NodeRaced(node_id) from None
            raise
        self._raise_largest(gpu_type, gpus, now)
        return node_from_item(item)

    def _update(self, current: Node, gpus: int, gpu_type: str, labels: dict, address: str,
                url: str, now: datetime, isolation: str) -> Node:
        """Refresh a registered node; a change of capacity or type, or a
        return from DOWN, moves the summaries in the same transaction.

        Only what differs from ``current`` is SET: a call-in that changed
        nothing SETs ``last_seen_at`` alone, which no placement index
        projects, so it writes the base item and neither index."""
        node_id, old_gpus, old_type, old_state = (current.node_id, current.gpus,
                                                  current.gpu_type, current.state)
        delta = gpus - old_gpus
        changes = Changes(NODES).set("last_seen_at", iso(now))
        for name, new, old in (("labels", labels, current.labels),
                               ("address", address, current.address),
                               ("inbox_queue_url", url, current.inbox_queue_url),
                               ("isolation", isolation, current.isolation)):
            if new != old:
                changes.set(name, new)
        #: GPU type -> the change of its registered GPUs
        with_fleet: dict[str, int] = {}
        cordoned = current.cordon is not None
        if old_state is NodeState.DOWN:
            # back from the dead: its attempts were failed and their GPUs
            # returned; a cordon it had holds on
            changes.set("state", _DRAINING if cordoned else _READY)
        if delta or gpu_type != old_type:
            if delta:
                changes.set("gpus", gpus).add("gpus_free", delta)
            if gpu_type != old_type:
                changes.set("gpu_type", gpu_type)
            deltas = {old_type: -old_gpus, ALL_TYPES: delta}
            deltas[gpu_type] = deltas.get(gpu_type, 0) + gpus
            # ALL_TYPES always moves on: its generation says "some type changed"
            with_fleet = {t: d for t, d in deltas.items() if d or t == ALL_TYPES}
        # READY now: a READY node (not cordoned, the condition says) holds its
        # keys already, written when it became READY; they change with its type
        if not cordoned and old_state is NodeState.DOWN:
            changes.set("ready_type", gpu_type).set("ready_any", _ANY)
        elif not cordoned and old_state is NodeState.READY and gpu_type != old_type:
            changes.set("ready_type", gpu_type)
        #: the fleets whose registered GPUs changed: their generation moves
        reshaped = set(with_fleet)
        room = room_types(gpu_type)
        if with_fleet or (old_state is NodeState.DOWN and not cordoned):
            # room may have appeared: grown, retyped or back from DOWN
            with_fleet.update({t: 0 for t in room if t not in with_fleet})
        request = changes.update(NODES.key(node_id),
                                 condition="#gpus = :old_gpus AND #state = :old_state AND "
                                 + _cordon_is(cordoned),
                                 values={":old_gpus": NODES.value("gpus", old_gpus),
                                         ":old_state": NODES.value("state", old_state.value)})
        stamp = iso(now)
        try:
            if not with_fleet:
                item = self._dynamo.update({**request, "ReturnValues": "ALL_NEW"})["Attributes"]
                return node_from_item(item)
            with self._dynamo.transaction() as tx:
                tx.update(request)
                for t, d in with_fleet.items():
                    tx.update(fleet_update(t, gpus=d, room_at=stamp if t in room else None,
                                           changed_at=stamp if t in reshaped else None))
        except ConditionFailed:
            raise NodeRaced(node_id) from None
        except TransactWriteError as e:
            if tx_lost(e):
                raise NodeRaced(node_id) from None
            raise
        written = self._dynamo.get(NODES.get(NODES.key(node_id)))
        self._raise_largest(gpu_type, gpus, now)
        if written is None:  # nodes are not deleted: read again, as after a lost race
            raise NodeRaced(node_id)
        return node_from_item(written)

    def _raise_largest(self, gpu_type: str, gpus: int, now: datetime) -> None:
        """``gpus`` is the largest node of its type and of every type, unless a
        larger one is recorded (then nothing changes: no new generation)."""
        for t in (gpu_type, ALL_TYPES):
            try:
                self._dynamo.update(fleet_update(t, largest_node=gpus, changed_at=iso(now)))
            except ConditionFailed:
                pass

    # -- cordons (service/cordons.py) --------------------------------------------
    def cordon(self, node_id: str, cordon: dict, now: datetime) -> Node | None:
        """Record ``cordon`` (domain/nodes.cordon_of): a READY node becomes
        DRAINING and leaves the placement indexes, in one write conditioned
        on the state read (a reservation's condition, state READY, then
        fails); a DOWN node stays DOWN and comes back DRAINING. None: no
        such node."""
        for _ in range(_TRIES):
            node = self.get(node_id)
            if node is None:
                return None
            changes = Changes(NODES).set("cordon", cordon)
            if node.state is NodeState.READY:
                changes.set("state", _DRAINING).remove("ready_type", "ready_any")
            try:
                return node_from_item(self._dynamo.update({**changes.update(
                    NODES.key(node_id), condition="#state = :old_state",
                    values={":old_state": NODES.value("state", node.state.value)}),
                    "ReturnValues": "ALL_NEW"})["Attributes"])
            except ConditionFailed:
                continue
        raise ServiceUnavailable(f"node {node_id} is changing concurrently; retry")

    def uncordon(self, node_id: str, now: datetime) -> Node | None:
        """Lift the node's cordon: a DRAINING node is READY again, back in
        the placement indexes, and room appears for its type (the placer's
        waiting jobs look again), in one transaction. None: no such node."""
        for _ in range(_TRIES):
            node = self.get(node_id)
            if node is None or node.cordon is None:
                return node
            changes = Changes(NODES).remove("cordon")
            draining = node.state is NodeState.DRAINING
            if draining:
                changes.set("state", _READY).set("ready_type", node.gpu_type) \
                    .set("ready_any", _ANY)
            request = changes.update(NODES.key(node_id), condition="#state = :old_state AND "
                                     "attribute_exists(#cordon)",
                                     values={":old_state": NODES.value("state",
                                                                       node.state.value)})
            try:
                with self._dynamo.transaction() as tx:
                    tx.update(request)
                    for t in room_types(node.gpu_type) if draining else ():
                        tx.update(room_update(t, iso(now)))
            except TransactWriteError as e:
                if tx_lost(e):
                    continue
                raise
            return self.get(node_id)
        raise ServiceUnavailable(f"node {node_id} is changing concurrently; retry")

    def record_failure(self, node_id: str, entry: str, since: str) -> list[str]:
        """Add a failure (domain/nodes.failure_entry) to the node's record and
        return those at or after ``since``; older ones are dropped."""
        try:
            item = self._dynamo.update({**NODES.update(
                NODES.key(node_id), "ADD #failures :entry",
                condition="attribute_exists(#node_id)",
                values={":entry": NODES.value("failures", {entry})}), "ReturnValues": "ALL_NEW"})
        except ConditionFailed:
            return []
        entries = NODES.values(item["Attributes"])["failures"] or set()
        recent = failures_since(entries, since)
        old = set(entries) - set(recent)
        if old:
            self._dynamo.update(NODES.update(NODES.key(node_id), "DELETE #failures :old",
                                             values={":old": NODES.value("failures", old)}))
        return recent

    # -- fleet generations: parked never-fitting jobs (domain/fleet.py) --------
    def fleet_of(self, gpu_type: str | None) -> Fleet:
        """A type's fleet (None: all types) with its generation; one strong read."""
        key = fleet_key(gpu_type)
        item = self._dynamo.get(FLEET.get(FLEET.key(key)))
        return Fleet(key) if item is None else fleet_from_item(item)

    def fleets(self) -> list[Fleet]:
        """Every type's fleet: one item per GPU type, read when some type changed;
        by key."""
        fleets = (fleet_from_item(i) for page in self._dynamo.pages(FLEET.scan(consistent=True),
                                                                    "Scan") for i in page)
        return sorted((f for f in fleets if f.key != LINE_KEY), key=lambda f: f.key)

    def line(self) -> Line | None:
        """The placer's line as it last wrote it, or None: one eventually
        consistent read (a snapshot a run old at best, read as such)."""
        item = self._dynamo.get(FLEET.get(FLEET.key(LINE_KEY), attributes=["line"],
                                          consistent=False))
        data = FLEET.values(item)["line"] if item else None
        return Line.from_json(data) if data else None

    def set_line(self, line: Line) -> None:
        """Write the placer's line over the last one (a snapshot: the last run wins)."""
        self._dynamo.update(Changes(FLEET).set("line", line.to_json()).update(FLEET.key(LINE_KEY)))

    def mark_swept(self, fleet: Fleet) -> None:
        """Record that the parked jobs of ``fleet``'s generation were judged again,
        unless the fleet moved on meanwhile (then they will be judged once more)."""
        try:
            self._dynamo.update(swept_update(fleet))
        except ConditionFailed:
            pass

    def ready_pages(self, gpu_type: str | None, min_free: int) -> Iterator[list[Node]]:
        """READY nodes with at least ``min_free`` GPUs, most free first, a page
        at a time (no empty pages).

        The index is eventually consistent: the conditional writes of a
        reservation are what decide, not this read. Its nodes are placement
        candidates (candidate_from_item), not whole nodes.
        """
        free = {":free": NODES.value("gpus_free", min_free)}
        if gpu_type:
            request = NODES.query(_READY_BY_TYPE, "#ready_type = :ready AND #gpus_free >= :free",
                                  {":ready": NODES.value("ready_type", gpu_type), **free},
                                  limit=CANDIDATE_PAGE, forward=False)
        else:
            request = NODES.query(_READY_ANY, "#ready_any = :ready AND #gpus_free >= :free",
                                  {":ready": NODES.value("ready_any", _ANY), **free},
                                  limit=CANDIDATE_PAGE, forward=False)
        for items in self._dynamo.pages(request):
            if items:
                yield [candidate_from_item(i) for i in items]

    def silent_since(self, before: datetime) -> list[Node]:
        """Nodes not DOWN that have not called in since ``before``, by id."""
        return self._nodes("#last_seen_at < :before AND #state <> :down",
                           {":before": NODES.value("last_seen_at", iso(before)),
                            ":down": NODES.value("state", _DOWN)})

    def down_holding_attempts(self) -> list[Node]:
        """DOWN nodes on which some attempt still holds GPUs, by id."""
        return self._nodes("#state = :down AND attribute_exists(#attempts)",
                           {":down": NODES.value("state", _DOWN)}, consistent=True)

    def mark_down(self, node: Node) -> bool:
        """DOWN, if it still has not called in since it was read; False if it has."""
        try:
            self._dynamo.update(NODES.update(
                NODES.key(node.node_id), "SET #state = :down REMOVE #ready_type, #ready_any",
                condition="#last_seen_at = :seen",
                values={":down": NODES.value("state", _DOWN),
                        ":seen": NODES.value("last_seen_at", iso(node.last_seen_at))}))
            return True
        except ConditionFailed:
            return False

    def mark_lost(self, node_id: str, key: str) -> bool:
        """Record that the attempt ``key`` ("job_id#attempt") was lost with the
        node: it keeps its GPUs until the node's agent confirms its ranks gone.
        False if it holds none here any more (its ranks were all confirmed)."""
        try:
            self._dynamo.update(NODES.update(
                NODES.key(node_id), "ADD #lost :keys", condition="contains(#attempts, :key)",
                values={":keys": NODES.value("lost", {key}), ":key": {"S": key}}))
            return True
        except ConditionFailed:
            return False

    def attempts_on(self, node_id: str) -> list[tuple[str, int]]:
        item = self._dynamo.get(NODES.get(NODES.key(node_id), attributes=["attempts"]))
        out = []
        for key in (NODES.values(item)["attempts"] or ()) if item else ():
            job_id, _, attempt = key.rpartition("#")
            out.append((job_id, int(attempt)))
        return sorted(out)
