"""Gang placement: all ranks at once, in priority order, never oversubscribed."""
import json
import random

import pytest

from chalicelib.adapters.models import AttemptModel, NodeModel
from chalicelib.domain.principal import Principal

from .helpers import aws_calls, drain, flood, race

AGENT = Principal("agent", "*")


def register(iso, node_id, gpus=8, gpu_type="h100"):
    return iso.nodes.register(AGENT, node_id, {"gpus": gpus, "gpu_type": gpu_type})


def submit(client, tenants, **spec):
    body = {"command": ["python", "-c", "pass"], "ranks": 1, **spec}
    r = client.http.post("/v1/jobs", body=json.dumps(body), headers=tenants.headers())
    assert r.status_code == 201, r.body
    return r.json_body["id"]


def job(client, tenants, job_id):
    return client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body


def test_a_gang_is_placed_whole_on_as_few_nodes_as_possible(iso, iso_client, tenants, sqs):
    urls = {n: register(iso, n).inbox_queue_url for n in ("a", "b", "c")}
    job_id = submit(iso_client, tenants, ranks=12, gpus_per_rank=2)
    assert iso.placer.run().placed == [job_id]
    j = job(iso_client, tenants, job_id)
    assert j["state"] == "SCHEDULED" and j["attempt"] == 1
    [attempt] = iso_client.http.get(f"/v1/jobs/{job_id}/attempts",
                                    headers=tenants.headers()).json_body["attempts"]
    assert [p["rank"] for p in attempt["placement"]] == list(range(12))
    per_node = {}
    for p in attempt["placement"]:
        per_node.setdefault(p["node_id"], []).append(p["rank"])
    assert sorted(len(r) for r in per_node.values()) == [4, 4, 4]
    assert all(NodeModel.get(n).gpus_free == 0 for n in urls)
    launches = {}
    for node, ranks in per_node.items():
        [launch] = drain(sqs, urls[node], job_id)
        assert launch["type"] == "LAUNCH" and launch["ranks"] == ranks
        assert launch["world_size"] == 12 and launch["command"] == ["python", "-c", "pass"]
        launches[node] = launch
    rendezvous = {(m["master_addr"], m["master_port"]) for m in launches.values()}
    assert len(rendezvous) == 1, "every node meets at the same master"


def test_a_job_runs_only_on_nodes_of_its_gpu_type(iso, iso_client, tenants):
    register(iso, "a100-1", gpu_type="a100")
    job_id = submit(iso_client, tenants, ranks=1, gpu_type="h100")
    assert iso.placer.run().placed == []
    assert "can never fit" in job(iso_client, tenants, job_id)["pending_reason"]
    register(iso, "h100-1", gpu_type="h100")
    assert iso.placer.run().placed == [job_id]
    [attempt] = iso.store.attempts(job_id)
    assert {p["node_id"] for p in attempt["placement"]} == {"h100-1"}


def test_higher_priority_places_first_then_older(iso, iso_client, tenants):
    register(iso, "only", gpus=8)
    low = submit(iso_client, tenants, ranks=8, priority=0)
    high = submit(iso_client, tenants, ranks=8, priority=5)
    older = submit(iso_client, tenants, ranks=8, priority=5)  # same priority, newer
    report = iso.placer.run()
    assert report.placed == [high]
    assert set(report.waiting) == {low, older}


def test_a_job_that_cannot_fit_now_waits_with_a_reason(iso, iso_client, tenants):
    register(iso, "n1", gpus=8)
    first = submit(iso_client, tenants, ranks=6)
    second = submit(iso_client, tenants, ranks=4)
    iso.placer.run()
    j = job(iso_client, tenants, second)
    assert j["state"] == "PENDING" and j["pending_reason"].startswith("waiting for 4 x 1")
    assert job(iso_client, tenants, first)["pending_reason"] is None


def test_a_job_that_can_never_fit_stays_pending_with_a_reason(iso, iso_client, tenants):
    register(iso, "n1", gpus=8)
    register(iso, "n2", gpus=8)
    too_many = submit(iso_client, tenants, ranks=17)
    too_wide = submit(iso_client, tenants, ranks=1, gpus_per_rank=9)
    assert iso.placer.run().never == [], "judged by their creates, parked"
    assert "needs 17" in job(iso_client, tenants, too_many)["pending_reason"]
    assert "largest" in job(iso_client, tenants, too_wide)["pending_reason"]
    assert job(iso_client, tenants, too_many)["state"] == "PENDING"


