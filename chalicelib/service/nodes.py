"""Node registration and reads."""
from __future__ import annotations

import logging

from ..domain.clock import Clock, utcnow
from ..domain.errors import Forbidden, InvalidArgument, NotFound
from ..domain.happened import RanksGone
from ..domain.nodes import Node, NodeState, is_node_id
from ..domain.principal import Principal
from .bus import Publish, nowhere
from .ports import CollectorStore, Inbox, NodeRegistry

DEFAULT_GPU_TYPE = "generic"

log = logging.getLogger(__name__)


class NodesService:
    def __init__(self, nodes: NodeRegistry, inbox: Inbox, collector: CollectorStore,
                 clock: Clock = utcnow, publish: Publish = nowhere,
                 down_after_s: float = 0.0) -> None:
        self.nodes, self.inbox, self.collector, self._clock = nodes, inbox, collector, clock
        #: a call-in that changes nothing is written only once the recorded
        #: ``last_seen_at`` is this old (a lease renewed a quarter of the way
        #: to DOWN: at 10-s call-ins and DOWN after 60 s, every 20 s), so a
        #: node is written half as often, and still seen far from DOWN
        self._fresh_s = down_after_s / 4
        #: tells what happened: a lost node's agent no longer runs an attempt's ranks
        self._publish = publish

    def authorize(self, principal: Principal, node_id: str, field: str = "node_id") -> None:
        """``field``: where the request names the node (a heartbeat POST's
        ``call_in.node_id``, the path's ``node_id``)."""
        if not principal.may_act_for_node(node_id):
            raise Forbidden(f"this token may not act for node {node_id}", field=field)
        if not is_node_id(node_id):
            raise InvalidArgument("node_id must be 1 to 63 of [A-Za-z0-9._-], starting "
                                  "with a letter or digit", field=field)

    def register(self, principal: Principal, node_id: str, body: dict) -> Node:
        self.authorize(principal, node_id)
        current = self.nodes.get(node_id)
        now = self._clock()
        url = self._inbox_of(node_id, current, bool(body.get("inbox_missing")))
        node = self.nodes.register(
            node_id, gpus=body["gpus"], gpu_type=body.get("gpu_type", DEFAULT_GPU_TYPE),
            labels=body.get("labels", {}), address=body.get("address", node_id),
            inbox_queue_url=url, now=now, current=current,
            isolation=body.get("isolation", "none"), fresh_s=self._fresh_s)
        # a node calling in shows the ingest path works, even if no rank beats
        self.collector.mark_ingest(now)
        running = body.get("running")
        if running is not None and node.lost:
            node = self._settle_lost(node, {f"{r['job_id']}#{r['attempt']}" for r in running})
        return node

    def _inbox_of(self, node_id: str, current: Node | None, missing: bool) -> str:
        """The node's inbox URL. CreateQueue (idempotent) runs once per node,
        not per call-in: on its first registration, on a return from DOWN,
        when the recorded URL is empty or not what this process would make
        (another stage's, another endpoint's), and when
        the agent says its inbox is gone (``inbox_missing``: its receive was
        told the queue does not exist, as after a deletion by hand)."""
        recorded = current.inbox_queue_url if current is not None else ""
        if current is not None and current.state is not NodeState.DOWN and recorded \
                and self.inbox.is_current(node_id, recorded) and not missing:
            return recorded
        if not missing or current is None or not recorded:
            return self.inbox.ensure(node_id)
        try:
            return self.inbox.ensure(node_id)
        except Exception as e:  # noqa: BLE001 - the call-in (liveness) must not fail with it
            # SQS refuses the name for 60 s after a deletion; the agent says
            # "missing" again on its next call-in
            log.warning("re-creating the inbox of node %s failed (%s); kept %s", node_id, e,
                        recorded)
            return recorded

    def _settle_lost(self, node: Node, running: set[str]) -> Node:
        """Attempts lost with the node (DOWN) that its agent no longer runs have
        no rank left there: their GPUs come back. Those it still runs keep them
        until it stops them (their absence from the answer's ``attempts`` tells
        it to) and says so."""
        gone = sorted(node.lost - running)
        if not gone:
            return node
        for key in gone:
            job_id, _, attempt = key.rpartition("#")
            self._publish(RanksGone(job_id, int(attempt), node.node_id))
        return self.nodes.get(node.node_id) or node

    def get(self, node_id: str) -> Node:
        node = self.nodes.get(node_id) if is_node_id(node_id) else None
        if node is None:
            raise NotFound(f"node {node_id} not found", field="node_id")
        return node

    def list(self) -> list[Node]:
        return self.nodes.all()
