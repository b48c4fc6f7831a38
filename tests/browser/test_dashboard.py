"""The dashboard in a real browser (headless Chromium) against the local stack
with real agents: sign in, watch a job appear, open it, cancel it, see the
heatmap name a hung rank, and check that user strings render as text."""
from __future__ import annotations

import json

from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from devstack.browser import wide_job
from tests.browser import ui
from tests.browser.conftest import TENANT_TOKEN, submit, unique, wait_state

XSS = "<img src=x onerror=alert(1)>"


def _cancel(api, job_id: str) -> None:
    api.post(f"/v1/jobs/{job_id}/cancel")


def test_sign_in_keeps_the_token_in_session_storage_only(page):
    assert page.execute_script("return sessionStorage.getItem('gpujobs.token')") == TENANT_TOKEN
    assert TENANT_TOKEN not in page.current_url
    assert page.execute_script("return document.cookie") == ""


def test_a_wrong_token_is_refused_with_a_message(chrome, browser_stack):
    chrome.get(browser_stack.api + "/#/login")
    chrome.execute_script("sessionStorage.clear()")
    chrome.refresh()
    ui.find(chrome, "#token").send_keys("not-a-token" + Keys.ENTER)
    assert "not recognised" in ui.text_in(chrome, "#login-status", "not recognised")
    assert chrome.execute_script("return sessionStorage.getItem('gpujobs.token')") is None


def test_a_new_job_appears_live_and_rows_are_updated_in_place(page, tenant, browser_stack):
    """Live refresh without flicker: no reload, and a row already shown is the
    same DOM element after refreshes (updated in place, not re-rendered)."""
    first = submit(tenant, name=unique("live-a"), labels={"team": "vision"})
    try:
        page.get(browser_stack.api + "/#/jobs")
        row = ui.find(page, f'tr[data-id="{first["id"]}"]')
        page.execute_script("window.__samePage = true; arguments[0].__kept = true", row)
        second = submit(tenant, name=unique("live-b"), labels={"team": "nlp"})
        ui.find(page, f'tr[data-id="{second["id"]}"]')
        assert page.execute_script("return window.__samePage") is True, "the page reloaded"
        assert page.execute_script(
            "return document.querySelector(arguments[0]).__kept === true",
            f'tr[data-id="{first["id"]}"]'), "the row was re-created"
        # newest first
        ids = [tr.get_attribute("data-id") for tr in page.find_elements(By.CSS_SELECTOR, "#jobs-body tr")]
        assert ids.index(second["id"]) < ids.index(first["id"])
        ui.screenshot(page, "jobs")
        # search by label narrows the page to the matching job
        page.find_element(By.ID, "search").send_keys("team=nlp " + second["name"])
        ids = [tr.get_attribute("data-id") for tr in page.find_elements(By.CSS_SELECTOR, "#jobs-body tr")]
        assert ids == [second["id"]]
    finally:
        _cancel(tenant, first["id"])
        _cancel(tenant, locals().get("second", first)["id"])


def test_state_filter_and_cursor_paging_walk_every_job_once(page, tenant, browser_stack):
    """Paging uses the API's tokens: Older/Newer walk the filtered listing with
    no job repeated or skipped."""
    made = [submit(tenant, name=unique("page"), gpu_type="none-such")["id"] for _ in range(27)]
    try:
        page.get(browser_stack.api + "/#/jobs?state=PENDING")
        ui.find(page, f'tr[data-id="{made[-1]}"]')
        assert page.find_element(By.ID, "state-filter").get_attribute("value") == "PENDING"
        seen = []
        while True:
            rows = page.find_elements(By.CSS_SELECTOR, "#jobs-body tr")
            seen += [r.get_attribute("data-id") for r in rows]
            assert all(r.find_elements(By.CSS_SELECTOR, ".s-pending") for r in rows)
            older = page.find_element(By.ID, "older")
            if not older.is_enabled():
                break
            page_no = page.find_element(By.ID, "page-no").text
            older.click()
            ui.wait(page).until(lambda d, page_no=page_no: d.find_element(By.ID, "page-no").text != page_no)
            ui.wait(page).until(lambda d, seen=seen: d.find_elements(By.CSS_SELECTOR, "#jobs-body tr")
                                and d.find_elements(By.CSS_SELECTOR, "#jobs-body tr")[0]
                                .get_attribute("data-id") not in seen)
        assert len(seen) == len(set(seen)), "a job was shown twice"
        assert set(made) <= set(seen), "a job was skipped"
        page.find_element(By.ID, "newer").click()
        ui.wait(page).until(lambda d: d.find_element(By.ID, "newer").is_enabled()
                            or d.find_element(By.ID, "page-no").text == "page 1")
    finally:
        for job_id in made:
            _cancel(tenant, job_id)


