"""The SDK's pipelines and sweeps (issue 27) against the fake server:
depends_on and array pass through create_job, the job says what it waits for
and how its array stands, list_jobs(parent=) pages an array's children; the
parsers of gpujobs_client.pipelines; and the fake's answers checked against
chalicelib's own functions."""
from __future__ import annotations

import pytest

from gpujobs_client import (
    ArrayProgress,
    Dependency,
    InvalidArgument,
    Job,
    NotFound,
    PipelineError,
    depends_on,
    parse_array,
    parse_array_env,
    pipelines as pl,
)

from .fakeserver import FakeApi


# -- dependencies ---------------------------------------------------------------------
def test_create_job_sends_depends_on_and_the_job_says_what_it_waits_for(fake, sdk):
    prep = sdk.create_job(command=["prep"], ranks=1)
    train = sdk.create_job(command=["train"], ranks=2,
                           depends_on=[{"job_id": prep.id}])
    assert fake.sent("POST", "/v1/jobs")[1].json()["depends_on"] == [{"job_id": prep.id}]
    assert train.depends_on == [Dependency(prep.id, "succeeded")], "the default, filled in"
    assert train.waiting_for == [prep.id]
    assert train.pending_reason == f"waiting for {prep.id} to succeed"
    assert prep.waiting_for == [] and prep.depends_on == []
    fake.place(prep.id, ["n1"])
    fake.end(prep.id, "SUCCEEDED")
    released = sdk.get_job(train.id)
    assert (released.state, released.waiting_for, released.pending_reason) == (
        "PENDING", [], None)


def test_a_dependency_that_can_no_longer_be_met_ends_the_job_down_the_chain(fake, sdk):
    train = sdk.create_job(command=["train"], ranks=2)
    export = sdk.create_job(command=["export"], ranks=1, depends_on=[{"job_id": train.id}])
    publish = sdk.create_job(command=["publish"], ranks=1,
                             depends_on=[{"job_id": export.id, "condition": "succeeded"}])
    report = sdk.create_job(command=["report"], ranks=1,
                            depends_on=[{"job_id": train.id, "condition": "ended"}])
    fake.place(train.id, ["n1"])
    fake.end(train.id, "FAILED", exit_code=3)
    got = sdk.get_job(export.id)
    assert got.state == "FAILED" and got.exit is not None
    assert (got.exit.reason, got.exit.exit_code, got.exit.dependency) == (
        "dependency_failed", None, train.id)
    assert got.exit.detail == f"{train.id} ended FAILED; this job needed it to succeed"
    assert sdk.get_job(publish.id).exit.dependency == export.id  # type: ignore[union-attr]
    assert sdk.get_job(report.id).state == "PENDING", "--after: any end will do"
    (event,) = sdk.list_events(export.id)
    assert (event.type, event.reason, event.detail) == ("finished", "dependency_failed",
                                                        got.exit.detail)


def test_a_dependency_must_be_an_existing_job_of_the_tenant(fake, sdk, policy):
    from gpujobs_client import Client
    theirs = fake.add_job(tenant="other")
    mine = sdk.create_job(command=["x"], ranks=1)
    for bad, at in (([{"job_id": "job_nope"}], 0),
                    ([{"job_id": mine.id}, {"job_id": theirs["id"]}], 1),
                    ([{"job_id": mine.id}, {"job_id": mine.id, "condition": "ended"}], 1)):
        with pytest.raises(InvalidArgument) as e:
            sdk.create_job(command=["x"], ranks=1, depends_on=bad)
        assert e.value.field == f"depends_on.{at}.job_id"
    with Client(fake.url, "t2", timeout=5, retry=policy()) as other:
        with pytest.raises(NotFound):
            other.get_job(mine.id)


# -- arrays -------------------------------------------------------------------------------
def test_create_job_makes_an_array_and_the_parent_counts_its_indexes(fake, sdk):
    parent = sdk.create_job(command=["train"], ranks=1, name="sweep",
                            array={"size": 6, "max_parallel": 2,
                                   "env": {"LR": ["1", "2", "3", "4", "5", "6"]}})
    assert fake.sent("POST", "/v1/jobs")[0].json()["array"]["max_parallel"] == 2
    assert parent.is_array and isinstance(parent.array, ArrayProgress)
    assert (parent.array.size, parent.array.materialized) == (6, 2)
    assert parent.array.counts == {"PENDING": 6, "RUNNING": 0, "SUCCEEDED": 0, "FAILED": 0,
                                   "CANCELLED": 0}
    kids = list(sdk.iter_jobs(parent=parent.id))
    assert [(k.array_index, k.parent_id, k.name) for k in kids] == [
        (0, parent.id, "sweep[0]"), (1, parent.id, "sweep[1]")]
    assert kids[1].spec["env"] == {"LR": "2", "GPUJOBS_ARRAY_INDEX": "1",
                                   "GPUJOBS_ARRAY_SIZE": "6"}
    assert not kids[0].is_array and kids[0].array is None
    fake.place(kids[0].id, ["n1"])
    fake.end(kids[0].id, "SUCCEEDED")
    now = sdk.get_job(parent.id)
    assert now.state == "RUNNING" and now.array is not None
    assert now.array.counts["SUCCEEDED"] == 1 and now.array.materialized == 3
    assert now.array.ended == 1


