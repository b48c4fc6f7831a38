"""The SDK retries only what is safe, within a budget, and a create retried
after a lost answer never makes a second job."""
from __future__ import annotations

import socket

import pytest

from gpujobs_client import (
    AlreadyFinished,
    ApiError,
    Client,
    IdempotencyKeyReused,
    InternalError,
    InvalidArgument,
    NotFound,
    RetryPolicy,
    ServerError,
    TransportError,
    Unauthenticated,
    Unavailable,
)
from gpujobs_client.retry import parse_retry_after

SPEC = {"command": ["python", "train.py"], "ranks": 2}


def keys_sent(fake):
    return [r.headers.get("idempotency-key") for r in fake.sent("POST", "/v1/jobs")]


def test_drops_and_503_before_success_create_the_job_exactly_once_with_one_key(fake, sdk,
                                                                                waits):
    fake.fail("POST", "/v1/jobs", "drop_before")          # never reached the handler
    fake.fail("POST", "/v1/jobs", "drop_after")           # created, answer lost
    fake.fail("POST", "/v1/jobs", status=503, code="unavailable", headers={"Retry-After": "0"})

    job = sdk.create_job(SPEC)

    assert len(fake.jobs) == 1
    assert job.id in fake.jobs
    keys = keys_sent(fake)
    assert len(keys) == 4
    assert len(set(keys)) == 1 and keys[0]
    assert job.idempotency_key == keys[0]
    assert job.replayed  # the fourth send got the job the second one made
    assert waits.sleeps[-1] == 0.0  # Retry-After: 0 was honoured, not the backoff


def test_every_send_carries_the_same_body_bytes(fake, sdk):
    fake.fail("POST", "/v1/jobs", "drop_after")
    sdk.create_job(SPEC, name="n")
    bodies = {r.body for r in fake.sent("POST", "/v1/jobs")}
    assert len(bodies) == 1


def test_a_given_key_is_sent_and_each_call_without_one_gets_a_fresh_key(fake, sdk):
    a = sdk.create_job(SPEC, idempotency_key="my-key-1")
    b = sdk.create_job(SPEC)
    c = sdk.create_job(SPEC)
    assert keys_sent(fake)[0] == "my-key-1" == a.idempotency_key
    assert len({a.id, b.id, c.id}) == 3
    assert len(set(keys_sent(fake))) == 3


def test_repeating_a_create_with_its_key_returns_the_same_job(fake, sdk):
    first = sdk.create_job(SPEC, idempotency_key="k")
    again = sdk.create_job(SPEC, idempotency_key="k")
    assert again.id == first.id and again.replayed and not first.replayed
    assert len(fake.jobs) == 1


def test_422_is_raised_at_once_not_retried(fake, sdk):
    sdk.create_job(SPEC, idempotency_key="k")
    with pytest.raises(IdempotencyKeyReused) as err:
        sdk.create_job({**SPEC, "ranks": 3}, idempotency_key="k")
    assert len(fake.sent("POST", "/v1/jobs")) == 2
    e = err.value
    assert (e.status, e.code, e.field) == (422, "idempotency_key_reused", "Idempotency-Key")
    assert e.title == "Idempotency key reused" and "different" in e.detail
    assert e.problem["type"] == "urn:gpujobs:problem:idempotency_key_reused"


def test_an_injected_422_is_not_retried_either(fake, sdk):
    fake.fail("POST", "/v1/jobs", status=422, code="idempotency_key_reused", times=5)
    with pytest.raises(IdempotencyKeyReused):
        sdk.create_job(SPEC)
    assert len(fake.sent("POST", "/v1/jobs")) == 1
    assert fake.jobs == {}


@pytest.mark.parametrize("status, code, cls", [
    (400, "invalid_argument", InvalidArgument), (401, "unauthenticated", Unauthenticated),
    (404, "not_found", NotFound), (409, "already_finished", AlreadyFinished),
    (500, "internal", InternalError)])
def test_other_errors_are_not_retried(fake, sdk, status, code, cls):
    fake.fail("GET", "/v1/jobs/.*", status=status, code=code, times=5)
    with pytest.raises(cls) as err:
        sdk.get_job("job_x")
    assert err.value.status == status and err.value.code == code
    assert len(fake.sent("GET", "/v1/jobs/.*")) == 1


