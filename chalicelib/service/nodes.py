"""Node registration and reads."""
from __future__ import annotations

from ..domain.clock import Clock, utcnow
from ..domain.errors import Forbidden, InvalidArgument, NotFound
from ..domain.nodes import Node, is_node_id
from ..domain.principal import Principal
from .ports import Inbox, NodeStore

DEFAULT_GPU_TYPE = "generic"


class NodesService:
    def __init__(self, nodes: NodeStore, inbox: Inbox, clock: Clock = utcnow) -> None:
        self.nodes, self.inbox, self._clock = nodes, inbox, clock

    def register(self, principal: Principal, node_id: str, body: dict) -> Node:
        if not is_node_id(node_id):
            raise InvalidArgument("node_id must be 1 to 63 of [A-Za-z0-9._-], starting "
                                  "with a letter or digit", field="node_id")
        if not principal.may_act_for_node(node_id):
            raise Forbidden(f"this token may not act for node {node_id}", field="node_id")
        current = self.nodes.get(node_id)
        # CreateQueue is idempotent, but a node calls in every few seconds:
        # only its first registration pays for it
        url = current.inbox_queue_url if current else self.inbox.ensure(node_id)
        return self.nodes.register(
            node_id, gpus=body["gpus"], gpu_type=body.get("gpu_type", DEFAULT_GPU_TYPE),
            labels=body.get("labels", {}), address=body.get("address", node_id),
            inbox_queue_url=url, now=self._clock())

    def get(self, node_id: str) -> Node:
        node = self.nodes.get(node_id) if is_node_id(node_id) else None
        if node is None:
            raise NotFound(f"node {node_id} not found", field="node_id")
        return node

    def list(self) -> list[Node]:
        return self.nodes.list()