def test_a_job_cancelled_while_being_placed_never_launches(iso, iso_client, tenants, sqs):
    url = register(iso, "n1").inbox_queue_url
    job_id = submit(iso_client, tenants, ranks=2)
    real_place = iso.store.place

    def cancel_first(j, *args, **kwargs):
        iso_client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
        return real_place(j, *args, **kwargs)

    iso.store.place = cancel_first
    try:
        assert iso.placer.run().placed == []
    finally:
        del iso.store.place
    assert job(iso_client, tenants, job_id)["state"] == "CANCELLED"
    assert drain(sqs, url, job_id) == [], "no LAUNCH"
    assert NodeModel.get("n1").gpus_free == 8, "nothing reserved"


def test_placing_one_job_reads_only_the_nodes_it_needs(iso, iso_client, tenants):
    for i in range(120):
        register(iso, f"n{i:03d}", gpus=8)
    iso.placer.settle_s = 0
    iso.placer.run()  # the fleet changed: this run looks at the parked jobs once
    submit(iso_client, tenants, ranks=2)
    with aws_calls() as calls:
        assert len(iso.placer.run().placed) == 1
    queries = [op for svc, op in calls if op in ("Query", "Scan", "GetItem", "BatchGetItem")]
    assert queries.count("Scan") == 0
    # fleet totals (and generation), pending jobs, one page of candidates
    assert len(queries) <= 3, queries


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_racing_placers_never_oversubscribe_and_never_place_twice(iso, iso_client, tenants,
                                                                  seed):
    rng = random.Random(seed)
    nodes = {f"n{i}": rng.choice([2, 4, 8]) for i in range(8)}
    for n, g in nodes.items():
        register(iso, n, gpus=g)
    jobs = [submit(iso_client, tenants, ranks=rng.randint(1, 6),
                   gpus_per_rank=rng.choice([1, 2]), priority=rng.randint(0, 3))
            for _ in range(25)]
    errors = []

    def placer():
        try:
            for _ in range(3):
                iso.placer.run()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - a thread's failure, reported below
            errors.append(e)

    race(placer, 4)
    assert not errors, errors
    reserved = {n: 0 for n in nodes}
    placed = 0
    for job_id in jobs:
        attempts = list(AttemptModel.query(job_id))
        assert len(attempts) <= 1, f"{job_id} placed {len(attempts)} times"
        for a in attempts:
            placed += 1
            for n, g in a.node_gpus.items():
                reserved[n] += g
    for n, g in nodes.items():
        free = int(NodeModel.get(n).gpus_free)
        assert free >= 0, f"{n} oversubscribed"
        assert reserved[n] + free == g, f"{n}: reserved {reserved[n]} + free {free} != {g}"
    assert placed > 0


def test_a_flood_of_never_fitting_and_huge_top_priority_jobs_cannot_hold_back_a_small_job(
        iso):
    """Issue 9: tenant B floods 600 never-fitting and 200 fitting-but-huge jobs at the
    highest priority; tenant A's small job starts in the first run after GPUs free."""
    for n in ("fair-1", "fair-2"):
        register(iso, n, gpus=8, gpu_type="fair")

    def create(tenant, ranks, gpus_per_rank, priority=0):
        job, _ = iso.jobs.submit(tenant, {"command": ["x"], "ranks": ranks, "gpu_type": "fair",
                                          "gpus_per_rank": gpus_per_rank,
                                          "priority": priority}, None)
        return job["job_id"]

    busy = create("tenant-b", 2, 8)
    assert iso.placer.run().placed == [busy]  # every GPU taken
    top = 1_000_000
    def body(ranks):
        return {"command": ["x"], "ranks": ranks, "gpu_type": "fair", "gpus_per_rank": 8,
                "priority": top}
    never = flood(iso, "tenant-b", body(3), 600)  # 24 GPUs each: the fleet has 16
    huge = flood(iso, "tenant-b", body(2), 200)   # all 16 GPUs each
    small = create("tenant-a", 1, 1)
    first = iso.placer.run()
    assert set(first.never) == set(never) and first.placed == []

    attempt = iso.store.attempt(busy, 1)
    for node, ranks in attempt.node_ranks.items():
        iso.attempts.report(AGENT, busy, 1, {"type": "EXITED", "ranks": ranks, "exit_code": 0,
                                             "node_id": node})
    report = iso.placer.run()
    assert small in report.placed, "A's small job starts in the first run after GPUs free"
    assert iso.store.get(small).state.value == "SCHEDULED"
    assert not set(report.placed) & set(never)
    assert len(report.placed) == 1, "the 16-GPU jobs no longer fit beside it"
    assert set(report.waiting) <= set(huge)


