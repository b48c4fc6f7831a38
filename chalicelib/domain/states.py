"""The job state machine of API.md, as data.

Every transition names the state it leaves; the store makes it a conditional
write on exactly the states :func:`sources` reads from this table (the job
store's ``place``, ``start``, ``cancel_unplaced`` and ``end_attempt``), so two
racing writers cannot both win, and the service picks the target state with
:func:`next_state`.
"""
from __future__ import annotations

import enum


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
#: placed on nodes: a cancel must go to the agents as an intent
PLACED = frozenset({JobState.SCHEDULED, JobState.RUNNING})


class Event(str, enum.Enum):
    PLACE = "PLACE"                  # placement wrote an attempt
    STARTED = "STARTED"              # agent started the ranks
    ALL_EXITED_OK = "ALL_EXITED_OK"  # every rank exited 0
    RANK_FAILED = "RANK_FAILED"      # the attempt failed, and no retry follows
    RETRY = "RETRY"                  # the attempt failed, and its retry rules retry it
    CANCEL_UNPLACED = "CANCEL_UNPLACED"  # cancel of a job no agent holds
    STOPPED = "STOPPED"              # agents confirmed a cancel
    PENDING_TIMEOUT = "PENDING_TIMEOUT"  # waited past its max_pending_s
    DEPENDENCY_FAILED = "DEPENDENCY_FAILED"  # a dependency can no longer be met
    # an array's own moves (domain/arrays.py): its first index placed, its end
    INDEX_PLACED = "INDEX_PLACED"
    INDEXES_SUCCEEDED = "INDEXES_SUCCEEDED"
    INDEXES_FAILED = "INDEXES_FAILED"
    INDEXES_CANCELLED = "INDEXES_CANCELLED"


TRANSITIONS: dict[tuple[JobState, Event], JobState] = {
    (JobState.PENDING, Event.PLACE): JobState.SCHEDULED,
    (JobState.PENDING, Event.CANCEL_UNPLACED): JobState.CANCELLED,
    (JobState.PENDING, Event.PENDING_TIMEOUT): JobState.FAILED,
    (JobState.PENDING, Event.DEPENDENCY_FAILED): JobState.FAILED,
    # an array is PENDING until an index is placed, then RUNNING until every
    # index ended (it is never SCHEDULED: it holds no attempt)
    (JobState.PENDING, Event.INDEX_PLACED): JobState.RUNNING,
    (JobState.PENDING, Event.INDEXES_SUCCEEDED): JobState.SUCCEEDED,
    (JobState.PENDING, Event.INDEXES_FAILED): JobState.FAILED,
    (JobState.PENDING, Event.INDEXES_CANCELLED): JobState.CANCELLED,
    (JobState.RUNNING, Event.INDEXES_SUCCEEDED): JobState.SUCCEEDED,
    (JobState.RUNNING, Event.INDEXES_FAILED): JobState.FAILED,
    (JobState.RUNNING, Event.INDEXES_CANCELLED): JobState.CANCELLED,
    (JobState.SCHEDULED, Event.STARTED): JobState.RUNNING,
    # reports arrive at least once and in any order: a short job can finish
    # before its STARTED is seen
    (JobState.SCHEDULED, Event.ALL_EXITED_OK): JobState.SUCCEEDED,
    (JobState.SCHEDULED, Event.STOPPED): JobState.CANCELLED,
    (JobState.SCHEDULED, Event.RANK_FAILED): JobState.FAILED,
    (JobState.SCHEDULED, Event.RETRY): JobState.PENDING,
    (JobState.RUNNING, Event.ALL_EXITED_OK): JobState.SUCCEEDED,
    (JobState.RUNNING, Event.RANK_FAILED): JobState.FAILED,
    (JobState.RUNNING, Event.RETRY): JobState.PENDING,
    (JobState.RUNNING, Event.STOPPED): JobState.CANCELLED,
}


#: the events that end an attempt (the store's ``end_attempt``)
ENDS_ATTEMPT = frozenset({Event.ALL_EXITED_OK, Event.RANK_FAILED, Event.RETRY, Event.STOPPED})


class IllegalTransition(Exception):
    def __init__(self, state: JobState, event: Event) -> None:
        super().__init__(f"{event.value} is not allowed in state {state.value}")
        self.state, self.event = state, event


#: an array's end, by the state it ends in
ARRAY_ENDS = {JobState.SUCCEEDED: Event.INDEXES_SUCCEEDED, JobState.FAILED: Event.INDEXES_FAILED,
              JobState.CANCELLED: Event.INDEXES_CANCELLED}


def next_state(state: JobState, event: Event) -> JobState:
    """The state ``event`` leads to from ``state``; terminal states have no way out."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None


def sources(*events: Event) -> frozenset[JobState]:
    """The states any of ``events`` may leave: the condition of their conditional write."""
    return frozenset(s for (s, e) in TRANSITIONS if e in events)
