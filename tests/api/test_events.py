"""Attempt events: the contract's transitions, repeats harmless, capacity
released exactly once, failures stop the rest of the gang."""
import json

import pytest

from chalicelib.adapters.models import NodeModel, OutboxModel
from chalicelib.domain.principal import Principal

from .helpers import drain

AGENT = Principal("agent", "*")


@pytest.fixture
def cluster(iso):
    urls = {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url
            for n in ("n1", "n2")}
    return urls


def submit(client, tenants, **spec):
    body = {"command": ["train"], "ranks": 4, **spec}
    return client.http.post("/v1/jobs", body=json.dumps(body),
                            headers=tenants.headers()).json_body["id"]


def event(client, tenants, job_id, attempt, body, who="agents"):
    return client.http.post(f"/v1/jobs/{job_id}/attempts/{attempt}/events",
                            body=json.dumps(body), headers=tenants.headers(who))


def placed(iso, client, tenants, **spec):
    job_id = submit(client, tenants, **spec)
    assert job_id in iso.placer.run().placed
    [attempt] = iso.store.attempts(job_id)
    by_node = {}
    for p in attempt["placement"]:
        by_node.setdefault(p["node_id"], []).append(p["rank"])
    return job_id, by_node


def free(node_id):
    return int(NodeModel.get(node_id, consistent_read=True).gpus_free)


def test_started_moves_scheduled_to_running_and_repeats_are_harmless(iso, iso_client, tenants,
                                                                    cluster):
    job_id, by_node = placed(iso, iso_client, tenants)
    r = event(iso_client, tenants, job_id, 1,
              {"type": "STARTED", "ranks": by_node["n1"], "node_id": "n1"})
    assert r.status_code == 200 and r.json_body["state"] == "RUNNING"
    assert r.json_body["started_at"]
    again = event(iso_client, tenants, job_id, 1,
                  {"type": "STARTED", "ranks": by_node["n1"], "node_id": "n1"})
    assert again.status_code == 200 and again.json_body["started_at"] == r.json_body["started_at"]
    assert OutboxModel.get(job_id, "LAUNCH#1").unacked == {"n2"}, "n1 acknowledged its LAUNCH"


def test_all_ranks_exiting_zero_succeeds_and_frees_gpus_exactly_once(iso, iso_client, tenants,
                                                                     cluster):
    job_id, by_node = placed(iso, iso_client, tenants)
    assert free("n1") == free("n2") == 0
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    for _ in range(2):  # the repeat must not give the GPUs back twice
        for n, ranks in by_node.items():
            r = event(iso_client, tenants, job_id, 1,
                      {"type": "EXITED", "ranks": ranks, "exit_code": 0, "node_id": n})
    assert r.json_body["state"] == "SUCCEEDED" and r.json_body["finished_at"]
    assert r.json_body["exit"]["exit_code"] == 0
    assert free("n1") == free("n2") == 2


def test_a_failed_rank_fails_the_job_and_stops_the_rest_of_the_gang(iso, iso_client, tenants,
                                                                    cluster, sqs):
    job_id, by_node = placed(iso, iso_client, tenants)
    for n, ranks in by_node.items():
        drain(sqs, cluster[n], job_id)
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    r = event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": [by_node["n1"][0]], "exit_code": 3, "node_id": "n1"})
    job = r.json_body
    assert job["state"] == "FAILED"
    rank = by_node["n1"][0]
    assert job["exit"] == {
        "reason": "rank_failed", "exit_code": 3, "rank": rank, "node_id": "n1",
        "decision": f"rank_failed (rank {rank}, exit code 3): not retried "
                    "(counted attempt 1 of 1, none left)"}
    assert [m["type"] for m in drain(sqs, cluster["n2"], job_id)] == ["CANCEL"]
    assert [m["type"] for m in drain(sqs, cluster["n1"], job_id)] == ["CANCEL"]
    # the rest stop; their GPUs come back once each node is done
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": [], "node_id": "n2"})
    assert free("n2") == 2 and free("n1") == 0
    event(iso_client, tenants, job_id, 1,
          {"type": "STOPPED", "ranks": by_node["n1"][1:], "node_id": "n1"})
    assert free("n1") == 2


