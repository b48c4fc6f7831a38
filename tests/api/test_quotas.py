"""Per-tenant limits (issue 9): over max_pending_jobs a create is 429
quota_exceeded, never a silent queue, and the count is kept in the same
transactions that move jobs in and out of PENDING, so no flood can exceed it;
a tenant at max_running_gpus is skipped by the placer, saying why."""
import json
import threading

import pytest
from pynamodb.connection.base import Connection
from pynamodb.exceptions import CancellationReason, TransactWriteError, VerboseClientError

from chalicelib.adapters.models import TenantModel
from chalicelib.domain.errors import QuotaExceeded
from chalicelib.domain.principal import Principal

from .helpers import race

AGENT = Principal("agent", "*")
BODY = {"command": ["python", "train.py"], "ranks": 1}


@pytest.fixture
def limited(make_services, aws_env, tenants):
    """Services where tenant A has the given limits (B keeps the defaults)."""
    def make(env=None, **limits):
        return make_services({**(env or aws_env),
                              "GPUJOBS_TENANT_LIMITS": json.dumps({tenants.a: limits})})
    return make


@pytest.fixture
def http(tenants):
    from chalice.test import Client

    import app

    with Client(app.app) as c:
        def post(path="/v1/jobs", body=BODY, who="a", **headers):
            return c.http.post(path, headers=tenants.headers(who, **headers),
                               body=json.dumps(body))
        post.get = lambda path, who="a": c.http.get(path, headers=tenants.headers(who))
        yield post


def pending_count(tenant: str) -> int:
    return int(TenantModel.get(tenant, consistent_read=True).pending)


def test_over_max_pending_jobs_a_create_is_429_naming_the_limit_and_writes_nothing(
        limited, http, tenants):
    limited(max_pending_jobs=2)
    assert [http().status_code for _ in range(2)] == [201, 201]
    r = http()
    assert r.status_code == 429
    problem = r.json_body
    assert problem["code"] == "quota_exceeded" and problem["status"] == 429
    assert "max_pending_jobs" in problem["detail"] and "2" in problem["detail"]
    assert r.headers["Content-Type"].startswith("application/problem+json")
    assert int(r.headers["Retry-After"]) > 0
    listed = http.get("/v1/jobs").json_body["jobs"]
    assert len(listed) == 2, "nothing half-written, no silent queue"
    assert pending_count(tenants.a) == 2
    assert http(who="b").status_code == 201, "another tenant has its own limit"


def test_an_idempotent_replay_is_not_counted_twice_and_is_served_at_the_limit(
        limited, http, tenants):
    limited(max_pending_jobs=2)
    first = http(**{"Idempotency-Key": "k1"})
    assert first.status_code == 201
    again = http(**{"Idempotency-Key": "k1"})
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json_body["id"] == first.json_body["id"]
    assert pending_count(tenants.a) == 1
    assert http(**{"Idempotency-Key": "k2"}).status_code == 201
    assert http(**{"Idempotency-Key": "k3"}).status_code == 429
    at_limit = http(**{"Idempotency-Key": "k1"})
    assert at_limit.status_code == 201 and at_limit.headers["Idempotent-Replayed"] == "true"
    assert at_limit.json_body["id"] == first.json_body["id"]
    assert pending_count(tenants.a) == 2


def test_a_cancelled_pending_job_frees_its_place(limited, http, tenants):
    limited(max_pending_jobs=1)
    job_id = http(**{"Idempotency-Key": "c1"}).json_body["id"]
    assert http().status_code == 429
    assert http(f"/v1/jobs/{job_id}/cancel", body={}).status_code == 202
    assert pending_count(tenants.a) == 0
    assert http().status_code == 201


def test_a_flood_of_concurrent_creates_never_exceeds_the_limit(limited, tenants):
    """The count and its condition are in the create's transaction: threads racing
    past the limit get 429, and exactly the limit's worth of jobs exist."""
    services = limited(max_pending_jobs=10)
    answers: list[str] = []
    errors: list[Exception] = []
    lock = threading.Lock()

    def flood():
        for _ in range(5):
            try:
                services.jobs.submit(tenants.a, dict(BODY), None)
                outcome = "created"
            except QuotaExceeded:
                outcome = "refused"
            except Exception as e:  # noqa: BLE001 - any other failure is reported below
                errors.append(e)
                continue
            with lock:
                answers.append(outcome)

    race(flood, 8)
    assert not errors, errors
    assert answers.count("created") == 10 and answers.count("refused") == 30
    jobs, _ = services.store.page(tenants.a, "PENDING", 100, None)
    assert len(jobs) == 10 and pending_count(tenants.a) == 10


