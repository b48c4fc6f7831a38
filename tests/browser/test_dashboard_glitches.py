"""The dashboard's glitches of issue 29, item 6, as a person sees them in
headless Chromium against the local stack: what shows before and after
sign-in, counts that read as English, a job page for a job that is not
there, sentences instead of JSON, and the jobs list's duration, GPUs and
reason columns."""
from __future__ import annotations

import contextlib
import json

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.browser import ui
from tests.browser.test_dashboard import fed
from tests.support.browser import TENANT_TOKEN, submit, unique, wait_state


def _cancel(api, job_id: str) -> None:
    api.post(f"/v1/jobs/{job_id}/cancel")


def _signed_out(chrome, url: str) -> None:
    chrome.get(url + "/#/login")
    chrome.execute_script("sessionStorage.clear()")
    chrome.refresh()
    ui.find(chrome, "#token")


def test_sign_out_shows_only_while_signed_in(chrome, browser_stack):
    _signed_out(chrome, browser_stack.api)
    signout = chrome.find_element(By.ID, "signout")
    assert not signout.is_displayed(), "Sign out shows on the sign-in form"
    chrome.find_element(By.ID, "token").send_keys(TENANT_TOKEN + Keys.ENTER)
    ui.present(chrome, "#jobs-body")
    ui.wait(chrome).until(lambda d: signout.is_displayed())
    assert signout.text == "Sign out"
    signout.click()
    ui.find(chrome, "#token")
    assert not signout.is_displayed()


@contextlib.contextmanager
def answered(page, answers: dict[str, dict]):
    """The page's fetch of a path ending in one of ``answers``' keys gets that
    answer (a 200 JSON body); the rest goes to the stack. Applies from the
    next document on."""
    script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const FAKE = %s, real = window.fetch;
        window.fetch = async (url, opts) => {
          const path = new URL(String(url), location.href).pathname;
          const hit = Object.keys(FAKE).find((k) => path.endsWith(k));
          if (!hit) return real(url, opts);
          return new Response(JSON.stringify(FAKE[hit]),
            {status: 200, headers: {'Content-Type': 'application/json'}});
        };""" % json.dumps(answers)})
    try:
        yield
    finally:
        page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                             {"identifier": script["identifier"]})


ONE_NODE = {"node_id": "node-solo", "gpus": 1, "gpus_free": 1, "gpu_type": "h100",
            "state": "READY", "inbox_queue_url": None, "last_seen_at": "2026-01-01T00:00:00.000Z",
            "labels": {}, "address": None, "isolation": None}


def test_counts_of_one_read_in_the_singular(page, tenant, browser_stack):
    job = submit(tenant, name=unique("one"), ranks=1, gpus_per_rank=1)
    try:
        assert wait_state(tenant, job["id"], {"RUNNING"})["state"] == "RUNNING"
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        facts = ui.text_in(page, "#facts", "rank")
        assert "1 rank × 1 GPU (h100)" in facts, facts
        attempts = ui.text_in(page, "#attempts tbody", "→ rank")
        assert "→ rank 0" in attempts and "ranks" not in attempts, attempts
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        meta = ui.text_in(page, "#heatmap-meta", "1 rank on 1 node ·")
        assert "ranks" not in meta and "nodes" not in meta, meta
        page.get(browser_stack.api + "/#/nodes")
        assert "2 nodes · " in ui.text_in(page, "#nodes-total", "nodes")
        assert " of 8 GPUs in use" in page.find_element(By.ID, "nodes-total").text
    finally:
        _cancel(tenant, job["id"])
    with answered(page, {"/v1/nodes": {"nodes": [ONE_NODE]}}):
        page.get(browser_stack.api + "/#/nodes")
        page.refresh()
        total = ui.text_in(page, "#nodes-total", "1 node ·")
        assert total == "1 node · 0 of 1 GPU in use · 1 free", total


def test_a_job_that_is_not_there_offers_no_cancel(page, browser_stack):
    page.get(browser_stack.api + "/#/jobs/job_NOSUCHJOB0000000000000000")
    error = ui.text_in(page, "main .error", "No job job_NOSUCHJOB")
    assert "or it belongs to another tenant" in error
    assert [c for c in page.find_elements(By.ID, "cancel") if c.is_displayed() or c.is_enabled()] == []
    assert page.find_elements(By.CSS_SELECTOR, "#cancel-dialog[open]") == []


def test_head_of_the_dashboard_answers_like_get(page, browser_stack):
    """HEAD / was 405: from the browser, as from any client, it is 200 with no body."""
    got = page.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch('/', {method: 'HEAD'}).then(async (r) => done(
          [r.status, r.headers.get('content-type'), (await r.text()).length]));""")
    assert got == [200, "text/html; charset=utf-8", 0]


FAILED_EXIT = {"reason": "rank_failed", "exit_code": 1, "rank": 3}
FAILED_JOB = {
    "id": "job_SENTENCES", "name": "sentences", "state": "FAILED", "attempt": 1,
    "created_at": "2026-01-01T00:00:00.000Z", "started_at": "2026-01-01T00:00:05.000Z",
    "finished_at": "2026-01-01T00:02:10.000Z", "cancel_requested_at": None, "cancel_reason": None,
    "pending_reason": None, "health": {}, "exit": FAILED_EXIT,
    "spec": {"ranks": 4, "gpus_per_rank": 2, "gpu_type": "h100", "command": ["train"], "labels": {}}}
FAILED_ATTEMPTS = {"attempts": [{
    "attempt": 1, "state": "FAILED", "created_at": "2026-01-01T00:00:01.000Z",
    "finished_at": "2026-01-01T00:02:10.000Z", "exit": FAILED_EXIT,
    "placement": [{"rank": r, "node_id": f"node-{r // 2}"} for r in range(4)]}]}
