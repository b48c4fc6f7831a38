"""The dashboard's daily-use features of issue 29, item 6, as a person sees
them in headless Chromium against the local stack with real agents: a
ranks page that stops asking once the job is not there."""
from __future__ import annotations

from tests.browser import ui


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
