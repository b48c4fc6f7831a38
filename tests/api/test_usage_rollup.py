"""GET /v1/usage (issue 46 item 2) on the moto stack: usage rolled up as
attempts end, by hour and day, grouped by GPU type, a label or job. The rows
sum exactly, to the GPU-second, to the jobs' own ``usage``: a job that failed
then was retried, one cancelled, one that succeeded, and one still running
(counted up to the read). A tenant sees its own, an operator any or all,
another tenant nothing of ours; bad input is a 400 naming the field."""
from collections import Counter
from datetime import timedelta

import pytest

from chalicelib.domain.clock import iso as iso_text
from chalicelib.domain.principal import Principal

from .test_events import event, placed

AGENT = Principal("agent", "*")


@pytest.fixture
def cluster(iso):
    return {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url for n in ("n1", "n2")}


def run(client, tenants, job_id, attempt, by_node, clock, *, startup, then):
    clock.advance(startup)
    for n, ranks in by_node.items():
        event(client, tenants, job_id, attempt, {"type": "STARTED", "ranks": ranks, "node_id": n})
    clock.advance(then)


def exit_all(client, tenants, job_id, attempt, by_node, code):
    for n, ranks in by_node.items():
        r = event(client, tenants, job_id, attempt,
                  {"type": "EXITED", "ranks": ranks, "exit_code": code, "node_id": n})
    return r.json_body


def usage_of(client, tenants, job_id):
    return client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body["usage"]


