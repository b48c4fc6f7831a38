"""GET /v1/jobs/{id} and GET /v1/jobs: tenant isolation, keyset paging, tokens."""
import json

import pytest

from .helpers import aws_calls

BODY = {"command": ["x"], "ranks": 1}


def create(client, tenants, n, who="a"):
    return [client.http.post("/v1/jobs", body=json.dumps(BODY),
                             headers=tenants.headers(who)).json_body["id"] for _ in range(n)]


def page_all(client, tenants, page_size, state=None, who="a"):
    ids, token, pages = [], None, 0
    while True:
        q = f"/v1/jobs?page_size={page_size}" + (f"&state={state}" if state else "")
        if token:
            q += f"&page_token={token}"
        r = client.http.get(q, headers=tenants.headers(who))
        assert r.status_code == 200, r.body
        ids += [j["id"] for j in r.json_body["jobs"]]
        token = r.json_body["next_page_token"]
        pages += 1
        if token is None:
            return ids, pages


def test_get_returns_the_job_with_one_read(client, tenants):
    """One read of the job, and for a PENDING job one of the placer's line
    (where it stands, domain/queue.py): never a query of the queue."""
    [job_id] = create(client, tenants, 1)
    with aws_calls() as calls:
        r = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers())
    assert r.status_code == 200 and r.json_body["id"] == job_id
    assert r.json_body["state"] == "PENDING"
    assert calls == [("dynamodb", "GetItem")] * 2
    client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    with aws_calls() as calls:
        r = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers())
    assert r.json_body["state"] == "CANCELLED" and r.json_body["queue"] is None
    assert calls == [("dynamodb", "GetItem")]


def test_another_tenants_job_is_404_exactly_like_a_missing_one(client, tenants):
    [job_id] = create(client, tenants, 1)
    theirs = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers("b"))
    missing = client.http.get("/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                              headers=tenants.headers("b"))
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json_body["code"] == missing.json_body["code"] == "not_found"


@pytest.mark.parametrize("job_id", ["nope", "job_" + "x" * 3000, "job_%00"])
def test_a_malformed_job_id_is_404_not_a_storage_error(client, tenants, job_id):
    r = client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers())
    assert r.status_code == 404


def test_listing_is_newest_first_and_every_job_appears_exactly_once(client, tenants):
    created = create(client, tenants, 23)
    ids, pages = page_all(client, tenants, page_size=7)
    assert ids == list(reversed(created))
    assert pages == 4, "7 + 7 + 7 + 2, and the last page says it is the last"


def test_a_full_last_page_carries_no_token(client, tenants):
    create(client, tenants, 6)
    r = client.http.get("/v1/jobs?page_size=6", headers=tenants.headers())
    assert len(r.json_body["jobs"]) == 6 and r.json_body["next_page_token"] is None


def test_an_unfiltered_page_is_one_query(client, tenants):
    create(client, tenants, 5)
    with aws_calls() as calls:
        client.http.get("/v1/jobs?page_size=3", headers=tenants.headers())
    assert calls == [("dynamodb", "Query")]


def test_tenants_only_list_their_own_jobs(client, tenants):
    mine = create(client, tenants, 3)
    create(client, tenants, 2, who="b")
    ids, _ = page_all(client, tenants, page_size=50)
    assert sorted(ids) == sorted(mine)


def test_a_state_filter_fills_pages_despite_limit_before_filter(client, tenants):
    created = create(client, tenants, 30)
    cancelled = created[::5]
    for job_id in cancelled:
        client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    ids, pages = page_all(client, tenants, page_size=2, state="CANCELLED")
    assert ids == list(reversed(cancelled))
    assert pages == 3, "full pages of 2, 2 and 2, none empty"


def test_a_state_filtered_page_is_one_query_whatever_the_history(client, tenants):
    """Filtered lists at the cost of the page: the (tenant, state) index holds
    only matching jobs, so 19 non-matching jobs cost no reads."""
    created = create(client, tenants, 20)
    client.http.post(f"/v1/jobs/{created[3]}/cancel", headers=tenants.headers())
    with aws_calls() as calls:
        r = client.http.get("/v1/jobs?state=CANCELLED&page_size=5", headers=tenants.headers())
    assert [j["id"] for j in r.json_body["jobs"]] == [created[3]]
    assert r.json_body["next_page_token"] is None
    assert calls == [("dynamodb", "Query")]


def test_a_job_moves_between_state_lists_with_its_state(client, tenants):
    [job_id] = create(client, tenants, 1)
    assert page_all(client, tenants, 10, state="PENDING")[0] == [job_id]
    client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    assert page_all(client, tenants, 10, state="PENDING")[0] == []
    assert page_all(client, tenants, 10, state="CANCELLED")[0] == [job_id]


