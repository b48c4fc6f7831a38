"""The tenant event feed (GET /v1/events) over the in-process API on moto:
each transition tells its event once, in order, to its own tenant only; the
cursor is signed and bound; the feed timer puts every event on the stack's
EventBridge bus, where a rule routes it to an SQS queue."""
import json

import boto3
import pytest

from .test_events import cluster, event, placed, submit  # noqa: F401 (fixture)


def feed(client, tenants, who="a", **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    r = client.http.get(f"/v1/events?{query}", headers=tenants.headers(who))
    assert r.status_code == 200, r.json_body
    return r.json_body


def moves(events):
    return [(e["type"], e["data"].get("from"), e["data"].get("to")) for e in events]


def test_a_jobs_life_is_told_once_in_order_and_the_cursor_resumes_after_it(
        iso, iso_client, tenants, cluster):  # noqa: F811
    """Invariant: following next_cursor returns every event after it exactly
    once, in id order; a run of the life adds only its own events."""
    job_id, by_node = placed(iso, iso_client, tenants)
    first = feed(iso_client, tenants)
    assert moves(first["events"]) == [("job.created", None, None),
                                      ("job.state_changed", "PENDING", "SCHEDULED")]
    assert all(e["job_id"] == job_id for e in first["events"])
    assert again_empty(iso_client, tenants, first["next_cursor"])
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1,
              {"type": "EXITED", "ranks": ranks, "exit_code": 0, "node_id": n})
    rest = feed(iso_client, tenants, after=first["next_cursor"])
    assert moves(rest["events"]) == [("job.state_changed", "SCHEDULED", "RUNNING"),
                                     ("job.state_changed", "RUNNING", "SUCCEEDED")]
    assert rest["events"][-1]["data"]["exit"] == {"exit_code": 0}
    ids = [e["id"] for e in first["events"] + rest["events"]]
    assert ids == sorted(ids) and len(set(ids)) == 4 and all(i.startswith("evt_") for i in ids)
    assert [e["id"] for e in feed(iso_client, tenants)["events"]] == ids, "from the start: all"
    assert again_empty(iso_client, tenants, rest["next_cursor"])


def again_empty(client, tenants, cursor):
    page = feed(client, tenants, after=cursor)
    return page["events"] == [] and page["next_cursor"]


def test_a_failed_attempt_is_told_as_a_retry_and_a_move_back_to_pending(
        iso, iso_client, tenants, cluster):  # noqa: F811
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    n, ranks = next(iter(by_node.items()))
    event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": ranks[:1], "exit_code": 3, "node_id": n})
    events = feed(iso_client, tenants, job_id=job_id)["events"]
    retried = [e for e in events if e["type"] == "job.retried"]
    assert len(retried) == 1 and retried[0]["data"]["attempt"] == 1
    assert retried[0]["data"]["next_attempt"] == 2
    assert ("job.state_changed", "RUNNING", "PENDING") in moves(events)
    only = feed(iso_client, tenants, type="job.retried")
    assert [e["id"] for e in only["events"]] == [retried[0]["id"]]


def test_another_tenant_sees_none_of_ours_and_cannot_use_our_cursor(iso, iso_client, tenants):
    submit(iso_client, tenants)
    ours = feed(iso_client, tenants)
    assert [e["type"] for e in ours["events"]] == ["job.created"]
    assert feed(iso_client, tenants, who="b")["events"] == []
    r = iso_client.http.get(f"/v1/events?after={ours['next_cursor']}", headers=tenants.headers("b"))
    assert r.status_code == 400 and r.json_body["code"] == "invalid_page_token"
    assert r.json_body["field"] == "after"


@pytest.mark.parametrize("query, field", [
    ("type=job.nope", "type"), ("page_size=0", "page_size"), ("page_size=501", "page_size"),
    ("wait_s=21", "wait_s"), ("wait_s=-1", "wait_s"), ("after=not-a-cursor", "after"),
])
def test_bad_input_is_a_400_naming_the_field(iso_client, tenants, query, field):
    r = iso_client.http.get(f"/v1/events?{query}", headers=tenants.headers())
    assert r.status_code == 400, r.json_body
    assert r.json_body["field"] == field


def test_a_cursor_is_bound_to_its_filter(iso, iso_client, tenants):
    submit(iso_client, tenants)
    page = feed(iso_client, tenants, type="job.created")
    r = iso_client.http.get(f"/v1/events?after={page['next_cursor']}", headers=tenants.headers())
    assert r.status_code == 400 and r.json_body["field"] == "after"


def test_the_feed_timer_puts_every_event_on_the_bus_where_a_rule_routes_it(
        iso, iso_client, tenants, aws_env):
    """Invariant: every numbered event goes on the stack's EventBridge bus
    (source gpujobs, detail-type its type), as an AWS Batch user routes it."""
    endpoint = aws_env["GPUJOBS_AWS_ENDPOINT_URL"]
    events = boto3.client("events", endpoint_url=endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    bus = iso.config.event_bus  # (the stack of its own that iso runs on)
    queue = sqs.create_queue(QueueName=f"feed-{tenants.a}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    rule = f"jobs-of-{tenants.a}"
    events.put_rule(Name=rule, EventBusName=bus, EventPattern=json.dumps(
        {"source": ["gpujobs"], "detail-type": ["job.created"]}))
    events.put_targets(Rule=rule, EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    try:
        job_id = submit(iso_client, tenants)
        iso.feed.sweep()
        got = []
        for _ in range(20):
            got += sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=1).get("Messages", [])
            mine = [json.loads(m["Body"]) for m in got]
            mine = [m for m in mine if m["detail"]["job_id"] == job_id]
            if mine:
                break
        assert len(mine) == 1, got
        assert mine[0]["source"] == "gpujobs" and mine[0]["detail-type"] == "job.created"
        assert mine[0]["detail"]["id"] == feed(iso_client, tenants)["events"][0]["id"]

        assert iso.feed.push(tenants.a) == 0, "pushed once: nothing due for us now"
    finally:
        events.remove_targets(Rule=rule, EventBusName=bus, Ids=["q"])
        events.delete_rule(Name=rule, EventBusName=bus)


def test_the_feed_and_the_webhooks_are_wired_both_ways(iso):
    """What the feed pushes goes to the webhooks' fan_out; an endpoint the
    webhooks disable is told on the feed (bootstrap.build)."""
    assert iso.feed._webhooks == iso.webhooks.fan_out
    assert iso.webhooks.on_disabled == iso.feed.webhook_disabled
