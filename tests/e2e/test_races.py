"""Concurrency over real HTTP: racing duplicates and paging while inserting."""
from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.stacks import Api

pytestmark = pytest.mark.e2e
THREADS = 32
ROUNDS = 20


def race(base: str, token: str, key: str, body: dict) -> list:
    barrier = threading.Barrier(THREADS)
    sessions = [Api(base, token) for _ in range(THREADS)]

    def one(i: int):
        api = sessions[i]
        barrier.wait()
        r = api.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
        # a duplicate that cannot see the first yet is told to retry
        for _ in range(50):
            if r.status_code != 409:
                break
            assert r.json()["code"] == "request_in_progress"
            r = api.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
        return r

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, range(THREADS)))


def test_32_simultaneous_duplicates_make_exactly_one_job_20_times(stack):
    tag = uuid.uuid4().hex[:8]
    creator = Api(stack.api, "e2e-race")  # a tenant no other test writes to
    before = count_jobs(creator)
    for round_ in range(ROUNDS):
        body = {"command": ["train"], "ranks": 4, "name": f"{tag}-{round_}"}
        responses = race(stack.api, "e2e-race", f"{tag}-key-{round_}", body)
        assert all(r.status_code == 201 for r in responses), \
            [(r.status_code, r.text) for r in responses if r.status_code != 201]
        ids = {r.json()["id"] for r in responses}
        assert len(ids) == 1, f"round {round_}: {len(ids)} jobs for one key"
        fresh = [r for r in responses if r.headers.get("Idempotent-Replayed") != "true"]
        assert len(fresh) == 1, f"round {round_}: {len(fresh)} creators"
    assert count_jobs(creator) - before == ROUNDS


def count_jobs(api: Api) -> int:
    n, token = 0, None
    while True:
        params = {"page_size": 500, **({"page_token": token} if token else {})}
        page = api.get("/v1/jobs", params=params).json()
        n += len(page["jobs"])
        token = page["next_page_token"]
        if token is None:
            return n


def test_paging_while_jobs_are_inserted_never_skips_or_repeats(api):
    existing = [api.post("/v1/jobs", json={"command": ["x"], "ranks": 1}).json()["id"]
                for _ in range(60)]
    stop = threading.Event()
    inserted: list[str] = []

    def insert() -> None:
        inserter = Api(api.base, "e2e-tenant")
        while not stop.is_set():
            r = inserter.post("/v1/jobs", json={"command": ["y"], "ranks": 1})
            inserted.append(r.json()["id"])

    t = threading.Thread(target=insert)
    t.start()
    seen: list[str] = []
    try:
        token = None
        while True:
            params = {"page_size": 7, **({"page_token": token} if token else {})}
            page = api.get("/v1/jobs", params=params).json()
            seen += [j["id"] for j in page["jobs"]]
            token = page["next_page_token"]
            if token is None:
                break
    finally:
        stop.set()
        t.join()
    assert inserted, "the inserter ran while paging"
    assert len(seen) == len(set(seen)), "no job twice"
    missing = set(existing) - set(seen)
    assert not missing, f"pre-existing jobs skipped: {sorted(missing)}"
    assert seen == sorted(seen, reverse=True), "newest first throughout"
