"""Stragglers over the in-process API on moto (API.md "Stragglers"): each
rank's step_time_s and slow_score in GET /ranks, health.slow_ranks, one
rank_slow story event an episode and its job.rank_slow on the tenant's feed."""
import json

from .test_feed import feed
from .test_heartbeats import AGENT, clock, running  # noqa: F401 (fixtures)

FAST, SLOW = 0.5, 1.2
SENTENCE = "rank 1 on {node} is slow: its steps take 2.4× the fastest rank's"


def _period(iso, client, tenants, job_id, at, step, times):
    """20 s of beats (every 5 s, each with its rank's step time), then a scan."""
    for _ in range(4):
        step += 1
        body = {"attempt": 1, "ranks": [{"rank": r, "step": step, "step_time_s": t}
                                        for r, t in times.items()]}
        r = client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers("agents"))
        assert r.status_code == 202, r.json_body
        at.advance(5)
    iso.nodes.register(AGENT, "n1", {"gpus": 2})  # the ingest path visibly alive
    iso.scanner.run()
    return step


def _job(client, tenants, job_id):
    return client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body


def test_a_slow_rank_is_scored_listed_and_told_once(iso, iso_client, tenants,
                                                    running):  # noqa: F811
    job_id, by_node, at = running
    node_of = {r: n for n, ranks in by_node.items() for r in ranks}
    times = {0: FAST, 1: SLOW, 2: FAST, 3: FAST}
    step = 0
    job = _job(iso_client, tenants, job_id)
    assert job["health"]["slow_ranks"] == [] and job["spec"]["heartbeat"]["slow_score"] == 0.7
    called_after = None
    for i in range(8):
        step = _period(iso, iso_client, tenants, job_id, at, step, times)
        if _job(iso_client, tenants, job_id)["health"]["slow_ranks"] == [1]:
            called_after = i + 1
            break
    # not on the first scans: only once the drop is sustained
    assert called_after is not None and called_after >= 3
    for _ in range(3):
        step = _period(iso, iso_client, tenants, job_id, at, step, times)
    view = iso_client.http.get(f"/v1/jobs/{job_id}/ranks", headers=tenants.headers()).json_body
    rows = {r["rank"]: r for r in view["ranks"]}
    assert (rows[1]["step_time_s"], rows[1]["slow_score"]) == (SLOW, round(FAST / SLOW, 3))
    assert (rows[0]["step_time_s"], rows[0]["slow_score"]) == (FAST, 1.0)
    sentence = SENTENCE.format(node=node_of[1])
    assert rows[1]["slow_text"] == sentence and rows[0]["slow_text"] is None
    health = _job(iso_client, tenants, job_id)["health"]
    assert health["slow_ranks"] == [1] and health["status"] == "OK"
    story = iso_client.http.get(f"/v1/jobs/{job_id}/events",
                                headers=tenants.headers()).json_body["events"]
    [told] = [e for e in story if e["type"] == "rank_slow"]
    assert (told["rank"], told["node_id"], told["reason"]) == (1, node_of[1], sentence)
    [fed] = feed(iso_client, tenants, type="job.rank_slow")["events"]
    assert fed["job_id"] == job_id and fed["data"] == {
        "attempt": 1, "rank": 1, "node_id": node_of[1], "score": round(FAST / SLOW, 3),
        "text": sentence}


def test_the_heartbeat_settings_take_slow_score_within_bounds(iso_client, tenants):
    for bad in (0, 1, 1.5, "x"):
        r = iso_client.http.post("/v1/jobs", body=json.dumps(
            {"command": ["x"], "ranks": 1, "heartbeat": {"slow_score": bad}}),
            headers=tenants.headers())
        assert r.status_code == 400, bad
    r = iso_client.http.post("/v1/jobs", body=json.dumps(
        {"command": ["x"], "ranks": 1, "heartbeat": {"slow_score": 0.5}}),
        headers=tenants.headers())
    assert r.status_code == 201 and r.json_body["spec"]["heartbeat"]["slow_score"] == 0.5