def test_pages_are_cut_by_size_and_resume_exactly_at_the_cut(services, client, tenants,
                                                              monkeypatch):
    """Every response inside Lambda's limit: with a budget of three large jobs,
    a page of 50 holds three, and the token resumes right after the third."""
    from chalicelib.service import limits
    from chalicelib.service.jobs import job_wire_bytes

    big = {**BODY, "env": {f"V{i}": "x" * 1000 for i in range(6)}}
    created = [client.http.post("/v1/jobs", body=json.dumps(big),
                                headers=tenants.headers()).json_body["id"] for _ in range(7)]
    one = job_wire_bytes(services.store.view(created[0]))
    monkeypatch.setattr(limits, "PAGE_BUDGET_BYTES", 3 * one + one // 2)
    r = client.http.get("/v1/jobs?page_size=50", headers=tenants.headers())
    assert [j["id"] for j in r.json_body["jobs"]] == created[::-1][:3]
    assert limits.proxy_bytes(r.json_body["jobs"]) <= limits.PAGE_BUDGET_BYTES
    ids, pages = page_all(client, tenants, page_size=50)
    assert ids == created[::-1] and pages == 3, "3 + 3 + 1: no skips, no repeats"


def test_a_token_from_another_tenant_is_rejected(client, tenants):
    create(client, tenants, 3)
    token = client.http.get("/v1/jobs?page_size=1",
                            headers=tenants.headers()).json_body["next_page_token"]
    r = client.http.get(f"/v1/jobs?page_size=1&page_token={token}",
                        headers=tenants.headers("b"))
    assert r.status_code == 400 and r.json_body["code"] == "invalid_page_token"


def test_a_token_used_with_another_filter_is_rejected(client, tenants):
    create(client, tenants, 3)
    token = client.http.get("/v1/jobs?page_size=1",
                            headers=tenants.headers()).json_body["next_page_token"]
    r = client.http.get(f"/v1/jobs?page_size=1&state=PENDING&page_token={token}",
                        headers=tenants.headers())
    assert r.status_code == 400 and r.json_body["code"] == "invalid_page_token"


@pytest.mark.parametrize("token", ["garbage", "a.b", "eyJrIjoiam9iX3gifQ.AAAA", "x" * 5000])
def test_a_malformed_or_tampered_token_is_rejected(client, tenants, token):
    r = client.http.get(f"/v1/jobs?page_token={token}", headers=tenants.headers())
    assert r.status_code == 400 and r.json_body["code"] == "invalid_page_token"


@pytest.mark.parametrize("query, field", [
    ("page_size=0", "page_size"), ("page_size=501", "page_size"),
    ("page_size=abc", "page_size"), ("page_size=-1", "page_size"),
    ("page_size=99999999999", "page_size"), ("state=DONE", "state"),
    ("state=pending", "state"),
])
def test_bad_query_parameters_are_400_naming_them(client, tenants, query, field):
    r = client.http.get(f"/v1/jobs?{query}", headers=tenants.headers())
    assert r.status_code == 400
    assert r.json_body["code"] == "invalid_argument" and r.json_body["field"] == field


def test_listing_needs_a_tenant_token(client, tenants):
    assert client.http.get("/v1/jobs").status_code == 401
    assert client.http.get("/v1/jobs", headers=tenants.headers("agent")).status_code == 403


def test_health_needs_no_token(client):
    r = client.http.get("/v1/health")
    assert r.status_code == 200 and r.json_body == {"status": "ok"}


def test_unreachable_storage_is_503_with_retry_after(make_services, aws_env, tenants):
    from chalice.test import Client

    import app
    from chalicelib import bootstrap
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.config import Config

    dead = Config.from_env({**aws_env, "GPUJOBS_AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    bootstrap.install(bootstrap.build(dead, tokens=TokenStore.from_entries(tenants.entries)))
    try:
        with Client(app.app) as c:
            r = c.http.get("/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV", headers=tenants.headers())
            h = c.http.get("/v1/health")
    finally:
        bootstrap.install(None)
        make_services()  # re-bind the models to the live stack for later tests
    assert r.status_code == 503 and r.json_body["code"] == "unavailable"
    assert r.headers["Retry-After"] == "1"
    assert h.status_code == 503


def test_page_size_defaults_to_50(client, tenants):
    create(client, tenants, 51)
    page = client.http.get("/v1/jobs", headers=tenants.headers()).json_body
    assert len(page["jobs"]) == 50 and page["next_page_token"] is not None
