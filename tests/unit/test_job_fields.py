"""A job's fields are declared once (domain/jobs.py: each field of Job and
its Column). The store's model, the OpenAPI Job schema and the client's
model are held to that declaration here: a field missing from any of them,
or one of them holding a field the declaration does not, fails."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from chalicelib.adapters.models import JobModel
from chalicelib.domain.jobs import API_NAMES, COLUMNS, STORED_FIELDS, VIEW_FIELDS, Job
from gpujobs_client import models as client

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
#: the model's attributes that are not a Job's fields: index keys, the queue
#: key, the job's story and a parked job's fleet generation (adapters write them)
#: (``unfed``/``unfed_keys``: which story events the tenant's feed has not
#: numbered yet, adapters' bookkeeping, domain/feed.py)
NOT_FIELDS = {"tenant_state", "active_state", "queue_key", "events", "parked_generation",
              "unfed", "unfed_keys"}
#: what the API's job shows beside its fields: an array's progress, a
#: PENDING job's place in the placer's line (computed on read: domain/queue.py)
#: and its usage (computed on read: domain/usage.py)
API_EXTRA = {"array", "queue", "usage"}


def test_every_field_of_a_job_declares_how_it_is_stored():
    assert set(COLUMNS) == {f.name for f in dataclasses.fields(Job)}


def test_the_store_model_holds_exactly_the_declared_fields():
    assert set(JobModel.get_attributes()) - NOT_FIELDS == set(STORED_FIELDS)
    assert set(VIEW_FIELDS) <= set(STORED_FIELDS)


def test_the_openapi_job_schema_has_exactly_the_shown_fields():
    with OPENAPI.open(encoding="utf-8") as f:
        schema = yaml.safe_load(f)["components"]["schemas"]["Job"]
    assert set(schema["properties"]) == set(API_NAMES.values()) | API_EXTRA


def test_the_clients_job_model_has_exactly_the_shown_fields():
    """The client's Job (client/gpujobs_client/models.py) compares by the
    API's members; what it keeps beside them (the raw JSON, the key it sent,
    whether it was a replay) is left out of its comparison."""
    compared = {f.name for f in dataclasses.fields(client.Job) if f.compare}
    assert compared == set(API_NAMES.values()) | API_EXTRA
