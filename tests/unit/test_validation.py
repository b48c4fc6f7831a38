"""Bad bodies get 4xx naming the field; nothing malformed gets through or crashes."""
import copy
import json

import pytest
from hypothesis import given, settings, strategies as st

from chalicelib.api import validation
from chalicelib.api.problems import status_of
from chalicelib.domain.errors import ApiError, InvalidArgument, PayloadTooLarge
from chalicelib.domain.spec import JobSpec

GOOD = {"command": ["python", "train.py"], "ranks": 2}


def check(body):
    return validation.validate("JOB_CREATE", body)


@pytest.mark.parametrize("body, field", [
    ({"ranks": 2}, "command"),
    ({"command": ["x"]}, "ranks"),
    ({**GOOD, "command": []}, "command"),
    ({**GOOD, "command": [1]}, "command.0"),
    ({**GOOD, "ranks": 0}, "ranks"),
    ({**GOOD, "ranks": True}, "ranks"),
    ({**GOOD, "ranks": 1.5}, "ranks"),
    ({**GOOD, "ranks": "2"}, "ranks"),
    ({**GOOD, "name": "x" * 129}, "name"),
    ({**GOOD, "max_attempts": 0}, "max_attempts"),
    ({**GOOD, "env": {"A": 1}}, "env.A"),
    ({**GOOD, "env": {"1A": "x"}}, "env"),
    ({**GOOD, "heartbeat": {"miss_probability": 1}}, "heartbeat.miss_probability"),
    ({**GOOD, "heartbeat": {"interval_s": 0}}, "heartbeat.interval_s"),
    ({**GOOD, "heartbeat": {"false_positive_budget_per_hour": 0}},
     "heartbeat.false_positive_budget_per_hour"),
    ({**GOOD, "colour": "red"}, "colour"),
    ({**GOOD, "heartbeat": {"period": 3}}, "heartbeat.period"),
    ([GOOD], "body"),
])
def test_each_bad_field_is_named(body, field):
    with pytest.raises(InvalidArgument) as e:
        check(body)
    assert e.value.field == field
    assert status_of(e.value.code) == 400


def test_a_good_body_passes_and_defaults_fill_in():
    spec = JobSpec.parse(check(dict(GOOD))).to_json()
    assert spec["gpus_per_rank"] == 1 and spec["max_attempts"] == 1 and spec["priority"] == 0
    assert spec["heartbeat"] == {"interval_s": 10, "false_positive_budget_per_hour": 0.001,
                                 "miss_probability": 0.01, "startup_grace_s": 120,
                                 "mode": "auto", "max_busy_s": 900, "idle_s": 300,
                                 "slow_score": 0.7}


@pytest.mark.parametrize("raw", [b"{", b"[1,]", b'{"a": NaN}', b"1e999", b'"\\ud800"',
                                 b"\xff\xfe", b"[" * 30000 + b"]" * 30000])
def test_malformed_json_is_invalid_argument(raw):
    with pytest.raises(InvalidArgument) as e:
        validation.parse_json(raw, required=True, content_type="application/json")
    assert e.value.field == "body"


def test_a_body_over_the_limit_is_413():
    with pytest.raises(PayloadTooLarge):
        validation.parse_json(b" " * (validation.MAX_BODY_BYTES + 1), required=True,
                              content_type=None)


def test_integral_floats_become_integers():
    assert validation.parse_json(b'{"ranks": 2.0}', required=True,
                                 content_type=None) == {"ranks": 2}
    assert isinstance(validation.parse_json(b"2.0", required=True, content_type=None), int)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                           allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children,
                                                                       max_size=4),
    max_leaves=20)


@settings(max_examples=300)
@given(st.one_of(json_values, st.fixed_dictionaries(
    {"command": json_values, "ranks": json_values}, optional={
        "heartbeat": json_values, "env": json_values, "labels": json_values})))
def test_any_json_value_is_accepted_or_refused_with_a_4xx(value):
    raw = json.dumps(value).encode()
    try:
        check(validation.parse_json(raw, required=True, content_type=None))
    except ApiError as e:
        assert 400 <= status_of(e.code) < 500 and e.field


