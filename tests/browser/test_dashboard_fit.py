"""Pages that fit (issue 47, item 4), as a person reads them on a 1280×800
screen in headless Chromium: a stalled job's verdict in the jobs list without
scrolling sideways, every time in UTC with the zone said, no section or
button that cannot apply (a job that is not there, a finished array), rank
cells that grow for a few ranks and a strip of the last minutes, the
verdict first and the silence order as evidence only, and counts said with
their nouns ("4 ranks × 4 GPUs")."""
from __future__ import annotations

import json
import re

from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By

from tests.browser import ui
from tests.browser.test_dashboard import COLLECTIVE, fed, small_job
from tests.browser.test_dashboard_glitches import (
    FAILED_ATTEMPTS,
    FAILED_EVENTS,
    FAILED_JOB,
    answered,
)

#: the deepest element under ``arguments[1]`` whose text holds ``arguments[0]``
HOLDING = """
    const [want, root] = arguments;
    const all = [...document.querySelectorAll(root + ' *')].filter((e) => e.textContent.includes(want));
    return all.length ? all[all.length - 1] : null;"""
#: words that name a culprit: only the verdict's own sentence may hold them
CULPRIT = re.compile(r"silent longest|stopped first|went quiet first|not necessarily", re.I)


def _words(text: str) -> str:
    return " ".join(text.split())


def _sideways(page, css: str) -> bool:
    """Whether the element at ``css`` holds more than its width (it scrolls sideways)."""
    return page.execute_script(
        "const e = document.querySelector(arguments[0]); return e.scrollWidth > e.clientWidth", css)


def test_a_stalled_jobs_verdict_reads_in_the_jobs_list_at_1280x800(page, browser_stack):
    """Invariant: on a 1280×800 screen the jobs list shows a stalled job's
    verdict, the server's sentence whole, inside the viewport (no sideways
    scroll of the page or the table), and every column heading is on screen,
    with a name and labels as long as real ones."""
    job, _ = small_job(COLLECTIVE)
    job["id"] = "job_01JFITSTALLEDVERDICT000000"  # as long as a real id: job_ and a 26-character ULID
    job["name"] = "llama-70b-finetune-lr3e-4-bs512-run7"
    job["spec"]["labels"] = {"experiment": "llama-70b-lr-sweep-0.0003-warmup", "team": "nlp-pretraining"}
    with fed(page, job), ui.viewport(page, 1280, 800):
        page.get(browser_stack.api + "/#/jobs")
        page.refresh()
        ui.find(page, f'tr[data-id="{job["id"]}"]')
        verdict = ui.wait(page).until(lambda d: d.execute_script(HOLDING, COLLECTIVE["text"], "#jobs-body"))
        assert _words(verdict.text) == COLLECTIVE["text"], "the verdict is not shown whole"
        where = ui.in_view(page, verdict)
        assert where["inside"], f"the verdict is outside the 1280×800 viewport: {where}"
        assert not where["sideways"], "the page scrolls sideways"
        assert not _sideways(page, ".table-wrap"), "the jobs table scrolls sideways"
        for th in page.find_elements(By.CSS_SELECTOR, "table.jobs th"):
            assert ui.in_view(page, th)["right"] <= where["width"], f"column {th.text!r} is off-screen"
        ui.screenshot(page, "jobs-1280")