def test_a_failure_with_attempts_left_runs_a_new_attempt(iso, iso_client, tenants, cluster):
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    r = event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": by_node["n1"], "exit_code": 1, "node_id": "n1"})
    assert r.json_body["state"] == "PENDING" and r.json_body["attempt"] == 1
    event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": [], "node_id": "n2"})
    assert job_id in iso.placer.run().placed
    attempts = iso.store.attempts(job_id)
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["state"] == "FAILED" and attempts[0]["exit"]["exit_code"] == 1
    # the old attempt is stale now
    stale = event(iso_client, tenants, job_id, 1,
                  {"type": "EXITED", "ranks": by_node["n1"], "exit_code": 0, "node_id": "n1"})
    assert stale.status_code == 409 and stale.json_body["code"] == "stale_attempt"


def test_a_cancelled_running_job_is_cancelled_when_every_node_confirms(iso, iso_client,
                                                                      tenants, cluster):
    job_id, by_node = placed(iso, iso_client, tenants)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    iso_client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    # a rank killed by the cancel may exit non-zero: still a cancel, not a failure
    r = event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": by_node["n1"], "exit_code": 143, "node_id": "n1"})
    assert r.json_body["state"] == "RUNNING"
    r = event(iso_client, tenants, job_id, 1,
              {"type": "STOPPED", "ranks": by_node["n2"], "node_id": "n2"})
    assert r.json_body["state"] == "CANCELLED" and r.json_body["finished_at"]
    assert free("n1") == free("n2") == 2
    assert OutboxModel.get(job_id, "CANCEL#1").pending is None


def test_a_cancel_before_launch_is_confirmed_with_no_ranks(iso, iso_client, tenants, cluster):
    job_id, by_node = placed(iso, iso_client, tenants)
    iso_client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    for n in by_node:
        r = event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "node_id": n})
    assert r.json_body["state"] == "CANCELLED"
    assert OutboxModel.get(job_id, "LAUNCH#1").pending is None, "no LAUNCH resent"


def test_an_agent_acts_only_on_ranks_of_its_node(iso, iso_client, tenants, cluster):
    job_id, by_node = placed(iso, iso_client, tenants)
    other = event(iso_client, tenants, job_id, 1,
                  {"type": "STARTED", "ranks": by_node["n2"], "node_id": "n1"})
    assert other.status_code == 403
    bound = event(iso_client, tenants, job_id, 1,
                  {"type": "STARTED", "ranks": by_node["n2"]}, who="agent")  # node-1 only
    assert bound.status_code == 403
    tenant = event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": []}, who="a")
    assert tenant.status_code == 403


@pytest.mark.parametrize("body, field", [
    ({"type": "DONE"}, "type"), ({"type": "EXITED", "ranks": [0], "node_id": "n1"}, "exit_code"),
    ({"type": "STARTED", "ranks": [-1]}, "ranks.0"), ({}, "type"),
])
def test_a_bad_event_is_400(iso, iso_client, tenants, cluster, body, field):
    job_id, _ = placed(iso, iso_client, tenants)
    r = event(iso_client, tenants, job_id, 1, body)
    assert r.status_code == 400 and r.json_body["field"] == field


def test_an_event_for_an_attempt_that_does_not_exist_is_stale(iso, iso_client, tenants,
                                                              cluster):
    job_id, _ = placed(iso, iso_client, tenants)
    r = event(iso_client, tenants, job_id, 7, {"type": "STARTED", "ranks": [], "node_id": "n1"})
    assert r.status_code == 409 and r.json_body["code"] == "stale_attempt"


def test_an_agent_token_cannot_tell_whether_a_tenants_job_exists(iso, iso_client, tenants,
                                                                  cluster):
    """Issue 9: a job of a tenant not placed on the token's node, a job id that does
    not exist and a malformed one get the same 403 from both agent endpoints."""
    job_id, _ = placed(iso, iso_client, tenants)  # on n1 and n2, not node-1
    missing = "job_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    answers = []
    for jid in (job_id, missing, "nonsense"):
        for attempt in (1, 2):
            ev = event(iso_client, tenants, jid, attempt, {"type": "STARTED", "ranks": [0]},
                       who="agent")
            hb = iso_client.http.post(f"/v1/jobs/{jid}/heartbeats", headers=tenants.headers(
                "agent"), body=json.dumps({"attempt": attempt, "ranks": [{"rank": 0}]}))
            for r in (ev, hb):
                p = r.json_body
                answers.append((r.status_code, p["code"], p["field"],
                                p["detail"].replace(jid, "JOB").replace(f"attempt {attempt}", "N")))
    assert len(set(answers)) == 1, answers
    assert answers[0][:3] == (403, "forbidden", "job_id")


