"""Domain events: what happened, so that what follows it is handled in one place.

A service that wrote a transition publishes what happened (service/bus.py);
bootstrap subscribes the handlers that follow up (a job's end reaching its
array and its dependents, a rank's failure counted against its node, a
preemption stopping its victim, ranks confirmed gone giving their GPUs
back). The publisher knows none of them: no service calls another through a
callback. The transition is written before its event is published, and each
follow-up is also made up for by a sweep or a retry (the pipelines' sweep,
a node's next registration, a preempting job's next placement run), so a
handler that fails delays a follow-up and loses nothing.

Each event names the tenant, the job and the time of what happened as the
transition wrote them, the shape a tenant's event feed reads. Pure: no AWS.
"""
from __future__ import annotations

from dataclasses import dataclass

from .jobs import Job


@dataclass(frozen=True)
class JobEnded:
    """A job reached a terminal state: ``job`` as its end wrote it (its
    dependents exact: an end is conditioned on the dependents it read)."""
    job: Job


@dataclass(frozen=True)
class ChildPlaced:
    """An array's child was placed: its array is RUNNING from now on."""
    job: Job


@dataclass(frozen=True)
class RankFailed:
    """An attempt ended because a rank exited with a failure on ``node_id``
    (auto-cordon counts these, service/cordons.py)."""
    node_id: str
    job_id: str
    attempt: int
    tenant: str


@dataclass(frozen=True)
class RanksGone:
    """A node that was lost called in without attempt ``attempt`` of
    ``job_id`` among those it runs: its ranks there are gone."""
    job_id: str
    attempt: int
    node_id: str


@dataclass(frozen=True)
class PreemptionChosen:
    """The placer chose ``victim`` to stop, to make room for a job that may
    preempt it; ``exit`` is how the victim's attempt ends."""
    victim: Job
    exit: dict


@dataclass(frozen=True)
class AttemptEnded:
    """Attempt ``attempt`` of ``job_id`` ended (the job retried or finished):
    its usage is rolled up (service/usage_rollup.py)."""
    tenant: str
    job_id: str
    attempt: int
