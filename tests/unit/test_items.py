"""The raw-item codec reads and writes exactly what PynamoDB's models do
(chalicelib/adapters/items.py), so the hot paths that skip model instances
store and serve the same jobs as every other path."""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings, strategies as st
from pynamodb.attributes import MapAttribute

from chalicelib.adapters.items import Codec
from chalicelib.adapters.jobs_table import (
    job_from_item,
    job_values,
    new_job_item,
    new_job_values,
    view_from_item,
)
from chalicelib.adapters.models import MODELS, AttemptModel, JobModel, NodeModel, OutboxModel
from chalicelib.domain.health import initial_health
from chalicelib.domain.jobs import Job
from chalicelib.domain.spec import JobSpec
from chalicelib.domain.states import JobState
from chalicelib.fastjson import RawJSON

T0 = datetime(2026, 12, 1, 2, 3, 4, 567000, tzinfo=timezone.utc)
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8)


def _job(**changes) -> Job:
    spec = JobSpec.parse({"command": ["python", "train.py"], "ranks": 4, "name": "n",
                          "labels": {"team": "ml ✓"}, "env": {"A": "1\n\t\"x\""}})
    values = dict(job_id="j-0123456789abcdef", tenant="acme", state=JobState.PENDING,
                  spec=spec, created_at=T0, updated_at=T0, name="n",
                  health=initial_health(spec, 60))
    values.update(changes)
    return Job(**values)


JOBS = [
    _job(),
    _job(state=JobState.RUNNING, attempt=2, started_at=T0, inboxes={"n1": "https://q/1"},
         idem_id="acme#k", pending_reason=None, incident_key="2#1", waiting_on="3@x"),
    _job(state=JobState.CANCELLED, finished_at=T0, cancel_requested_at=T0,
         cancel_reason="because ✗", exit={"reason": "cancelled", "exit_code": None},
         pending_reason="waiting for 32 H100 GPUs"),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.state.value)
def test_a_job_item_reads_as_the_model_path_reads_it(job):
    model = JobModel(**new_job_values(job))
    # set by later transitions, not by a new job's item
    model.incident_key, model.waiting_on = job.incident_key, job.waiting_on
    item = model.serialize()
    assert job_from_item(item) == job
    assert Codec(JobModel).values(item) == {
        name: _plain(getattr(JobModel.from_raw_data(item), name))
        for name in JobModel.get_attributes()}


def _plain(value):
    """A model's map attribute as the codec gives it: a dict."""
    return value.as_dict() if isinstance(value, MapAttribute) else value


@pytest.mark.parametrize("model", list(MODELS), ids=lambda m: m.__name__)
def test_an_item_with_absent_and_null_attributes_reads_as_pynamodb_reads_it(model):
    """Absent and NULL attributes are their default (``attempt`` 0, ``events``
    {}) or None, exactly as on a model read from DynamoDB."""
    keys = {a.attr_name: {a.attr_type: "1" if a.attr_type == "N" else "k"}
            for a in model.get_attributes().values() if a.is_hash_key or a.is_range_key}
    nulls = {a.attr_name: {"NULL": True} for a in model.get_attributes().values()
             if not (a.is_hash_key or a.is_range_key)}
    for item in (keys, {**nulls, **keys}):
        expected = model.from_raw_data(dict(item))
        got = Codec(model).values(item)
        assert got == {name: _plain(getattr(expected, name)) for name in model.get_attributes()}


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.state.value)
def test_writing_values_makes_the_item_a_model_serialises(job):
    model = JobModel(**new_job_values(job))
    values = {name: getattr(model, name) for name in JobModel.get_attributes()}
    assert Codec(JobModel).item(values) == model.serialize() == new_job_item(job)


def test_a_new_item_gets_the_models_defaults_and_refuses_a_missing_required_value():
    codec = Codec(JobModel)
    values = {name: getattr(JobModel(**job_values(JOBS[0])), name) for name in JobModel.get_attributes()}
    item = codec.item({**values, "attempt": None, "events": None})
    assert item["attempt"] == {"N": "0"} and item["events"] == {"M": {}}
    with pytest.raises(ValueError, match="JobModel.spec"):
        codec.item({**values, "spec": None})


