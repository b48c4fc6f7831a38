"""The job state machine: terminal states never change again."""
import pytest
from hypothesis import given, strategies as st

from chalicelib.domain.states import (
    ARRAY_ENDS,
    ENDS_ATTEMPT,
    PLACED,
    TERMINAL,
    TRANSITIONS,
    Event,
    IllegalTransition,
    JobState,
    next_state,
    sources,
)


def run(events, state=JobState.PENDING):
    seen = [state]
    for e in events:
        try:
            state = next_state(state, e)
        except IllegalTransition:
            continue
        seen.append(state)
    return seen


@given(st.lists(st.sampled_from(list(Event)), max_size=40))
def test_no_sequence_of_events_leaves_a_terminal_state(events):
    seen = run(events)
    for i, s in enumerate(seen):
        if s in TERMINAL:
            assert seen[i:] == [s], f"left terminal {s} via {events}"


@given(st.sampled_from(sorted(TERMINAL)), st.sampled_from(list(Event)))
def test_every_event_on_a_terminal_state_is_refused(state, event):
    with pytest.raises(IllegalTransition):
        next_state(state, event)


def test_cancel_of_an_unplaced_job_is_the_only_way_from_pending_to_cancelled():
    assert next_state(JobState.PENDING, Event.CANCEL_UNPLACED) is JobState.CANCELLED
    assert sources(Event.CANCEL_UNPLACED) == {JobState.PENDING}


def test_agents_confirming_a_stop_cancel_only_placed_jobs():
    assert sources(Event.STOPPED) == PLACED


def test_a_retry_returns_a_placed_job_to_pending():
    assert next_state(JobState.RUNNING, Event.RETRY) is JobState.PENDING
    assert next_state(JobState.SCHEDULED, Event.RETRY) is JobState.PENDING


def test_the_happy_path_reaches_succeeded():
    assert run([Event.PLACE, Event.STARTED, Event.ALL_EXITED_OK])[-1] is JobState.SUCCEEDED


def test_an_attempt_ends_only_from_the_placed_states():
    """end_attempt's condition: every attempt-ending event leaves exactly PLACED."""
    assert sources(*ENDS_ATTEMPT) == PLACED
    assert all(sources(e) == PLACED for e in ENDS_ATTEMPT)


def test_placing_and_starting_leave_one_state_each():
    """The conditions of the store's place and start, read from the table."""
    assert sources(Event.PLACE) == {JobState.PENDING}
    assert sources(Event.STARTED) == {JobState.SCHEDULED}


def test_every_row_of_the_table_is_used_by_the_store_or_the_service():
    """No row only tests read: each event is a conditional write's source
    (place, start, cancel_unplaced, expire_pending, fail_dependency, an
    array's mark_array_running and finish_array) or an attempt's end
    (end_attempt)."""
    used = {Event.PLACE, Event.STARTED, Event.CANCEL_UNPLACED, Event.PENDING_TIMEOUT,
            Event.DEPENDENCY_FAILED, Event.INDEX_PLACED} | set(ARRAY_ENDS.values()) \
        | ENDS_ATTEMPT
    assert {e for (_, e) in TRANSITIONS} == used == set(Event)
