"""Pipelines and sweeps on the dashboard (issue 27), as a person sees them in
headless Chromium against the local stack with real agents: an array's page
says its counts by state and shows a grid of its indexes (one cell per index,
coloured by state, each a link to its job), a child's page says its index and
parent, and a dependent job's page says what it waits for and, once that can
no longer be met, why it ended. The jobs list says an array's progress."""
from __future__ import annotations

import re

from selenium.webdriver.common.by import By

from tests.browser import ui
from tests.support.browser import submit, unique, wait_state

ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
#: each index waits for its gate file, then exits with its OUTCOME (array.env)
GATED = ["sh", "-c", 'while [ ! -e "$GATE/$GPUJOBS_ARRAY_INDEX" ]; do sleep 0.1; done; '
                     'exit "$OUTCOME"']
#: a cell's tooltip, "index 3: running", by the state the page says
SAID = {"NOT_MADE": "not started yet (pending)", "PENDING": "pending",
        "SCHEDULED": "scheduled", "RUNNING": "running", "SUCCEEDED": "succeeded",
        "FAILED": "failed", "CANCELLED": "cancelled"}
#: the class that colours a cell in each state
COLOUR = {s: f"c-{s.lower()}" for s in SAID}

CELLS_JS = """return [...document.querySelectorAll('#array-cells .cell')].map((a) =>
  [a.title, a.className, a.getAttribute('href')]);"""


def _cells(page) -> list[tuple[str, str, str | None]]:
    """Each grid cell's tooltip, classes and link, in the grid's order."""
    return [tuple(c) for c in page.execute_script(CELLS_JS)]


def _states(page) -> list[str] | None:
    """The state each cell shows, by its tooltip, checked against its colour;
    None while a tooltip and a colour disagree."""
    out = []
    for i, (title, classes, _) in enumerate(_cells(page)):
        m = re.fullmatch(rf"index {i}: (.+)", title)
        state = next((s for s, words in SAID.items() if m and m.group(1) == words), None)
        if state is None or COLOUR[state] not in classes.split():
            return None
        out.append(state)
    return out


def _grid_shows(page, states: list[str], timeout: float = 60) -> None:
    seen: dict = {}

    def shows(d) -> bool:
        seen["states"] = _states(d)
        return seen["states"] == states
    ui.wait(page, timeout).until(shows, message=f"grid shows {seen}, not {states}")


def _fact(page, name: str, text: str, timeout: float = 60) -> str:
    """The facts once they hold "<name>\\n<text>" (its whole line)."""
    seen: dict = {}

    def has(d) -> bool:
        seen["facts"] = d.find_element(By.ID, "facts").text
        return f"\n{name}\n{text}\n" in f"\n{seen['facts']}\n"
    ui.wait(page, timeout).until(has, message=f"no fact {name}: {text!r} in {seen}")
    return seen["facts"]


def _legend(page) -> list[str]:
    """The legend's entries shown: "<state> <cells in it>"."""
    return [li.text for li in page.find_elements(By.CSS_SELECTOR, "#array-legend li")
            if li.is_displayed()]


def _release(gate, *indexes: int) -> None:
    for i in indexes:
        (gate / str(i)).write_text("go")


def _children(api, parent_id: str) -> dict[int, str]:
    """index -> child id, from GET /v1/jobs?parent= (every page)."""
    out: dict[int, str] = {}
    token = None
    while True:
        page = api.get("/v1/jobs", params={"parent": parent_id, "page_size": 500,
                                           **({"page_token": token} if token else {})}).json()
        out.update({j["array_index"]: j["id"] for j in page["jobs"]})
        token = page["next_page_token"]
        if not token:
            return out


