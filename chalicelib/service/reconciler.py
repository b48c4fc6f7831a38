"""The reconciler (scheduled): what must happen eventually, made to happen.

- Intents some agent has not acknowledged in time are sent again (to the
  nodes that have not acknowledged only).
- A node that stopped calling in, and whose agent stopped posting its ranks'
  beats too, is marked DOWN (a busy node calls in only now and then: its
  beats are its lease); the attempts it held lose its
  ranks (failed, or re-queued while attempts remain) and a CANCEL waits in its
  inbox. Its GPUs come back only once its agent confirms those ranks gone
  (AttemptsService.settle_node, NodesService.register). Every step of that can
  be repeated, and the attempt is marked lost on the node last, so a run that
  fails half-way (a store outage) is finished by the next one.
- Open arrays are fed and ended, and waiting jobs judged again
  (PipelinesService.sweep): what a follow-up that died left undone.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Callable, Protocol

from ..domain import intents
from ..domain.clock import Clock, plus, utcnow
from ..domain.nodes import Node
from .attempts import AttemptsService
from .dispatch import Dispatcher
from .pipelines import PipelinesService
from .ports import Attempts, HeartbeatStore, JobReads, NodeLiveness, NodeRegistry, Outbox

log = logging.getLogger(__name__)


class ReconcilerNodes(NodeRegistry, NodeLiveness, Protocol):
    """What the reconciler reads and marks of the nodes: the quiet ones."""


class ReconcilerPorts(JobReads, Attempts, Outbox, Protocol):
    """What the reconciler calls: due intents, and a lost node's jobs and attempts."""


class Reconciler:
    def __init__(self, store: ReconcilerPorts, nodes: ReconcilerNodes, dispatcher: Dispatcher,
                 attempts: AttemptsService, *, resend_after_s: float, down_after_s: float,
                 pipelines: PipelinesService, beats: HeartbeatStore,
                 placed: Callable[[str, int], dict[int, str]], clock: Clock = utcnow) -> None:
        """``placed(job_id, attempt)``: where the attempt's ranks run (fixed
        for an attempt: HeartbeatsService.node_of, which remembers them)."""
        self.store, self.nodes, self.dispatcher, self.attempts = store, nodes, dispatcher, attempts
        self.pipelines, self.beats, self._placed = pipelines, beats, placed
        self._resend_after_s, self._down_after_s, self._clock = resend_after_s, down_after_s, clock

    def run(self) -> dict:
        return {"resent": self.resend_due_intents(), "down": self.mark_silent_nodes_down(),
                "pipelines": self.pipelines.sweep()}

    def resend_due_intents(self, limit: int = 100) -> int:
        now = self._clock()
        sent = 0
        for entry in self.store.due_intents(now, limit):
            sent += self.dispatcher.send(entry.intent, set(entry.unacked))
            self.store.reschedule_intent(entry, plus(now, self._resend_after_s))
        return sent

    def mark_silent_nodes_down(self) -> list[str]:
        now = self._clock()
        since = now - timedelta(seconds=self._down_after_s)
        silent = self.nodes.silent_since(since)
        posting = self._posting(silent, since)
        down = []
        for node in silent:
            if node.node_id in posting:
                continue  # busy: its beats arrive, so its agent is alive
            if not self.nodes.mark_down(node):
                continue  # it called in meanwhile
            down.append(node.node_id)
            log.warning("node %s is DOWN (last seen %s)", node.node_id, node.last_seen_at)
            self._lose_attempts(node, self.nodes.attempts_on(node.node_id))
        # a run that failed half-way (a store outage) left attempts of a DOWN
        # node not yet lost: finish them (each step below can be repeated)
        for node in self.nodes.down_holding_attempts():
            unfinished = sorted(node.attempts - node.lost)
            if unfinished:
                log.warning("node %s: finishing the DOWN handling of %s", node.node_id,
                            unfinished)
                self._lose_attempts(node, [(k.rpartition("#")[0], int(k.rpartition("#")[2]))
                                           for k in unfinished])
        return down

    def _posting(self, silent: list[Node], since) -> set[str]:
        """The nodes of ``silent`` whose agent posted beats for an attempt
        they hold after ``since``, by the collector's clock: an agent calls
        in only every few minutes while its posts show it alive
        (agent/runner.py), so these are silent by their call-ins alone."""
        held = {(job_id, int(n)) for node in silent for key in node.live_attempts
                for job_id, _, n in (key.rpartition("#"),)}
        if not held:
            return set()
        attempts = {key: self._placed(*key) for key in sorted(held)}
        last = self.beats.last_posts({k: v for k, v in attempts.items() if v},
                                     {node.node_id for node in silent})
        return {node_id for node_id, at in last.items() if at > since}

    def _lose_attempts(self, node: Node, attempts: list[tuple[str, int]]) -> None:
        for job_id, attempt_no in attempts:
            job = self.store.get(job_id)
            attempt = self.store.attempt(job_id, attempt_no)
            if job is None or attempt is None:
                continue
            # a CANCEL waits in the lost node's inbox: an agent that comes
            # back (paused, restarted) reads it first and stops the ranks of
            # the attempt failed here
            self.dispatcher.send(intents.cancel(job_id, attempt_no, "node_lost",
                                                {node.node_id: node.inbox_queue_url}))
            self.attempts.node_lost(job, attempt, node.node_id)
            # last, as the mark of this attempt's handling done: its GPUs stay
            # held until the node's agent confirms the ranks gone
            self.nodes.mark_lost(node.node_id, f"{job_id}#{attempt_no}")
