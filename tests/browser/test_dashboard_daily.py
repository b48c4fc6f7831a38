"""The dashboard's daily-use features of issue 29, item 6, as a person sees
them in headless Chromium against the local stack with real agents: Resubmit
on the job page, the nodes page's GPUs by job, a job's spec said in words,
and a ranks page that stops asking once the job is not there."""
from __future__ import annotations

import json
import re
import uuid

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from tests.browser import ui
from tests.browser.test_dashboard_glitches import answered
from tests.support.browser import submit, unique, wait_state
from tests.support.stacks import Api

OTHER_TOKEN = "e2e-other"  # a second tenant of tests/support/stacks.TOKENS
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def _cancel(api, job_id: str) -> None:
    api.post(f"/v1/jobs/{job_id}/cancel")


def _named(api, name: str) -> list[dict]:
    """The tenant's jobs called ``name``, newest first (the newest 100 jobs)."""
    jobs = api.get("/v1/jobs", params={"page_size": 100}).json()["jobs"]
    return [j for j in jobs if j["name"] == name]


def _page_job(driver) -> str | None:
    """The job id of the job page open now, if one is."""
    m = re.search(r"#/jobs/([^/?]+)$", driver.current_url)
    return m.group(1) if m else None


def _search(page, base: str, words: str) -> None:
    """The jobs list, searched for ``words``."""
    page.get(base + "/#/jobs")
    ui.present(page, "#jobs-body")
    page.find_element(By.ID, "search").send_keys(words)


def _listed(page) -> set[str]:
    """The ids of the jobs the jobs list shows."""
    return {tr.get_attribute("data-id") for tr in page.find_elements(By.CSS_SELECTOR, "#jobs-body tr[data-id]")}


def _finished(tenant, name: str, **spec) -> dict:
    job = submit(tenant, name=name, command=["echo", "daily bread"], **spec)
    assert wait_state(tenant, job["id"], ENDED)["state"] == "SUCCEEDED"
    return job


def test_resubmit_makes_one_new_job_like_this_one_even_on_a_double_click(page, tenant, browser_stack):
    """Invariant: Resubmit on a finished job's page creates exactly one new job
    (a double click included) whose spec is the old one's, and the browser
    lands on that job's page; the jobs list then shows both."""
    base, name = browser_stack.api, unique("again")
    first = _finished(tenant, name, env={"DAILY": "1"}, labels={"team": "bread"})
    made: list[str] = []
    try:
        page.get(base + f"/#/jobs/{first['id']}")
        ui.text_in(page, "#job-state", "SUCCEEDED")
        # the key's source is there: the page (http://127.0.0.1) is a secure context
        assert page.execute_script(
            "return window.isSecureContext && typeof crypto.randomUUID === 'function'") is True
        button = ui.find(page, "#resubmit")
        ui.wait(page).until(lambda d: button.is_enabled())
        assert button.text == "Resubmit"
        ActionChains(page).double_click(button).perform()
        ui.wait(page).until(lambda d: _page_job(d) not in (None, first["id"]))
        new_id = _page_job(page)
        made.append(new_id)
        assert ui.text_in(page, "#job-title", name) == name
        facts = ui.text_in(page, "#facts", new_id)
        assert "Command\necho 'daily bread'" in facts and "Labels\nteam=bread" in facts, facts
        ui.text_in(page, "#job-state", "SUCCEEDED", timeout=60)
        # the spec as the API returned it, defaults filled, was taken back as it is
        assert tenant.get(f"/v1/jobs/{new_id}").json()["spec"] == first["spec"]
        assert {j["id"] for j in _named(tenant, name)} == {first["id"], new_id}, "not one new job"
        _search(page, base, name)
        ui.wait(page).until(lambda d: _listed(d) == {first["id"], new_id})
        assert ui.text_in(page, f'tr[data-id="{new_id}"] a.job-link', name) == name
    finally:
        for job_id in [first["id"], *made]:
            _cancel(tenant, job_id)


PROBLEM = {"type": "urn:gpujobs:problem:quota_exceeded", "title": "Quota exceeded", "status": 429,
           "detail": "tenant e2e holds its limit of 100 PENDING jobs", "code": "quota_exceeded"}
#: POST /v1/jobs as the page sends it, its Idempotency-Keys kept in window.__keys;
#: window.__mode 'refuse' answers PROBLEM, 'lose' lets the create through and
#: then loses its answer to the network (once)
FLAKY_CREATE = """
    window.__keys = []; window.__mode = null;
    const PROBLEM = %s, real = window.fetch;
    window.fetch = async (url, opts) => {
      const path = new URL(String(url), location.href).pathname;
      if (!(opts && opts.method === 'POST' && path.endsWith('/v1/jobs'))) return real(url, opts);
      window.__keys.push(opts.headers['Idempotency-Key']);
      if (window.__mode === 'refuse') return new Response(JSON.stringify(PROBLEM),
        {status: 429, headers: {'Content-Type': 'application/problem+json', 'Retry-After': '30'}});
      if (window.__mode === 'lose') {
        window.__mode = null;
        await real(url, opts);
        throw new TypeError('Failed to fetch');
      }
      return real(url, opts);
    };""" % json.dumps(PROBLEM)


