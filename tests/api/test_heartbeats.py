"""Heartbeat ingest, the ranks view and the stall scan, on the collector's clock."""
import json
from datetime import timedelta

import pytest

from chalicelib.domain.clock import iso as rfc3339, utcnow
from chalicelib.domain.principal import Principal

from ..clock import FakeClock
from .test_events import event, placed

AGENT = Principal("agent", "*")


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def running(iso, iso_client, tenants, clock):
    """A 4-rank RUNNING job on two nodes, with every clock under the test's control."""
    for n in ("n1", "n2"):
        iso.nodes.register(AGENT, n, {"gpus": 2})
    job_id, by_node = placed(iso, iso_client, tenants,
                             heartbeat={"interval_s": 5, "startup_grace_s": 30})
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    return job_id, by_node, clock


def beat(client, tenants, job_id, ranks, step=1, attempt=1, who="agents", **extra):
    body = {"attempt": attempt, "ranks": [{"rank": r, "step": step, **extra} for r in ranks]}
    return client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                            headers=tenants.headers(who))


def ranks_view(client, tenants, job_id):
    return client.http.get(f"/v1/jobs/{job_id}/ranks", headers=tenants.headers()).json_body


def health(client, tenants, job_id):
    return client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body["health"]


def test_a_beat_is_stamped_with_the_collectors_time_not_the_senders(iso, iso_client, tenants,
                                                                    running):
    job_id, _, clock = running
    r = beat(iso_client, tenants, job_id, [0], sent_at="2001-01-01T00:00:00.000Z")
    assert r.status_code == 202 and r.json_body["received_at"] == rfc3339(clock.t)
    clock.advance(12)
    v = ranks_view(iso_client, tenants, job_id)
    [r0] = [r for r in v["ranks"] if r["rank"] == 0]
    assert r0["last_heard_at"] == rfc3339(clock.t - timedelta(seconds=12))
    assert r0["silence_s"] == 12.0


def test_the_ranks_view_orders_by_silence_then_rank_and_shows_its_inputs(iso, iso_client,
                                                                         tenants, running):
    job_id, _, clock = running
    beat(iso_client, tenants, job_id, [2, 3])
    clock.advance(3)
    beat(iso_client, tenants, job_id, [0])
    clock.advance(2)
    v = ranks_view(iso_client, tenants, job_id)
    assert [r["rank"] for r in v["ranks"]] == [1, 2, 3, 0], "never heard counts from start"
    assert v["ranks"][0]["last_heard_at"] is None
    assert v["threshold_s"] == v["threshold_inputs"]["k"] * 5
    assert v["threshold_inputs"]["scans_per_hour"] == 60.0 and v["attempt"] == 1


def test_a_rank_exactly_at_the_threshold_is_not_stalled_a_hair_past_it_is(iso, iso_client,
                                                                          tenants, running):
    job_id, _, clock = running
    threshold = ranks_view(iso_client, tenants, job_id)["threshold_s"]
    clock.advance(31)  # past the startup grace
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    clock.advance(threshold)
    assert not any(r["stalled"] for r in ranks_view(iso_client, tenants, job_id)["ranks"])
    clock.advance(0.001)
    assert all(r["stalled"] for r in ranks_view(iso_client, tenants, job_id)["ranks"])


def test_the_scan_names_the_rank_silent_longest_and_records_one_incident(iso, iso_client,
                                                                         tenants, running):
    job_id, _, clock = running
    threshold = ranks_view(iso_client, tenants, job_id)["threshold_s"]
    step = 0
    for _ in range(3):  # all healthy
        step += 1
        beat(iso_client, tenants, job_id, [0, 1, 2, 3], step=step)
        clock.advance(5)
        iso.scanner.run()
    assert health(iso_client, tenants, job_id)["status"] == "OK"
    # rank 3 hangs; the others stall behind it two intervals later
    for i in range(2):
        beat(iso_client, tenants, job_id, [0, 1, 2], step=step + i + 1)
        clock.advance(5)
        iso.scanner.run()
    while clock.t < utcnow() + timedelta(seconds=threshold + 60):
        clock.advance(5)
        iso.scanner.run()
        # keep the ingest path visibly alive: a node calls in
        iso.nodes.register(AGENT, "n1", {"gpus": 2})
        if health(iso_client, tenants, job_id)["status"] == "STALLED":
            break
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 3
    assert h["detected_at"] and h["last_heard_at"] and h["detection_s"] > threshold
    first_incident = h["detected_at"]
    for _ in range(3):  # more scans, the cascade grows, still one incident
        clock.advance(5)
        iso.nodes.register(AGENT, "n1", {"gpus": 2})
        iso.scanner.run()
    h = health(iso_client, tenants, job_id)
    assert h["detected_at"] == first_incident and h["first_stalled_rank"] == 3
    assert h["stalled_ranks"][0] == 3 and set(h["stalled_ranks"]) == {0, 1, 2, 3}


