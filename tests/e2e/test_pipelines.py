"""Pipelines and sweeps over real HTTP (issue 27): duplicates of one array's
create racing at the same instant make one array, whose children are made
once each; a dependency names an existing job of the tenant."""
from __future__ import annotations

import uuid

import pytest

from tests.e2e.test_races import THREADS, race
from tests.support.stacks import Api

pytestmark = pytest.mark.e2e


def _children(api: Api, parent: str) -> list[dict]:
    out, token = [], None
    while True:
        params = {"parent": parent, "page_size": 500, **({"page_token": token} if token else {})}
        page = api.get("/v1/jobs", params=params).json()
        out += page["jobs"]
        token = page["next_page_token"]
        if token is None:
            return out


def test_simultaneous_duplicates_of_an_array_make_one_array_and_its_children_once(stack):
    tag = uuid.uuid4().hex[:8]
    body = {"command": ["train"], "ranks": 1, "name": f"{tag}-sweep",
            "gpu_type": f"none-{tag}",  # no node has it: nothing runs, nothing moves
            "array": {"size": 50, "max_parallel": 4}}
    for round_ in range(3):
        responses = race(stack.api, "e2e-pipelines", f"{tag}-array-{round_}", body)
        assert all(r.status_code == 201 for r in responses), \
            [(r.status_code, r.text) for r in responses if r.status_code != 201]
        ids = {r.json()["id"] for r in responses}
        assert len(ids) == 1, f"round {round_}: {len(ids)} arrays for one key"
        [parent] = ids
        api = Api(stack.api, "e2e-pipelines")
        shown = api.get(f"/v1/jobs/{parent}").json()
        assert shown["array"] == {"size": 50, "materialized": 4, "counts": {
            "PENDING": 50, "RUNNING": 0, "SUCCEEDED": 0, "FAILED": 0, "CANCELLED": 0}}
        children = _children(api, parent)
        assert [c["array_index"] for c in children] == [0, 1, 2, 3]
        assert {c["parent_id"] for c in children} == {parent}
        assert [c["name"] for c in children] == [f"{tag}-sweep[{i}]" for i in range(4)]
        r = api.post(f"/v1/jobs/{parent}/cancel", json={"reason": "done racing"})
        assert r.status_code == 202
        cancelled = api.get(f"/v1/jobs/{parent}").json()
        assert cancelled["state"] == "CANCELLED", cancelled
        assert cancelled["array"]["counts"]["CANCELLED"] == 50
    assert THREADS >= 32


def test_a_dependency_on_another_tenant_s_job_is_a_400_naming_it(stack):
    theirs = Api(stack.api, "e2e-other").post("/v1/jobs", json={
        "command": ["x"], "ranks": 1}).json()["id"]
    mine = Api(stack.api, "e2e-pipelines")
    r = mine.post("/v1/jobs", json={"command": ["x"], "ranks": 1,
                                    "depends_on": [{"job_id": theirs}]})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "depends_on.0.job_id"
    assert theirs in r.json()["detail"]
    r = mine.get("/v1/jobs", params={"parent": theirs})
    assert (r.status_code, r.json()["field"]) == (404, "parent")