def test_resubmit_says_a_refusal_and_asks_a_lost_answer_again_with_the_same_key(
        page, tenant, browser_stack):
    """Invariant: a refused create shows the problem's detail as text by the
    button, makes no job and leaves the button usable; every click has a fresh
    Idempotency-Key, and a click whose answer was lost is asked again with its
    own key, so it still makes one job, not two."""
    base, name = browser_stack.api, unique("again-flaky")
    first = _finished(tenant, name)
    made: list[str] = []
    try:
        with ui.on_every_document(page, FLAKY_CREATE):
            page.get(base + f"/#/jobs/{first['id']}")
            page.refresh()
            ui.text_in(page, "#job-state", "SUCCEEDED")
            button = ui.find(page, "#resubmit")
            ui.wait(page).until(lambda d: button.is_enabled())
            page.execute_script("window.__mode = 'refuse'")
            button.click()
            said = ui.text_in(page, "#resubmit-status", PROBLEM["detail"])
            assert said == f"Resubmit refused: 429 Quota exceeded: {PROBLEM['detail']}", said
            assert _page_job(page) == first["id"]
            ui.wait(page).until(lambda d: button.is_enabled() and button.text == "Resubmit")
            assert len(_named(tenant, name)) == 1
            page.execute_script("window.__mode = 'lose'")
            button.click()
            ui.wait(page).until(lambda d: _page_job(d) not in (None, first["id"]))
            made.append(_page_job(page))
            assert ui.text_in(page, "#job-title", name) == name
            keys = page.execute_script("return window.__keys")
        assert len(keys) == 3 and keys[1] == keys[2] and keys[0] != keys[1], keys
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", k)
                   for k in keys), keys
        assert {j["id"] for j in _named(tenant, name)} == {first["id"], made[0]}
    finally:
        for job_id in [first["id"], *made]:
            _cancel(tenant, job_id)


def _per_node(api, job_id: str, gpus_per_rank: int) -> dict[str, int]:
    """node id -> GPUs the job's current attempt holds there, from the API."""
    job = api.get(f"/v1/jobs/{job_id}").json()
    attempts = api.get(f"/v1/jobs/{job_id}/attempts").json()["attempts"]
    current = next(a for a in attempts if a["attempt"] == job["attempt"])
    out: dict[str, int] = {}
    for p in current["placement"]:
        out[p["node_id"]] = out.get(p["node_id"], 0) + gpus_per_rank
    return out


def _users(page, node: str) -> list[str]:
    return [li.text for li in page.find_elements(
        By.CSS_SELECTOR, f'#nodes-body tr[data-node="{node}"] td.users li')]


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def test_the_nodes_page_says_which_of_your_jobs_hold_each_nodes_gpus(page, tenant, browser_stack):
    """Invariant: under each node, each of the caller's running jobs placed
    there is named (a link to its page) with the GPUs it holds there, ranks
    there × gpus_per_rank; another tenant's GPUs are said only as a number,
    never by its job's name or id."""
    other = Api(browser_stack.api, OTHER_TOKEN)
    name, theirs_name = unique("held"), unique("theirs")
    mine = submit(tenant, name=name, ranks=2, gpus_per_rank=2)
    theirs = submit(other, name=theirs_name, ranks=1, gpus_per_rank=2)
    try:
        assert wait_state(tenant, mine["id"], {"RUNNING"})["state"] == "RUNNING"
        assert wait_state(other, theirs["id"], {"RUNNING"})["state"] == "RUNNING"
        held = _per_node(tenant, mine["id"], 2)
        held_by_them = _per_node(other, theirs["id"], 2)
        assert sum(held.values()) == 4
        page.get(browser_stack.api + "/#/nodes")
        ui.text_in(page, "#nodes-body", "local-2")
        line = re.compile(rf"{re.escape(name)} \(job_\w+…{mine['id'][-5:]}\): (\d+) GPUs?")
        seen: dict = {}

        def shown(d) -> bool:
            for node in ("local-1", "local-2"):
                lines = seen[node] = _users(page, node)
                ours = [m for m in map(line.fullmatch, lines) if m]
                if [int(m.group(1)) for m in ours] != ([held[node]] if node in held else []):
                    return False
                # GPUs a job of this tenant that a test before cancelled may
                # hold a moment longer are not theirs: wait for them to go
                if node in held_by_them and f"other tenants: {_gpus(held_by_them[node])}" not in lines:
                    return False
            return True
        ui.wait(page, 60).until(shown, message=f"not shown: {seen}")
        text = page.find_element(By.TAG_NAME, "main").text
        assert theirs_name not in text and theirs["id"] not in text
        node = next(iter(held))
        link = page.find_element(By.CSS_SELECTOR, f'#nodes-body tr[data-node="{node}"] td.users a')
        assert link.text == name
        link.click()
        assert ui.text_in(page, "#job-title", name) == name
        assert _page_job(page) == mine["id"]
    finally:
        _cancel(tenant, mine["id"])
        _cancel(other, theirs["id"])


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


