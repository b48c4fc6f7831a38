"""Who is calling: a tenant, or an agent bound to one node (or "*")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    kind: str  # "tenant" or "agent"
    #: the tenant's name, or the node id an agent is bound to ("*" for all)
    name: str

    @property
    def is_tenant(self) -> bool:
        return self.kind == "tenant"

    def may_act_for_node(self, node_id: str) -> bool:
        return self.kind == "agent" and self.name in ("*", node_id)