def test_a_culprit_that_beats_again_is_counted_as_a_false_alarm(iso, iso_client, tenants,
                                                               running):
    job_id, _, clock = running
    threshold = ranks_view(iso_client, tenants, job_id)["threshold_s"]
    clock.advance(31)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    iso.scanner.run()
    clock.advance(threshold / 2)
    beat(iso_client, tenants, job_id, [0, 1, 2])
    clock.advance(threshold / 2 + 1)
    beat(iso_client, tenants, job_id, [0, 1, 2])
    iso.scanner.run()
    assert health(iso_client, tenants, job_id)["first_stalled_rank"] == 3
    clock.advance(1)
    beat(iso_client, tenants, job_id, [3])
    iso.scanner.run()
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "OK" and h["false_alarms"] == 1
    # issue 47: the recovery is told in the job's story, with its time,
    # written on DynamoDB with the health that ends the incident; once
    clock.advance(1)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3], step=2)
    iso.scanner.run()
    events = iso_client.http.get(f"/v1/jobs/{job_id}/events",
                                 headers=tenants.headers()).json_body["events"]
    [stalled] = [e for e in events if e["type"] == "stalled"]
    [recovered] = [e for e in events if e["type"] == "recovered"]
    assert recovered["time"] == rfc3339(clock.t - timedelta(seconds=1))
    assert recovered["rank"] == 3 and recovered["incident"] == "1#1"
    assert recovered["reason"].startswith("rank 3 beat again 1 s after the stall was detected")
    assert events.index(stalled) < events.index(recovered)


def test_a_late_scan_convicts_nobody_and_says_why(iso, iso_client, tenants, running):
    job_id, _, clock = running
    iso.scanner.run()
    clock.advance(31)
    beat(iso_client, tenants, job_id, [0, 1, 2])
    clock.advance(600)  # the collector was paused for ten minutes
    iso.nodes.register(AGENT, "n1", {"gpus": 2})
    beat(iso_client, tenants, job_id, [0, 1, 2])
    report = iso.scanner.run()
    assert report["suppressed"] and "collector paused" in report["suppressed"]
    h = health(iso_client, tenants, job_id)
    assert h["status"] != "STALLED" and h["suppressed"] == report["suppressed"]


def test_a_declared_pause_is_not_silence_until_its_bound(iso, iso_client, tenants, running):
    job_id, _, clock = running
    clock.advance(31)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    body = {"attempt": 1, "ranks": [{"rank": r, "pause": {"reason": "checkpoint",
                                                         "remaining_s": 600}} for r in range(4)]}
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers("agents"))
    assert r.status_code == 202
    clock.advance(300)
    v = ranks_view(iso_client, tenants, job_id)
    assert all(r["paused"] and not r["stalled"] for r in v["ranks"])
    assert all(r["silence_s"] == 300 for r in v["ranks"]), "a pause is not a beat"
    clock.advance(301)
    assert all(r["stalled"] for r in ranks_view(iso_client, tenants, job_id)["ranks"])


def test_restart_on_stall_cancels_the_attempt_and_requeues(iso, iso_client, tenants, clock):
    for n in ("n1", "n2"):
        iso.nodes.register(AGENT, n, {"gpus": 2})
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2, on_stall="restart",
                             heartbeat={"interval_s": 5, "startup_grace_s": 0})
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    iso.scanner.run()
    clock.advance(100)
    iso.nodes.register(AGENT, "n1", {"gpus": 2})
    iso.scanner.run()
    j = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert j["state"] == "PENDING"
    [attempt] = iso.store.attempts(job_id)
    assert attempt["exit"]["reason"] == "stalled"