def test_an_array_and_its_dependents_as_their_pages_show_them(page, tenant, browser_stack,
                                                               shared_dir):
    """Issue 27, item 5: an array of 6 indexes with max_parallel 2 (index 4
    fails) and two jobs after it. The array's page says its counts and shows
    6 cells whose states follow the indexes as they run (2 at most at once,
    the rest not started yet), each made one a link to its job; the grid is
    not asked for again while nothing changes. The dependent's page links the
    array and says it waits for it; once the array has failed, it says the
    dependency failed (the array linked), while the one after any end ran."""
    base, name = browser_stack.api, unique("sweep")
    ui.console_errors(page)  # read (and so cleared): what the tests before on this page left
    sweep = submit(tenant, name=name, command=GATED, env={"GATE": str(shared_dir)},
                   array={"size": 6, "max_parallel": 2,
                          "env": {"OUTCOME": ["0", "0", "0", "0", "3", "0"]}})
    sid = sweep["id"]
    after_ok = submit(tenant, name=unique("after-ok"), command=["true"],
                      depends_on=[{"job_id": sid}])
    after_any = submit(tenant, name=unique("after-any"), command=["true"],
                       depends_on=[{"job_id": sid, "condition": "ended"}])
    try:
        page.get(base + f"/#/jobs/{sid}")
        assert ui.text_in(page, "#job-title", name) == name
        ui.present(page, "#array-cells .cell")
        assert len(_cells(page)) == 6
        _fact(page, "Progress", "0 of 6 indexes done; 2 scheduled or running, 4 pending")
        _grid_shows(page, ["RUNNING"] * 2 + ["NOT_MADE"] * 4)
        facts = _fact(page, "Array", "6 indexes, at most 2 at once; 2 made so far; env by "
                                     "index: OUTCOME (values are not shown)")
        assert "Ranks\n1 rank × 1 GPU (h100) per index" in facts, facts
        assert _legend(page) == ["not started yet 4", "running 2"]
        assert not page.find_element(By.ID, "ranks-link").is_displayed()
        assert "An array does not run itself" in ui.text_in(page, "#attempts", "array")
        # nothing changes while the gates are shut: the children are not asked for again
        ui.watch_fetches(page)
        ui.never(page, lambda d: ui.fetched(d, "parent="), 5, "the grid was asked again")
        assert len([u for u in ui.fetched(page, sid) if u.endswith(sid)]) >= 2, \
            "the page stopped refreshing"

        kids = _children(tenant, sid)
        assert sorted(kids) == [0, 1]
        hrefs = [c[2] for c in _cells(page)]
        assert hrefs == [f"#/jobs/{kids[0]}", f"#/jobs/{kids[1]}", None, None, None, None]

        # the dependent waits for the array, linked
        page.get(base + f"/#/jobs/{after_ok['id']}")
        _fact(page, "Why pending", f"waiting for {sid} to succeed")
        _fact(page, "Waiting for", sid)
        _fact(page, "Depends on", f"{sid} to succeed — waiting")
        link = page.find_element(By.CSS_SELECTOR, "#facts ul.deps a.job-link")
        assert link.text == sid and link.get_attribute("href").endswith(f"#/jobs/{sid}")
        link.click()
        assert ui.text_in(page, "#job-title", name) == name

        _release(shared_dir, 0, 1)
        _fact(page, "Progress", "2 of 6 indexes done: 2 succeeded; 2 scheduled or running, "
                                "2 pending")
        _grid_shows(page, ["SUCCEEDED"] * 2 + ["RUNNING"] * 2 + ["NOT_MADE"] * 2)
        page.execute_script("document.getElementById('facts').scrollIntoView()")
        ui.screenshot(page, "array")

        _release(shared_dir, 2, 3, 4, 5)
        ui.text_in(page, "#job-state", "FAILED", timeout=90)
        _fact(page, "Progress", "6 of 6 indexes done: 5 succeeded, 1 failed")
        _fact(page, "Exit", "array_failed: 5 of 6 indexes succeeded, 1 failed")
        _grid_shows(page, ["SUCCEEDED"] * 4 + ["FAILED", "SUCCEEDED"])
        kids = _children(tenant, sid)
        assert [c[2] for c in _cells(page)] == [f"#/jobs/{kids[i]}" for i in range(6)]
        assert _legend(page) == ["succeeded 5", "failed 1"]

        # a child's page: its index and its parent, linked
        page.find_element(By.CSS_SELECTOR, '#array-cells .cell[title="index 4: failed"]').click()
        assert ui.text_in(page, "#job-title", f"{name}[4]") == f"{name}[4]"
        facts = _fact(page, "Array", f"index 4 of 6 in the array {sid}")
        parent = page.find_element(By.CSS_SELECTOR, "#facts .array-child a.job-link")
        assert parent.get_attribute("href").endswith(f"#/jobs/{sid}")
        assert "Exit\nrank_failed: rank 0" in facts and "exited with code 3" in facts, facts

        # the dependents: one could never start, the other ran after the end
        assert wait_state(tenant, after_ok["id"], ENDED)["state"] == "FAILED"
        page.get(base + f"/#/jobs/{after_ok['id']}")
        ui.text_in(page, "#job-state", "FAILED")
        facts = _fact(page, "Exit", f"dependency_failed: {sid} ended FAILED; this job "
                                    "needed it to succeed")
        _fact(page, "Depends on", f"{sid} to succeed — never met")
        assert "Waiting for" not in facts and "Why pending" not in facts, facts
        exit_link = page.find_element(By.CSS_SELECTOR, "#facts a.job-link[href$='%s']" % sid)
        assert exit_link.text == sid
        assert wait_state(tenant, after_any["id"], ENDED)["state"] == "SUCCEEDED"
        page.get(base + f"/#/jobs/{after_any['id']}")
        ui.text_in(page, "#job-state", "SUCCEEDED")
        _fact(page, "Depends on", f"{sid} to end, however it ends — met")

        # the jobs list: the array's progress by its name, each child by its index
        page.get(base + "/#/jobs")
        ui.present(page, "#jobs-body")
        page.find_element(By.ID, "search").send_keys(name)
        row = ui.text_in(page, f'tr[data-id="{sid}"] .array-progress', "done")
        assert row == "array 6/6 done, 1 failed", row
        assert ui.text_in(page, f'tr[data-id="{kids[3]}"] a.job-link', f"{name}[3]") == \
            f"{name}[3]"
        assert not page.find_element(By.CSS_SELECTOR,
                                     f'tr[data-id="{kids[3]}"] .array-progress').is_displayed()
        assert not ui.console_errors(page)
    finally:
        _release(shared_dir, *range(6))
        for job_id in (sid, after_ok["id"], after_any["id"]):
            tenant.post(f"/v1/jobs/{job_id}/cancel")


