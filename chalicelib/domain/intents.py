"""Intents: the messages agents must receive at least once (LAUNCH, CANCEL).

Every intent is built here, and nowhere else. An intent is recorded in the
outbox in the same transaction as the transition that calls for it, then sent
to each target node's inbox; agents acknowledge per node and the reconciler
resends to the rest (service/ports.py ``Outbox``: due, acknowledge,
reschedule). What the messages hold is the wire schema's (domain/wire.py),
which the agent parses them with. Pure: no AWS here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import wire
from .jobs import Job
from .wire import CANCEL, LAUNCH


def intent_id(kind: str, attempt: int) -> str:
    """The outbox key of an attempt's intent of one kind (one record each)."""
    return f"{kind}#{attempt}"


@dataclass(frozen=True)
class Intent:
    """A message for the agents of some nodes that must arrive at least once.

    One record per job attempt and kind, naming every target node, so a job
    on hundreds of nodes is still one outbox item (a transaction holds at most
    100 items). Agents acknowledge per node; the reconciler resends to the rest.
    """
    job_id: str
    attempt: int
    kind: str
    message: dict
    #: node id -> inbox queue URL
    targets: dict[str, str]
    #: node id -> the ranks it holds, where the message names them (LAUNCH)
    node_ranks: dict[str, list[int]] = field(default_factory=dict)

    @property
    def intent_id(self) -> str:
        return intent_id(self.kind, self.attempt)

    def message_for(self, node_id: str) -> dict:
        if node_id in self.node_ranks:
            return wire.with_ranks(self.message, self.node_ranks[node_id])
        return self.message


def cancel(job_id: str, attempt: int, reason: str | None, targets: dict[str, str]) -> Intent:
    """A CANCEL of one attempt for the nodes ``targets`` (node id -> inbox)."""
    return Intent(job_id, attempt, CANCEL, wire.Cancel(job_id, attempt, reason).to_message(),
                  dict(sorted(targets.items())))


def cancel_intent(job: Job, reason: str | None) -> Intent:
    """One CANCEL for every node holding a rank of the current attempt."""
    return cancel(job.job_id, job.attempt, reason, job.inboxes)


def launch_intent(job: Job, attempt: int, ranks_by_node: dict[str, list[int]],
                  inboxes: dict[str, str], master_addr: str, master_port: int) -> Intent:
    """One LAUNCH for every node of a new attempt, each naming its own ranks."""
    message = wire.AttemptLaunch.of_spec(job.job_id, attempt, job.spec, master_addr=master_addr,
                                         master_port=master_port).to_message()
    return Intent(job.job_id, attempt, LAUNCH, message, dict(sorted(inboxes.items())),
                  {n: list(r) for n, r in sorted(ranks_by_node.items())})