def test_a_job_that_cannot_fit_costs_no_node_reads_until_gpus_are_released(iso, iso_client,
                                                                            tenants, clock):
    """The capacity summary: a waiting job is not tried against an unchanged
    fleet; the release that gives GPUs back (same transaction) wakes it."""
    from chalicelib.domain import placement

    from .test_events import event

    for n in ("w1", "w2"):
        register(iso, n, gpus=2)
    clock.advance(placement.INDEX_LAG_S + 1)  # the nodes' registration is past the index lag
    running = submit(iso_client, tenants, ranks=2, gpus_per_rank=2, gpu_type="h100")
    waiting = submit(iso_client, tenants, ranks=1, gpus_per_rank=2, gpu_type="h100")
    report = iso.placer.run()
    assert report.placed == [running] and report.waiting == [waiting]
    with aws_calls() as calls:
        assert iso.placer.run().waiting == [waiting]
    assert sorted(calls) == [("dynamodb", "GetItem")] * 2 + [("dynamodb", "Query")], \
        "the fleet's generation, the pending jobs, the type's summary; no node read, no write"
    [attempt] = iso_client.http.get(f"/v1/jobs/{running}/attempts",
                                    headers=tenants.headers()).json_body["attempts"]
    node = attempt["placement"][0]["node_id"]
    ranks = [p["rank"] for p in attempt["placement"] if p["node_id"] == node]
    for kind in ("STARTED", "EXITED"):
        r = event(iso_client, tenants, running, 1, {"type": kind, "ranks": ranks,
                                                    "exit_code": 0, "node_id": node})
        assert r.status_code == 200, r.body
    assert iso.placer.run().placed == [waiting]


def test_a_waiting_job_is_tried_again_after_the_recheck_bound(iso, iso_client, tenants, clock):
    from chalicelib.domain import placement

    register(iso, "r1", gpus=2)
    clock.advance(placement.INDEX_LAG_S + 1)
    submit(iso_client, tenants, ranks=1, gpus_per_rank=2, gpu_type="h100")
    waiting = submit(iso_client, tenants, ranks=1, gpus_per_rank=2, gpu_type="h100")
    iso.placer.run()
    clock.advance(placement.RECHECK_S + 1)
    with aws_calls() as calls:
        assert iso.placer.run().waiting == [waiting]
    assert ("dynamodb", "Query") in calls[1:], "the nodes were read again"


def _conflict(times):
    """Connection.transact_write_items failing with TransactionConflict ``times``
    times (moto does not simulate concurrent transactions), then working."""
    from pynamodb.connection.base import Connection
    from pynamodb.exceptions import CancellationReason, TransactWriteError, VerboseClientError

    original = Connection.transact_write_items
    left = [times]

    def conflicting(self, *args, **kwargs):
        if left[0] > 0:
            left[0] -= 1
            cause = VerboseClientError(
                {"Error": {"Code": "TransactionCanceledException", "Message": "conflict"}},
                "TransactWriteItems", {},
                cancellation_reasons=[CancellationReason(code="TransactionConflict"), None,
                                      None, None])
            raise TransactWriteError("Failed to write transaction items", cause)
        return original(self, *args, **kwargs)
    return conflicting


def test_a_release_that_loses_to_a_concurrent_one_on_the_summary_is_retried(
        iso, iso_client, tenants, monkeypatch):
    """Two releases of one GPU type touch its summary item at once: DynamoDB
    cancels one (TransactionConflict); it must be tried again, not taken for
    'already released' (the GPUs would never come back)."""
    from pynamodb.connection.base import Connection

    register(iso, "c1", gpus=2)
    job_id = submit(iso_client, tenants, ranks=1, gpus_per_rank=2, gpu_type="h100")
    assert iso.placer.run().placed == [job_id]
    attempt = iso.store.attempt(job_id, 1)
    monkeypatch.setattr(Connection, "transact_write_items", _conflict(2))
    assert iso.store.release(attempt, "c1") is True
    assert NodeModel.get("c1", consistent_read=True).gpus_free == 2
    monkeypatch.undo()
    assert iso.store.release(iso.store.attempt(job_id, 1), "c1") is False, "exactly once"