def test_every_time_is_utc_with_the_zone_said(page, browser_stack):
    """Invariant: with the browser in New York, every time the job page and the
    jobs list show is the API's UTC time ("2026-01-01 00:00:00 UTC", as the
    CLI shows it), never the browser's local time, and the page says so once."""
    base = "/v1/jobs/" + FAILED_JOB["id"]
    with ui.time_zone(page, "America/New_York"), answered(
            page, {base: FAILED_JOB, base + "/attempts": FAILED_ATTEMPTS,
                   base + "/events": FAILED_EVENTS, base + "/logs": {"lines": []}}):
        page.get(browser_stack.api + f"/#/jobs/{FAILED_JOB['id']}")
        page.refresh()
        assert page.execute_script("return new Date(0).getTimezoneOffset()") == 300, "not in New York"
        facts = ui.text_in(page, "#facts", "Finished")
        for name, at in (("Created", "2026-01-01 00:00:00 UTC"), ("Started", "2026-01-01 00:00:05 UTC"),
                         ("Finished", "2026-01-01 00:02:10 UTC")):
            assert f"{name}\n{at}" in facts, (name, facts)
        times = [t.text for t in page.find_elements(By.CSS_SELECTOR, "#events time")]
        assert times == ["2026-01-01 00:00:00 UTC", "2026-01-01 00:00:01 UTC",
                         "2026-01-01 00:02:09 UTC", "2026-01-01 00:02:10 UTC"], times
        row = page.find_element(By.CSS_SELECTOR, "#attempts tbody tr").text
        assert "2026-01-01 00:00:01 UTC" in row and "2026-01-01 00:02:10 UTC" in row, row
        note = ui.find(page, "#time-note")
        assert "UTC" in note.text and "CLI" in note.text, note.text
    with ui.time_zone(page, "America/New_York"), fed(page, FAILED_JOB):
        page.get(browser_stack.api + "/#/jobs")
        page.refresh()
        created = ui.text_in(page, f'tr[data-id="{FAILED_JOB["id"]}"] td.created', "UTC")
        assert _words(created) == "2026-01-01 00:00:00 UTC", created
        assert re.fullmatch(r"updated \d\d:\d\d:\d\d UTC", ui.text_in(page, "#jobs-status", "UTC"))