FAILED_EVENTS = {"events": [
    {"type": "created", "time": "2026-01-01T00:00:00.000Z", "reason": "submitted",
     "tenant": "e2e-tenant", "attempt": None},
    {"type": "placed", "time": "2026-01-01T00:00:01.000Z", "attempt": 1,
     "reason": "placed on 2 nodes", "nodes": {"node-0": "0-1", "node-1": "2-3"}},
    {"type": "rank_exited", "time": "2026-01-01T00:02:09.000Z", "attempt": 1,
     "reason": "rank 3 exited with code 1", "ranks": [3], "exit_code": 1, "node_id": "node-1"},
    {"type": "finished", "time": "2026-01-01T00:02:10.000Z", "attempt": 1, "state": "FAILED",
     "reason": "rank 3 failed", "exit_code": 1, "rank": 3}]}


def test_exits_and_events_read_as_sentences_not_json(page, browser_stack):
    base = "/v1/jobs/" + FAILED_JOB["id"]
    with answered(page, {base: FAILED_JOB, base + "/attempts": FAILED_ATTEMPTS,
                         base + "/events": FAILED_EVENTS, base + "/logs": {"lines": []}}):
        page.get(browser_stack.api + f"/#/jobs/{FAILED_JOB['id']}")
        page.refresh()
        sentence = "rank_failed: rank 3 exited with code 1"
        assert f"Exit\n{sentence}" in ui.text_in(page, "#facts", "Exit")
        assert "4 ranks × 2 GPUs (h100)" in page.find_element(By.ID, "facts").text
        row = ui.text_in(page, "#attempts tbody", sentence)
        assert "node-0 → ranks 0–1" in row and "node-1 → ranks 2–3" in row
        events = [li.text for li in page.find_elements(By.CSS_SELECTOR, "#events ol.timeline > li")]
        assert len(events) == 4, events
        texts = [e.split("\n")[0] for e in events]
        assert texts[0].endswith("created — submitted (tenant e2e-tenant)"), texts
        assert texts[1].endswith("placed — placed on 2 nodes (attempt 1 · on node-0 (ranks 0–1), "
                                 "node-1 (ranks 2–3))"), texts
        assert texts[2].endswith("rank_exited — rank 3 exited with code 1 (attempt 1 · on node-1)"), texts
        assert texts[3].endswith("finished — rank 3 failed (attempt 1 · exit code 1 · rank 3)"), texts
        for section in ("facts", "attempts", "events"):
            text = page.find_element(By.ID, section).text
            assert "{" not in text and '":' not in text and "[object Object]" not in text, (
                section, text)


def _cell(page, job_id: str, css: str, text: str = "") -> str:
    return ui.text_in(page, f'tr[data-id="{job_id}"] td.{css}', text)


def test_the_jobs_list_shows_duration_gpus_and_reason(page, tenant, browser_stack):
    running = submit(tenant, name=unique("cols-run"), ranks=2, gpus_per_rank=2)
    r = tenant.post("/v1/jobs", data=json.dumps(  # no gpu_type: any
        {"name": unique("cols-wait"), "command": ["sleep", "600"], "ranks": 1, "gpus_per_rank": 64}),
        headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    waiting = r.json()
    try:
        assert wait_state(tenant, running["id"], {"RUNNING"})["state"] == "RUNNING"
        with fed(page, FAILED_JOB):
            page.get(browser_stack.api + "/#/jobs")
            page.refresh()
            headers = [th.text for th in page.find_elements(By.CSS_SELECTOR, "table.jobs th")]
            assert {"Duration", "Ranks × GPUs", "Reason"} <= set(headers), headers
            # finished: started -> finished; its exit, said
            assert _cell(page, FAILED_JOB["id"], "duration", "min") == "2 min"
            assert _cell(page, FAILED_JOB["id"], "gpus", "×") == "4 ranks × 2 GPUs\nh100"
            assert _cell(page, FAILED_JOB["id"], "reason", "rank") == (
                "rank_failed: rank 3 exited with code 1")
            # running: started -> now, and it goes on
            assert _cell(page, running["id"], "gpus", "×") == "2 ranks × 2 GPUs\nh100"
            ui.wait(page).until(lambda d: _cell(page, running["id"], "duration", " s")
                                not in ("0 s", "1 s"))
            assert _cell(page, running["id"], "reason") == ""
            # pending: no duration yet, any type, why it waits
            assert _cell(page, waiting["id"], "gpus", "×") == "1 rank × 64 GPUs\nany type"
            assert _cell(page, waiting["id"], "duration", "—") == "—"
            ui.wait(page).until(lambda d: tenant.get(f"/v1/jobs/{waiting['id']}").json()
                                .get("pending_reason"))
            why = tenant.get(f"/v1/jobs/{waiting['id']}").json()["pending_reason"]
            # the placer's "1 x 64 free GPUs" said with its nouns (test_dashboard_fit)
            said = why.replace("1 x 64 free GPUs", "1 rank × 64 free GPUs each")
            assert _cell(page, waiting["id"], "reason", said[:20]) == said
        tenant.post(f"/v1/jobs/{running['id']}/cancel", data=json.dumps({"reason": "cols test"}),
                    headers={"Content-Type": "application/json"})
        assert wait_state(tenant, running["id"], {"CANCELLED"})["state"] == "CANCELLED"
        assert _cell(page, running["id"], "reason", "cancelled") == "cancelled: cols test"
    finally:
        _cancel(tenant, running["id"])
        _cancel(tenant, waiting["id"])