def test_409_request_in_progress_is_retried_with_the_same_key(fake, sdk, waits):
    fake.fail("POST", "/v1/jobs", status=409, code="request_in_progress",
              headers={"Retry-After": "0"}, times=2)
    job = sdk.create_job(SPEC)
    assert len(fake.jobs) == 1 and job.id in fake.jobs
    assert len(set(keys_sent(fake))) == 1 and len(keys_sent(fake)) == 3
    assert waits.sleeps == [0.0, 0.0]


def test_429_and_503_are_retried_honouring_retry_after(fake, sdk, waits):
    job = fake.add_job()
    fake.fail("GET", "/v1/jobs/.*", status=429, code="rate_limited", headers={"Retry-After": "2"})
    fake.fail("GET", "/v1/jobs/.*", status=503, code="unavailable")  # no header: backoff
    assert sdk.get_job(job["id"]).id == job["id"]
    assert waits.sleeps[0] == 2.0
    assert 0 <= waits.sleeps[1] <= 0.02  # full jitter under the second cap (2 x base)
    assert len(fake.sent("GET", "/v1/jobs/.*")) == 3


def test_the_budget_of_attempts_stops_the_retries(fake, policy):
    fake.fail("GET", "/v1/jobs", status=503, code="unavailable", headers={"Retry-After": "0"},
              times=100)
    with Client(fake.url, "t1", retry=policy(max_attempts=4)) as c, \
            pytest.raises(Unavailable) as err:
        c.list_jobs()
    assert err.value.attempts == 4
    assert len(fake.sent("GET", "/v1/jobs")) == 4


def test_the_budget_of_time_stops_the_retries(fake, policy, waits):
    fake.fail("GET", "/v1/jobs", "drop_before", times=100)
    p = policy(max_attempts=100, max_elapsed_s=5.0, base_delay_s=1.0, max_delay_s=1.0,
               rng=lambda lo, hi: hi)
    with Client(fake.url, "t1", retry=p) as c, pytest.raises(TransportError) as err:
        c.list_jobs()
    # waits of 1s at 0,1,2,3,4; at 5 a further wait would end past the budget
    assert waits.sleeps == [1.0] * 5
    assert err.value.attempts == 6 == len(fake.sent("GET", "/v1/jobs"))


def test_a_retry_after_beyond_the_budget_is_not_waited_for(fake, policy, waits):
    fake.fail("GET", "/v1/jobs", status=503, code="unavailable", headers={"Retry-After": "50"},
              times=3)
    with Client(fake.url, "t1", retry=policy(max_elapsed_s=10)) as c, \
            pytest.raises(Unavailable):
        c.list_jobs()
    assert waits.sleeps == []
    assert len(fake.sent("GET", "/v1/jobs")) == 1


def test_connection_refused_is_retried_then_raised(policy, waits):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on it now
    with Client(f"http://127.0.0.1:{port}", "t1", retry=policy(max_attempts=3)) as c, \
            pytest.raises(TransportError) as err:
        c.create_job(SPEC)
    assert err.value.attempts == 3 and len(waits.sleeps) == 2
    assert "cannot connect" in str(err.value)


def test_a_post_that_is_not_idempotent_is_not_resent_after_a_dropped_answer(fake, sdk):
    fake.fail("POST", "/v1/jobs", "drop_after")
    with pytest.raises(TransportError):
        sdk.request("POST", "/v1/jobs", body=SPEC)  # no key: a resend could duplicate
    assert len(fake.sent("POST", "/v1/jobs")) == 1
    assert len(fake.jobs) == 1


def test_a_read_timeout_on_create_is_retried_with_the_same_key(fake, policy):
    fake.fail("POST", "/v1/jobs", "hang")
    with Client(fake.url, "t1", timeout=0.3, retry=policy()) as c:
        job = c.create_job(SPEC)
    assert len(fake.sent("POST", "/v1/jobs")) == 2
    assert len(set(keys_sent(fake))) == 1
    assert list(fake.jobs) == [job.id]