def test_open_a_job_and_cancel_it_shows_202_then_cancelled(page, tenant, browser_stack):
    job = submit(tenant, name=unique("cancel-me"), ranks=2, labels={"team": "nlp"})
    try:
        assert wait_state(tenant, job["id"], {"RUNNING"})["state"] == "RUNNING"
        page.get(browser_stack.api + "/#/jobs")
        ui.find(page, f'tr[data-id="{job["id"]}"] a.job-link').click()
        ui.text_in(page, "#job-state", "RUNNING")
        attempts = ui.text_in(page, "#attempts", "ranks")
        assert "local-" in attempts and "→ ranks" in attempts
        assert '"ranks": 2' in page.find_element(By.ID, "spec").text
        ui.screenshot(page, "job")
        page.find_element(By.ID, "cancel").click()
        dialog = ui.find(page, "#cancel-dialog")
        assert "RUNNING" in dialog.text
        page.find_element(By.ID, "cancel-reason").send_keys("browser test")
        page.find_element(By.ID, "confirm-cancel").click()
        assert "202 Accepted" in ui.text_in(page, "#cancel-status", "202 Accepted")
        ui.text_in(page, "#job-state", "CANCELLED", timeout=60)
        assert "now CANCELLED" in ui.text_in(page, "#cancel-status", "CANCELLED")
        assert tenant.get(f"/v1/jobs/{job['id']}").json()["state"] == "CANCELLED"
        assert not page.find_element(By.ID, "cancel").is_enabled()
    finally:
        _cancel(tenant, job["id"])


def test_the_heatmap_names_the_hung_rank(page, tenant, browser_stack):
    """examples/hang.py (the README walk-through): rank 3 stops first."""
    job = submit(tenant, name=unique("hang"), command=["python", "examples/hang.py"], ranks=4,
                 heartbeat={"interval_s": 1, "startup_grace_s": 10})
    try:
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        first = ui.text_in(page, "#stall-summary .sum-first", "First to stop", timeout=90)
        assert first.startswith("First to stop: rank 3 on local-"), first
        canvas = page.find_element(By.ID, "heatmap")
        assert canvas.get_attribute("data-cells") == "4"
        # the same information as text: the table, silent longest first
        page.find_element(By.ID, "table-toggle").click()
        first_row = ui.find(page, "#rank-table tbody tr")
        assert first_row.get_attribute("data-rank") == "3"
        assert "stalled (first)" in first_row.text
        # and from the keyboard: focusing the map selects the first to stop
        canvas.send_keys(Keys.NULL)
        page.execute_script("arguments[0].focus()", canvas)
        assert ui.text_in(page, "#rank-info", "Rank 3").startswith("Rank 3 on local-")
        canvas.send_keys(Keys.HOME)
        assert ui.text_in(page, "#rank-info", "Rank 0").startswith("Rank 0 on")
        canvas.send_keys(Keys.ARROW_RIGHT)
        assert ui.text_in(page, "#rank-info", "Rank 1").startswith("Rank 1 on")
        page.find_element(By.ID, "table-toggle").click()
        ui.screenshot(page, "ranks")
    finally:
        _cancel(tenant, job["id"])