@pytest.mark.parametrize("body, status, code", [
    ({"attempt": 1, "ranks": [{"rank": 4, "step": 1}]}, 400, "invalid_argument"),
    ({"attempt": 2, "ranks": [{"rank": 0, "step": 1}]}, 409, "stale_attempt"),
    ({"attempt": 1, "ranks": []}, 400, "invalid_argument"),
    ({"attempt": 1, "ranks": [{"rank": 0, "sent_at": "yesterday"}]}, 400, "invalid_argument"),
    ({"attempt": 1, "ranks": [{"rank": 0, "step": 10**40}]}, 400, "invalid_argument"),
    ({"attempt": 1, "ranks": [{"rank": 0, "step": 1}] * 1025}, 400, "invalid_argument"),
])
def test_bad_heartbeats_are_refused(iso, iso_client, tenants, running, body, status, code):
    job_id, _, _ = running
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers("agents"))
    assert r.status_code == status and r.json_body["code"] == code


def test_heartbeats_for_a_finished_job_are_409_already_finished(iso, iso_client, tenants,
                                                               running):
    job_id, by_node, _ = running
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": ranks, "exit_code": 0, "node_id": n})
    r = beat(iso_client, tenants, job_id, [0])
    assert r.status_code == 409 and r.json_body["code"] == "already_finished"


def test_an_agent_beats_only_for_ranks_on_its_node(iso, iso_client, tenants, running):
    job_id, by_node, _ = running
    assert beat(iso_client, tenants, job_id, by_node["n1"], who="agent").status_code == 403
    assert beat(iso_client, tenants, job_id, [0], who="a").status_code == 403


def test_a_throttled_write_is_503_with_retry_after(iso, iso_client, tenants, running,
                                                   monkeypatch):
    """A beat must never vanish silently: throttling tells the agent to retry."""
    from botocore.exceptions import ClientError

    from chalicelib.adapters.aws import SharedConnection

    job_id, _, _ = running
    dispatch = SharedConnection.dispatch

    def throttled(self, operation, request):
        # what botocore raises once its retries are spent
        if operation == "UpdateItem" and "heartbeats" in request["TableName"]:
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                         "Message": "slow"}}, operation)
        return dispatch(self, operation, request)
    monkeypatch.setattr(SharedConnection, "dispatch", throttled)
    r = beat(iso_client, tenants, job_id, [0])
    assert r.status_code == 503 and r.json_body["code"] == "unavailable"
    assert r.headers["Retry-After"] == "1"


def test_a_bare_rank_entry_is_a_beat(iso, iso_client, tenants, running):
    job_id, _, _ = running
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", headers=tenants.headers("agents"),
                             body=json.dumps({"attempt": 1, "ranks": [{"rank": 0}]}))
    assert r.status_code == 202
    [r0] = [r for r in ranks_view(iso_client, tenants, job_id)["ranks"] if r["rank"] == 0]
    assert r0["last_heard_at"] is not None


def test_a_full_batch_of_1024_ranks_fits_the_body_limit(iso, iso_client, tenants):
    body = {"attempt": 1, "ranks": [{"rank": r, "step": 123456789,
                                     "sent_at": "2026-11-29T17:00:00.123Z"}
                                    for r in range(1024)]}
    raw = json.dumps(body)
    assert len(raw) > 64 * 1024
    r = iso_client.http.post("/v1/jobs/job_01ARZ3NDEKTSV4RRFFQ69G5FAV/heartbeats", body=raw,
                             headers=tenants.headers("agents"))
    assert r.status_code == 403, "parsed and validated, then the job is not this node's"


def test_beats_for_an_attempt_that_ended_are_stale(iso, iso_client, tenants):
    for n in ("n1", "n2"):
        iso.nodes.register(AGENT, n, {"gpus": 2})
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": by_node["n1"], "exit_code": 1, "node_id": "n1"})
    r = beat(iso_client, tenants, job_id, by_node["n2"])
    assert r.status_code == 409 and r.json_body["code"] == "stale_attempt"