def test_the_job_page_says_the_retry_policy_the_limits_and_the_time_left(page, tenant,
                                                                           browser_stack):
    """Issue 26: a running job's page says its retry rules, its time limits
    and how long until it times out, in words; once it ends, why it ended and
    what the retry rules decided."""
    job = submit(tenant, name=unique("limits"), command=["sleep", "30"], ranks=1,
                 max_attempts=2, max_runtime_s=3 * 3600, warn_before_s=300,
                 retry={"rules": [{"exit_codes": [42], "action": "fail"}]})
    try:
        wait_state(tenant, job["id"], {"RUNNING"})
        page.get(browser_stack.api + f"/#/jobs/{job['id']}")
        facts = ui.text_in(page, "#facts", "Time left")
        assert ("Retry policy\nexit 42 → fail; then defaults (infra causes not counted, up "
                "to 10)") in facts, facts
        assert "max runtime 3 h per attempt (warning SIGUSR1 5 min before)" in facts, facts
        assert re.search(r"Time left\ntimes out in 2 h 5\d min", facts), facts
        _cancel(tenant, job["id"])
        assert wait_state(tenant, job["id"], ENDED)["state"] == "CANCELLED"
        ui.text_in(page, "#facts", "Exit")
        assert "Time left" not in page.find_element(By.ID, "facts").text
    finally:
        _cancel(tenant, job["id"])


def test_the_nodes_page_says_why_a_node_is_cordoned(page, browser_stack):
    """Issue 28: an operator's cordon shows on the nodes page, with its reason
    and who; uncordoned, the node is READY there again."""
    ops = Api(browser_stack.api, "e2e-ops")
    reason = unique("bad ECC on GPU 3")
    try:
        r = ops.post("/v1/nodes/local-2/cordon", json={"reason": reason})
        assert r.status_code == 200, r.text
        page.get(browser_stack.api + "/#/nodes")
        row = ui.text_in(page, '#nodes-body tr[data-node="local-2"]', reason)
        assert "DRAINING" in row and "e2e-ops" in row, row
        assert reason not in page.find_element(
            By.CSS_SELECTOR, '#nodes-body tr[data-node="local-1"]').text
    finally:
        assert ops.post("/v1/nodes/local-2/uncordon").status_code == 200
    page.refresh()
    ui.wait(page, 30).until(lambda d: reason not in d.find_element(
        By.CSS_SELECTOR, '#nodes-body tr[data-node="local-2"]').text
        and "READY" in d.find_element(By.CSS_SELECTOR, '#nodes-body tr[data-node="local-2"]').text,
        message="uncordoned: READY again")


def test_the_job_page_reads_only_new_log_lines_as_they_come(page, tenant, browser_stack):
    """Invariant (issue 25, item 4): a running job's page does not download
    its log again on every refresh: its first read asks for the latest lines
    (``tail``), every later one only for what is new (the tail's token, then
    each page's), no line is downloaded twice, and the page shows each line
    once, in order, up to the last one."""
    import urllib.parse

    script = ("import time\nfor i in range(40):\n    print(f'tick {i:02d}', flush=True)\n"
              "    time.sleep(0.25)\n")
    job = submit(tenant, name=unique("logs"), command=["python", "-c", script], ranks=1)
    try:
        assert wait_state(tenant, job["id"], {"RUNNING"} | ENDED)["state"] in {"RUNNING"} | ENDED
        with ui.on_every_document(page, """
                window.__logs = [];  // [url, lines in the answer] of each /logs request
                const real = window.fetch;
                window.fetch = async (url, opts) => {
                  const res = await real(url, opts);
                  if (String(url).includes('/logs')) {
                    const body = await res.clone().json().catch(() => ({}));
                    window.__logs.push([String(url), (body.lines || []).length]);
                  }
                  return res;
                };"""):
            page.get(browser_stack.api + f"/#/jobs/{job['id']}")
            page.refresh()
            ui.text_in(page, "#logs", "tick 39", timeout=60)
            answered = page.execute_script("return window.__logs")
        asked = [(urllib.parse.parse_qs(urllib.parse.urlsplit(u).query), n) for u, n in answered]
        assert len(asked) >= 2 and "tail" in asked[0][0], asked
        # the tail once, then its token (positioned at the start when the tail was
        # empty) and each page's
        assert all("page_token" in q and "since" not in q for q, _ in asked[1:]), asked
        first = next(i for i, (_, n) in enumerate(asked) if n)
        assert len(asked) > first + 2, "the log was followed"
        text = page.find_element(By.CSS_SELECTOR, "#logs pre").text
        assert sum(n for _, n in asked) == len(text.splitlines()), "no line downloaded twice"
        ticks = [line.split("] ", 1)[1] for line in text.splitlines() if "tick" in line]
        assert ticks == [f"tick {i:02d}" for i in range(40)], ticks
    finally:
        _cancel(tenant, job["id"])