def test_list_jobs_parent_pages_the_children_in_index_order(fake, sdk):
    parent = sdk.create_job(command=["x"], ranks=1, array={"size": 5})
    pages = list(sdk.iter_pages(parent=parent.id, page_size=2))
    assert [[j.array_index for j in p.jobs] for p in pages] == [[0, 1], [2, 3], [4]]
    calls = fake.sent("GET", "/v1/jobs")
    assert all(c.query["parent"] == [parent.id] for c in calls)
    assert "page_token" in calls[1].query
    assert [j.array_index for j in sdk.iter_jobs(parent=parent.id, limit=3)] == [0, 1, 2]
    fake.place(sdk.list_jobs(parent=parent.id).jobs[3].id, ["n1"])
    running = sdk.list_jobs(parent=parent.id, state="RUNNING")
    assert [j.array_index for j in running.jobs] == [3]
    sdk.list_jobs()
    assert "parent" not in fake.sent("GET", "/v1/jobs")[-1].query


def test_listing_the_children_of_what_is_not_an_array(fake, sdk):
    plain = sdk.create_job(command=["x"], ranks=1)
    with pytest.raises(InvalidArgument) as e:
        sdk.list_jobs(parent=plain.id)
    assert e.value.field == "parent"
    with pytest.raises(NotFound) as missing:
        sdk.list_jobs(parent="job_nope")
    assert missing.value.field == "parent"


def test_max_failed_indexes_fails_the_array_and_cancels_the_rest(fake, sdk):
    parent = sdk.create_job(command=["x"], ranks=1,
                            array={"size": 10, "max_parallel": 3, "max_failed_indexes": 1})
    kids = sdk.list_jobs(parent=parent.id).jobs
    for k in kids[:2]:
        fake.place(k.id, ["n1"])
        fake.end(k.id, "FAILED", exit_code=1)
    fake.place(kids[2].id, ["n1"])
    stopping = sdk.get_job(kids[2].id)
    assert stopping.cancel_requested_at is not None and stopping.state == "RUNNING"
    fake.end(kids[2].id, "CANCELLED")
    ended = sdk.get_job(parent.id)
    assert ended.state == "FAILED" and ended.exit is not None
    assert ended.exit.reason == "max_failed_indexes"
    assert ended.exit.detail == ("2 indexes failed, more than max_failed_indexes 1; 0 of 10 "
                                 "indexes succeeded, 2 failed, 8 cancelled (6 never started)")


def test_cancelling_an_array_cancels_every_index(fake, sdk):
    parent = sdk.create_job(command=["x"], ranks=1, array={"size": 4, "max_parallel": 2})
    first = sdk.list_jobs(parent=parent.id).jobs[0]
    fake.place(first.id, ["n1"])
    cancelled = sdk.cancel_job(parent.id, "wrong grid")
    assert cancelled.cancel_requested_at is not None and cancelled.state == "RUNNING"
    assert sdk.get_job(first.id).cancel_requested_at is not None
    fake.end(first.id, "CANCELLED")
    done = sdk.get_job(parent.id)
    assert done.state == "CANCELLED" and done.exit is not None
    assert done.exit.detail == "0 of 4 indexes succeeded, 4 cancelled (2 never started)"


def test_a_job_from_a_server_without_pipelines_has_none():
    job = Job.from_json({"id": "job_1", "state": "PENDING", "spec": {"command": ["x"]}})
    assert (job.waiting_for, job.parent_id, job.array_index, job.array, job.is_array,
            job.depends_on) == ([], None, None, None, False, [])


# -- the parsers ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("0-99%8", {"size": 100, "max_parallel": 8}),
    ("100%8", {"size": 100, "max_parallel": 8}),
    ("0-99", {"size": 100}),
    ("100", {"size": 100}),
    ("0-0", {"size": 1}),
    (" 0-9999%10000 ", {"size": 10000, "max_parallel": 10000}),
])
def test_parse_array_reads_slurms_notation_from_zero(text, want):
    assert parse_array(text) == want


