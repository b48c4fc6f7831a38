"""The dashboard in a real browser (headless Chromium) against the local stack
with real agents: sign in, watch a job appear, open it, cancel it, see the
heatmap name a hung rank, and check that user strings render as text."""
from __future__ import annotations

import contextlib
import json

import pytest
from selenium.common.exceptions import NoAlertPresentException, TimeoutException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from devstack.browser import wide_job
from tests.browser import ui
from tests.support.browser import TENANT_TOKEN, submit, unique, wait_state

XSS = "<img src=x onerror=alert(1)>"
BLACK = [0, 0, 0]  # --hm-named: the outline of the verdict's cells, nowhere else in the map


@contextlib.contextmanager
def fed(page, job: dict, ranks: dict | None = None, events: list | None = None,
        pages: int = 1):
    """The page's own fetch answers for ``job`` (its ranks, attempts, events
    and logs) and puts it first in the job list; the rest goes to the stack.
    ``pages`` > 1 cuts the ranks view into that many pages of rank ranges, as
    the server cuts a big attempt's (each page in the view's order, a
    ``next_page_token`` but on the last). Applies from the next document on."""
    script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const FAKE = %s, real = window.fetch;
        const answer = (body) => new Response(JSON.stringify(body),
          {status: 200, headers: {'Content-Type': 'application/json'}});
        window.fetch = async (url, opts) => {
          const path = new URL(String(url), location.href).pathname;
          const base = '/v1/jobs/' + FAKE.job.id;
          // ranks as pages: the page a page_token "p<i>" names, the first without
          const token = new URL(String(url), location.href).searchParams.get('page_token');
          const ranks = FAKE.pages ? FAKE.pages[token ? Number(token.slice(1)) : 0] : FAKE.ranks;
          const ours = {[base]: FAKE.job, [base + '/ranks']: ranks,
            [base + '/attempts']: {attempts: []}, [base + '/events']: {events: FAKE.events},
            [base + '/logs']: {lines: []}};
          const hit = Object.keys(ours).find((k) => path.endsWith(k));
          if (hit) return answer(ours[hit]);
          const res = await real(url, opts);
          if (!path.endsWith('/v1/jobs') || !res.ok) return res;
          const list = await res.json();
          return answer({...list, jobs: [FAKE.job, ...list.jobs]});
        };""" % json.dumps({"job": job, "ranks": ranks, "events": events or [],
                            "pages": ranks_pages(ranks, pages) if pages > 1 else None})})
    try:
        yield
    finally:
        page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument",
                             {"identifier": script["identifier"]})


def ranks_pages(view: dict, n: int) -> list[dict]:
    """``view`` cut into ``n`` pages of rank ranges, as HeartbeatService.ranks_page cuts it."""
    world = max(r["rank"] for r in view["ranks"]) + 1
    size = -(-world // n)
    return [{**view, "ranks": [r for r in view["ranks"] if i * size <= r["rank"] < (i + 1) * size],
             "next_page_token": f"p{i + 1}" if i + 1 < n else None} for i in range(n)]


def outline_colour(page, rank: int) -> list[int]:
    """The colour just outside the left edge of ``rank``'s cell, where its
    outline is drawn when the verdict names it."""
    return page.execute_script("""
        const c = document.getElementById('heatmap'), [x, y, w] = c.boxOf_(arguments[0]);
        const d = devicePixelRatio, p = c.getContext('2d')
          .getImageData(Math.round((x - 2) * d), Math.round((y + w / 2) * d), 1, 1).data;
        return [p[0], p[1], p[2]];""", rank)


def small_job(verdict: dict, ranks: int = 6) -> tuple[dict, dict]:
    """A STALLED job of ``ranks`` ranks on two nodes carrying ``verdict``."""
    view = [{"rank": r, "node_id": f"node-{r % 2}", "last_heard_at": "2026-01-01T00:00:00.000Z",
             "silence_s": 40.0 - r, "step": 100, "stalled": r < 4, "paused": False,
             "status": "stalled" if r < 4 else "live"} for r in range(ranks)]
    job = {"id": f"job_VERDICT{verdict['by'].upper()}", "name": "verdict",
           "state": "RUNNING", "attempt": 1, "created_at": "2026-01-01T00:00:00.000Z",
           "spec": {"ranks": ranks, "gpus_per_rank": 1, "command": ["train"], "labels": {}},
           "health": {"status": "STALLED", "threshold_s": 12.0, "first_stalled_rank": 0,
                      "stalled_ranks": [0, 1, 2, 3], "verdict": verdict,
                      "detected_at": "2026-01-01T00:01:00.000Z"}}
    return job, {"attempt": 1, "threshold_s": 12.0, "now": "2026-01-01T00:01:00.000Z",
                 "ranks": view, "verdict": verdict}


TIE = {"rank": None, "ranks": [0, 1, 2, 3], "node_id": None, "by": "silence", "confidence": "low",
       "stack": None, "evidence": {},
       "text": "ranks 0-3 went quiet together (within 1.2 s): silence cannot tell which stopped first"}
COLLECTIVE = {"rank": 3, "ranks": [3], "node_id": "node-1", "by": "collective",
              "confidence": "certain", "stack": "train.py:88 in forward → time.sleep(3600)",
              "evidence": {"collective": {"seq": 41, "name": "all_reduce", "waiting": [0, 1, 2],
                                          "missing": [3]}},
              "text": "rank 3 on node-1 never reached all_reduce #41, where ranks 0-2 wait"}


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
        ids = [tr.get_attribute("data-id") for tr in page.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")]
        assert ids.index(second["id"]) < ids.index(first["id"])
        ui.screenshot(page, "jobs")
        # search by label narrows the page to the matching job
        page.find_element(By.ID, "search").send_keys("team=nlp " + second["name"])
        ids = [tr.get_attribute("data-id") for tr in page.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")]
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
            rows = page.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")
            seen += [r.get_attribute("data-id") for r in rows]
            assert all(r.find_elements(By.CSS_SELECTOR, ".s-pending") for r in rows)
            older = page.find_element(By.ID, "older")
            if not older.is_enabled():
                break
            page_no = page.find_element(By.ID, "page-no").text
            older.click()
            ui.wait(page).until(lambda d, page_no=page_no: d.find_element(By.ID, "page-no").text != page_no)
            ui.wait(page).until(lambda d, seen=seen: d.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")
                                and d.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")[0]
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
        assert "local-" in attempts and "→ rank" in attempts
        assert "2 ranks × 1 GPU (h100)" in page.find_element(By.ID, "facts").text
        assert "Max attempts\n1" in page.find_element(By.ID, "spec").text
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
    """examples/hang.py (the README walk-through): rank 3 stops first. The
    verdict leads; the silence order under it is evidence (issue 47: it said
    "Silent longest (not necessarily the one that stopped)", a second culprit)."""
    job = submit(tenant, name=unique("hang"), command=["python", "examples/hang.py"], ranks=4,
                 heartbeat={"interval_s": 1, "startup_grace_s": 10})
    try:
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        order = ui.text_in(page, "#stall-summary .sum-order", "Silence order", timeout=90)
        assert order.startswith("Silence order (evidence, longest first): "), order
        # the headline is the server's verdict word for word, its ranks outlined:
        # the verdict is sharpened while the incident is open (late posts land),
        # so the page, which polls, agrees with the API once both settle
        canvas = page.find_element(By.ID, "heatmap")
        assert canvas.get_attribute("data-cells") == "4"
        seen: dict = {}

        def agrees(d) -> bool:
            verdict = tenant.get(f"/v1/jobs/{job['id']}").json()["health"].get("verdict")
            headline = d.find_element(By.CSS_SELECTOR, "#stall-summary .sum-verdict").text
            seen.update(verdict=verdict, headline=headline)
            return bool(verdict) and headline == verdict["text"] and \
                canvas.get_attribute("data-named") == ",".join(map(str, verdict["ranks"]))
        try:
            ui.wait(page, 60).until(agrees)
        except TimeoutException:
            raise AssertionError(f"the page never showed the API's verdict: {seen}") from None
        assert seen["verdict"]["ranks"] == [3] and seen["headline"].startswith("rank 3 on local-")
        lines = [p.text for p in page.find_elements(By.CSS_SELECTOR, "#stall-summary p")]
        assert lines[0] == seen["headline"], "the verdict is the first line"
        assert not [t for t in lines[1:] if "longest" in t and "evidence" not in t], lines
        # the same information as text: the table, silent longest first
        page.find_element(By.ID, "table-toggle").click()
        first_row = ui.find(page, "#rank-table tbody tr")
        assert first_row.get_attribute("data-rank") == "3"
        assert "stalled" in first_row.text
        # and from the keyboard: focusing the map selects the named rank (else the
        # silent longest)
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



@pytest.mark.parametrize("pages", [1, 2])
def test_the_heatmap_draws_16384_ranks_by_node(page, browser_stack, pages):
    """The page, fed a 16,384-rank job through its own fetch: one cell per
    rank, 64 node blocks on about one screen, the verdict named as text first
    and its cell outlined. Cut into two pages of ranks (as the server cuts a
    view past Lambda's 6 MB), every rank is drawn all the same and the table
    is in silence order across them: the named rank 9000 is on the second."""
    job, ranks = wide_job()
    with fed(page, job, ranks, pages=pages):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()  # the script applies from the next document on
        meta = ui.text_in(page, "#heatmap-meta", "16,384 ranks on 64 nodes")

        def drawn(d):  # the summary and the heatmap, read from one drawing
            summary = d.find_element(By.ID, "stall-summary")
            first = summary.find_elements(By.TAG_NAME, "p")[0]
            canvas = d.find_element(By.ID, "heatmap")
            return (first.text, first.value_of_css_property("font-weight"), summary.text,
                    canvas.get_attribute("data-cells"), canvas.get_attribute("data-named"),
                    canvas.size["height"])
        headline, weight, summary, cells, named, height = ui.read(page, drawn)
        assert headline == "rank 9000 on node-35 went quiet first, 0.5 s before ranks 9001, 9003"
        assert weight == "600", "the headline is bold"
        assert "co-first): ranks 9001, 9003" in summary
        assert "Suspect node: node-35" in summary
        assert (cells, named) == ("16384", "9000")
        assert outline_colour(page, 9000) == BLACK
        assert height <= 760, "about one screen"
        ui.screenshot(page, "ranks-16384")
        page.find_element(By.ID, "table-toggle").click()

        def table(d):
            rows = d.find_elements(By.CSS_SELECTOR, "#rank-table tbody tr")
            return ([(r.get_attribute("data-rank"), r.text) for r in rows[:2]], len(rows),
                    d.find_element(By.ID, "more-ranks").text)
        (first, second), count, more = ui.read(page, table)
        assert count == 500 and first[0] == "9000"
        assert "(named)" in first[1] and "(named)" not in second[1]
        assert "more of 15884" in more
        print(f"16,384-rank heatmap: {meta}")


def test_a_tie_is_said_as_a_tie_and_every_tied_cell_is_outlined(page, browser_stack):
    """Invariant: the headline is verdict.text; exactly the cells of
    verdict.ranks are outlined, and the table marks them tied, not named."""
    job, ranks = small_job(TIE)
    with fed(page, job, ranks):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        headline = ui.text_in(page, "#stall-summary .sum-verdict", "went quiet together")
        assert headline == TIE["text"]
        assert "by silence, confidence low" in page.find_element(By.ID, "stall-summary").text
        canvas = page.find_element(By.ID, "heatmap")
        ui.wait(page).until(lambda d: canvas.get_attribute("data-named") == "0,1,2,3")
        assert [outline_colour(page, r) == BLACK for r in range(6)] == [True] * 4 + [False] * 2
        page.find_element(By.ID, "table-toggle").click()
        rows = {r.get_attribute("data-rank"): r.text
                for r in page.find_elements(By.CSS_SELECTOR, "#rank-table tbody tr")}
        assert [k for k, text in rows.items() if "(tied)" in text] == ["0", "1", "2", "3"]
        assert "(named)" not in " ".join(rows.values())


def test_the_job_page_and_list_say_the_verdict_and_the_stop_time_stacks(page, browser_stack):
    """Invariant: the job page's bold headline is verdict.text (then its stack),
    no culprit JSON anywhere, the silence order a fact said as evidence; a
    rank_stopped event lists each rank's stack as "rank N: where" under it; the
    job list's line under the job's row is verdict.text."""
    job, ranks = small_job(COLLECTIVE)
    where = COLLECTIVE["stack"]
    events = [{"type": "stalled", "time": "2026-01-01T00:01:00.000Z", "attempt": 1,
               "reason": COLLECTIVE["text"]},
              {"type": "rank_stopped", "time": "2026-01-01T00:01:01.000Z", "attempt": 1,
               "reason": "SIGTERM (stall restart)",
               "stacks": [{"rank": 3, "where": where, "frames": ["forward (train.py:88)"]},
                          {"rank": 0, "where": "dist.py:12 in all_reduce", "frames": []}]}]
    with fed(page, job, ranks, events):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        page.refresh()
        headline = ui.find(page, "#job-verdict .v-verdict")
        assert headline.text == COLLECTIVE["text"]
        assert headline.value_of_css_property("font-weight") == "600"
        assert page.find_element(By.CSS_SELECTOR, "#job-verdict .v-stack").text == f"Stack: {where}"
        facts = page.find_element(By.ID, "facts").text
        assert "Silence order (evidence)\n0 first" in facts and "Culprit" not in facts
        assert "Silent longest" not in facts
        stopped = ui.find(page, "#events li:nth-child(2)")
        assert "rank_stopped" in stopped.text
        assert [li.text for li in stopped.find_elements(By.CSS_SELECTOR, "ul.stacks li")] == [
            f"rank 3: {where}", "rank 0: dist.py:12 in all_reduce"]
        assert "frames" not in stopped.text and "[object Object]" not in page.find_element(
            By.TAG_NAME, "main").text
        ui.screenshot(page, "job-verdict")
        page.get(browser_stack.api + "/#/jobs")
        note = ui.find(page, f'tr[data-detail-of="{job["id"]}"] td.note .verdict')
        assert note.text == COLLECTIVE["text"] and note.get_attribute("title") == COLLECTIVE["text"]


SLOW_TEXT = "rank 1 on node-1 is slow: its steps take 2.4× the fastest rank's"


def test_the_ranks_view_and_the_job_page_say_the_slow_rank_in_a_sentence(page, browser_stack):
    """Stragglers (API.md): the server's sentence for each rank it calls
    slow is a line of the summary and of the job page's headline; a rank's
    detail line carries its slow score."""
    job, ranks = small_job(COLLECTIVE)
    job["id"] = "job_SLOWRANK"
    job["health"] = {**job["health"], "slow_ranks": [1], "slow": {
        "attempt": 1, "episodes": {"1": 1}, "ranks": {"1": {
            "below": 0, "since": None, "above": 0, "open": 1, "score": 0.417,
            "text": SLOW_TEXT}}}}
    for r in ranks["ranks"]:
        r.update(step_time_s=1.2 if r["rank"] == 1 else 0.5,
                 slow_score=0.417 if r["rank"] == 1 else 1.0,
                 slow_text=SLOW_TEXT if r["rank"] == 1 else None)
    with fed(page, job, ranks):
        page.get(browser_stack.api + f"/#/jobs/{job['id']}/ranks")
        page.refresh()
        assert ui.text_in(page, "#stall-summary .sum-slow", "is slow") == SLOW_TEXT
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        assert ui.text_in(page, "#job-verdict .v-slow", "is slow") == SLOW_TEXT
