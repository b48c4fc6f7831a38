"""The usage page (issue 46) in a real browser: GPU time by UTC day, each
day's bar stacked productive and lost by cause in the job timeline's
colours, grouped by a label, the GPU type or the job, with a legend, the
totals as text and a table. Asserted on what a person reads: the legend's
labels, the totals, a day's total, each group's name and goodput, the
table; with canned rows (the page's own fetch), then with a real job."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import datetime, timezone

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select

from tests.api.test_dashboard_usage import days_back, rows
from tests.browser import ui
from tests.support.browser import submit, unique, wait_state


def by_gpu_type(given: list[dict]) -> list[dict]:
    """The same usage grouped by GPU type: every job ran on h100s, so a row a day."""
    out: dict[str, dict] = {}
    for r in given:
        d = out.setdefault(r["start"], {**r, "group": {"gpu_type": "h100"}, "gpu_seconds": 0,
                                        "productive_gpu_seconds": 0, "lost_gpu_seconds": {}, "jobs": 0})
        d["gpu_seconds"] += r["gpu_seconds"]
        d["productive_gpu_seconds"] += r["productive_gpu_seconds"]
        d["jobs"] += r["jobs"]
        for k, v in r["lost_gpu_seconds"].items():
            d["lost_gpu_seconds"][k] = d["lost_gpu_seconds"].get(k, 0) + v
    for d in out.values():
        d["gpu_hours"] = round(d["gpu_seconds"] / 3600, 6)
        d["productive_gpu_hours"] = round(d["productive_gpu_seconds"] / 3600, 6)
        d["lost_gpu_hours"] = {k: round(v / 3600, 6) for k, v in d["lost_gpu_seconds"].items()}
    return list(out.values())


@contextlib.contextmanager
def fed(page, answers: dict[str, list[dict]]):
    """The page's own fetch answers GET /v1/usage with ``answers[group_by]``'s
    rows (and records what it asked); the rest goes to the stack. Applies
    from the next document on."""
    script = page.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const FAKE = %s, real = window.fetch;
        window.__usageAsked = [];
        window.fetch = async (url, opts) => {
          const u = new URL(String(url), location.href);
          if (!u.pathname.endsWith('/v1/usage')) return real(url, opts);
          window.__usageAsked.push(u.search);
          const rows = FAKE[u.searchParams.get('group_by') || ''] || [];
          return new Response(JSON.stringify({rows}), {status: 200, headers: {'Content-Type': 'application/json'}});
        };""" % json.dumps(answers)})
    try:
        yield
    finally:
        page.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def asked(page) -> list[dict]:
    return [dict(p.split("=", 1) for p in q.lstrip("?").split("&"))
            for q in page.execute_script("return window.__usageAsked || []")]


def legend(page) -> list[str]:
    return [li.text for li in page.find_elements(By.CSS_SELECTOR, "#usage-legend li")]


def totals(page) -> dict[str, str]:
    terms = page.find_elements(By.CSS_SELECTOR, "#usage-totals dt")
    return {t.text: t.find_element(By.XPATH, "following-sibling::dd[1]").text for t in terms}


def panels(page) -> list[tuple[str, str]]:
    """Each group's chart: its name and the line under it."""
    return [(p.find_element(By.CSS_SELECTOR, "h3").text, p.find_element(By.CSS_SELECTOR, ".us-lead").text)
            for p in page.find_elements(By.CSS_SELECTOR, "#usage-groups section.us-panel")]


def day_titles(page, panel: str) -> dict[str, str]:
    """Each day's tooltip (its SVG <title>) in a chart."""
    return page.execute_script("""
        const out = {};
        for (const g of document.querySelectorAll(arguments[0] + ' g.us-day'))
          out[g.dataset.day] = g.querySelector(':scope > title').textContent;
        return out;""", panel)