@pytest.mark.parametrize("text, message", [
    ("1-100", "'1-100' starts at 1, but an array's indexes always start at 0: write 0-100 "
              "for 101 indexes, or 0-99 (or 100) for 100"),
    ("5-3", "ends before it starts"),
    ("0", "has 0 indexes; an array has 1 to 10,000"),
    ("0-10000", "has 10001 indexes"),
    ("10%0", "%0 is not 1 to 10,000 at once"),
    ("0-9%", "is not an array range"),
    ("a-b", "is not an array range"),
    ("1,2,3", "is not an array range"),
    ("-5", "is not an array range"),
])
def test_parse_array_says_what_is_wrong(text, message):
    with pytest.raises(PipelineError) as e:
        parse_array(text)
    assert message in str(e.value)


def test_parse_array_env_splits_one_value_per_index():
    assert parse_array_env("LR=0.1,0.01,0.001") == ("LR", ["0.1", "0.01", "0.001"])
    assert parse_array_env("TAG=a=b,") == ("TAG", ["a=b", ""])
    for bad, message in (("LR", "not NAME=V0,V1"), ("=1,2", "not NAME=V0,V1"),
                         ("9LR=1", "not an environment variable name")):
        with pytest.raises(PipelineError) as e:
            parse_array_env(bad)
        assert message in str(e.value)


def test_depends_on_keeps_the_order_and_names_a_job_once():
    assert depends_on([("succeeded", "job_a"), ("ended", "job_b")]) == [
        {"job_id": "job_a", "condition": "succeeded"}, {"job_id": "job_b", "condition": "ended"}]
    with pytest.raises(PipelineError, match="job_a is named twice"):
        depends_on([("succeeded", "job_a"), ("ended", "job_a")])
    with pytest.raises(PipelineError, match="at most 100"):
        depends_on([("ended", f"job_{i}") for i in range(101)])
    with pytest.raises(PipelineError, match="not one of"):
        depends_on([("afterok", "job_a")])


def test_the_array_and_its_counts_in_words():
    assert pl.array_spec_text({"size": 100, "max_parallel": 8, "max_failed_indexes": 2,
                               "env": {"LR": [], "BATCH": []}}) == (
        "100 indexes (0-99), at most 8 at once, fails once more than 2 failed; env LR, BATCH")
    assert pl.array_spec_text({"size": 1}) == "1 index (0)"
    progress = ArrayProgress.from_json({"size": 100, "materialized": 12, "counts": {
        "PENDING": 88, "RUNNING": 4, "SUCCEEDED": 7, "FAILED": 1, "CANCELLED": 0}})
    assert progress is not None
    assert pl.counts_text(progress) == "100: 88 pending, 4 running, 7 succeeded, 1 failed"


def test_a_dependency_stands_waiting_met_or_can_no_longer_be_met():
    spec = {"depends_on": [{"job_id": "job_a", "condition": "succeeded"},
                           {"job_id": "job_b", "condition": "ended"},
                           {"job_id": "job_c", "condition": "failed"}]}
    waiting = Job.from_json({"id": "job_x", "state": "PENDING", "spec": spec,
                             "waiting_for": ["job_a", "job_c"]})
    assert pl.dependency_lines(waiting) == ["job_a to succeed: waiting", "job_b to end: met",
                                            "job_c to fail: waiting"]
    failed = Job.from_json({"id": "job_x", "state": "FAILED", "spec": spec,
                            "waiting_for": ["job_a", "job_c"],
                            "exit": {"reason": "dependency_failed", "exit_code": None,
                                     "dependency": "job_a"}})
    assert pl.dependency_lines(failed) == ["job_a to succeed: can no longer be met",
                                           "job_b to end: -", "job_c to fail: -"]
    assert pl.dependencies_summary(spec) == "job_a to succeed, job_b to end, job_c to fail"


# -- the names, limits and words are the server's ----------------------------------------------
def test_the_limits_and_words_are_the_servers():
    deps = pytest.importorskip("chalicelib.domain.dependencies")
    arrays = pytest.importorskip("chalicelib.domain.arrays")
    schemas = pytest.importorskip("chalicelib.api.schemas")
    from gpujobs_client import models
    assert models.CONDITIONS == deps.CONDITIONS
    assert models.DEFAULT_CONDITION == deps.DEFAULT_CONDITION
    assert pl.MAX_DEPENDENCIES == deps.MAX_DEPENDENCIES == schemas.DEPENDS_ON["maxItems"]
    assert pl.MAX_ARRAY_SIZE == arrays.MAX_SIZE
    assert schemas.ARRAY["properties"]["max_parallel"]["maximum"] == pl.MAX_ARRAY_SIZE
    assert {c: f"to {w}" for c, w in deps._WAITING.items()} == pl.CONDITION_WORDS
    env = schemas.ARRAY["properties"]["env"]["propertyNames"]["pattern"]
    assert env == f"^{pl.ENV_NAME.pattern}$"
    from chalicelib.domain.states import JobState
    assert models.ARRAY_COUNT_STATES == tuple(arrays.Counts().by_state(1)) == tuple(
        s for s in (st.value for st in JobState) if s != "SCHEDULED")