def _shown(page, css: str) -> list[str]:
    """What a person sees of the elements at ``css``: the displayed ones' texts."""
    return [e.text or e.tag_name for e in page.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


def test_a_job_that_is_not_there_is_said_and_nothing_else_is_drawn(page, browser_stack):
    """Invariant: a job page and a ranks page for a job that is not there (404)
    say so, and draw no section, heatmap, legend or button that could only
    apply to a job."""
    missing = "job_NOSUCHFIT00000000000000"
    page.get(browser_stack.api + f"/#/jobs/{missing}")
    said = ui.text_in(page, "main .error", f"No job {missing}")
    assert said == f"No job {missing} (or it belongs to another tenant)."
    assert ui.text_in(page, "main h1", "No such job") == "No such job"
    assert _shown(page, "main h2, main section, main button, main .button, #ranks-link") == []
    page.get(browser_stack.api + f"/#/jobs/{missing}/ranks")
    ui.text_in(page, "main .error", f"No job {missing}")
    assert _shown(page, "main h2, main canvas, main button, main ul.legend, #stall-summary") == []


ARRAY_DONE = {
    "id": "job_ARRAYDONEFIT", "name": "sweep-done", "state": "SUCCEEDED", "attempt": 0,
    "created_at": "2026-01-01T00:00:00.000Z", "started_at": "2026-01-01T00:00:01.000Z",
    "finished_at": "2026-01-01T00:00:09.000Z", "cancel_requested_at": None, "cancel_reason": None,
    "pending_reason": None, "health": {}, "exit": {"reason": "succeeded", "exit_code": 0},
    "waiting_for": None, "parent_id": None, "array_index": None,
    "spec": {"command": ["x"], "ranks": 1, "array": {"size": 2}},
    "array": {"size": 2, "materialized": 2, "counts": {"SUCCEEDED": 2}}}
ARRAY_KIDS = {"jobs": [{"id": f"job_ARRAYDONEKID{i}", "name": f"sweep-done[{i}]", "state": "SUCCEEDED",
                        "parent_id": ARRAY_DONE["id"], "array_index": i, "attempt": 1,
                        "spec": {"command": ["x"], "ranks": 1}} for i in range(2)],
              "next_page_token": None}


def test_a_finished_array_and_a_finished_job_offer_only_what_applies(page, browser_stack):
    """Invariant: an ended job's page offers no Cancel; an array, which runs
    nothing itself, has no logs section ("No output yet") and no heatmap; an
    ended job that wrote nothing says so without "yet"."""
    base = "/v1/jobs/" + ARRAY_DONE["id"]
    with answered(page, {base: ARRAY_DONE, base + "/attempts": {"attempts": []},
                         base + "/events": {"events": []}, base + "/logs": {"lines": []},
                         "/v1/jobs": ARRAY_KIDS}):
        page.get(browser_stack.api + f"/#/jobs/{ARRAY_DONE['id']}")
        page.refresh()
        ui.text_in(page, "#facts", "2 of 2 indexes done")
        ui.find(page, "#resubmit")
        text = page.find_element(By.TAG_NAME, "main").text
        assert "No output yet" not in text, text
        assert "Logs" not in _shown(page, "main h2"), _shown(page, "main h2")
        assert _shown(page, "#cancel, #ranks-link") == []
    base = "/v1/jobs/" + FAILED_JOB["id"]
    with answered(page, {base: FAILED_JOB, base + "/attempts": FAILED_ATTEMPTS,
                         base + "/events": FAILED_EVENTS, base + "/logs": {"lines": []}}):
        page.get(browser_stack.api + f"/#/jobs/{FAILED_JOB['id']}")
        page.refresh()
        assert ui.text_in(page, "#logs", "output") == "The job wrote no output."
        assert _shown(page, "#cancel") == []
        assert _shown(page, "#ranks-link, #resubmit") == ["Rank heatmap", "Resubmit"]


def _box(page, rank: int) -> list[float]:
    return page.execute_script("return document.getElementById('heatmap').boxOf_(arguments[0])", rank)


def test_a_few_ranks_get_big_cells_and_a_strip_of_their_last_minutes(page, browser_stack):
    """Invariant: a 4-rank job's cells are at least 40 px (16,384 ranks still
    fit on about one screen: test_the_heatmap_draws_16384_ranks_by_node), and
    under the map a strip shows each rank's silence at each poll since the
    page opened, its caption saying that the page keeps it, not the server."""
    job, ranks = small_job(COLLECTIVE, ranks=4)
    with fed(page, job, ranks), ui.viewport(page, 1280, 800):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        ui.text_in(page, "#heatmap-meta", "4 ranks on 2 nodes")
        sizes = [_box(page, r)[2] for r in range(4)]
        assert min(sizes) >= 40, f"cells of {sizes} px for 4 ranks"
        strip = ui.present(page, "#history")
        ui.wait(page, 20).until(lambda d: int(strip.get_attribute("data-samples") or 0) >= 3)
        assert strip.is_displayed() and strip.get_attribute("data-rows") == "4"
        caption = ui.find(page, "#history-caption").text
        assert "since you opened it" in caption and "server keeps no history" in caption, caption
        ui.screenshot(page, "ranks-4")


def test_the_verdict_leads_and_the_silence_order_is_evidence(page, browser_stack):
    """Invariant: where the verdict names rank 3 and rank 0 has been silent
    longest, the ranks page's first line is the verdict; the silence order is
    shown as evidence, and no other line names a culprit (no "silent
    longest ... rank 0" under "rank 3 ..."); the job page's facts say the
    order as evidence too."""
    job, ranks = small_job(COLLECTIVE, ranks=4)
    assert ranks["ranks"][0]["rank"] == 0 and COLLECTIVE["rank"] == 3
    with fed(page, job, ranks):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        ui.text_in(page, "#stall-summary", "Silence order")
        lines = ui.read(page, lambda d: [p.text for p in d.find_elements(By.CSS_SELECTOR, "#stall-summary p")])
        assert lines[0] == COLLECTIVE["text"], lines
        order = [t for t in lines if t.startswith("Silence order (evidence")]
        assert order and order[0].startswith("Silence order (evidence, longest first): 0 (40.0 s), "
                                              "1 (39.0 s), 2 (38.0 s), 3 (37.0 s)"), lines
        assert [t for t in lines[1:] if CULPRIT.search(t)] == [], lines
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        facts = ui.text_in(page, "#facts", "Silence order")
        assert "Silence order (evidence)\n0 first" in facts, facts
        assert not CULPRIT.search(facts), facts
        assert ui.find(page, "#job-verdict .v-verdict").text == COLLECTIVE["text"]


WAITING = {**FAILED_JOB, "id": "job_WAITING4X4", "name": "waits", "state": "PENDING", "exit": None,
           "started_at": None, "finished_at": None, "attempt": 0,
           "pending_reason": "waiting for 4 x 4 free h100 GPUs on READY nodes",
           "spec": {**FAILED_JOB["spec"], "ranks": 4, "gpus_per_rank": 4}}


def test_counts_say_their_nouns(page, browser_stack):
    """Invariant: "4 x 4" reads "4 ranks × 4 GPUs" wherever the page says a
    job's size: its GPUs column, its pending reason in the list and on its page."""
    with fed(page, WAITING):
        page.get(browser_stack.api + "/#/jobs")
        page.refresh()
        row = f'tr[data-id="{WAITING["id"]}"]'
        assert _words(ui.text_in(page, f"{row} td.gpus", "ranks")) == "4 ranks × 4 GPUs h100"
        reason = ui.text_in(page, f"{row} td.reason", "waiting")
        assert reason == "waiting for 4 ranks × 4 free h100 GPUs each on READY nodes", reason
        page.get(browser_stack.api + f"/#/jobs/{WAITING['id']}")
        facts = ui.text_in(page, "#facts", "Why pending")
        assert "Why pending\nwaiting for 4 ranks × 4 free h100 GPUs each on READY nodes" in facts, facts
        assert "4 x 4" not in page.find_element(By.TAG_NAME, "main").text


def _fill(page, rank: int) -> list[int]:
    """The colour inside ``rank``'s cell, near its bottom-left corner (clear of its text)."""
    return page.execute_script("""
        const c = document.getElementById('heatmap'), [x, y, w] = c.boxOf_(arguments[0]);
        const d = devicePixelRatio, p = c.getContext('2d')
          .getImageData(Math.round((x + 3) * d), Math.round((y + w - 4) * d), 1, 1).data;
        return [p[0], p[1], p[2]];""", rank)


def test_the_heatmap_draws_each_polls_ranks(page, browser_stack):
    """Invariant: the cells show the latest poll. A rank never heard at the
    page's first poll and stalled at the next is drawn stalled (red), as the
    summary says (the map kept the first poll's cells while the attempt and
    the rank count stayed the same)."""
    job, later = small_job(COLLECTIVE, ranks=4)
    first = {**later, "ranks": [{**r, "last_heard_at": None, "silence_s": 0.2, "stalled": False,
                                 "status": None} for r in later["ranks"]]}
    with fed(page, job, later), ui.on_every_document(page, """
            const FIRST = %s, fedFetch = window.fetch;
            let asked = 0;
            window.fetch = (url, opts) => new URL(String(url), location.href).pathname.endsWith('/ranks')
              && asked++ === 0
              ? Promise.resolve(new Response(JSON.stringify(FIRST), {status: 200,
                  headers: {'Content-Type': 'application/json'}}))
              : fedFetch(url, opts);""" % json.dumps(first)):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        ui.text_in(page, "#stall-summary", "4 of 4 ranks stalled", timeout=30)
        seen: dict = {}

        def red(d) -> bool:
            seen["fill"] = _fill(d, 0)
            r, g, b = seen["fill"]
            return r > 90 and g < 60 and b < 60
        try:
            ui.wait(page, 10).until(red)
        except TimeoutException:
            raise AssertionError(f"rank 0 is stalled but drawn {seen['fill']}") from None


QUEUED = {**WAITING, "id": "job_QUEUED3RD", "queue": {
    "position": 3, "of": 5, "gpu_type": "h100",
    "ahead": [{"job_id": "job_AHEADOFIT", "gpus": 16}, {"job_id": None, "gpus": 4}],
    "waiting_for": [{"job_id": "job_HOLDSGPUS", "gpus": 16, "ends_by": "2026-12-07T12:10:00.000Z"}],
    "estimated_start": "2026-12-07T12:10:00.000Z",
    "basis": "about 4 min, when job_HOLDSGPUS reaches its 10 min limit",
    "as_of": "2026-12-07T12:06:00.000Z"}}


def test_a_waiting_jobs_page_says_where_it_stands_and_when_it_may_start(page, browser_stack):
    """Issue 47, item 1: the job page of a waiting job reads its place in the
    placer's line, behind whom (another tenant's job counted, never named),
    whose GPUs it waits for, and the estimated start in UTC with its basis:
    the words `gpujobs describe` prints."""
    with fed(page, QUEUED):
        page.get(browser_stack.api + f"/#/jobs/{QUEUED['id']}")
        page.refresh()  # a new document, which the fed answers apply to
        facts = _words(ui.text_in(page, "#facts", "In line"))
        assert ("In line 3rd of 5 for h100 GPUs, behind job_AHEADOFIT (16 GPUs) and "
                "1 job of another tenant") in facts, facts
        assert "GPUs held by job_HOLDSGPUS (16 GPUs)" in facts, facts
        assert ("Estimated start 2026-12-07 12:10:00 UTC (about 4 min, when job_HOLDSGPUS "
                "reaches its 10 min limit)") in facts, facts


def test_a_recovery_and_a_rank_awaiting_its_first_beat_read_in_words(page, browser_stack):
    """Issue 47, item 3, on the page: a stall that ended is a `recovered`
    event read as its sentence, and a rank the server reports as
    awaiting_first_beat reads "waiting for the first beat", the CLI's words,
    never the status's code or "not instrumented"."""
    from tests.browser.test_dashboard_glitches import answered

    job = {**FAILED_JOB, "id": "job_RECOVERED", "state": "RUNNING", "exit": None,
           "finished_at": None}
    base = "/v1/jobs/" + job["id"]
    events = {"events": [
        {"type": "stalled", "time": "2026-01-01T00:01:00.000Z", "attempt": 1, "rank": 1,
         "reason": "rank 1 on node-0 went quiet first"},
        {"type": "recovered", "time": "2026-01-01T00:01:07.000Z", "attempt": 1, "rank": 1,
         "incident": "1#1", "detected_at": "2026-01-01T00:01:00.000Z", "stalled_s": 7.0,
         "reason": "rank 1 beat again 7 s after the stall was detected: the job recovered "
                   "(false alarm 1)"}]}
    ranks = {"attempt": 1, "threshold_s": 10.0, "health": {"status": "UNKNOWN"}, "ranks": [
        {"rank": r, "node_id": "node-0", "status": "awaiting_first_beat", "stalled": False,
         "silence_s": None, "last_heard_at": None, "step": None} for r in range(2)]}
    with answered(page, {base: job, base + "/attempts": FAILED_ATTEMPTS, base + "/events": events,
                         base + "/logs": {"lines": []}, base + "/ranks": ranks}):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        page.refresh()
        story = _words(ui.text_in(page, "#events", "recovered"))
        assert ("recovered — rank 1 beat again 7 s after the stall was detected: the job "
                "recovered (false alarm 1)") in story, story
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        ui.text_in(page, "#ranks-body", "Show as table")  # the ranks were read and drawn
        ui.find(page, "#table-toggle").click()
        table = ui.text_in(page, "#rank-table tbody", "waiting for the first beat")
        assert "awaiting_first_beat" not in table and "not instrumented" not in table, table
