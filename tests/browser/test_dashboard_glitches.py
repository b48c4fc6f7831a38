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
from tests.browser.conftest import TENANT_TOKEN, submit, unique, wait_state


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
    cancel = page.find_element(By.ID, "cancel")
    assert not cancel.is_displayed() and not cancel.is_enabled()
    assert page.find_elements(By.CSS_SELECTOR, "#cancel-dialog[open]") == []