def test_a_scan_that_overran_its_period_is_not_a_paused_collector(iso, iso_client, tenants,
                                                                 running, monkeypatch):
    """The pause check measures the time nobody scanned: from the end of the
    previous scan. A scan that took three periods on a busy machine (its
    reads slow, beats still arriving) holds no conviction of the next one."""
    job_id, _, clock = running
    period = 3600 / ranks_view(iso_client, tenants, job_id)["threshold_inputs"]["scans_per_hour"]
    clock.advance(31)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    active = iso.scanner.store.active

    def slow_reads(*args, **kwargs):
        for _ in range(3):
            clock.advance(period)
            beat(iso_client, tenants, job_id, [0, 1, 2])
        return active(*args, **kwargs)

    monkeypatch.setattr(iso.scanner.store, "active", slow_reads)
    assert iso.scanner.run()["suppressed"] is None
    monkeypatch.setattr(iso.scanner.store, "active", active)
    clock.advance(period)  # the next start on the schedule's grid
    beat(iso_client, tenants, job_id, [0, 1, 2])
    report = iso.scanner.run()
    assert report["suppressed"] is None and report["incidents"] == 1
    assert health(iso_client, tenants, job_id)["first_stalled_rank"] == 3


def test_convictions_stay_held_while_the_backlog_drains_after_a_pause(iso, iso_client,
                                                                      tenants, running):
    job_id, _, clock = running
    iso.scanner.run()
    clock.advance(31)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    clock.advance(600)  # the collector was blind for ten minutes
    iso.nodes.register(AGENT, "n1", {"gpus": 2})
    assert "collector paused" in iso.scanner.run()["suppressed"]
    clock.advance(5)  # the next, punctual scan: ranks are still catching up
    iso.nodes.register(AGENT, "n1", {"gpus": 2})
    report = iso.scanner.run()
    assert report["suppressed"].startswith("recovering until")
    assert health(iso_client, tenants, job_id)["status"] != "STALLED"
    held_for = 5.0
    while held_for <= iso.scanner._hold_s:  # punctual scans until the hold is over
        clock.advance(30)
        held_for += 30
        iso.nodes.register(AGENT, "n1", {"gpus": 2})
        beat(iso_client, tenants, job_id, [0, 1, 2])
        report = iso.scanner.run()
    assert report["suppressed"] is None, "silence counts again"
    assert health(iso_client, tenants, job_id)["first_stalled_rank"] == 3


def test_the_ranks_view_pages_by_rank_range_without_skips_or_repeats(iso, iso_client, tenants,
                                                                      running, monkeypatch):
    """Every response inside Lambda's limit: a page holds a range of ranks (in
    the view's order), cut by size too, and its token resumes at the next rank."""
    from chalicelib.service import limits

    job_id, _, clock = running
    beat(iso_client, tenants, job_id, [2])
    clock.advance(3)
    beat(iso_client, tenants, job_id, [0])
    whole = ranks_view(iso_client, tenants, job_id)
    assert whole["next_page_token"] is None and len(whole["ranks"]) == 4
    h = tenants.headers()
    first = iso_client.http.get(f"/v1/jobs/{job_id}/ranks?page_size=3", headers=h).json_body
    assert [r["rank"] for r in first["ranks"]] == [1, 2, 0], "silent longest first, in range"
    rest = iso_client.http.get(f"/v1/jobs/{job_id}/ranks?page_size=3&page_token="
                               f"{first['next_page_token']}", headers=h).json_body
    assert [r["rank"] for r in rest["ranks"]] == [3] and rest["next_page_token"] is None
    # cut by size: room for two entries, whatever page_size asks
    one = max(limits.proxy_bytes(r) for r in whole["ranks"])
    monkeypatch.setattr(limits, "PAGE_BUDGET_BYTES", 2 * one + 5)
    seen, token = [], None
    while True:
        q = f"/v1/jobs/{job_id}/ranks" + (f"?page_token={token}" if token else "")
        page = iso_client.http.get(q, headers=h).json_body
        assert len(page["ranks"]) == 2
        seen += [r["rank"] for r in page["ranks"]]
        token = page["next_page_token"]
        if token is None:
            break
    assert sorted(seen) == [0, 1, 2, 3]


