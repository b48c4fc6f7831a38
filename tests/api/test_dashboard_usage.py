"""The usage page's figures (chalicelib/web/static/usage.js, issue 46) under
node against what the CLI says for the same rows of ``GET /v1/usage``: the
totals and each row are `gpujobs usage`'s table (gpujobs_client/cli.py
usage_table), each day's tooltip is `gpujobs describe`'s usage sentence of
that day's sum, the page's address round-trips its settings. ROWS and DAYS
are the canned answer tests/browser/test_dashboard_usage.py serves too."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from chalicelib.domain.clock import iso
from tests.api.test_dashboard_assets import run_under_node


def days_back(n: int, now: datetime | None = None) -> str:
    """The UTC day ``n`` days before today's (or ``now``'s), YYYY-MM-DD."""
    now = now or datetime.now(timezone.utc)
    return (now - timedelta(days=n)).strftime("%Y-%m-%d")


def row(day: str, team: str | None, productive: int, **lost: int) -> dict:
    """A row as GET /v1/usage?granularity=day&group_by=label:team answers it."""
    start = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
    held = productive + sum(lost.values())
    return {"start": iso(start), "end": iso(start + timedelta(days=1)), "tenant": "acme",
            "group": {"label:team": team}, "gpu_hours": round(held / 3600, 6),
            "productive_gpu_hours": round(productive / 3600, 6),
            "lost_gpu_hours": {k: round(v / 3600, 6) for k, v in sorted(lost.items())},
            "jobs": 2 if team else 1, "gpu_seconds": held, "productive_gpu_seconds": productive,
            "lost_gpu_seconds": dict(sorted(lost.items()))}


def rows(now: datetime | None = None) -> list[dict]:
    """Three days of the last seven: team ml, team vision and jobs without a team."""
    d5, d2, d0 = days_back(5, now), days_back(2, now), days_back(0, now)
    return [row(d5, "ml", 28800, failed_attempt=5400, startup=1800),
            row(d5, "vision", 7200),
            row(d2, "ml", 10800, preempted=2700, stalled=900),
            row(d2, None, 1800, node_lost=1800),
            row(d0, "vision", 4500, startup=900)]


SCRIPT = """
import { usageModel, totalsOf, dayText, dayKeys, settingsOf, addressOf, scaleOf, groupTitle } from './usage.js';
const given = JSON.parse(process.argv[2]);
const days = dayKeys(Date.parse(given.now), 7);
const model = usageModel(given.rows, days, 'label:team');
console.log(JSON.stringify({
  days, totals: totalsOf(model.total),
  dayTexts: days.map((d) => dayText(d, model.byDay.get(d))),
  groups: model.groups.map((g) => [g.title, g.total.held, g.total.productive]),
  settings: [settingsOf('#/usage'), settingsOf('#/usage?days=30&by='), settingsOf('#/usage?days=9&by=job'),
    settingsOf(addressOf({ days: 30, by: 'label:team name' }))],
  scales: [scaleOf(12), scaleOf(0.7), scaleOf(0), scaleOf(43)],
  titles: [groupTitle('gpu_type', 'any'), groupTitle('gpu_type', 'h100'), groupTitle('label:team', null),
    groupTitle('job', 'job_1')],
  // 15 jobs of a day, job_i holding i + 1 GPU-hours: the 11 biggest drawn, the rest summed in one chart
  byJob: usageModel(Array.from({ length: 15 }, (_, i) => ({ start: `${days[6]}T00:00:00.000Z`,
    group: { job: `job_${i}` }, gpu_seconds: 3600 * (i + 1), productive_gpu_seconds: 3600 * (i + 1),
    lost_gpu_seconds: {} })), days, 'job').groups.map((g) => [g.title, g.total.held]),
}));
"""


def test_the_page_says_the_totals_and_each_day_as_the_cli_does(tmp_path):
    from gpujobs_client import cli
    from gpujobs_client.models import Usage

    now = datetime.now(timezone.utc)
    given = rows(now)
    said = run_under_node(tmp_path, SCRIPT, {"rows": given, "now": iso(now)})
    assert said["days"] == [days_back(n, now) for n in range(6, -1, -1)]
    # the totals: the CLI table's total line, in GPU-h to a decimal
    total = cli.usage_table(given, by="label:team", granularity="day")[-1]
    assert total[3:6] == ["18.50", "14.75", "80 %"]
    assert said["totals"] == [["Held", "18.5 GPU-h"], ["Productive", "14.8 GPU-h"], ["Goodput", "80 %"],
                              ["Lost", "3.8 GPU-h: 0.8 startup, 0.2 stalled, 1.5 failed attempt, "
                                       "0.8 preempted, 0.5 node lost"]]
    # each day's tooltip: describe's sentence of the day's sum
    by_day: dict[str, dict] = {}
    for r in given:
        d = by_day.setdefault(r["start"][:10], {"gpu_seconds": 0, "productive_gpu_seconds": 0,
                                                "lost_gpu_seconds": {}})
        d["gpu_seconds"] += r["gpu_seconds"]
        d["productive_gpu_seconds"] += r["productive_gpu_seconds"]
        for k, v in r["lost_gpu_seconds"].items():
            d["lost_gpu_seconds"][k] = d["lost_gpu_seconds"].get(k, 0) + v
    for day, text in zip(said["days"], said["dayTexts"]):
        if day in by_day:
            assert text == f"{day}: {cli.usage_sentence(Usage.from_json(by_day[day]))}"
        else:
            assert text == f"{day}: no GPU time"
    assert said["dayTexts"][1] == f"{days_back(5, now)}: held 12.0 GPU-h: 10.0 productive (83 %), " \
                                  "1.5 failed, 0.5 startup"
    # most GPU time first, the jobs without the label last
    assert said["groups"] == [["team=ml", 50400, 39600], ["team=vision", 12600, 11700],
                              ["no team label", 3600, 1800]]
    assert said["settings"] == [{"days": 7, "by": "label:team"}, {"days": 30, "by": ""},
                                {"days": 7, "by": "job"}, {"days": 30, "by": "label:team name"}]
    assert said["scales"] == [[12.5, 2.5], [0.8, 0.2], [1, 1], [50, 10]]
    assert said["titles"] == ["any GPU type", "h100", "no team label", "job_1"]
    assert said["byJob"] == [[f"job_{i}", 3600 * (i + 1)] for i in range(14, 3, -1)] + \
        [["4 other jobs", 3600 * (1 + 2 + 3 + 4)]]
