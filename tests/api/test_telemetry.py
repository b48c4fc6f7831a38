"""Structured JSON logs with the request id on every line; EMF metrics."""
import json

from tests.fakes import FailingInbox

from .helpers import place


def records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_create_emits_a_jobs_created_metric(client, services, tenants, capsys):
    services.telemetry.flush()  # what earlier tests' direct service calls left counted
    capsys.readouterr()
    r = client.http.post("/v1/jobs", body=json.dumps({"command": ["x"], "ranks": 1}),
                         headers=tenants.headers())
    assert r.status_code == 201
    emf = [rec for rec in records(capsys.readouterr().out) if "_aws" in rec]
    assert emf and emf[-1]["JobsCreated"] == [1.0]
    assert emf[-1]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "gpujobs"


def test_log_lines_are_json_and_name_the_request(client, tenants, make_services, capsys):
    services = make_services()  # built under capsys: its log handler writes there
    job_id = client.http.post("/v1/jobs", body=json.dumps({"command": ["x"], "ranks": 1}),
                              headers=tenants.headers()).json_body["id"]
    place(services, job_id, ["node-t"])
    make_services(inbox=FailingInbox(services.nodes.inbox))
    capsys.readouterr()
    client.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
    out = records(capsys.readouterr().out)
    warnings = [rec for rec in out if rec.get("level") == "WARNING"]
    assert warnings, "the failed send is logged"
    assert all(rec.get("request_id") for rec in warnings)
    assert any(rec.get("CancelsRequested") == [1.0] for rec in out if "_aws" in rec)


def test_heartbeat_counts_are_summed_not_emitted_per_request(capsys):
    from chalicelib.adapters.telemetry import LambdaTelemetry

    t = LambdaTelemetry()
    for _ in range(5):
        t.count("HeartbeatsIngested", 8)
        t.flush()
    assert not [r for r in records(capsys.readouterr().out) if "HeartbeatsIngested" in r]
    t._batched_since -= 61
    t.flush()
    [emf] = [r for r in records(capsys.readouterr().out) if "HeartbeatsIngested" in r]
    assert emf["HeartbeatsIngested"] == [40.0]


def test_a_metric_reaching_emf_s_hundred_values_leaves_at_once(capsys):
    """EMF takes at most 100 values of a metric in a record: the hundredth
    sends them, and the rest leave at the invocation's end."""
    from chalicelib.adapters.telemetry import MAX_VALUES, LambdaTelemetry

    t = LambdaTelemetry(metrics=True)
    for _ in range(MAX_VALUES + 3):
        t.seconds("ScanLagSeconds", 0.5)
    [first] = [r for r in records(capsys.readouterr().out) if "_aws" in r]
    assert first["ScanLagSeconds"] == [0.5] * MAX_VALUES
    assert first["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [
        {"Name": "ScanLagSeconds", "Unit": "Seconds"}]
    t.flush()
    [rest] = [r for r in records(capsys.readouterr().out) if "_aws" in r]
    assert rest["ScanLagSeconds"] == [0.5] * 3


def test_metrics_turned_off_write_nothing_and_keep_nothing(capsys, monkeypatch):
    """POWERTOOLS_METRICS_DISABLED (the quiet local stack's setting) writes no
    record, not even one per hundred values, and holds none in memory."""
    from chalicelib.adapters.telemetry import MAX_VALUES, LambdaTelemetry

    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    t = LambdaTelemetry()
    for _ in range(3 * MAX_VALUES):
        t.count("JobsCreated")
    t.flush()
    assert not [r for r in records(capsys.readouterr().out) if "_aws" in r]
    assert not t._metrics