def test_a_ranks_token_is_bound_to_its_job_and_page_size_is_checked(iso, iso_client, tenants,
                                                                     running):
    job_id, _, _ = running
    h = tenants.headers()
    token = iso_client.http.get(f"/v1/jobs/{job_id}/ranks?page_size=1",
                                headers=h).json_body["next_page_token"]
    other = iso_client.http.post("/v1/jobs", body=json.dumps({"command": ["x"], "ranks": 4}),
                                 headers=h).json_body["id"]
    r = iso_client.http.get(f"/v1/jobs/{other}/ranks?page_token={token}", headers=h)
    assert r.status_code == 400 and r.json_body["code"] == "invalid_page_token"
    for bad in ("0", "65537", "x"):
        r = iso_client.http.get(f"/v1/jobs/{job_id}/ranks?page_size={bad}", headers=h)
        assert r.status_code == 400 and r.json_body["field"] == "page_size"


def test_a_hosts_beat_of_8_ranks_is_one_write_of_one_item_under_1_kb(iso, iso_client, tenants,
                                                                      monkeypatch):
    """The floor of docs/deploy.md: what a host's post must make durable (each
    rank's last step, the collector's receive time) is one item of under 1 KB,
    1 WRU, written by one request, whatever the agent sends beside it."""
    import boto3

    from bench.harness import item_size
    from chalicelib.adapters.aws import SharedConnection
    from chalicelib.adapters.models import HeartbeatModel

    iso.nodes.register(AGENT, "n8", {"gpus": 8})
    job_id, by_node = placed(iso, iso_client, tenants, ranks=8)
    assert list(by_node) == ["n8"]
    event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": by_node["n8"],
                                           "node_id": "n8"})
    writes: list[str] = []
    dispatch = SharedConnection.dispatch

    def counted(self, operation, request):
        if "heartbeats" in str(request.get("TableName")):
            writes.append(operation)
        return dispatch(self, operation, request)

    monkeypatch.setattr(SharedConnection, "dispatch", counted)
    for step in (10**9, 10**9 + 1):  # the first makes the item, the second is the steady state
        writes.clear()
        r = beat(iso_client, tenants, job_id, list(range(8)), step=step, age_s=0.25,
                 sent_at="2026-12-01T03:04:05.678Z")
        assert r.status_code == 202
    assert writes == ["UpdateItem"]
    dynamodb = boto3.client("dynamodb", endpoint_url=iso.config.endpoint_url,
                            region_name="us-east-1")
    [item] = dynamodb.scan(TableName=HeartbeatModel.Meta.table_name,
                           ScanFilter={"shard_key": {"ComparisonOperator": "BEGINS_WITH",
                                                     "AttributeValueList": [{"S": job_id}]}}
                           )["Items"]
    assert item_size(item) < 1024, f"{item_size(item)} bytes: more than 1 WRU a beat"
    [view] = [v for v in ranks_view(iso_client, tenants, job_id)["ranks"] if v["rank"] == 7]
    assert view["step"] == 10**9 + 1


def test_a_beat_carrying_the_call_in_answers_as_put_does_and_records_both(iso, iso_client,
                                                                         tenants, running):
    """One request an interval for a busy node: the heartbeat POST's
    ``call_in`` is the node's call-in, answered with PUT /v1/nodes's answer."""
    job_id, by_node, clock = running
    clock.advance(16)   # past the node's fresh lease (a quarter of the 60 s to DOWN)
    call_in = {"node_id": "n1", "gpus": 2, "running": [{"job_id": job_id, "attempt": 1}]}
    assert "node" not in beat(iso_client, tenants, job_id, by_node["n1"]).json_body
    body = {"attempt": 1, "ranks": [{"rank": r} for r in by_node["n1"]], "call_in": call_in}
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers("agents"))
    assert r.status_code == 202 and r.json_body["received_at"] == rfc3339(clock.t)
    assert iso.nodes.get("n1").last_seen_at == clock.t
    put = iso_client.http.put("/v1/nodes/n1", headers=tenants.headers("agents"),
                              body=json.dumps({k: v for k, v in call_in.items()
                                               if k != "node_id"})).json_body
    assert r.json_body["node"] == put, "the same answer as PUT /v1/nodes/n1"
    assert r.json_body["node"]["attempts"] == [{"job_id": job_id, "attempt": 1}]
    assert {x["rank"]: x["last_heard_at"] for x in ranks_view(iso_client, tenants, job_id)[
        "ranks"] if x["rank"] in by_node["n1"]} == {x: rfc3339(clock.t) for x in by_node["n1"]}


