"""The job page's timeline (issue 46) in a real browser: a job's attempts as
bars over time, cut by cause, with its stalls, preemptions and node losses
marked, a legend, the axis times and the usage sentence `gpujobs describe`
prints. Asserted on what a person reads: the total line, the legend's
labels, each bar's text and tooltips, the markers' titles, the table."""
from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime, timedelta, timezone

from selenium.webdriver.common.by import By

from chalicelib.domain import usage as usage_of
from chalicelib.domain.clock import iso, parse_iso
from tests.browser import ui
from tests.support.browser import submit, unique, wait_state

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
JOB_ID = "job_01TIME11NE0000000000000000"


def at(seconds: float) -> str:
    return iso(T0 + timedelta(seconds=seconds))


def ev(kind: str, seconds: float, attempt: int | None, reason: str | None = None, **more) -> dict:
    return {"type": kind, "time": at(seconds), "attempt": attempt, "reason": reason, **more}


#: four attempts of 4 ranks x 1 GPU: rank 3 fails; preempted; its node lost;
#: stalled 2 min (from the culprit's last beat), recovered, succeeded
EVENTS = [
    ev("created", 0, None, "submitted"),
    ev("placed", 5, 1, "placed on 2 nodes", nodes={"n1": "0-1", "n2": "2-3"}),
    ev("started", 45, 1, "ranks started"),
    ev("rank_exited", 1799, 1, "rank 3 exited with code 1", ranks=[3], exit_code=1, node_id="n2"),
    ev("retried", 1800, 1, "rank_failed", rank=3, node_id="n2", next_attempt=2,
       decision="rank_failed (rank 3, exit code 1): retried (attempt 2 of 4)"),
    ev("placed", 1860, 2, "placed on 2 nodes", nodes={"n1": "0-1", "n3": "2-3"}),
    ev("started", 1900, 2, "ranks started"),
    ev("retried", 3600, 2, "preempted", node_id="n1", next_attempt=3,
       decision="preempted: retried, not counted (uncounted retry 1 of 10)"),
    ev("placed", 3700, 3, "placed on 2 nodes", nodes={"n2": "0-1", "n3": "2-3"}),
    ev("started", 3730, 3, "ranks started"),
    ev("retried", 5400, 3, "node_lost", rank=2, node_id="n3", next_attempt=4,
       decision="node_lost: retried, not counted (uncounted retry 2 of 10)"),
    ev("placed", 5500, 4, "placed on 2 nodes", nodes={"n2": "0-1", "n4": "2-3"}),
    ev("started", 5530, 4, "ranks started"),
    ev("stalled", 9100, 4, "rank 2 on n4 went silent first", rank=2, last_heard_at=at(9000)),
    ev("recovered", 9120, 4, "rank 2 beat again 20 s after the stall was detected", incident="i1",
       rank=2),
    ev("finished", 14400, 4, "succeeded", state="SUCCEEDED", exit_code=0),
]
EXITS = {1: {"reason": "rank_failed", "exit_code": 1, "rank": 3, "node_id": "n2"},
         2: {"reason": "preempted", "exit_code": None, "node_id": "n1", "detail": "node n1 drained: bad ECC"},
         3: {"reason": "node_lost", "exit_code": None, "rank": 2, "node_id": "n3"},
         4: {"reason": "succeeded", "exit_code": 0}}
ATTEMPTS = [{"attempt": n, "state": "SUCCEEDED" if n == 4 else "FAILED", "placement": [],
             "created_at": at(placed), "finished_at": at(ended), "exit": EXITS[n]}
            for n, placed, ended in ((1, 5, 1800), (2, 1860, 3600), (3, 3700, 5400), (4, 5500, 14400))]
USAGE = usage_of.usage(usage_of.spans_of(EVENTS, 4), T0 + timedelta(days=1))
JOB = {"id": JOB_ID, "name": "timeline", "state": "SUCCEEDED", "attempt": 4, "uncounted_retries": 2,
       "created_at": at(0), "started_at": at(45), "finished_at": at(14400),
       "spec": {"ranks": 4, "gpus_per_rank": 1, "gpu_type": "h100", "command": ["train"], "labels": {},
                "max_attempts": 4},
       "exit": EXITS[4], "usage": USAGE}


