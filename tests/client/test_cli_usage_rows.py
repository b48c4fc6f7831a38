"""`gpujobs usage` (GET /v1/usage): an sreport-style table of GPU-hours per
period and group, productive, goodput and a column per cause of loss, a
total; --csv for spreadsheets (exact GPU-seconds); the query it sends."""
from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

import pytest


def _row(start, end, group, held, productive, lost, jobs, **more):
    return {"start": start, "end": end, "tenant": "acme", "group": group,
            "gpu_hours": round(held / 3600, 6), "productive_gpu_hours": round(productive / 3600, 6),
            "lost_gpu_hours": {k: round(v / 3600, 6) for k, v in lost.items()}, "jobs": jobs,
            "gpu_seconds": held, "productive_gpu_seconds": productive,
            "lost_gpu_seconds": lost, **more}


D1, D2, D3 = "2026-12-01T00:00:00.000Z", "2026-12-02T00:00:00.000Z", "2026-12-03T00:00:00.000Z"
ROWS = [
    _row(D1, D2, {"label:team": "nlp"}, 44640, 36360,
         {"failed_attempt": 5760, "stalled": 1800, "startup": 720}, 3, cost=31.0),
    _row(D1, D2, {"label:team": None}, 3600, 3240, {"startup": 360}, 1, cost=2.5),
    _row(D2, D3, {"label:team": "cv"}, 7200, 0, {"cancelled": 7200}, 2, cost=5.0),
]


@pytest.fixture
def frozen(monkeypatch):
    from gpujobs_client import cli
    monkeypatch.setattr(cli, "_utcnow", lambda: datetime(2026, 12, 8, 0, 15, tzinfo=timezone.utc))


def test_usage_prints_an_sreport_style_table_with_a_total(run, fake, frozen):
    fake.usage_rows = ROWS
    r = run("usage", "--since", "7d", "--by", "label:team")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == ("Usage 2026-12-01T00:15:00.000Z - 2026-12-08T00:15:00.000Z "
                        "by label:team, per day")
    assert lines[1] == "Usage reported in GPU-hours"
    assert lines[2].split() == ["Period", "Tenant", "team", "GPU-h", "Productive", "Goodput",
                                "Cancelled", "Failed", "attempt", "Stalled", "Startup", "Jobs",
                                "Cost"]
    assert set(lines[3].replace(" ", "")) == {"-"}
    assert lines[4].split() == ["2026-12-01", "acme", "nlp", "12.40", "10.10", "81", "%",
                                "0.00", "1.60", "0.50", "0.20", "3", "31.00"]
    assert lines[5].split()[:4] == ["2026-12-01", "acme", "(none)", "1.00"]
    assert lines[6].split() == ["2026-12-02", "acme", "cv", "2.00", "0.00", "0", "%", "2.00",
                                "0.00", "0.00", "0.00", "2", "5.00"]
    assert set(lines[7].replace(" ", "")) == {"-"}
    assert lines[8].split() == ["Total", "15.40", "11.00", "71", "%", "2.00", "1.60", "0.50",
                                "0.30", "38.50"]
    # figures right-aligned under their header
    assert lines[2].index("GPU-h") + len("GPU-h") == lines[4].index("12.40") + len("12.40")
    [sent] = fake.sent("GET", "/v1/usage")
    assert sent.query == {"start": ["2026-12-01T00:15:00.000Z"], "granularity": ["day"],
                          "group_by": ["label:team"]}


def test_usage_csv_has_the_exact_seconds_and_every_row(run, fake, frozen):
    fake.usage_rows = ROWS
    r = run("usage", "--since", "2026-12-01T00:00:00Z", "--until", "1d", "--by", "label:team",
            "--granularity", "hour", "--csv")
    assert r.exit_code == 0, r.output
    got = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [g["label:team"] for g in got] == ["nlp", "", "cv"]
    assert got[0]["gpu_seconds"] == "44640" and got[0]["lost_failed_attempt_gpu_seconds"] == "5760"
    assert got[2]["lost_cancelled_gpu_seconds"] == "7200" and got[2]["cost"] == "5.0"
    assert sum(int(g["gpu_seconds"]) for g in got) == 44640 + 3600 + 7200
    [sent] = fake.sent("GET", "/v1/usage")
    assert sent.query["start"] == ["2026-12-01T00:00:00.000Z"]
    assert sent.query["end"] == ["2026-12-07T00:15:00.000Z"]
    assert sent.query["granularity"] == ["hour"]


def test_usage_without_rows_or_group_and_json(run, fake, frozen):
    r = run("usage")
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "No usage in this period."
    fake.usage_rows = [_row(D1, D2, {}, 3600, 3600, {}, 1)]
    lines = run("usage").stdout.splitlines()
    assert lines[2].split() == ["Period", "Tenant", "GPU-h", "Productive", "Goodput", "Jobs"]
    assert lines[4].split() == ["2026-12-01", "acme", "1.00", "1.00", "100", "%", "1"]
    assert '"rows"' in run("usage", "-o", "json").stdout


def test_a_bad_since_is_a_usage_error_naming_it(run, fake, frozen):
    r = run("usage", "--since", "last week")
    assert r.exit_code == 2 and "--since" in r.output
    assert fake.sent("GET", "/v1/usage") == []