def _conflict_on_the_counter(calls):
    """DynamoDB cancels a transaction that collides with another on the same item
    (moto does not simulate it): the counter item loses the first ``calls``."""
    real = Connection.transact_write_items

    def conflicting(self, *args, **kwargs):
        # pynamodb sends checks, puts, then updates: [the fleet's check (a job made
        # parked),] the job, the tenant count, for a create without a key; one
        # reason an item, as DynamoDB answers
        if calls and len(kwargs["put_items"]) == 1 and len(kwargs["update_items"]) == 1:
            calls.pop()
            before = [None] * (len(kwargs["condition_check_items"] or ()) + 1)
            cause = VerboseClientError(
                {"Error": {"Code": "TransactionCanceledException", "Message": "conflict"}},
                "TransactWriteItems", {},
                cancellation_reasons=[*before, CancellationReason(code="TransactionConflict")])
            raise TransactWriteError("Failed to write transaction items", cause)
        return real(self, *args, **kwargs)
    return conflicting


def test_a_create_that_collides_on_the_tenant_count_is_retried(
        services, http, tenants, monkeypatch):
    monkeypatch.setattr(Connection, "transact_write_items", _conflict_on_the_counter([1]))
    assert http().status_code == 201
    assert pending_count(tenants.a) == 1


def test_a_create_that_keeps_colliding_is_503_with_retry_after(
        services, http, tenants, monkeypatch):
    monkeypatch.setattr(Connection, "transact_write_items",
                        _conflict_on_the_counter([1] * 10))
    r = http()
    assert r.status_code == 503 and r.json_body["code"] == "unavailable"
    assert int(r.headers["Retry-After"]) >= 1
    assert http.get("/v1/jobs").json_body["jobs"] == [], "nothing written"


# -- the GPU limit, in the placer ---------------------------------------------------
def _create(services, tenant, ranks, gpus_per_rank=8, gpu_type="quota"):
    job, _ = services.jobs.submit(tenant, {"command": ["x"], "ranks": ranks,
                                           "gpus_per_rank": gpus_per_rank,
                                           "gpu_type": gpu_type}, None)
    return job["job_id"]


def test_a_tenant_at_max_running_gpus_is_skipped_with_a_reason_and_uses_no_try(
        limited, fresh_env, tenants):
    s = limited(fresh_env, max_running_gpus=8)
    for n in ("q1", "q2", "q3"):
        s.nodes.register(AGENT, n, {"gpus": 8, "gpu_type": "quota"})
    a1, a2, a3 = (_create(s, tenants.a, 1) for _ in range(3))
    b = _create(s, tenants.b, 1)
    first = s.placer.run()
    assert a1 in first.placed and b in first.placed
    assert set(first.limited) == {a2, a3}
    reason = s.store.get(a2).pending_reason
    assert "GPU limit" in reason and "max_running_gpus" in reason and "8" in reason
    assert pending_count(tenants.a) == 2 and pending_count(tenants.b) == 0
    # one try per run: the limited jobs do not take it from B's next job
    b2 = _create(s, tenants.b, 1)
    assert s.placer.run(limit=1).placed == [b2]


def test_the_count_follows_every_move_in_and_out_of_pending(make_services, fresh_env,
                                                           tenants):
    """Create +1, place -1, a retry back to PENDING +1, cancel -1."""
    s = make_services(fresh_env)
    s.nodes.register(AGENT, "r1", {"gpus": 8, "gpu_type": "quota"})
    job, _ = s.jobs.submit(tenants.a, {"command": ["x"], "ranks": 1, "gpu_type": "quota",
                                       "max_attempts": 2}, None)
    job_id = job["job_id"]
    assert pending_count(tenants.a) == 1
    assert s.placer.run().placed == [job_id]
    assert pending_count(tenants.a) == 0
    s.attempts.report(AGENT, job_id, 1, {"type": "EXITED", "ranks": [0], "exit_code": 1,
                                         "node_id": "r1"})
    assert s.store.get(job_id).state.value == "PENDING", "a second attempt waits"
    assert pending_count(tenants.a) == 1
    s.jobs.cancel(tenants.a, job_id, None)
    assert pending_count(tenants.a) == 0


def test_a_placement_that_collides_on_the_tenant_count_is_tried_again(
        make_services, fresh_env, tenants, monkeypatch):
    s = make_services(fresh_env)
    s.nodes.register(AGENT, "k1", {"gpus": 8, "gpu_type": "quota"})
    job_id = _create(s, tenants.a, 1)
    real = Connection.transact_write_items
    lost = []

    def conflicting(self, *args, **kwargs):
        items = len(kwargs["put_items"]) + len(kwargs["update_items"])
        if not lost and len(kwargs["put_items"]) == 2:  # the attempt and its LAUNCH
            lost.append(job_id)
            cause = VerboseClientError(
                {"Error": {"Code": "TransactionCanceledException", "Message": "conflict"}},
                "TransactWriteItems", {},
                cancellation_reasons=[None] * (items - 1)
                + [CancellationReason(code="TransactionConflict")])
            raise TransactWriteError("Failed to write transaction items", cause)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Connection, "transact_write_items", conflicting)
    assert s.placer.run().placed == [job_id]
    assert lost == [job_id], "the first try lost on the count"
    assert pending_count(tenants.a) == 0