@contextlib.contextmanager
def fed(page, job: dict, attempts: list, events: list):
    """The page's own fetch answers for ``job``, its attempts and its story; the
    rest goes to the stack. Applies from the next document on."""
    script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const FAKE = %s, real = window.fetch;
        const answer = (body) => new Response(JSON.stringify(body),
          {status: 200, headers: {'Content-Type': 'application/json'}});
        window.fetch = async (url, opts) => {
          const path = new URL(String(url), location.href).pathname;
          const base = '/v1/jobs/' + FAKE.job.id;
          const ours = {[base]: FAKE.job, [base + '/attempts']: {attempts: FAKE.attempts},
            [base + '/events']: {events: FAKE.events}, [base + '/logs']: {lines: []}};
          const hit = Object.keys(ours).find((k) => path.endsWith(k));
          return hit ? answer(ours[hit]) : real(url, opts);
        };""" % json.dumps({"job": job, "attempts": attempts, "events": events})})
    # a blank page first: the dashboard's next load is a new document, which
    # has the fake fetch (a hash change alone would stay in the document open
    # now, whose real fetch of the canned job is a 404 in the console)
    page.get("about:blank")
    try:
        yield
    finally:
        page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def legend(page) -> list[str]:
    return [li.text for li in page.find_elements(By.CSS_SELECTOR, "#timeline-legend li")]


def bars(page) -> list[str]:
    return [b.get_attribute("aria-label") for b in page.find_elements(By.CSS_SELECTOR, "#timeline-bars svg.tl-bar")]


def titles(page, css: str) -> list[str]:
    """The tooltips (SVG <title>) of what ``css`` finds, in the page's order."""
    return page.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.querySelector('title').textContent)", css)


def parts_shown(page) -> dict[str, int]:
    """GPU-ms by part over every piece of every bar."""
    out: dict[str, int] = {}
    for part, gpu_ms in page.execute_script(
            "return [...document.querySelectorAll('#timeline-bars rect.tl-seg')]"
            ".map((r) => [r.dataset.part, Number(r.dataset.gpuMs)])"):
        out[part] = out.get(part, 0) + gpu_ms
    return out


