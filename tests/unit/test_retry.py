"""The retry rules (domain/retry.py): the first matching rule decides, the
defaults retry infrastructure causes without counting, and nothing loops."""
import pytest

from chalicelib.domain import retry
from chalicelib.domain.spec import JobSpec


def spec(**body):
    return JobSpec.parse({"command": ["x"], "ranks": 2, **body})


def failed(code=1, rank=0):
    return {"reason": "rank_failed", "exit_code": code, "rank": rank, "node_id": "n1"}


def test_with_no_rules_a_rank_failure_counts_and_fails_once_attempts_are_used():
    s = spec(max_attempts=2)
    first = retry.decide(s, failed(), attempt=1, uncounted=0)
    assert (first.action, first.counted) == ("retry", True)
    assert first.text == "rank_failed (rank 0, exit code 1): retried (counted attempt 1 of 2)"
    last = retry.decide(s, failed(), attempt=2, uncounted=0)
    assert not last.retry
    assert last.text == ("rank_failed (rank 0, exit code 1): not retried "
                         "(counted attempt 2 of 2, none left)")


@pytest.mark.parametrize("reason", sorted(retry.INFRA))
def test_infrastructure_causes_retry_without_counting_by_default(reason):
    d = retry.decide(spec(), {"reason": reason, "exit_code": None, "rank": 3},
                     attempt=5, uncounted=4)
    assert d.action == "retry_uncounted" and not d.counted
    assert d.text == f"{reason} (rank 3): retried, not counted (uncounted retry 5 of 10)"


@pytest.mark.parametrize("reason", ["stalled", "timeout"])
def test_a_stall_restart_and_a_time_out_count(reason):
    d = retry.decide(spec(), {"reason": reason, "exit_code": None}, attempt=1, uncounted=0)
    assert d.action == "fail" and "counted attempt 1 of 1" in d.text


def test_past_the_uncounted_cap_an_infrastructure_retry_counts_so_nothing_loops_forever():
    s = spec(max_attempts=2, retry={"max_uncounted_retries": 2})
    lost = {"reason": "node_lost", "exit_code": None, "rank": 0}
    assert retry.decide(s, lost, attempt=3, uncounted=2).text == (
        "node_lost (rank 0): retried (all 2 uncounted retries used, so it counts; "
        "counted attempt 1 of 2)")
    assert not retry.decide(s, lost, attempt=4, uncounted=2).retry
    # however many attempts a job makes, it ends: at most max_attempts + the cap
    attempt, uncounted = 1, 0
    while (d := retry.decide(s, lost, attempt=attempt, uncounted=uncounted)).retry:
        uncounted += not d.counted
        attempt += 1
    assert attempt == 2 + 2


def test_the_first_matching_rule_decides():
    s = spec(max_attempts=5, retry={"rules": [
        {"exit_codes": [42], "action": "fail"},
        {"reasons": ["rank_failed"], "action": "retry_uncounted"},
        {"exit_codes": [42], "action": "retry"}]})
    assert retry.decide(s, failed(42), attempt=1, uncounted=0).text == (
        "rank_failed (rank 0, exit code 42): not retried (rule 1 says fail)")
    d = retry.decide(s, failed(3), attempt=1, uncounted=0)
    assert d.action == "retry_uncounted" and "uncounted retry 1 of 10" in d.text


def test_a_signal_matches_the_exit_code_of_a_rank_killed_by_it():
    s = spec(max_attempts=3, retry={"rules": [{"signals": ["SIGKILL"], "action": "fail"}]})
    assert retry.signal_exit_code("SIGKILL") == 137
    assert retry.decide(s, failed(137), attempt=1, uncounted=0).text == (
        "rank_failed (rank 0, exit code 137, SIGKILL): not retried (rule 1 says fail)")
    assert retry.decide(s, failed(1), attempt=1, uncounted=0).retry
    assert retry.signal_of(1) is None and retry.signal_of(143) == "SIGTERM"


def test_every_criterion_a_rule_gives_must_match():
    s = spec(max_attempts=3, retry={"rules": [
        {"reasons": ["timeout"], "exit_codes": [1], "action": "fail"}]})
    assert retry.decide(s, failed(1), attempt=1, uncounted=0).retry, "reason differs"
    assert retry.decide(s, {"reason": "timeout", "exit_code": None}, attempt=1,
                        uncounted=0).retry, "no exit code to match"


def test_a_rule_can_make_an_infrastructure_cause_count():
    s = spec(retry={"rules": [{"reasons": ["node_lost"], "action": "retry"}]})
    d = retry.decide(s, {"reason": "node_lost", "exit_code": None, "rank": 1}, attempt=1,
                     uncounted=0)
    assert not d.retry and d.text == ("node_lost (rank 1): not retried (rule 1; counted "
                                      "attempt 1 of 1, none left)")


def test_a_rule_with_nothing_to_match_on_is_named():
    assert retry.check_rules([{"reasons": ["stalled"], "action": "fail"},
                              {"action": "retry"}]) == (
        "retry.rules.1",
        "retry.rules.1 must match on at least one of reasons, exit_codes, signals")
