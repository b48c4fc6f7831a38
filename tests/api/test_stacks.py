"""Ranks' Python stacks on the wire (issue 23, item 4): a process sample's
``proc.stack`` and ``proc.wchan`` in a heartbeat post, bounded; a STOPPED
report's ``stacks``, carried into its ``rank_stopped`` event."""
import json

from . import test_events, test_heartbeats
from .test_events import event, placed
from .test_heartbeats import ranks_view

# the fixtures of the events and heartbeats tests: two nodes; a RUNNING job on them
cluster = test_events.cluster
clock, running = test_heartbeats.clock, test_heartbeats.running

STACK = {"frames": ["hang_in_here (train.py:88)", "<module> (train.py:120)"],
         "code": "time.sleep(3600)", "age_s": 3.2}
SAMPLE = {"cpu": 0.0, "io_bps": 0, "write_bps": 0, "state": "S", "procs": 2,
          "wchan": "hrtimer_nanosleep"}


def post(client, tenants, job_id, entries):
    return client.http.post(f"/v1/jobs/{job_id}/heartbeats",
                            body=json.dumps({"attempt": 1, "ranks": entries}),
                            headers=tenants.headers("agents"))


def test_a_sample_with_its_stack_and_wchan_is_taken_and_kept_as_posted(iso, iso_client,
                                                                      tenants, running):
    """Invariant: proc.stack and proc.wchan are accepted and the ranks view
    shows the sample as the agent posted it."""
    job_id, _, _ = running
    r = post(iso_client, tenants, job_id, [{"rank": 1, "proc": {**SAMPLE, "stack": STACK}}])
    assert r.status_code == 202, r.json_body
    [row] = [x for x in ranks_view(iso_client, tenants, job_id)["ranks"] if x["rank"] == 1]
    assert row["proc"]["stack"] == STACK and row["proc"]["wchan"] == "hrtimer_nanosleep"


def test_a_stack_past_its_bounds_is_400_naming_the_field(iso, iso_client, tenants, running):
    """Invariant: at most 16 frames of at most 200 characters, a wchan of at
    most 64, and no member the schema does not name; 400 names the field."""
    job_id, _, _ = running
    cases = {
        "ranks.0.proc.stack.frames": {**STACK, "frames": [f"f{i} (t.py:{i})" for i in range(17)]},
        "ranks.0.proc.stack.frames.1": {**STACK, "frames": ["ok (t.py:1)", "x" * 201]},
        "ranks.0.proc.stack.code": {**STACK, "code": "y" * 201},
        "ranks.0.proc.stack.age_s": {**STACK, "age_s": 3601},
        "ranks.0.proc.stack.locals": {**STACK, "locals": {}},
    }
    for field, stack in cases.items():
        r = post(iso_client, tenants, job_id, [{"rank": 0, "proc": {**SAMPLE, "stack": stack}}])
        assert r.status_code == 400 and r.json_body["field"] == field, (field, r.json_body)
    r = post(iso_client, tenants, job_id, [{"rank": 0, "proc": {**SAMPLE, "wchan": "w" * 65}}])
    assert r.status_code == 400 and r.json_body["field"] == "ranks.0.proc.wchan"


def test_a_stopped_report_with_stacks_puts_them_in_its_rank_stopped_event(iso, iso_client,
                                                                          tenants, cluster):
    """Invariant: a STOPPED report's stacks are accepted and the rank_stopped
    event carries them by rank (where worked out from the frames when the
    report has none); a report past 64 stacks is 400."""
    job_id, by_node = placed(iso, iso_client, tenants)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    iso_client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    low, high = sorted(by_node["n1"])
    stacks = [{"rank": high, "frames": ["barrier (torch/distributed/distributed_c10d.py:5356)",
                                        "<module> (w.py:14)"]},
              {"rank": low, "where": "w.py:10 in <module> → time.sleep(3600)",
               "frames": ["<module> (w.py:10)"]}]
    too_many = event(iso_client, tenants, job_id, 1, {
        "type": "STOPPED", "ranks": by_node["n1"], "node_id": "n1",
        "stacks": [{"rank": low, "frames": []}] * 65})
    assert too_many.status_code == 400 and too_many.json_body["field"] == "stacks"
    r = event(iso_client, tenants, job_id, 1, {"type": "STOPPED", "ranks": by_node["n1"],
                                               "node_id": "n1", "stacks": stacks})
    assert r.status_code == 200, r.json_body
    events = iso_client.http.get(f"/v1/jobs/{job_id}/events",
                                 headers=tenants.headers()).json_body["events"]
    [stopped] = [e for e in events if e["type"] == "rank_stopped"]
    assert stopped["stacks"] == [
        {"rank": low, "where": "w.py:10 in <module> → time.sleep(3600)",
         "frames": ["<module> (w.py:10)"]},
        {"rank": high, "where": "w.py:14 in <module>",
         "frames": ["barrier (torch/distributed/distributed_c10d.py:5356)",
                    "<module> (w.py:14)"]}]


def test_stacks_that_would_overflow_the_attempt_item_are_left_out_not_the_stop(
        iso, iso_client, tenants, cluster, monkeypatch):
    """Invariant: the stop is recorded even when its stacks would take the
    attempt item past DynamoDB's 400 KB: the event is written without them.
    DynamoDB's refusal is injected: moto applies an oversized update in part
    before it refuses it (real DynamoDB writes all of an update or none)."""
    from botocore.exceptions import ClientError

    job_id, by_node = placed(iso, iso_client, tenants)
    ranks = by_node["n1"]
    dynamo = iso.store._dynamo
    real_update, sent = dynamo.update, []

    def update(request):
        big = "stacks" in json.dumps(request)
        sent.append(big)
        if big:
            raise ClientError({"Error": {"Code": "ValidationException", "Message":
                                         "Item size to update has exceeded the maximum "
                                         "allowed size"}}, "UpdateItem")
        return real_update(request)
    monkeypatch.setattr(dynamo, "update", update)
    stacks = [{"rank": r, "frames": ["x" * 200] * 16} for r in ranks]
    attempt = iso.store.record_ranks(job_id, 1, "stopped", ranks, None, "n1", stacks)
    monkeypatch.undo()
    assert sent == [True, False] and set(ranks) <= attempt.stopped
    events = iso_client.http.get(f"/v1/jobs/{job_id}/events",
                                 headers=tenants.headers()).json_body["events"]
    [stopped] = [e for e in events if e["type"] == "rank_stopped"]
    assert "stacks" not in stopped and stopped["ranks"] == sorted(ranks)
