"""Cordons and drains: nodes an operator takes out of service, and nodes that
take themselves out by failing attempts (Kubernetes' cordon and drain,
Slurm's ``state=drain reason=...``, NVRx's exclusion of a failing node).

- ``cordon``: the node takes no new placements (DRAINING); its jobs run on.
- ``drain``: a cordon, and every attempt running there is preempted at once:
  it ends with reason ``preempted`` (by default retried without counting,
  domain/retry.py), and its ranks get SIGTERM and their grace period through
  the normal CANCEL intents, so they can checkpoint; ``wait`` lets them
  finish instead.
- ``uncordon``: placements again.

A node where attempts of ``failures`` jobs of ``tenants`` different tenants
end ``rank_failed`` within ``window_s`` is cordoned by :class:`FailureWatch`,
the reason saying so, so the retries of those jobs go elsewhere.

Each step is one conditional write on the node (store.cordon), and each
preemption the attempts service's conditional end of the attempt: a repeated
or racing drain preempts an attempt once.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Protocol

from ..domain import nodes as node_rules
from ..domain.clock import Clock, iso, utcnow
from ..domain.errors import ApiError, NotFound
from ..domain.nodes import Node, is_node_id
from ..domain.principal import Principal
from ..domain.states import PLACED
from .attempts import AttemptsService
from .ports import JobReads, NodeCordons, NodeRegistry

log = logging.getLogger(__name__)


def _not_found(node_id: str) -> ApiError:
    return NotFound(f"node {node_id} not found", field="node_id")


class CordonNodes(NodeRegistry, NodeCordons, Protocol):
    """What cordons read and write of the nodes."""


class Cordons:
    def __init__(self, nodes: CordonNodes, jobs: JobReads, attempts: AttemptsService,
                 clock: Clock = utcnow) -> None:
        self.nodes, self.jobs, self.attempts, self._clock = nodes, jobs, attempts, clock

    def cordon(self, principal: Principal, node_id: str, reason: str | None,
               drain: str = node_rules.KEEP) -> Node:
        now = self._clock()
        record = node_rules.cordon_of(reason or "cordoned", principal.name, iso(now), drain)
        node = self.nodes.cordon(node_id, record, now) if is_node_id(node_id) else None
        if node is None:
            raise _not_found(node_id)
        log.warning("node %s cordoned by %s (%s): %s", node_id, principal.name, drain,
                    record["reason"])
        return node

    def drain(self, principal: Principal, node_id: str, reason: str | None, *,
              wait: bool = False) -> Node:
        """Cordon the node; unless ``wait``, preempt every attempt running there."""
        node = self.cordon(principal, node_id, reason or "drained",
                           node_rules.WAIT if wait else node_rules.STOP)
        if not wait:
            self.preempt_all(node, f"node {node_id} drained: {node.cordon['reason']}"
                             if node.cordon else f"node {node_id} drained")
        return node

    def uncordon(self, principal: Principal, node_id: str) -> Node:
        node = self.nodes.uncordon(node_id, self._clock()) if is_node_id(node_id) else None
        if node is None:
            raise _not_found(node_id)
        log.warning("node %s uncordoned by %s", node_id, principal.name)
        return node

    def preempt_all(self, node: Node, detail: str) -> int:
        """End every live attempt on the node as preempted (each once: the
        attempt's end is conditional); the number ended."""
        ended = 0
        for job_id, number in self.nodes.attempts_on(node.node_id):
            if f"{job_id}#{number}" in node.lost:
                continue  # lost with the node already
            job = self.jobs.get(job_id)
            if job is None or job.attempt != number or job.state not in PLACED:
                continue
            after = self.attempts.abandon(job, {"reason": "preempted", "exit_code": None,
                                                "node_id": node.node_id, "detail": detail})
            if after.attempt != number or after.state not in PLACED:
                ended += 1
                log.info("job %s attempt %d preempted: %s", job_id, number, detail)
        return ended


class FailureWatch:
    """Cordons a node once attempts of ``failures`` different jobs, of
    ``tenants`` different tenants, ended ``rank_failed`` there within
    ``window_s`` (0 failures: never).

    A node's failures are anyone's, so one tenant could submit failing jobs
    to take nodes out of service for everyone (issue 41: one tenant
    cordoned half of a 2-node fleet). So different jobs are needed (a crash
    loop is one job) of different tenants (one tenant's bad code is that
    tenant's; ``tenants`` 1 is the operator's say that tenants are trusted
    that far), and at most ``max_fraction`` of the fleet (at least one node)
    is auto-cordoned at a time; past it the failures are logged, and an
    operator decides (docs/security.md)."""

    def __init__(self, nodes: CordonNodes, *, failures: int, window_s: float,
                 tenants: int = 2, max_fraction: float = 0.1, clock: Clock = utcnow) -> None:
        self.nodes, self.failures, self.window_s, self._clock = nodes, failures, window_s, clock
        self.tenants, self.max_fraction = tenants, max_fraction

    def attempt_failed(self, node_id: str, job_id: str, attempt: int, tenant: str) -> bool:
        """Note the failure; True if it cordoned the node."""
        if self.failures <= 0:
            return False
        now = self._clock()
        recent = self.nodes.record_failure(
            node_id, node_rules.failure_entry(iso(now), f"{job_id}#{attempt}", tenant),
            iso(now - timedelta(seconds=self.window_s)))
        failed = dict(map(node_rules.failure_of, recent))  # job id -> tenant
        jobs, tenants = len(failed), len(set(failed.values()))
        if jobs < self.failures or tenants < self.tenants:
            return False
        node = self.nodes.get(node_id)
        if node is None or node.cordon is not None:
            return False
        fleet = self.nodes.all()  # rare: only once a node reached the threshold
        cap = max(1, int(self.max_fraction * len(fleet)))
        if sum(1 for n in fleet if n.cordon and n.cordon.get("auto")) >= cap:
            log.warning("node %s: %d jobs' attempts failed here, but %d nodes are "
                        "auto-cordoned already (the most at once): left for an operator",
                        node_id, jobs, cap)
            return False
        reason = node_rules.auto_cordon_reason(jobs, tenants, self.window_s)
        self.nodes.cordon(node_id, node_rules.cordon_of(reason, node_rules.AUTO, iso(now),
                                                        auto=True), now)
        log.warning("node %s: %s", node_id, reason)
        return True