@pytest.mark.parametrize("who, call_in, status, field", [
    ("agent", {"node_id": "n1", "gpus": 2}, 403, "call_in.node_id"),   # node-1's token
    ("agents", {"node_id": "n1"}, 400, "call_in.gpus"),                # no gpus
    ("agents", {"node_id": "n1", "gpus": 0}, 400, "call_in.gpus"),
    ("agents", {"node_id": "-bad", "gpus": 2}, 400, "call_in.node_id"),
    ("agents", {"node_id": "n1", "gpus": 2, "extra": 1}, 400, "call_in.extra"),
])
def test_a_bad_carried_call_in_is_refused_by_name_and_records_nothing(
        iso, iso_client, tenants, running, who, call_in, status, field):
    job_id, by_node, clock = running
    seen = iso.nodes.get("n1").last_seen_at
    clock.advance(16)   # past the fresh lease: a call-in recorded would show
    body = {"attempt": 1, "ranks": [{"rank": by_node["n1"][0], "step": 5}], "call_in": call_in}
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers(who))
    assert r.status_code == status and r.json_body["field"] == field, r.json_body
    assert iso.nodes.get("n1").last_seen_at == seen
    [row] = [x for x in ranks_view(iso_client, tenants, job_id)["ranks"]
             if x["rank"] == by_node["n1"][0]]
    assert row["last_heard_at"] is None, "no beat recorded either"


def test_refused_beats_carry_no_call_in(iso, iso_client, tenants, running):
    """A stale attempt's beats are refused before anything is written: the
    node is not called in (the agent then calls in by PUT)."""
    job_id, by_node, clock = running
    seen = iso.nodes.get("n1").last_seen_at
    clock.advance(16)   # past the fresh lease: a call-in recorded would show
    body = {"attempt": 2, "ranks": [{"rank": by_node["n1"][0]}],
            "call_in": {"node_id": "n1", "gpus": 2}}
    r = iso_client.http.post(f"/v1/jobs/{job_id}/heartbeats", body=json.dumps(body),
                             headers=tenants.headers("agents"))
    assert r.status_code == 409 and r.json_body["code"] == "stale_attempt"
    assert iso.nodes.get("n1").last_seen_at == seen


def test_beats_read_the_job_eventually_consistent_and_refuse_only_on_a_consistent_read(
        iso, iso_client, tenants, running, monkeypatch):
    """Half the read units on every POST, and no 409 (which stops ranks) or
    403 from a stale read: a refusal is read again strongly consistent."""
    job_id, by_node, _ = running
    store, reads, stale = iso.heartbeats.store, [], [False]
    get = store.get

    def recorded(job_id, *, consistent=True):
        reads.append(consistent)
        # stale: what an eventually consistent read may return for a job
        # written a moment ago (here: not there yet)
        return None if stale[0] and not consistent else get(job_id, consistent=consistent)
    monkeypatch.setattr(store, "get", recorded)
    assert beat(iso_client, tenants, job_id, [0]).status_code == 202
    assert reads == [False], "one eventually consistent read"
    reads.clear()
    stale[0] = True
    assert beat(iso_client, tenants, job_id, [0]).status_code == 202
    assert reads == [False, True], "the stale answer was read again, consistently"
    reads.clear()
    assert beat(iso_client, tenants, job_id, [0], attempt=2).json_body["code"] == "stale_attempt"
    assert reads == [False, True]
