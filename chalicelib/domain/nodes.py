"""GPU hosts as the control plane sees them."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime

NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class NodeState(str, enum.Enum):
    READY = "READY"        # takes new placements
    DRAINING = "DRAINING"  # cordoned: keeps its ranks (or stops them: drain), takes nothing new
    DOWN = "DOWN"          # stopped calling in; its attempts were failed or re-queued


#: how a cordon treats the node's running jobs: left to run (cordon, or a
#: drain that waits for them), or stopped and requeued as preempted (drain)
KEEP, WAIT, STOP = "keep", "wait", "stop"
#: who cordons a node that keeps failing attempts (auto-cordon)
AUTO = "gpujobs"


def cordon_of(reason: str, by: str, at: str, drain: str = KEEP, *, auto: bool = False) -> dict:
    """A cordon as it is stored and shown: why, by whom, when, and what it
    does to the running jobs. A cordoned node is DRAINING (DOWN stays DOWN,
    and comes back DRAINING): no new placements until it is uncordoned."""
    return {"reason": reason, "by": by, "at": at, "drain": drain, "auto": auto}


def auto_cordon_reason(jobs: int, tenants: int, window_s: float) -> str:
    return (f"auto-cordoned: attempts of {jobs} jobs of {tenants} tenants ended rank_failed "
            f"here within {int(window_s)} s")


def failure_entry(at: str, key: str, tenant: str) -> str:
    """A failure as the node keeps it: "<iso time>|<job_id#attempt>|<tenant>"."""
    return f"{at}|{key}|{tenant}"


def failure_of(entry: str) -> tuple[str, str]:
    """(job id, tenant) of a failure_entry; an entry written before tenants
    were kept counts as a tenant of its own job's (as the rule then was)."""
    _, key, tenant = (entry.split("|", 2) + [""])[:3]
    job_id = key.rpartition("#")[0]
    return job_id, tenant or f"job:{job_id}"


def failures_since(entries, since: str) -> list[str]:
    """The entries (failure_entry) at or after ``since`` (ISO text sorts as time)."""
    return sorted(e for e in entries if e.split("|", 1)[0] >= since)


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
    #: the cordon (cordon_of) while the node takes no placements; None: none
    cordon: dict | None = None
    #: recent attempt failures here (failure_entry), for auto-cordon
    failures: frozenset = frozenset()

    @property
    def live_attempts(self) -> list[str]:
        """The attempts the server still waits for on this node."""
        return sorted(self.attempts - self.lost)


def fresh_call_in(node: Node, *, gpus: int, gpu_type: str, labels: dict, address: str,
                  inbox_queue_url: str, isolation: str, now: datetime, fresh_s: float) -> bool:
    """True for a call-in that would change nothing of ``node`` but its
    ``last_seen_at``, while the recorded one is less than ``fresh_s`` old: it
    needs no write (a node is taken for silent only ``down_after_s`` after
    it, several times ``fresh_s``)."""
    return (fresh_s > 0 and node.state is not NodeState.DOWN and node.gpus == gpus
            and node.gpu_type == gpu_type and node.labels == labels
            and node.address == address and node.inbox_queue_url == inbox_queue_url
            and node.isolation == isolation
            and (now - node.last_seen_at).total_seconds() < fresh_s)


def is_node_id(s: str) -> bool:
    return bool(NODE_ID_RE.match(s))