def test_a_retried_jobs_timeline_says_each_attempt_its_causes_and_its_marks(page, browser_stack):
    """Canned JSON (the page's own fetch): four attempts, each ended
    otherwise; the total line is describe's sentence of the job's usage, the
    bars add up to it, each says how its attempt ended, the stall, the
    preemption and the node loss are marked with their words."""
    from gpujobs_client import cli
    from gpujobs_client.models import Attempt, Usage

    sentence = cli.usage_sentence(Usage.from_json(USAGE), [Attempt.from_json(a) for a in ATTEMPTS])
    assert sentence.startswith("held 15.7 GPU-h: ") and "failed attempt 1 (rank 3 exited 1)" in sentence
    with fed(page, JOB, ATTEMPTS, EVENTS), ui.viewport(page, 1280, 800), ui.time_zone(page, "America/New_York"):
        page.get(browser_stack.api + f"/#/jobs/{JOB_ID}")
        page.refresh()
        total = ui.text_in(page, "#usage-total", "held")
        assert total == f"GPU time: {sentence}"
        assert legend(page) == ["productive", "startup", "stalled", "failed attempt", "preempted",
                                "node lost", "stall (from the last beat)", "preemption", "node loss"]
        said = bars(page)
        assert [b.split(";")[0] for b in said] == [
            "attempt 1: failed (rank 3 exited 1)", "attempt 2: preempted (node n1 drained: bad ECC)",
            "attempt 3: node lost (n3)", "attempt 4: succeeded"]
        assert said[3].startswith("attempt 4: succeeded; 4 GPUs for 2 h 28 min: productive 2 h 25 min, "
                                  "startup 30 s, stalled 2 min; stalled 2 min from 02:30:00 UTC, then "
                                  "recovered: rank 2 on n4 went silent first"), said[3]
        assert [t.text for t in page.find_elements(By.CSS_SELECTOR, "#timeline-bars .tl-label")] == [
            "Attempt 1\nfailed (rank 3 exited 1)", "Attempt 2\npreempted (node n1 drained: bad ECC)",
            "Attempt 3\nnode lost (n3)", "Attempt 4\nsucceeded"]
        pieces = titles(page, "#timeline-bars rect.tl-seg")
        assert "attempt 4: stalled 2 min (8.0 GPU-min), 02:30:00–02:32:00 UTC" in pieces
        assert "attempt 1: failed attempt 29 min 15 s (1.9 GPU-h), 00:00:45–00:30:00 UTC" in pieces
        assert "attempt 1: startup 40 s (2.7 GPU-min), 00:00:05–00:00:45 UTC" in pieces
        assert titles(page, "#timeline-bars g.tl-mark") == [
            "attempt 2 preempted (node n1 drained: bad ECC) at 01:00:00 UTC",
            "attempt 3 node lost (n3) at 01:30:00 UTC",
            "stalled 2 min from 02:30:00 UTC, then recovered: rank 2 on n4 went silent first"]
        # the bars are the usage: its parts in GPU-ms, to the second
        shown = parts_shown(page)
        assert round(shown.pop("productive") / 1000) == USAGE["productive_gpu_seconds"]
        assert {k: round(v / 1000) for k, v in shown.items()} == USAGE["lost_gpu_seconds"]
        # the axis: the first placement to the end, in UTC, ticks between
        assert ui.find(page, "#timeline-axis").text == \
            "From 2026-01-01 00:00:05 UTC to 2026-01-01 04:00:00 UTC (3 h 59 min)"
        ticks = page.execute_script(
            "return [...document.querySelectorAll('svg.tl-axis text')].map((t) => t.textContent)")
        assert ticks[-2:] == ["00:00:05", "04:00:00"] and ticks[:3] == ["01:00", "02:00", "03:00"]
        # each colour is its own, and a stall's piece the legend's stalled swatch's
        colours = page.execute_script("""
            const out = {};
            for (const li of document.querySelectorAll('#timeline-legend li[data-part]'))
              out[li.dataset.part] = getComputedStyle(li.querySelector('.swatch')).backgroundColor;
            return out;""")
        assert len(set(colours.values())) == len(colours)
        fill = page.execute_script(
            "return getComputedStyle(document.querySelector('rect.tl-seg[data-part=stalled]')).fill")
        assert fill == colours["stalled"]
        # the text alternative: a table of the same, row by attempt
        page.find_element(By.CSS_SELECTOR, "details.tl-table summary").click()
        rows = [r.text for r in page.find_elements(By.CSS_SELECTOR, "#timeline-table tbody tr")]
        assert rows[1].startswith("2 preempted (node n1 drained: bad ECC) 2026-01-01 00:31:00 UTC "
                                  "2026-01-01 01:00:00 UTC 4"), rows[1]
        assert "attempt 3 node lost (n3) at 01:30:00 UTC" in rows[2]
        assert not ui.console_errors(page)
        page.find_element(By.CSS_SELECTOR, "details.tl-table summary").click()
        page.execute_script("document.getElementById('timeline').previousElementSibling.scrollIntoView()")
        ui.screenshot(page, "timeline")


#: attempt 1: rank 0 exits 3 after 1.5 s, rank 1 runs until stopped; attempt 2 ends well
FAILS_ONCE = ("import os, sys, time\n"
              "first, rank = os.environ['GPUJOBS_ATTEMPT'] == '1', os.environ['RANK']\n"
              "time.sleep(1.5 if rank == '0' or not first else 3600)\n"
              "sys.exit(3 if first else 0)\n")


