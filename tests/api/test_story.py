"""A job's story (GET /v1/jobs/{id}/events): every transition leaves its event,
written in the transition's own conditional write, so there is no event
without its transition and a repeated report adds none."""
import json

import pytest

from chalicelib.domain.principal import Principal

from .test_events import event, placed

AGENT = Principal("agent", "*")


@pytest.fixture
def cluster(iso):
    return {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url for n in ("n1", "n2")}


def story(client, tenants, job_id, who="a"):
    return client.http.get(f"/v1/jobs/{job_id}/events", headers=tenants.headers(who))


def types(r):
    return [e["type"] for e in r.json_body["events"]]


def test_a_failed_attempt_then_a_retry_then_success_is_told_in_order(iso, iso_client, tenants,
                                                                     cluster):
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": by_node["n1"],
                                           "node_id": "n1"})  # a repeat adds nothing
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": by_node["n1"][:1], "exit_code": 3, "node_id": "n1"})
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": by_node["n1"][1:],
                                           "node_id": "n1"})
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": by_node["n2"],
                                           "node_id": "n2"})
    assert iso.placer.run().placed == [job_id]
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 2, {"type": "STARTED", "ranks": ranks, "node_id": n})
        event(iso_client, tenants, job_id, 2,
              {"type": "EXITED", "ranks": ranks, "exit_code": 0, "node_id": n})
    r = story(iso_client, tenants, job_id)
    assert r.status_code == 200
    got = types(r)
    assert got[:2] == ["created", "placed"]
    assert got.count("rank_started") == 4, "two nodes x two attempts, repeats not counted"
    assert got.count("started") == 2 and got.count("placed") == 2
    assert got.count("rank_stopped") == 2
    assert got.count("retried") == 1 and got[-1] == "finished"
    failed = next(e for e in r.json_body["events"] if e["type"] == "rank_exited")
    assert failed["exit_code"] == 3 and failed["attempt"] == 1 and failed["node_id"] == "n1"
    assert "exited with code 3" in failed["reason"]
    retried = next(e for e in r.json_body["events"] if e["type"] == "retried")
    assert retried["reason"] == "rank_failed" and retried["next_attempt"] == 2
    placed_1 = next(e for e in r.json_body["events"] if e["type"] == "placed")
    assert sorted(placed_1["nodes"].values()) == ["0-1", "2-3"], "each node's ranks, as a span"
    assert r.json_body["events"][-1]["state"] == "SUCCEEDED"
    times = [e["time"] for e in r.json_body["events"]]
    assert times == sorted(times)


def test_cancel_of_a_pending_job_tells_who_and_why(iso, iso_client, tenants):
    r = iso_client.http.post("/v1/jobs", headers=tenants.headers(), body=json.dumps(
        {"command": ["x"], "ranks": 1, "gpu_type": "nonexistent"}))
    job_id = r.json_body["id"]
    iso.placer.run()
    iso_client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers(),
                         body=json.dumps({"reason": "wrong data"}))
    events = story(iso_client, tenants, job_id).json_body["events"]
    assert [e["type"] for e in events] == ["created", "waiting", "cancel_requested", "finished"]
    assert events[1]["reason"].startswith("can never fit")
    assert events[2]["reason"] == "wrong data" and events[2]["by"] == tenants.a
    assert events[3]["state"] == "CANCELLED"


def test_a_lost_transition_writes_no_event(iso, iso_client, tenants):
    """Cancelling a job the placer already moved on loses its condition: no
    cancel event may appear for the cancel that did not happen."""
    from chalicelib.domain.clock import utcnow
    from chalicelib.service.ports import StateChanged
    job_id = iso_client.http.post("/v1/jobs", headers=tenants.headers(), body=json.dumps(
        {"command": ["x"], "ranks": 1})).json_body["id"]
    stale = iso.store.get(job_id)
    iso.store.cancel_unplaced(stale, utcnow(), "first")
    with pytest.raises(StateChanged):
        iso.store.cancel_unplaced(stale, utcnow(), "second")
    events = story(iso_client, tenants, job_id).json_body["events"]
    assert [e["reason"] for e in events if e["type"] == "cancel_requested"] == ["first"]


def test_another_tenants_job_story_is_not_found(iso, iso_client, tenants):
    job_id = iso_client.http.post("/v1/jobs", headers=tenants.headers(), body=json.dumps(
        {"command": ["x"], "ranks": 1})).json_body["id"]
    r = story(iso_client, tenants, job_id, who="b")
    assert r.status_code == 404 and r.json_body["field"] == "job_id"
