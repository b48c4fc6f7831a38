"""Who is calling: a tenant, an agent bound to one node (or "*"), or an
operator (cordons and drains nodes; docs/security.md)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    kind: str  # "tenant", "agent" or "operator"
    #: the tenant's name, the node id an agent is bound to ("*" for all), or
    #: the operator's name (shown as who cordoned a node)
    name: str

    @property
    def is_tenant(self) -> bool:
        return self.kind == "tenant"

    def may_act_for_node(self, node_id: str) -> bool:
        return self.kind == "agent" and self.name in ("*", node_id)

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"