def test_a_gateway_error_without_problem_json_is_readable_and_retried_on_get(fake, sdk):
    job = fake.add_job()
    fake.fail("GET", "/v1/jobs/.*", status=502, body=b"<html>Bad Gateway</html>")
    assert sdk.get_job(job["id"]).id == job["id"]
    fake.fail("GET", "/v1/jobs/.*", status=502, body=b"<html>Bad Gateway</html>", times=10)
    with pytest.raises(ServerError) as err:
        sdk.get_job(job["id"])
    assert err.value.status == 502 and err.value.code == "http_502"
    assert err.value.title == "Bad Gateway" and "Bad Gateway" in err.value.detail


def test_cancel_events_and_heartbeats_are_retried_after_a_dropped_answer(fake, sdk, agent_sdk):
    job = fake.add_job(ranks=2)
    fake.place(job["id"], ["node-1"])
    fake.fail("POST", r"/v1/jobs/.*/cancel", "drop_after")
    assert sdk.cancel_job(job["id"], "stop").cancel_requested_at
    fake.fail("POST", r"/v1/jobs/.*/heartbeats", "drop_after")
    agent_sdk.post_heartbeats(job["id"], 1, [(0, 5), (1, 6)])
    fake.fail("POST", r"/v1/jobs/.*/events", "drop_after")
    assert agent_sdk.post_event(job["id"], 1, "STOPPED", [0, 1]).state == "CANCELLED"
    for path in (r"/v1/jobs/.*/cancel", r"/v1/jobs/.*/heartbeats", r"/v1/jobs/.*/events"):
        assert len(fake.sent("POST", path)) == 2


def test_put_node_is_retried_after_a_dropped_answer(fake, agent_sdk):
    fake.fail("PUT", "/v1/nodes/.*", "drop_after")
    assert agent_sdk.put_node("node-1", gpus=8, gpu_type="h100").gpus == 8
    assert len(fake.sent("PUT", "/v1/nodes/node-1")) == 2


def test_retries_are_reported_to_the_hook(fake, policy):
    fake.fail("GET", "/v1/health", status=503, code="unavailable", headers={"Retry-After": "0"})
    seen = []
    with Client(fake.url, retry=policy(), on_retry=lambda n, d, e: seen.append((n, d, e.code))) \
            as c:
        assert c.health() == {"status": "ok"}
    assert seen == [(1, 0.0, "unavailable")]


# -- the policy itself ----------------------------------------------------------------
def test_backoff_is_capped_exponential_with_full_jitter():
    top = RetryPolicy(base_delay_s=0.25, max_delay_s=2.0, rng=lambda lo, hi: hi)
    assert [top.backoff(n) for n in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    bottom = RetryPolicy(rng=lambda lo, hi: lo)
    assert bottom.backoff(5) == 0.0
    spread = {RetryPolicy(base_delay_s=1, max_delay_s=1).backoff(3) for _ in range(50)}
    assert len(spread) > 1 and all(0 <= d <= 1 for d in spread)


def test_retry_after_is_parsed_as_seconds_or_an_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("Fri, 31 Jan 2025 12:00:10 GMT", now=1738324800.0) == 10.0


def test_a_policy_needs_at_least_one_attempt():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_api_errors_carry_the_problem_and_name_their_class():
    from gpujobs_client.errors import error_from_problem
    p = {"type": "urn:gpujobs:problem:stale_attempt", "title": "Stale attempt", "status": 409,
         "detail": "attempt 1 is not current", "code": "stale_attempt", "field": "attempt"}
    e = error_from_problem(p)
    from gpujobs_client import Conflict, StaleAttempt
    assert isinstance(e, StaleAttempt) and isinstance(e, Conflict) and isinstance(e, ApiError)
    assert e.problem == p and "attempt 1 is not current" in str(e)
    # an unknown code falls back to the status; a code that contradicts it too
    assert type(error_from_problem({"status": 404, "code": "gone_fishing"})) is NotFound
    assert type(error_from_problem({"status": 400, "code": "not_found"})).__name__ == "BadRequest"
    assert type(error_from_problem({"status": 599})) is ServerError


def test_a_refused_connection_is_retried_even_for_a_post_that_is_not_idempotent(policy, waits):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with Client(f"http://127.0.0.1:{port}", "t1", retry=policy(max_attempts=3)) as c, \
            pytest.raises(TransportError) as err:
        c.request("POST", "/v1/jobs", body=SPEC, idempotent=False)  # never reached a server
    assert err.value.attempts == 3