def test_a_release_that_keeps_losing_is_unavailable_and_writes_nothing(iso, iso_client, tenants,
                                                                      monkeypatch):
    """The store says the dependency is unavailable (ServiceUnavailable); the
    HTTP edge answers it as 503 with Retry-After."""
    from pynamodb.connection.base import Connection

    from chalicelib.api.problems import answer
    from chalicelib.domain.errors import ServiceUnavailable

    register(iso, "c2", gpus=2)
    job_id = submit(iso_client, tenants, ranks=1, gpus_per_rank=2, gpu_type="h100")
    assert iso.placer.run().placed == [job_id]
    monkeypatch.setattr(Connection, "transact_write_items", _conflict(100))
    with pytest.raises(ServiceUnavailable) as caught:
        iso.store.release(iso.store.attempt(job_id, 1), "c2")
    assert answer(caught.value)[1]["Retry-After"] == "1"
    assert "concurrently" in str(caught.value)
    assert NodeModel.get("c2", consistent_read=True).gpus_free == 0, "nothing half-written"


@pytest.mark.parametrize("seed", [1, 2])
def test_racing_placers_preempt_once_for_one_job(make_services, fresh_env, iso_client,
                                                 tenants, seed):
    """Issue 28: placers racing (real threads, DynamoDB's conditional writes)
    record one preemption for the urgent job, end each victim once, and never
    leave a node's GPUs claimed twice."""
    iso = make_services({**fresh_env, "GPUJOBS_PRIORITY_CLASSES":
                         '{"urgent": {"value": 10, "preempts": true}, "batch": {"value": -1}}',
                         "GPUJOBS_PREEMPT_MIN_RUNTIME_S": "0"})
    rng = random.Random(seed)
    nodes = [f"n{i}" for i in range(4)]
    for n in nodes:
        register(iso, n, gpus=2)
    batch = [submit(iso_client, tenants, ranks=2, priority_class="batch") for _ in nodes]
    assert sorted(iso.placer.run().placed) == sorted(batch)
    for job_id in batch:
        [a] = iso.store.attempts(job_id)
        [node] = {p["node_id"] for p in a["placement"]}
        r = iso_client.http.post(f"/v1/jobs/{job_id}/attempts/1/events",
                                 headers=tenants.headers("agents"),
                                 body=json.dumps({"type": "STARTED", "ranks": [0, 1],
                                                  "node_id": node}))
        assert r.status_code == 200, r.body
    urgent = submit(iso_client, tenants, ranks=2 * rng.choice([1, 2]),
                    priority_class="urgent")
    errors = []

    def placer():
        try:
            for _ in range(3):
                iso.placer.run()
        except Exception as e:  # noqa: BLE001  # pragma: no cover - reported below
            errors.append(e)

    race(placer, 4)
    assert not errors, errors
    stories = {j: iso_client.http.get(f"/v1/jobs/{j}/events",
                                      headers=tenants.headers()).json_body["events"]
               for j in [*batch, urgent]}
    preempting = [e for e in stories[urgent] if e["type"] == "preempting"]
    assert len(preempting) == 1, preempting
    ended = [j for j in batch if any(e["type"] == "retried" for e in stories[j])]
    assert sorted(ended) == sorted(preempting[0]["jobs"]), "each victim ended once, as chosen"
    assert all(sum(e["type"] == "retried" for e in stories[j]) == 1 for j in ended)
    assert len(ended) == job(iso_client, tenants, urgent)["spec"]["ranks"] // 2, "no more"
    for n in nodes:
        assert int(NodeModel.get(n).gpus_free) >= 0, f"{n} oversubscribed"


def test_an_unknown_priority_class_is_a_400_naming_it(iso_client, tenants):
    r = iso_client.http.post("/v1/jobs", headers=tenants.headers(),
                             body=json.dumps({"command": ["x"], "ranks": 1,
                                              "priority_class": "vip"}))
    assert r.status_code == 400 and r.json_body["field"] == "priority_class", r.json_body
    assert "vip" in r.json_body["detail"]