def test_an_agent_token_cannot_report_for_a_job_placed_elsewhere(iso, iso_client, tenants,
                                                                 cluster):
    """Issue 9, kept tested: events and beats only for ranks placed on the token's node."""
    job_id, by_node = placed(iso, iso_client, tenants)
    for r in (event(iso_client, tenants, job_id, 1,
                    {"type": "EXITED", "ranks": by_node["n1"], "exit_code": 1}, who="agent"),
              iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", headers=tenants.headers(
                  "agent"), body=json.dumps({"attempt": 1, "ranks": [{"rank": 0}]}))):
        assert r.status_code == 403
    j = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert j["state"] == "SCHEDULED" and j["exit"] is None


def test_a_job_of_65536_ranks_is_placed_in_items_of_a_few_kb(iso, iso_client, tenants):
    """The API takes 65,536 ranks: its placement (on 64 nodes of 1,024 GPUs)
    must fit DynamoDB's 400 KB items. The attempt, its LAUNCH intent and the
    job's placed event hold each node's ranks as runs, not 65,536 numbers."""
    import boto3

    from bench.harness import item_size
    from chalicelib.adapters.models import AttemptModel, JobModel, OutboxModel

    nodes = [f"big-{i:02d}" for i in range(64)]
    for n in nodes:
        iso.nodes.register(AGENT, n, {"gpus": 1024, "gpu_type": "b200"})
    job_id, by_node = placed(iso, iso_client, tenants, ranks=65536, gpu_type="b200")
    assert sorted(r for rs in by_node.values() for r in rs) == list(range(65536))
    attempt = iso.store.attempt(job_id, 1)
    assert sorted(attempt.node_ranks) == nodes and attempt.rank_nodes()[65535] in nodes
    dynamodb = boto3.client("dynamodb", endpoint_url=iso.config.endpoint_url,
                            region_name="us-east-1")
    items = {
        "attempt": dynamodb.get_item(TableName=AttemptModel.Meta.table_name, Key={
            "job_id": {"S": job_id}, "attempt": {"N": "1"}})["Item"],
        "intent": dynamodb.get_item(TableName=OutboxModel.Meta.table_name, Key={
            "job_id": {"S": job_id}, "intent_id": {"S": "LAUNCH#1"}})["Item"],
        "job": dynamodb.get_item(TableName=JobModel.Meta.table_name, Key={
            "job_id": {"S": job_id}})["Item"]}
    sizes = {k: item_size(v) for k, v in items.items()}
    assert all(size < 32 * 1024 for size in sizes.values()), sizes
    r = iso_client.http.get(f"/v1/jobs/{job_id}/attempts", headers=tenants.headers())
    [shown] = r.json_body["attempts"]
    assert [p["rank"] for p in shown["placement"]] == list(range(65536))


@pytest.mark.parametrize("exit_code,ends_as", [(0, "SUCCEEDED"), (3, "FAILED")])
def test_a_jobs_gpus_go_back_only_after_it_has_ended(iso, iso_client, tenants, cluster,
                                                     monkeypatch, exit_code, ends_as):
    """A job placed on freed GPUs never reads as placed before the job that
    held them ended (a preempting job's events and its victim's, on a loaded
    stack, once showed the victim placed again 37 ms before the other's
    finished_at): the release comes after the end is written."""
    job_id, by_node = placed(iso, iso_client, tenants)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    seen = []
    release = iso.store.release

    def noting(attempt, node_id, heard_at=None):
        seen.append((node_id, iso.store.get(job_id).state.value))
        return release(attempt, node_id, heard_at)
    monkeypatch.setattr(iso.store, "release", noting)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": ranks, "exit_code": exit_code, "node_id": n})
    first, last = by_node  # a failed rank ends the job at once; all exits, at the last
    assert seen == [(first, ends_as if exit_code else "RUNNING"), (last, ends_as)]
    assert free("n1") == free("n2") == 2