def test_a_real_failed_and_retried_job_on_its_page(page, tenant, browser_stack):
    """Real agents: the job fails once (rank 0 exits 3) and succeeds; its page
    says describe's sentence of its usage, a bar an attempt saying how it
    ended, and the bars add up to the usage, to a GPU-second a piece."""
    from gpujobs_client import cli
    from gpujobs_client.models import Attempt, Usage

    job = submit(tenant, name=unique("timeline"), command=[sys.executable, "-c", FAILS_ONCE], ranks=2,
                 max_attempts=2)
    done = wait_state(tenant, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    usage = tenant.get(f"/v1/jobs/{job['id']}").json()["usage"]
    attempts = tenant.get(f"/v1/jobs/{job['id']}/attempts").json()["attempts"]
    page.get(browser_stack.api + f"/#/jobs/{job['id']}")
    total = ui.text_in(page, "#usage-total", "held", timeout=60)
    assert total == "GPU time: " + cli.usage_sentence(Usage.from_json(usage),
                                                      [Attempt.from_json(a) for a in attempts])
    assert "failed attempt 1 (rank 0 exited 3)" in total
    said = ui.read(page, bars)
    assert [b.split(";")[0] for b in said] == ["attempt 1: failed (rank 0 exited 3)", "attempt 2: succeeded"]
    assert all("2 GPUs for " in b for b in said)
    assert legend(page)[:3] == ["productive", "startup", "failed attempt"]
    shown = ui.read(page, parts_shown)
    assert abs(shown.pop("productive") / 1000 - usage["productive_gpu_seconds"]) <= 1
    # a part under half a GPU-second is none in usage (its whole seconds), a sliver of a bar here
    assert set(usage["lost_gpu_seconds"]) <= set(shown), (shown, usage)
    for part, gpu_ms in shown.items():
        assert abs(gpu_ms / 1000 - usage["lost_gpu_seconds"].get(part, 0)) <= 1, (part, shown, usage)
    # each bar from its attempt's placement to its end
    placed = parse_iso(attempts[0]["created_at"])
    axis = ui.find(page, "#timeline-axis").text
    assert axis.startswith(f"From {placed.strftime('%Y-%m-%d %H:%M:%S')} UTC to "), axis
    assert not ui.console_errors(page)


def test_a_running_attempts_bar_grows_to_now_and_an_open_stall_is_marked(page, browser_stack):
    """Canned JSON of a RUNNING job, placed 10 minutes ago, stalled since its
    culprit's last beat 2 minutes ago: its bar runs to now (the axis ends
    "now") and grows as the page refreshes; the stall is marked as still
    open; a job not placed yet says so, with no bar."""
    import re

    now = datetime.now(timezone.utc)
    back = lambda s: iso(now - timedelta(seconds=s))  # noqa: E731
    events = [{"type": "placed", "time": back(600), "attempt": 1, "reason": "placed on 1 node"},
              {"type": "started", "time": back(590), "attempt": 1, "reason": "ranks started"},
              {"type": "stalled", "time": back(60), "attempt": 1, "reason": "rank 1 stalled first",
               "rank": 1, "last_heard_at": back(120)}]
    job = {**JOB, "state": "RUNNING", "attempt": 1, "uncounted_retries": 0, "finished_at": None,
           "exit": None, "spec": {**JOB["spec"], "ranks": 2},
           "usage": usage_of.usage(usage_of.spans_of(events, 2), now)}
    attempts = [{"attempt": 1, "state": "SCHEDULED", "placement": [], "created_at": back(600),
                 "finished_at": None, "exit": None}]
    with fed(page, job, attempts, events):
        page.get(browser_stack.api + f"/#/jobs/{JOB_ID}")
        page.refresh()
        ui.text_in(page, "#usage-total", "held")
        [said] = ui.read(page, bars)
        assert re.match(r"attempt 1: running; 2 GPUs for 10 min( \d+ s)?: productive 7 min( \d+ s)?, "
                        r"startup 10 s, stalled 2 min( \d+ s)?; stalled 2 min( \d+ s)? from "
                        r"\d\d:\d\d:\d\d UTC, still stalled: rank 1 stalled first$", said), said
        assert re.match(r"From .* UTC to now \(10 min( \d+ s)?\)$", ui.find(page, "#timeline-axis").text)
        assert page.execute_script(
            "return [...document.querySelectorAll('svg.tl-axis text')].pop().textContent") == "now"
        assert legend(page) == ["productive", "startup", "stalled", "stall (from the last beat)"]
        grown = ui.read(page, parts_shown)
        ui.wait(page, 15).until(lambda d: ui.read(d, parts_shown)["stalled"] > grown["stalled"])
        assert not ui.console_errors(page)
    placed = {**JOB, "id": JOB_ID, "state": "PENDING", "attempt": 0, "started_at": None, "finished_at": None,
              "exit": None, "usage": {"gpu_seconds": 0, "productive_gpu_seconds": 0, "lost_gpu_seconds": {},
                                      "goodput": None, "estimated": False}}
    with fed(page, placed, [], [{"type": "created", "time": back(5), "attempt": None, "reason": "submitted"}]):
        page.get(browser_stack.api + f"/#/jobs/{JOB_ID}")
        page.refresh()
        assert ui.text_in(page, "#timeline", "Not placed") == "Not placed yet: no GPU time held."
        assert not page.find_elements(By.CSS_SELECTOR, "#timeline svg")
