"""The dashboard's daily-use features of issue 29, item 6, as a person sees
them in headless Chromium against the local stack with real agents: a job's
spec said in words, and a ranks page that stops asking once the job is not
there."""
from __future__ import annotations

import uuid

from selenium.webdriver.common.by import By

from tests.browser import ui
from tests.browser.conftest import submit, unique, wait_state
from tests.browser.test_dashboard_glitches import answered

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _cancel(api, job_id: str) -> None:
    api.post(f"/v1/jobs/{job_id}/cancel")


def test_the_job_page_says_the_spec_in_words_and_no_env_value(page, tenant, browser_stack):
    """Invariant: the job page shows its spec as words, no JSON anywhere
    (no '{', no '"command"'): the command shell-quoted, the environment's
    variable names but none of their values, and every other setting said."""
    secret = f"s3cret-{uuid.uuid4().hex[:8]}"
    job = submit(tenant, name=unique("spec"), command=["echo", "hello world", "it's"], ranks=2,
                 env={"GREETING": secret, "OTHER_VAR": secret + "-2"}, labels={"team": "vision"},
                 priority=5, max_attempts=2, working_dir="/tmp",
                 heartbeat={"interval_s": 2, "startup_grace_s": 30})
    try:
        assert wait_state(tenant, job["id"], ENDED)["state"] == "SUCCEEDED"
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        ui.text_in(page, "#logs", "hello world it's")
        ui.text_in(page, "#events", "finished")
        spec = ui.text_in(page, "#spec", "Environment")
        text = page.find_element(By.TAG_NAME, "main").text
        assert "{" not in text and '"command"' not in text and "[object Object]" not in text, text
        assert secret not in text, "an env value is shown"
        facts = page.find_element(By.ID, "facts").text
        assert "Command\necho 'hello world' 'it'\\''s'" in facts, facts
        assert "Ranks\n2 ranks × 1 GPU (h100)" in facts and "Working dir\n/tmp" in facts
        assert "Labels\nteam=vision" in facts
        assert "Environment\n2 variables: GREETING, OTHER_VAR (values are not shown)" in spec, spec
        for said in ("Priority\n5 (higher places first)", "Max attempts\n2",
                     "On a stall\nreport it (the job keeps running)",
                     "A heartbeat expected every 2 s.", "Startup grace 30 s:",
                     "Judged by heartbeats, once any rank has sent one (mode auto)."):
            assert said in spec, (said, spec)
    finally:
        _cancel(tenant, job["id"])


ODD_JOB = {
    "id": "job_ODDSPEC", "name": "odd", "state": "SUCCEEDED", "attempt": 1,
    "created_at": "2026-01-01T00:00:00.000Z", "started_at": None, "finished_at": None,
    "cancel_requested_at": None, "cancel_reason": None, "pending_reason": None, "health": {},
    "exit": None,
    "spec": {"command": ["train"], "ranks": 1, "env": {"TOKEN": "hunter2"}, "labels": {},
             "queue": {"name": "night", "slots": [1, 2]}, "heartbeat": {"interval_s": 5, "jitter": 0.1}}}


def test_a_spec_member_the_page_does_not_know_is_said_as_key_and_value(page, browser_stack):
    """Invariant: a spec member the dashboard has no words for (a newer
    server's) still shows as "key: value" text, never as JSON."""
    base = "/v1/jobs/" + ODD_JOB["id"]
    with answered(page, {base: ODD_JOB, base + "/attempts": {"attempts": []},
                         base + "/events": {"events": []}, base + "/logs": {"lines": []}}):
        page.get(browser_stack.api + f"/#/jobs/{ODD_JOB['id']}")
        page.refresh()
        spec = ui.text_in(page, "#spec", "queue")
        assert "queue\nname=night, slots=1, 2" in spec, spec
        assert "jitter: 0.1" in spec and "A heartbeat expected every 5 s." in spec, spec
        text = page.find_element(By.TAG_NAME, "main").text
        assert "{" not in text and "hunter2" not in text, text


def test_the_ranks_page_of_a_missing_job_stops_asking(page, browser_stack):
    """Invariant: once the ranks page has said the job is not there (404), it
    stays still: no further request for that job over several refresh periods
    (2 s each), and the message stays visible."""
    missing = "job_NOSUCHRANKS000000000000"
    page.get(browser_stack.api + f"/#/jobs/{missing}/ranks")
    error = ui.find(page, "main .error")
    ui.text_in(page, "main .error", f"No job {missing}")
    ui.watch_fetches(page)
    ui.never(page, lambda d: ui.fetched(d, missing), 6.5, "the ranks page asked again after a 404")
    assert error.is_displayed()
    assert error.text == f"No job {missing} (or it belongs to another tenant)."
    # the watch sees what the page fetches: another page's polling shows in it
    page.execute_script("location.hash = '#/jobs'")
    ui.wait(page).until(lambda d: ui.fetched(d, "/v1/jobs"))
