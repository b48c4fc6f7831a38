"""GPU hosts as the control plane sees them."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime

NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class NodeState(str, enum.Enum):
    READY = "READY"        # takes new placements
    DRAINING = "DRAINING"  # keeps its ranks, takes nothing new
    DOWN = "DOWN"          # stopped calling in; its attempts were failed or re-queued


@dataclass
class Node:
    node_id: str
    gpus: int
    gpus_free: int
    gpu_type: str
    state: NodeState
    inbox_queue_url: str
    last_seen_at: datetime
    registered_at: datetime
    labels: dict = field(default_factory=dict)
    #: where other nodes reach this one (MASTER_ADDR when it holds rank 0)
    address: str = ""
    #: "user": ranks run as an unprivileged user; "none": as the agent (docs/security.md)
    isolation: str = "none"
    #: "job_id#attempt" of every attempt holding GPUs here
    attempts: frozenset = frozenset()
    #: those of them lost with the node (DOWN): they hold their GPUs until the
    #: node's agent confirms their ranks gone
    lost: frozenset = frozenset()

    @property
    def live_attempts(self) -> list[str]:
        """The attempts the server still waits for on this node."""
        return sorted(self.attempts - self.lost)


def is_node_id(s: str) -> bool:
    return bool(NODE_ID_RE.match(s))