@settings(max_examples=60, deadline=None)
@given(node_ranks=st.dictionaries(text, json_values.filter(lambda v: v is not None),
                                  max_size=4),
       labels=st.dictionaries(text, text, max_size=4), gpus=st.integers(1, 1024))
def test_json_and_number_attributes_round_trip_through_the_codec(node_ranks, labels, gpus):
    node = NodeModel("n1", gpus=gpus, gpus_free=gpus, gpu_type="H100", state="READY",
                     address="10.0.0.1", labels=labels, inbox_queue_url="https://q",
                     last_seen_at="t", registered_at="t")
    codec = Codec(NodeModel)
    assert codec.item(codec.values(node.serialize())) == node.serialize()
    attempt = AttemptModel("j", 1, state="RUNNING", node_ranks=node_ranks,
                           node_gpus={}, world_size=1, created_at="t", exit_codes={})
    values = Codec(AttemptModel).values(attempt.serialize())
    assert values["node_ranks"] == node_ranks
    assert Codec(AttemptModel).item(values) == attempt.serialize()


def test_an_expression_value_is_the_attributes_serialisation():
    codec = Codec(OutboxModel)
    assert codec.value("targets", {"n1": "u"}) == {"S": OutboxModel.targets.serialize({"n1": "u"})}
    with pytest.raises(KeyError):
        codec.value("nope", 1)


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.state.value)
def test_a_job_read_as_a_view_shows_as_the_job_it_stores(job):
    """get and the list page read views straight from items (no Job, stored
    times passed through): what they show is what the Job shows."""
    from chalicelib.api.representation import job_json, job_view_json
    from chalicelib.service.views import view_of

    item = new_job_item(job)
    view = view_from_item(item)
    assert isinstance(view["spec"], RawJSON), "the spec is shown as stored, not decoded"
    assert view == view_of(job_from_item(item)), "the same text a Job's view holds"
    assert job_view_json(view) == job_json(job)


@settings(max_examples=60, deadline=None)
@given(env=st.dictionaries(text, text, max_size=4), labels=st.dictionaries(text, text, max_size=4),
       health=json_values,
       name=st.none() | text, reason=st.none() | text,
       times=st.lists(st.none() | st.datetimes(timezones=st.just(timezone.utc)),
                      min_size=3, max_size=3))
def test_any_job_read_as_a_view_shows_as_the_job_it_stores(env, labels, health, name, reason,
                                                           times):
    from chalicelib.api.representation import job_json, job_view_json

    started, finished, cancelled = times
    job = _job(spec=dataclasses.replace(JOBS[0].spec, env=env, labels=labels), health=health if isinstance(health, dict) else {},
               name=name, cancel_reason=reason, started_at=started, finished_at=finished,
               cancel_requested_at=cancelled)
    stored = job_from_item(new_job_item(job))  # times at milliseconds
    assert job_view_json(view_from_item(new_job_item(job))) == job_json(stored)


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(text, json_values, max_size=4))
def test_a_raw_map_of_json_values_is_written_as_pynamodb_writes_it(value):
    """The codec's own serialiser for raw maps (a job's events) writes
    exactly what PynamoDB's MapAttribute does, nested maps and lists, None,
    booleans and numbers included."""
    assert Codec(JobModel).value("events", value) == {"M": JobModel.events.serialize(value)}


@pytest.mark.parametrize("value", [{"s": {1, 2}}, {"t": (1, 2)}, {"b": b"x"}],
                         ids=["set", "tuple", "bytes"])
def test_a_raw_map_of_other_values_is_pynamodb_s_to_write(value):
    """What JSON has no form for goes to PynamoDB, which writes it or refuses
    it as it always did."""
    try:
        expected = {"M": JobModel.events.serialize(value)}
    except Exception as e:  # noqa: BLE001 - whatever PynamoDB raises, the codec raises
        with pytest.raises(type(e)):
            Codec(JobModel).value("events", value)
    else:
        assert Codec(JobModel).value("events", value) == expected


@settings(max_examples=100, deadline=None)
@given(n=st.integers(-10**30, 10**30) | st.floats(allow_nan=False))
def test_a_number_is_written_as_pynamodb_writes_it(n):
    assert Codec(JobModel).value("attempt", n) == {"N": JobModel.attempt.serialize(n)}
