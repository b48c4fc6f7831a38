"""The typed spec (chalicelib/domain/spec.py): the schema's fields and
JobSpec's are the same, every default is filled by JobSpec.parse alone, and
what is stored and shown is the body as submitted, defaults filled."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from chalicelib.api import schemas, validation
from chalicelib.domain.arrays import ArraySpec
from chalicelib.domain.dependencies import Dependency
from chalicelib.domain.retry import RetryRule, RetrySpec
from chalicelib.domain.spec import HeartbeatSpec, JobSpec

#: every member the schema allows, none at its default
FULL = {
    "name": "train", "command": ["python", "train.py", "--lr", "0.1"], "ranks": 8,
    "working_dir": "/data/run", "env": {"A": "1"}, "gpus_per_rank": 2, "gpu_type": "h100",
    "priority": 5, "priority_class": "urgent", "max_attempts": 3,
    "retry": {"rules": [{"reasons": ["node_lost"], "exit_codes": [42],
                         "signals": ["SIGKILL"], "action": "fail"}],
              "max_uncounted_retries": 4},
    "max_runtime_s": 3600, "warn_before_s": 300, "warn_signal": "SIGUSR2",
    "max_pending_s": 600, "checkpoint_dir": "/shared/ckpt",
    "heartbeat": {"interval_s": 5, "false_positive_budget_per_hour": 0.01,
                  "miss_probability": 0.05, "startup_grace_s": 60, "mode": "beats",
                  "max_busy_s": 100, "idle_s": 50, "slow_score": 0.5},
    "on_stall": "restart",
    "depends_on": [{"job_id": "job_01ARZ3NDEKTSV4RRFFQ69G5FAV", "condition": "ended"}],
    "array": {"size": 2, "max_parallel": 1, "max_failed_indexes": 1,
              "env": {"LR": ["0.1", "0.2"]}},
    "labels": {"team": "ml"},
}
MINIMAL = {"command": ["x"], "ranks": 1}


def check(body: dict) -> dict:
    return validation.validate("JOB_CREATE", body)


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls, schema", [
    (JobSpec, schemas.JOB_CREATE), (HeartbeatSpec, schemas.HEARTBEAT),
    (RetrySpec, schemas.RETRY), (RetryRule, schemas.RETRY_RULE),
    (ArraySpec, schemas.ARRAY), (Dependency, schemas.DEPENDS_ON["items"]),
])
def test_each_typed_part_has_exactly_the_fields_its_schema_allows(cls, schema):
    """A field added to the schema and not to the spec (or the other way) fails here."""
    assert _names(cls) == set(schema["properties"])


def test_the_full_example_sets_every_field_so_none_goes_untested():
    """FULL is valid and leaves no field of the spec at its default: a new
    field must join it, and so the round trip below."""
    spec = JobSpec.parse(check(copy.deepcopy(FULL)))
    default = JobSpec.parse(MINIMAL)
    unchanged = [f.name for f in dataclasses.fields(JobSpec)
                 if getattr(spec, f.name) == getattr(default, f.name)]
    assert unchanged == []


@pytest.mark.parametrize("body", [MINIMAL, FULL, {**MINIMAL, "depends_on": []},
                                  {**MINIMAL, "max_runtime_s": 60, "warn_before_s": 5}])
def test_what_is_stored_parses_back_to_the_same_spec_and_shows_the_same(body):
    spec = JobSpec.parse(check(copy.deepcopy(body)))
    shown = spec.to_json()
    assert JobSpec.parse(shown) == spec
    assert JobSpec.parse(shown).to_json() == shown


def test_what_is_shown_is_the_body_as_submitted_with_the_defaults_filled():
    assert JobSpec.parse(FULL).to_json() == FULL, "nothing given is changed or dropped"
    assert JobSpec.parse(MINIMAL).to_json() == {
        **MINIMAL, "env": {}, "labels": {}, "gpus_per_rank": 1, "priority": 0,
        "max_attempts": 1, "on_stall": "report",
        "retry": {"rules": [], "max_uncounted_retries": 10},
        "heartbeat": {"interval_s": 10, "false_positive_budget_per_hour": 0.001,
                      "miss_probability": 0.01, "startup_grace_s": 120, "mode": "auto",
                      "max_busy_s": 900, "idle_s": 300, "slow_score": 0.7}}


def test_defaults_that_depend_on_another_member_are_filled_only_with_it():
    warned = JobSpec.parse({**MINIMAL, "max_runtime_s": 60, "warn_before_s": 5})
    assert warned.warn_signal == "SIGUSR1"
    assert JobSpec.parse({**MINIMAL, "max_runtime_s": 60}).warn_signal is None
    dep = JobSpec.parse({**MINIMAL, "depends_on": [{"job_id": "j"}]})
    assert dep.depends_on == (Dependency("j", "succeeded"),)
    assert dep.to_json()["depends_on"] == [{"job_id": "j", "condition": "succeeded"}]


def test_parsing_leaves_the_body_as_it_was_and_shares_nothing_with_it():
    """The body's hash is the idempotency key's: parsing must not change it,
    and a later change of what is shown must not reach it."""
    body = copy.deepcopy(FULL)
    spec = JobSpec.parse(body)
    assert body == FULL
    shown = spec.to_json()
    shown["env"]["B"] = "2"
    shown["command"].append("y")
    shown["heartbeat"]["interval_s"] = 1
    assert body == FULL and spec.to_json() == FULL