def test_the_fakes_job_has_the_servers_members():
    pytest.importorskip("chalicelib.api.representation")
    from datetime import datetime, timezone

    from chalicelib.api.representation import job_view_json
    from chalicelib.domain import arrays
    from chalicelib.domain.health import initial_health
    from chalicelib.domain.jobs import Job as ServerJob
    from chalicelib.domain.spec import JobSpec
    from chalicelib.domain.states import JobState
    from chalicelib.service.views import view_of
    now = datetime(2025, 1, 31, 12, tzinfo=timezone.utc)
    spec = JobSpec.parse({"command": ["x"], "ranks": 1, "array": {"size": 4}})
    served = job_view_json(view_of(ServerJob(
        job_id="job_01JJ5D4Z7T3W9XKQ2M8N6P4R5S", tenant="t", state=JobState.PENDING,
        spec=spec, created_at=now, updated_at=now, name="n",
        health=initial_health(spec, 60.0), array_counts={k: 0 for k in arrays.COUNTERS})))
    fake = FakeApi()
    try:
        mine = fake.add_job(command=["x"], array={"size": 4})
        assert set(mine) == set(served)
        assert mine["array"]["counts"] == served["array"]["counts"]
        assert mine["spec"] == spec.to_json()
        body = {"command": ["x"], "ranks": 1, "depends_on": [{"job_id": mine["id"]}]}
        assert fake.add_job(**body)["spec"] == JobSpec.parse(body).to_json(), "the condition filled in"
    finally:
        fake.server.server_close()


@pytest.mark.parametrize("states, cancel, max_failed", [
    (["SUCCEEDED"] * 4, False, None),
    (["SUCCEEDED", "FAILED", "SUCCEEDED", "CANCELLED"], False, None),
    (["FAILED", "FAILED"], False, 1),
    (["SUCCEEDED", "CANCELLED"], True, None),
])
def test_the_fakes_array_ends_as_the_servers(states, cancel, max_failed):
    arrays = pytest.importorskip("chalicelib.domain.arrays")
    from chalicelib.domain.states import JobState
    fake = FakeApi()
    try:
        a = {"size": 4, "max_parallel": 4 if max_failed is None else 2}
        if max_failed is not None:
            a["max_failed_indexes"] = max_failed
        parent = fake.add_job(array=a)
        for i, state in enumerate(states):
            if cancel and i == len(states) - 1:
                fake.handle("POST", f"/v1/jobs/{parent['id']}/cancel", {},
                            {"authorization": "Bearer t1"}, b"")
                break
            kid = fake.children(parent["id"])[i]
            fake.place(kid["id"], ["n1"])
            fake.end(kid["id"], state)
        kids = fake.children(parent["id"])
        counts = arrays.Counts(
            materialized=len(kids),
            succeeded=sum(k["state"] == "SUCCEEDED" for k in kids),
            failed=sum(k["state"] == "FAILED" for k in kids),
            cancelled=sum(k["state"] == "CANCELLED" for k in kids))
        spec = arrays.ArraySpec(4, a["max_parallel"], max_failed)
        assert arrays.done(spec, counts, cancel)
        state, exit_ = arrays.final(spec, counts, cancel)
        assert parent["state"] == state.value
        assert parent["exit"] == exit_ or (state is JobState.SUCCEEDED and parent["exit"] is None)
    finally:
        fake.server.server_close()


@pytest.mark.parametrize("condition, ends", [("succeeded", "FAILED"), ("succeeded", "CANCELLED"),
                                             ("failed", "SUCCEEDED")])
def test_the_fakes_dependency_texts_are_the_servers(condition, ends):
    deps = pytest.importorskip("chalicelib.domain.dependencies")
    from chalicelib.domain.states import JobState
    fake = FakeApi()
    try:
        first, other = fake.add_job(), fake.add_job()
        job = fake.add_job(depends_on=[{"job_id": first["id"], "condition": condition},
                                       {"job_id": other["id"], "condition": "ended"}])
        spec = pytest.importorskip("chalicelib.domain.spec").JobSpec.parse(job["spec"])
        assert job["pending_reason"] == deps.waiting_reason(spec, job["waiting_for"])
        fake.end(first["id"], ends)
        assert job["exit"] == deps.failed_exit(deps.Dependency(first["id"], condition),
                                               JobState(ends))
        assert job["pending_reason"] is None and job["state"] == "FAILED"
    finally:
        fake.server.server_close()