def test_defaults_leave_the_submitted_body_as_it_was_and_share_nothing_with_it():
    """The body's hash is the idempotency key's: filling defaults must not
    change it, nor may a later change of the spec reach the body."""
    body = {"command": ["a"], "ranks": 2, "env": {"A": "1"}, "labels": {"t": "x"},
            "heartbeat": {"interval_s": 5}}
    before = copy.deepcopy(body)
    spec = JobSpec.parse(body)
    assert body == before
    shown = spec.to_json()
    shown["command"].append("b")
    shown["env"]["B"] = "2"
    shown["labels"]["u"] = "y"
    assert body == before
    assert spec.to_json() == {**shown, "command": ["a"], "env": {"A": "1"},
                              "labels": {"t": "x"}}, "what is shown is a copy"


def test_a_command_whose_program_is_empty_is_refused_naming_the_field():
    """The agent can never start an empty program (domain/wire.py refuses the
    LAUNCH), so the API refuses the job instead of placing one that would
    wait forever; an empty argument after it is a real argument."""
    with pytest.raises(InvalidArgument) as caught:
        check({**GOOD, "command": ["", "train.py"]})
    assert caught.value.field == "command" and "must not be empty" in caught.value.detail
    assert check({**GOOD, "command": ["python", "-c", ""]})["command"][2] == ""


@pytest.mark.parametrize("where", ["relative/dir", "", "/with\x00nul", "/" + "x" * 4096])
def test_a_working_dir_must_be_an_absolute_path_the_hosts_can_enter(where):
    with pytest.raises(InvalidArgument) as caught:
        check({**GOOD, "working_dir": where})
    assert caught.value.field == "working_dir"


def test_an_absolute_working_dir_is_kept_in_the_spec():
    assert JobSpec.parse(check({**GOOD, "working_dir": "/data/run 1"})).working_dir == \
        "/data/run 1"


@pytest.mark.parametrize("body, field", [
    ({"retry": {"rules": [{"reasons": ["node_lost"]}]}}, "retry.rules.0.action"),
    ({"retry": {"rules": [{"reasons": ["exploded"], "action": "retry"}]}},
     "retry.rules.0.reasons.0"),
    ({"retry": {"rules": [{"action": "retry"}]}}, "retry.rules.0"),
    ({"retry": {"rules": [{"exit_codes": [0], "action": "fail"}]}},
     "retry.rules.0.exit_codes.0"),
    ({"retry": {"rules": [{"signals": ["SIGNOPE"], "action": "fail"}]}},
     "retry.rules.0.signals.0"),
    ({"retry": {"rules": [{"reasons": ["stalled"], "action": "sometimes"}]}},
     "retry.rules.0.action"),
    ({"retry": {"rules": [{"reasons": ["stalled"], "action": "fail", "when": 1}]}},
     "retry.rules.0.when"),
    ({"retry": {"max_uncounted_retries": -1}}, "retry.max_uncounted_retries"),
    ({"retry": {"rules": [{"reasons": ["stalled"], "action": "fail"}] * 17}}, "retry.rules"),
    ({"max_runtime_s": 0}, "max_runtime_s"),
    ({"max_runtime_s": 1.5}, "max_runtime_s"),
    ({"max_pending_s": 0}, "max_pending_s"),
    ({"warn_before_s": 60}, "warn_before_s"),
    ({"max_runtime_s": 60, "warn_before_s": 60}, "warn_before_s"),
    ({"max_runtime_s": 60, "warn_before_s": 30, "warn_signal": "SIGKILL"}, "warn_signal"),
    ({"max_runtime_s": 60, "warn_signal": "SIGUSR2"}, "warn_signal"),
    ({"checkpoint_dir": "relative"}, "checkpoint_dir"),
])
def test_a_malformed_retry_rule_or_time_limit_is_a_400_naming_its_field(body, field):
    with pytest.raises(InvalidArgument) as caught:
        check({**GOOD, **body})
    assert caught.value.field == field, caught.value


def test_the_lifecycle_members_are_kept_with_their_defaults_filled():
    spec = JobSpec.parse(check({
        **GOOD, "max_runtime_s": 3600, "warn_before_s": 300, "max_pending_s": 600,
        "checkpoint_dir": "/shared/ckpt",
        "retry": {"rules": [{"exit_codes": [42], "action": "fail"}]}})).to_json()
    assert spec["retry"] == {"rules": [{"exit_codes": [42], "action": "fail"}],
                             "max_uncounted_retries": 10}
    assert (spec["max_runtime_s"], spec["warn_before_s"], spec["warn_signal"]) == (
        3600, 300, "SIGUSR1")
    assert JobSpec.parse(check(GOOD)).to_json()["retry"] == {"rules": [],
                                                             "max_uncounted_retries": 10}
    assert "warn_signal" not in JobSpec.parse(check({**GOOD, "max_runtime_s": 60})).to_json()