def read(client, tenants, who="a", **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return client.http.get(f"/v1/usage?{query}", headers=tenants.headers(who))


def parts(u) -> Counter:
    return Counter({"productive": u["productive_gpu_seconds"], **u["lost_gpu_seconds"]})


def row_parts(rows) -> Counter:
    out: Counter = Counter()
    for r in rows:
        out["productive"] += r["productive_gpu_seconds"]
        out.update(r["lost_gpu_seconds"])
        assert r["gpu_seconds"] == r["productive_gpu_seconds"] + sum(r["lost_gpu_seconds"].values())
        assert r["gpu_hours"] == round(r["gpu_seconds"] / 3600, 6)
    return +out


@pytest.fixture
def story(iso, iso_client, tenants, cluster, clock):
    """Three jobs of tenant a, one after the other on the cluster's 4 GPUs,
    over hours: failed then retried (team nlp), cancelled (team cv),
    succeeded (no label)."""
    begun = clock()
    c = iso_client
    retried, by_node = placed(iso, c, tenants, max_attempts=2, labels={"team": "nlp"},
                              name="retried")
    run(c, tenants, retried, 1, by_node, clock, startup=12.3, then=2000.4)
    assert exit_all(c, tenants, retried, 1, by_node, 3)["state"] == "PENDING"
    clock.advance(10)
    assert iso.placer.run().placed == [retried]
    run(c, tenants, retried, 2, by_node, clock, startup=20.7, then=5000.9)
    assert exit_all(c, tenants, retried, 2, by_node, 0)["state"] == "SUCCEEDED"
    cancelled, by_node = placed(iso, c, tenants, labels={"team": "cv"}, name="cancelled")
    run(c, tenants, cancelled, 1, by_node, clock, startup=3.1, then=1500.2)
    c.http.post(f"/v1/jobs/{cancelled}/cancel", headers=tenants.headers())
    for n, ranks in by_node.items():
        r = event(c, tenants, cancelled, 1, {"type": "STOPPED", "ranks": ranks, "node_id": n})
    assert r.json_body["state"] == "CANCELLED"
    succeeded, by_node = placed(iso, c, tenants, name="succeeded")
    run(c, tenants, succeeded, 1, by_node, clock, startup=7.7, then=800.05)
    assert exit_all(c, tenants, succeeded, 1, by_node, 0)["state"] == "SUCCEEDED"
    return begun, [retried, cancelled, succeeded]


def test_rows_sum_exactly_to_the_jobs_usage_hour_and_day_by_any_group(iso, iso_client, tenants,
                                                                      story, clock):
    begun, jobs = story
    c = iso_client
    expected = sum((parts(usage_of(c, tenants, j)) for j in jobs), Counter())
    assert expected["failed_attempt"] > 0 and expected["cancelled"] > 0
    start = iso_text(begun - timedelta(hours=1))
    for granularity in ("hour", "day"):
        for group_by in (None, "gpu_type", "job", "label:team"):
            params = {"start": start, "granularity": granularity,
                      **({"group_by": group_by} if group_by else {})}
            r = read(c, tenants, **params)
            assert r.status_code == 200, r.json_body
            rows = r.json_body["rows"]
            assert row_parts(rows) == +expected, (granularity, group_by)
            assert {row["tenant"] for row in rows} == {tenants.a}
    by_job = read(c, tenants, start=start, granularity="day", group_by="job").json_body["rows"]
    for j in jobs:  # each job's rows are its usage, to the GPU-second
        mine = [row for row in by_job if row["group"] == {"job": j}]
        assert row_parts(mine) == +parts(usage_of(c, tenants, j))
        assert sum(row["jobs"] for row in mine) >= 1
    by_team = read(c, tenants, start=start, granularity="day",
                   group_by="label:team").json_body["rows"]
    teams = {row["group"]["label:team"] for row in by_team}
    assert teams == {"nlp", "cv", None}, "the jobs without the label are a row of their own"
    nlp = [row for row in by_team if row["group"] == {"label:team": "nlp"}]
    assert row_parts(nlp) == +parts(usage_of(c, tenants, jobs[0]))
    hourly = read(c, tenants, start=start, granularity="hour").json_body["rows"]
    assert len(hourly) >= 2, "the jobs ran over more than one hour"
    assert all(row["end"] > row["start"] for row in hourly)


def test_a_running_job_counts_up_to_now(iso, iso_client, tenants, story, cluster, clock):
    begun, jobs = story
    c = iso_client
    closed = sum((parts(usage_of(c, tenants, j)) for j in jobs), Counter())
    running, by_node = placed(iso, c, tenants, name="running")
    run(c, tenants, running, 1, by_node, clock, startup=5, then=3000)
    before = usage_of(c, tenants, running)["gpu_seconds"]
    rows = read(c, tenants, start=iso_text(begun - timedelta(hours=1))).json_body["rows"]
    after = usage_of(c, tenants, running)["gpu_seconds"]
    held = sum(row["gpu_seconds"] for row in rows)
    assert sum(closed.values()) + before <= held <= sum(closed.values()) + after


def test_a_tenant_sees_its_own_an_operator_any_or_all(iso, iso_client, tenants, story):
    begun, _ = story
    c = iso_client
    start = iso_text(begun - timedelta(hours=1))
    mine = read(c, tenants, start=start).json_body["rows"]
    assert mine and read(c, tenants, "b", start=start).json_body == {"rows": []}
    other = read(c, tenants, "b", start=start, tenant=tenants.a)
    assert other.status_code == 403 and other.json_body["code"] == "forbidden"
    ops = read(c, tenants, "ops", start=start, tenant=tenants.a)
    assert ops.status_code == 200 and ops.json_body["rows"] == mine
    everyone = read(c, tenants, "ops", start=start).json_body["rows"]
    assert [row for row in everyone if row["tenant"] == tenants.a] == mine
    assert read(c, tenants, "agents", start=start).status_code == 403


@pytest.mark.parametrize("params, field", [
    ({}, "start"),
    ({"start": "yesterday"}, "start"),
    ({"start": "2026-13-01T00:00:00Z"}, "start"),
    ({"start": "2026-12-01T00:00:00Z", "end": "2026-11-01T00:00:00Z"}, "end"),
    ({"start": "2024-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end"),
    ({"start": "2026-12-01T00:00:00Z", "end": "soon"}, "end"),
    ({"start": "2026-12-01T00:00:00Z", "granularity": "week"}, "granularity"),
    ({"start": "2026-12-01T00:00:00Z", "group_by": "team"}, "group_by"),
    ({"start": "2026-12-01T00:00:00Z", "group_by": "label:"}, "group_by"),
])
def test_bad_input_is_a_400_naming_the_field(iso, iso_client, tenants, params, field):
    r = read(iso_client, tenants, **params)
    assert r.status_code == 400, r.json_body
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert r.json_body["code"] == "invalid_argument" and r.json_body["field"] == field


def test_a_price_book_adds_cost(make_services, fresh_env, iso_client, tenants, cluster, clock):
    iso = make_services({**fresh_env, "GPUJOBS_PRICES": '{"any": 2.5}'})
    iso.nodes.register(AGENT, "n1", {"gpus": 2})
    iso.nodes.register(AGENT, "n2", {"gpus": 2})
    begun = clock()
    job_id, by_node = placed(iso, iso_client, tenants)
    run(iso_client, tenants, job_id, 1, by_node, clock, startup=0, then=900)
    exit_all(iso_client, tenants, job_id, 1, by_node, 0)
    rows = read(iso_client, tenants, start=iso_text(begun - timedelta(hours=1))).json_body["rows"]
    held = sum(row["gpu_seconds"] for row in rows)
    assert held == pytest.approx(4 * 900, abs=4)
    assert sum(row["cost"] for row in rows) == pytest.approx(held / 3600 * 2.5, abs=0.02)


def test_a_roll_that_failed_is_made_up_by_the_sweep_once(iso, iso_client, tenants, cluster,
                                                         clock, monkeypatch):
    from chalicelib.service.usage_rollup import SWEEP_AFTER_S, UsageService

    begun = clock()
    real = UsageService.roll

    def lost(self, job_id, attempt=None):
        raise ConnectionError("the roll's follow-up is lost")

    monkeypatch.setattr(UsageService, "roll", lost)
    job_id, by_node = placed(iso, iso_client, tenants)
    run(iso_client, tenants, job_id, 1, by_node, clock, startup=5, then=600)
    assert exit_all(iso_client, tenants, job_id, 1, by_node, 0)["state"] == "SUCCEEDED"
    monkeypatch.setattr(UsageService, "roll", real)
    start = iso_text(begun - timedelta(hours=1))
    assert read(iso_client, tenants, start=start).json_body["rows"] == []
    assert iso.usage.sweep() == 0, "not before SWEEP_AFTER_S"
    clock.advance(SWEEP_AFTER_S + 1)
    assert iso.usage.sweep() == 1
    assert iso.usage.sweep() == 0, "done: no longer due"
    rows = read(iso_client, tenants, start=start).json_body["rows"]
    assert row_parts(rows) == +parts(usage_of(iso_client, tenants, job_id))
    assert iso.usage.roll(job_id, 1) == 0, "a repeat adds nothing"
    assert row_parts(read(iso_client, tenants, start=start).json_body["rows"]) == row_parts(rows)


def test_an_operators_rows_of_every_tenant_are_by_period_then_tenant(iso, iso_client, tenants,
                                                                    story):
    begun, _ = story
    rows = read(iso_client, tenants, "ops", start=iso_text(begun - timedelta(hours=1)),
                granularity="hour").json_body["rows"]
    assert [(r["start"], r["tenant"]) for r in rows] == \
        sorted((r["start"], r["tenant"]) for r in rows)