def test_the_usage_page_says_the_totals_each_day_and_each_group(page, browser_stack):
    """Canned rows of the last seven days grouped by team: the totals, the
    legend (the timeline's words and colours), a chart of every team
    together whose day's tooltip is describe's sentence of the day, one per
    team (most GPU time first, the jobs without the label last), the table;
    then 30 days, and grouped by GPU type."""
    now = datetime.now(timezone.utc)
    canned = rows(now)
    by_job = [{**r, "group": {"job": "job_01USAGE0000000000000000" + ("1" if r["group"]["label:team"] else "2")}}
              for r in canned]
    with fed(page, {"label:team": canned, "gpu_type": by_gpu_type(canned), "job": by_job}), \
            ui.viewport(page, 1280, 800), \
            ui.time_zone(page, "America/New_York"):
        page.get(browser_stack.api + "/#/usage")
        page.refresh()
        ui.text_in(page, "#usage-totals", "Held")
        nav = page.find_element(By.CSS_SELECTOR, "nav a[data-nav=usage]")
        assert nav.text == "Usage" and nav.get_attribute("aria-current") == "page"
        assert page.title == "Usage · gpujobs"
        assert asked(page)[0] == {"start": f"{days_back(6, now)}T00%3A00%3A00Z", "granularity": "day",
                                  "group_by": "label%3Ateam"}
        assert totals(page) == {"Held": "18.5 GPU-h", "Productive": "14.8 GPU-h", "Goodput": "80 %",
                                "Lost": "3.8 GPU-h: 0.8 startup, 0.2 stalled, 1.5 failed attempt, "
                                        "0.8 preempted, 0.5 node lost"}
        assert legend(page) == ["productive", "startup", "stalled", "failed attempt", "preempted", "node lost"]
        assert Select(page.find_element(By.ID, "usage-days")).first_selected_option.text == "last 7 days"
        assert page.find_element(By.ID, "usage-key").get_attribute("value") == "team"
        # every team together: a bar a day, its tooltip the day's sum as describe says it
        days = day_titles(page, "#usage-all")
        assert list(days) == [days_back(n, now) for n in range(6, -1, -1)]
        assert days[days_back(5, now)] == f"{days_back(5, now)}: held 12.0 GPU-h: 10.0 productive (83 %), " \
                                          "1.5 failed, 0.5 startup"
        assert days[days_back(2, now)] == f"{days_back(2, now)}: held 5.0 GPU-h: 3.5 productive (70 %), " \
                                          "0.8 preempted, 0.5 node lost, 0.2 stalled"
        assert days[days_back(1, now)] == f"{days_back(1, now)}: no GPU time"
        ticks = page.execute_script(
            "return [...document.querySelectorAll('#usage-all text.us-tick')].map((t) => t.textContent)")
        assert ticks == ["0", "2.5", "5", "7.5", "10", "12.5"]
        assert "GPU-h a day" in ui.find(page, "#usage-all .us-lead").text
        # one chart a team, on one scale
        assert panels(page) == [("team=ml", "held 14.0 GPU-h, 79 % goodput · GPU-h a day"),
                                ("team=vision", "held 3.5 GPU-h, 93 % goodput · GPU-h a day"),
                                ("no team label", "held 1.0 GPU-h, 50 % goodput · GPU-h a day")]
        # the bars' heights are the GPU time: a day of 12 GPU-h is 2.4 of one of 5
        heights = page.execute_script("""
            const out = {};
            for (const g of document.querySelectorAll('#usage-all g.us-day'))
              out[g.dataset.day] = [...g.querySelectorAll('rect.tl-seg')].reduce((s, r) => s + r.getBBox().height, 0);
            return out;""")
        assert abs(heights[days_back(5, now)] / heights[days_back(2, now)] - 12 / 5) < 0.01
        # the timeline's colours: a swatch is its bars' colour, failed attempt the timeline's red
        colours = page.execute_script("""
            const out = {};
            for (const li of document.querySelectorAll('#usage-legend li'))
              out[li.dataset.part] = getComputedStyle(li.querySelector('.swatch')).backgroundColor;
            return out;""")
        assert len(set(colours.values())) == len(colours) == 6
        fills = page.execute_script("""
            const out = {};
            for (const r of document.querySelectorAll('#usage-all rect.tl-seg'))
              out[r.dataset.part] = getComputedStyle(r).fill;
            return out;""")
        assert fills == colours
        assert colours["failed_attempt"] == "rgb(207, 34, 46)"
        ui.screenshot(page, "usage")
        # the table: a day's total over the teams, then each team's row; the total last
        page.find_element(By.CSS_SELECTOR, "#usage-details summary").click()
        head = [t.text for t in page.find_elements(By.CSS_SELECTOR, "#usage-table thead th")]
        assert head == ["Day (UTC)", "team", "GPU-h held", "Productive", "Goodput", "startup", "stalled",
                        "failed attempt", "preempted", "node lost", "Jobs"]
        body = [r.text for r in page.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr")]
        d5 = days_back(5, now)
        assert body[:3] == [f"{d5} all 12.00 10.00 83 % 0.50 0.00 1.50 0.00 0.00",
                            f"{d5} team=ml 10.00 8.00 80 % 0.50 0.00 1.50 0.00 0.00 2",
                            f"{d5} team=vision 2.00 2.00 100 % 0.00 0.00 0.00 0.00 0.00 2"]
        assert ui.find(page, "#usage-table tfoot tr").text == "Total 18.50 14.75 80 % 0.75 0.25 1.50 0.75 0.50"
        assert not ui.console_errors(page)

        # 30 days: asked again from 29 days back, the address says so
        Select(page.find_element(By.ID, "usage-days")).select_by_visible_text("last 30 days")
        ui.wait(page, 15).until(lambda d: len(day_titles(d, "#usage-all")) == 30)
        assert asked(page)[-1]["start"] == f"{days_back(29, now)}T00%3A00%3A00Z"
        assert page.execute_script("return location.hash") == "#/usage?days=30&by=label%3Ateam"
        labels = page.execute_script(
            "return [...document.querySelectorAll('#usage-all text.us-day-label')].map((t) => t.textContent)")
        assert 5 <= len(labels) <= 8
        # grouped by GPU type: one chart, the totals unchanged
        Select(page.find_element(By.ID, "usage-by")).select_by_visible_text("GPU type")
        ui.wait(page, 15).until(lambda d: [p[0] for p in panels(d)] == ["h100"])
        assert not page.find_element(By.ID, "usage-key").is_displayed()
        assert asked(page)[-1]["group_by"] == "gpu_type"
        assert totals(page)["Held"] == "18.5 GPU-h"
        assert ui.find(page, "#usage-groups-head").text == "By GPU type"
        # by job: each chart's name links to its job
        Select(page.find_element(By.ID, "usage-by")).select_by_visible_text("job")
        ui.wait(page, 15).until(lambda d: len(panels(d)) == 2)
        links = [(a.text, a.get_attribute("href").rsplit("/", 1)[1])
                 for a in page.find_elements(By.CSS_SELECTOR, "#usage-groups h3 a")]
        assert links == [("job_01USAGE00000000000000001", "job_01USAGE00000000000000001"),
                         ("job_01USAGE00000000000000002", "job_01USAGE00000000000000002")]
        assert ui.find(page, "#usage-all h3").text == "All jobs together"
        Select(page.find_element(By.ID, "usage-by")).select_by_visible_text("GPU type")
        ui.wait(page, 15).until(lambda d: [p[0] for p in panels(d)] == ["h100"])
        # a reload keeps what was chosen
        page.refresh()
        ui.text_in(page, "#usage-totals", "Held")
        assert Select(page.find_element(By.ID, "usage-by")).first_selected_option.text == "GPU type"
        assert Select(page.find_element(By.ID, "usage-days")).first_selected_option.text == "last 30 days"
        assert not ui.console_errors(page)


def test_the_navigation_reaches_it_no_usage_says_so_and_a_refusal_is_shown(page, browser_stack):
    """The page is a link of the navigation, reached by keyboard alone; with
    no rows it says so and draws nothing; a 400 is shown as its problem."""
    with fed(page, {"label:team": []}):
        page.get(browser_stack.api + "/#/jobs")
        page.refresh()  # focus starts at the top of the document
        ui.present(page, "#jobs-body")
        ActionChains(page).send_keys(Keys.TAB).perform()
        for _ in range(6):
            if page.switch_to.active_element.text == "Usage":
                break
            page.switch_to.active_element.send_keys(Keys.TAB)
        assert page.switch_to.active_element.text == "Usage"
        page.switch_to.active_element.send_keys(Keys.ENTER)
        assert ui.text_in(page, "#usage-none", "No GPU time") == "No GPU time in the last 7 days."
        assert totals(page) == {"Held": "no GPU time"}
        assert page.current_url.endswith("#/usage")
        assert not page.find_elements(By.CSS_SELECTOR, "svg.us-chart")
        assert not ui.console_errors(page)
    # a label key the API refuses (over 128 characters): its problem, by the form
    page.get(browser_stack.api + "/#/usage?days=7&by=label:" + "k" * 129)
    page.refresh()
    said = ui.text_in(page, "#usage-error", "400")
    assert said.startswith("Could not read the usage: 400 ") and "group_by" in said, said
    # the browser logs the refused request itself: that, and nothing else
    assert all("status of 400" in e for e in ui.console_errors(page))


#: two ranks that sleep a little and succeed
QUICK = "import time; time.sleep(2)\n"


def _unit(seconds: float) -> str:
    return "GPU-h" if seconds >= 3600 else "GPU-min" if seconds >= 60 else "GPU-s"


def test_a_real_jobs_usage_on_the_page(page, tenant, browser_stack):
    """Real agents: a job labelled with a team of its own runs and succeeds;
    once GET /v1/usage has it, the page's chart of that team says the GPU time
    the API rolled up, and today's bar in it holds it."""
    from gpujobs_client import cli

    team = unique("team")
    job = submit(tenant, name=unique("usage"), command=[sys.executable, "-c", QUICK], ranks=2,
                 labels={"team": team})
    done = wait_state(tenant, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    today = days_back(0)
    mine: list[dict] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the rollup follows the attempt's end
        got = tenant.get("/v1/usage", params={"start": f"{today}T00:00:00Z", "granularity": "day",
                                              "group_by": "label:team"}).json()["rows"]
        mine = [r for r in got if r["group"].get("label:team") == team]
        if mine and sum(r["gpu_seconds"] for r in mine) >= done["usage"]["gpu_seconds"] > 0:
            break
        time.sleep(1)
    held = sum(r["gpu_seconds"] for r in mine)
    productive = sum(r["productive_gpu_seconds"] for r in mine)
    assert held == done["usage"]["gpu_seconds"] > 0, (mine, done["usage"])
    page.get(browser_stack.api + "/#/usage?days=7&by=label:team")
    ui.wait(page, 60).until(lambda d: any(p[0] == f"team={team}" for p in ui.read(d, panels)))
    lead = dict(ui.read(page, panels))[f"team={team}"]
    goodput = f"{100 * productive / held:.0f} %"
    assert lead.startswith(f"held {cli.gpu_amount(held, _unit(held))} {_unit(held)}, {goodput} goodput"), lead
    index = [p[0] for p in ui.read(page, panels)].index(f"team={team}")
    bars = ui.read(page, lambda d: day_titles(d, f"#usage-panel-{index}"))
    assert bars[today].startswith(f"{today}: held "), bars
    assert legend(page)[0] == "productive"
    assert not ui.console_errors(page)