def test_a_job_named_like_html_renders_as_text(page, tenant, browser_stack):
    job = submit(tenant, name=XSS, labels={"note": "<b>bold</b>"},
                 command=["echo", "<script>alert(2)</script>"])
    try:
        page.get(browser_stack.api + "/#/jobs")
        link = ui.find(page, f'tr[data-id="{job["id"]}"] a.job-link')
        assert link.text == XSS
        assert page.find_elements(By.CSS_SELECTOR, "main img, main b, main script") == []
        link.click()
        assert ui.text_in(page, "#job-title", XSS) == XSS
        assert "<script>alert(2)</script>" in page.find_element(By.ID, "facts").text
        assert page.find_elements(By.CSS_SELECTOR, "main img, main b, main script") == []
        try:
            alert = page.switch_to.alert
            raise AssertionError(f"a script ran: alert {alert.text!r}")
        except NoAlertPresentException:
            pass
        assert not [m for m in ui.console_errors(page) if "Content Security Policy" in m]
    finally:
        _cancel(tenant, job["id"])


def test_the_nodes_page_shows_gpus_used_and_free(page, tenant, browser_stack):
    job = submit(tenant, name=unique("node-user"), ranks=3)
    try:
        wait_state(tenant, job["id"], {"RUNNING"})
        page.get(browser_stack.api + "/#/nodes")
        ui.text_in(page, "#nodes-body", "local-2")
        rows = page.find_elements(By.CSS_SELECTOR, "#nodes-body tr")
        assert [r.find_element(By.TAG_NAME, "code").text for r in rows] == ["local-1", "local-2"]
        total = ui.text_in(page, "#nodes-total", "GPUs in use")
        nodes = tenant.get("/v1/nodes").json()["nodes"]
        used = sum(n["gpus"] - n["gpus_free"] for n in nodes)
        assert f"{used} of {sum(n['gpus'] for n in nodes)} GPUs in use" in total
        assert "READY" in rows[0].text and "ago" in rows[0].text
        ui.screenshot(page, "nodes")
    finally:
        _cancel(tenant, job["id"])


def test_keyboard_alone_reaches_every_page(page, browser_stack):
    page.get(browser_stack.api + "/#/jobs")
    ui.present(page, "#jobs-body")
    page.refresh()  # focus starts at the top of the document
    ui.present(page, "#jobs-body")
    ActionChains(page).send_keys(Keys.TAB).perform()
    assert page.switch_to.active_element.text == "Skip to content"
    for _ in range(5):
        if page.switch_to.active_element.text == "Nodes":
            break
        page.switch_to.active_element.send_keys(Keys.TAB)
    assert page.switch_to.active_element.text == "Nodes"
    page.switch_to.active_element.send_keys(Keys.ENTER)
    ui.present(page, "#nodes-body")
    assert page.current_url.endswith("#/nodes")



def test_the_heatmap_draws_16384_ranks_by_node(page, browser_stack):
    """The page, fed a 16,384-rank job through its own fetch: one cell per
    rank, 64 node blocks on about one screen, the culprit named as text."""
    job, ranks = wide_job()
    script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const FAKE = %s, real = window.fetch;
        window.fetch = (url, opts) => {
          const u = String(url);
          if (!u.includes('/v1/jobs/' + FAKE.job.id)) return real(url, opts);
          const body = u.endsWith('/ranks') ? FAKE.ranks : FAKE.job;
          return Promise.resolve(new Response(JSON.stringify(body),
            {status: 200, headers: {'Content-Type': 'application/json'}}));
        };""" % json.dumps({"job": job, "ranks": ranks})})
    try:
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()  # the script applies from the next document on
        meta = ui.text_in(page, "#heatmap-meta", "16,384 ranks on 64 nodes")
        first = ui.text_in(page, "#stall-summary .sum-first", "First to stop")
        assert first.startswith("First to stop: rank 9000 on node-35"), first
        summary = page.find_element(By.ID, "stall-summary").text
        assert "co-first): ranks 9001, 9003" in summary and "Suspect node: node-35" in summary
        canvas = page.find_element(By.ID, "heatmap")
        assert canvas.get_attribute("data-cells") == "16384"
        assert canvas.size["height"] <= 760, "about one screen"
        ui.screenshot(page, "ranks-16384")
        page.find_element(By.ID, "table-toggle").click()
        rows = page.find_elements(By.CSS_SELECTOR, "#rank-table tbody tr")
        assert len(rows) == 500 and rows[0].get_attribute("data-rank") == "9000"
        assert "more of 15884" in page.find_element(By.ID, "more-ranks").text
        print(f"16,384-rank heatmap: {meta}")
    finally:
        page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                             {"identifier": script["identifier"]})