# -- a large array, its answers made up: what the grid asks for ---------------------
BIG = 1200
PARENT = "job_01JARRAYBIGPARENT000000000"
#: an array of BIG indexes, 1100 made; the page's fetches of it answered here:
#: its children in pages of 500 (page tokens "p500", "p1000"), the first 700
#: SUCCEEDED, the rest PENDING; window.__step() then ends index 800, and the
#: parent's counts move; window.__lists records every children request
BIG_ARRAY = """
(() => {
  const BIG = %d, MADE = 1100, PARENT = '%s', real = window.fetch;
  const kids = Array.from({ length: MADE }, (_, i) => ({
    id: 'job_01JARRAYBIGCHILD' + String(i).padStart(10, '0'), name: 'big[' + i + ']',
    state: i < 700 ? 'SUCCEEDED' : 'PENDING', parent_id: PARENT, array_index: i, attempt: 0,
    spec: { command: ['x'], ranks: 1 } }));
  const counts = () => {
    const c = { PENDING: BIG - MADE, RUNNING: 0, SUCCEEDED: 0, FAILED: 0, CANCELLED: 0 };
    for (const k of kids) c[k.state === 'SCHEDULED' ? 'RUNNING' : k.state] += 1;
    return c;
  };
  const parent = () => ({ id: PARENT, name: 'big', state: 'RUNNING', attempt: 0,
    created_at: '2026-01-01T00:00:00.000Z', started_at: '2026-01-01T00:00:01.000Z',
    finished_at: null, cancel_requested_at: null, cancel_reason: null, pending_reason: null,
    health: {}, exit: null, waiting_for: null, parent_id: null, array_index: null,
    spec: { command: ['x'], ranks: 1, array: { size: BIG } },
    array: { size: BIG, materialized: MADE, counts: counts() } });
  window.__lists = [];
  window.__step = () => { kids[800].state = 'SUCCEEDED'; };
  const json = (body) => new Response(JSON.stringify(body),
    { status: 200, headers: { 'Content-Type': 'application/json' } });
  window.fetch = async (url, opts) => {
    const u = new URL(String(url), location.href);
    if (u.pathname.endsWith('/v1/jobs') && u.searchParams.get('parent') === PARENT) {
      const token = u.searchParams.get('page_token');
      window.__lists.push(token || 'first');
      const from = token ? Number(token.slice(1)) : 0;
      const size = Number(u.searchParams.get('page_size'));
      const next = from + size < MADE ? 'p' + (from + size) : null;
      return json({ jobs: kids.slice(from, from + size), next_page_token: next });
    }
    const base = '/v1/jobs/' + PARENT;
    if (u.pathname.endsWith(base)) return json(parent());
    if (u.pathname.endsWith(base + '/attempts')) return json({ attempts: [] });
    if (u.pathname.endsWith(base + '/events')) return json({ events: [] });
    if (u.pathname.endsWith(base + '/logs')) return json({ lines: [] });
    return real(url, opts);
  };
})();""" % (BIG, PARENT)


def test_a_large_arrays_grid_asks_only_for_what_may_have_changed(page, browser_stack):
    """Invariant: an array of 1,200 indexes shows 1,200 cells (the 100 not made
    yet as not started), from its children asked in pages of 500 once; while
    its counts stay the same the children are not asked again, and when one
    index ends only the pages from the first one holding an index not ended
    are asked again (the first page, all ended, is not)."""
    with ui.on_every_document(page, BIG_ARRAY):
        page.get(browser_stack.api + f"/#/jobs/{PARENT}")
        page.refresh()
        _fact(page, "Progress", "700 of 1,200 indexes done: 700 succeeded; 500 pending")
        ui.wait(page).until(lambda d: _states(d) == ["SUCCEEDED"] * 700 + ["PENDING"] * 400
                            + ["NOT_MADE"] * 100)
        assert len(_cells(page)) == BIG
        assert page.execute_script("return window.__lists") == ["first", "p500", "p1000"]
        assert _legend(page) == ["not started yet 100", "pending 400", "succeeded 700"]
        ui.never(page, lambda d: len(d.execute_script("return window.__lists")) > 3, 5,
                 "the grid was asked again while nothing changed")
        page.execute_script("window.__step()")
        _fact(page, "Progress", "701 of 1,200 indexes done: 701 succeeded; 499 pending")
        ui.wait(page).until(lambda d: (_states(d) or [None] * BIG)[800] == "SUCCEEDED")
        assert page.execute_script("return window.__lists")[3:] == ["p500", "p1000"]
        title, _, href = _cells(page)[800]
        assert title == "index 800: succeeded"
        assert href == "#/jobs/job_01JARRAYBIGCHILD0000000800"
        page.execute_script("document.getElementById('array-grid').scrollIntoView()")
        ui.screenshot(page, "array-1200")
