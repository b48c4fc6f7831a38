"""gpujobs_client.lifecycle: durations and retry rules as people type them,
and a job's policy and limits said back; its names are the server's."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpujobs_client import lifecycle as lc

from .fakeserver import FakeApi


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("90s", 90), ("15m", 900), ("4h", 14400), ("2d", 172800), ("1h30m", 5400),
    ("1d12h", 129600), ("2h0m5s", 7205), (" 4H ", 14400)])
def test_durations(text, seconds):
    assert lc.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "1.5h", "30m1h", "h", "-5", "4 h", "4hours",
                                  "1w", "²", "9" * 5000])
def test_bad_durations_say_what_a_duration_is(text):
    with pytest.raises(lc.LifecycleError, match="duration"):
        lc.parse_duration(text)


@pytest.mark.parametrize("seconds, exact, text", [
    (14400, True, "4 h"), (5400, True, "1 h 30 min"), (300, True, "5 min"), (45, True, "45 s"),
    (90061, True, "1 d 1 h 1 min 1 s"), (11520 + 59, False, "3 h 12 min"),
    (3 * 3600 + 40, False, "3 h"), (0, False, "0 s")])
def test_duration_text(seconds, exact, text):
    assert lc.duration_text(seconds, exact=exact) == text


@pytest.mark.parametrize("text, rule", [
    ("node_lost", {"reasons": ["node_lost"], "action": "retry"}),
    ("node_lost,preempted=uncounted", {"reasons": ["node_lost", "preempted"],
                                       "action": "retry_uncounted"}),
    ("exit:42=fail", {"exit_codes": [42], "action": "fail"}),
    ("exit:1,2,1=retry", {"exit_codes": [1, 2], "action": "retry"}),
    ("signal:SIGKILL=uncounted", {"signals": ["SIGKILL"], "action": "retry_uncounted"}),
    ("signal:kill,9,SEGV", {"signals": ["SIGKILL", "SIGSEGV"], "action": "retry"}),
    ("timeout=retry_uncounted", {"reasons": ["timeout"], "action": "retry_uncounted"})])
def test_retry_on(text, rule):
    assert lc.parse_retry_on(text) == rule


@pytest.mark.parametrize("text, message", [
    ("nope", "'nope' is not a reason"), ("=fail", "is not a reason"),
    ("node_lost=maybe", "'maybe' is not an action"), ("exit:0", "'0' is not an exit code"),
    ("exit:256", "from 1 to 255"), ("exit:x", "'x' is not an exit code"),
    ("exit:", "names nothing"), ("exit:1,", "names nothing"),
    ("signal:SIGFOO", "'SIGFOO' is not a signal"), ("signal:64", "not a signal"),
    ("code:1", "use a reason, exit:CODE or signal:NAME")])
def test_bad_retry_on_says_why(text, message):
    with pytest.raises(lc.LifecycleError, match=message):
        lc.parse_retry_on(text)


def test_the_policy_in_words():
    spec = {"retry": {"rules": [{"exit_codes": [42], "action": "fail"},
                                {"reasons": ["node_lost"], "action": "retry_uncounted"},
                                {"reasons": ["rank_failed"], "signals": ["SIGKILL"],
                                 "action": "retry"}],
                      "max_uncounted_retries": 10}}
    assert lc.retry_policy_text(spec) == (
        "exit 42 → fail; node_lost → retry, not counted; rank_failed and SIGKILL → retry; "
        "then defaults (infra causes not counted, up to 10)")
    assert lc.retry_policy_text({"retry": {"rules": [], "max_uncounted_retries": 3}}) == \
        "defaults (infra causes not counted, up to 3)"
    assert lc.retry_policy_text({}) == "defaults (infra causes not counted, up to 10)"


def test_attempts_limits_and_what_is_left():
    assert lc.attempt_text(3, 3, 0) == "3 of max 3"
    assert lc.attempt_text(3, 3, 1) == "3 (2 counted of max 3, 1 not counted)"
    assert lc.limits_lines({"max_runtime_s": 14400, "warn_before_s": 300,
                            "warn_signal": "SIGUSR1", "max_pending_s": 1800}) == [
        "max runtime 4 h per attempt (warning SIGUSR1 5 min before)", "max pending 30 min"]
    now = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)
    started = (now - timedelta(minutes=48)).isoformat()
    spec = {"max_runtime_s": 14400, "max_pending_s": 1800}
    left = lc.time_left_text
    assert left("RUNNING", spec, started_at=started, pending_since=None, now=now) == \
        "times out in 3 h 12 min"
    assert left("PENDING", spec, started_at=None, pending_since=started, now=now).startswith(
        "waited past its max pending by 18 min")
    assert left("PENDING", spec, started_at=None, pending_since=now.isoformat(), now=now) == \
        "gives up waiting in 30 min"
    assert left("SUCCEEDED", spec, started_at=started, pending_since=None, now=now) is None
    assert left("RUNNING", {}, started_at=started, pending_since=None, now=now) is None


def test_the_exit_in_words():
    assert lc.exit_text({"reason": "rank_failed", "exit_code": 1, "rank": 3,
                         "node_id": "node-2", "decision": "rank_failed (rank 3, exit code 1): "
                         "not retried (rule 1 says fail)"}) == \
        "rank_failed, exit code 1, rank 3 on node-2 — not retried (rule 1 says fail)"
    assert lc.exit_text({"reason": "rank_failed", "exit_code": 137, "rank": 0}) == \
        "rank_failed, exit code 137 (SIGKILL), rank 0"
    assert lc.exit_text({"reason": "pending_timeout", "exit_code": None,
                         "decision": "waited longer than max_pending_s (60 s): can never "
                         "fit: x"}) == \
        "pending_timeout — waited longer than max_pending_s (60 s): can never fit: x"

    assert lc.exit_text({"reason": "preempted", "exit_code": None, "node_id": "n1",
                         "detail": "node n1 drained: bad ECC",
                         "decision": "preempted (node n1 drained: bad ECC): retried, not "
                         "counted (uncounted retry 1 of 10)"}) == \
        ("preempted, on n1, node n1 drained: bad ECC — retried, not counted "
         "(uncounted retry 1 of 10)")


@pytest.mark.parametrize("detail", ["node n1 drained: bad ECC", "node n1 drained: GPU 3 (ECC",
                                    "node n1 drained: a) b: c", "node n1 drained"])
def test_the_decision_of_a_preemption_is_cut_after_its_cause(detail):
    """The cause holds the drain's reason, free text with ": " or parentheses
    of its own: the rest starts after it, as the server wrote it."""
    retry = pytest.importorskip("chalicelib.domain.retry")
    spec = pytest.importorskip("chalicelib.domain.spec").JobSpec(command=("x",), ranks=1)
    exit_ = {"reason": "preempted", "exit_code": None, "node_id": "n1", "detail": detail}
    decision = retry.decide(spec, exit_, attempt=1, uncounted=0).text
    assert lc.decision_rest({**exit_, "decision": decision}) == \
        "retried, not counted (uncounted retry 1 of 10)"
    # a rank's cause, no detail: cut after its parenthesis
    exit_ = {"reason": "rank_failed", "exit_code": 137, "rank": 3}
    decision = retry.decide(spec, exit_, attempt=1, uncounted=0).text
    assert lc.decision_rest({**exit_, "decision": decision}) == \
        "not retried (counted attempt 1 of 1, none left)"


# -- the names and defaults are the server's -------------------------------------------
def test_the_names_are_the_servers():
    retry = pytest.importorskip("chalicelib.domain.retry")
    wire = pytest.importorskip("chalicelib.domain.wire")
    assert lc.REASONS == retry.REASONS and set(lc.INFRA_REASONS) == retry.INFRA
    assert lc.ACTIONS == retry.ACTIONS and lc.SIGNALS == retry.SIGNALS
    assert lc.WARN_SIGNALS == wire.WARN_SIGNALS
    assert lc.DEFAULT_MAX_UNCOUNTED == retry.DEFAULT_MAX_UNCOUNTED
    schemas = pytest.importorskip("chalicelib.api.schemas")
    for name in ("max_runtime_s", "warn_before_s", "max_pending_s"):
        assert schemas.JOB_CREATE["properties"][name]["maximum"] == lc.MAX_LIMIT_S
    for code in (1, 129, 137, 139, 159, 160):
        assert lc.signal_of(code) == retry.signal_of(code)


@pytest.mark.parametrize("body", [
    {"command": ["x"], "ranks": 1},
    {"command": ["x"], "ranks": 2, "max_runtime_s": 60, "warn_before_s": 10,
     "retry": {"rules": [{"reasons": ["node_lost"], "action": "fail"}]},
     "heartbeat": {"interval_s": 5}, "checkpoint_dir": "/c", "max_pending_s": 9}])
def test_the_fake_server_fills_the_defaults_the_real_one_does(body):
    spec = pytest.importorskip("chalicelib.domain.spec")
    fake = FakeApi()
    try:
        assert fake.add_job(**body)["spec"] == spec.JobSpec.parse(body).to_json()
    finally:
        fake.server.server_close()


def test_the_fake_server_decides_as_the_real_one_when_no_retry_is_left():
    retry = pytest.importorskip("chalicelib.domain.retry")
    spec = pytest.importorskip("chalicelib.domain.spec").JobSpec(command=("x",), ranks=2)
    want = retry.decide(spec, {"reason": "rank_failed", "exit_code": 137, "rank": 1},
                        attempt=1, uncounted=0).text
    fake = FakeApi()
    try:
        job = fake.add_job(ranks=2)
        fake.place(job["id"], ["node-1", "node-2"])
        status, got, _ = fake.handle(
            "POST", f"/v1/jobs/{job['id']}/attempts/1/events", {},
            {"authorization": "Bearer a1"},
            b'{"type": "EXITED", "ranks": [1], "exit_code": 137}')
        assert status == 200 and got["exit"]["decision"] == want
        assert got["exit"]["node_id"] == "node-2" and got["exit"]["rank"] == 1
    finally:
        fake.server.server_close()
