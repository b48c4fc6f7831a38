"""The dashboard's static files as the app serves them (chalicelib/web): the
right content types, a strict Content-Security-Policy, conditional GETs, no
file outside the folder, and nothing that API Gateway would treat as binary."""
from __future__ import annotations

import json
import re

import pytest
from chalice.app import _matches_content_type

import app
from chalicelib import web
from chalicelib.api import schemas


def run_under_node(tmp_path, script: str, given: object = None) -> dict:
    """``script`` run under node (the machine's Node.js, as the browser tests
    use its Chromium) beside the dashboard's modules, ``given`` as its JSON
    argument; what it printed, as JSON."""
    import shutil
    import subprocess

    node = shutil.which("node")
    assert node is not None, "no node to run the dashboard's modules"
    for p in web.STATIC_DIR.glob("*.js"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "package.json").write_text('{"type": "module"}')
    (tmp_path / "check.js").write_text(script)
    args = [] if given is None else [json.dumps(given)]
    ran = subprocess.run([node, "check.js", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


CSP = web.CSP


def test_the_index_is_html_with_a_strict_policy(client):
    r = client.http.get("/")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["X-Frame-Options"] == "DENY"
    assert b'<script type="module" src="static/app.js"></script>' in r.body


def test_the_policy_allows_no_inline_code_and_no_other_origin():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src", "img-src"):
        assert directives[name] == "'self'", name
    assert "unsafe" not in CSP and "http" not in CSP and "data:" not in CSP
    assert directives["frame-ancestors"] == "'none'"


@pytest.mark.parametrize("name", web.names())
def test_every_file_is_served_with_its_text_content_type(client, name):
    r = client.http.get(f"/static/{name}")
    assert r.status_code == 200
    ext = name.rsplit(".", 1)[1]
    assert r.headers["Content-Type"] == web.CONTENT_TYPES[ext]
    assert r.headers["Content-Security-Policy"] == CSP
    assert r.headers["Cache-Control"] == "no-cache"
    assert r.body == (web.STATIC_DIR / name).read_bytes()


def test_no_served_type_is_binary_to_api_gateway():
    """A binary type would be base64-encoded by Chalice and need a matching
    Accept header; text types pass through API Gateway as they are."""
    for content_type in web.CONTENT_TYPES.values():
        assert not _matches_content_type(content_type, app.app.api.binary_types), content_type


def test_a_matching_etag_is_304_without_a_body(client):
    first = client.http.get("/static/app.js")
    etag = first.headers["ETag"]
    again = client.http.get("/static/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.body == b""
    assert again.headers["ETag"] == etag
    other = client.http.get("/static/app.js", headers={"If-None-Match": '"stale"'})
    assert other.status_code == 200 and other.body == first.body


@pytest.mark.parametrize("name", ["nope.js", "app.py", "..%2Fapp.py", "%2E%2E", "APP.JS",
                                  ".hidden.js", "index.html.bak", "web.pyc"])
def test_anything_else_is_a_problem_json_404(client, name):
    r = client.http.get(f"/static/{name}")
    assert r.status_code == 404
    assert r.headers["Content-Type"] == "application/problem+json"
    assert json.loads(r.body)["code"] == "not_found"


def test_any_request_content_type_is_accepted_for_a_page(client):
    r = client.http.get("/", headers={"Content-Type": "text/plain"})
    assert r.status_code == 200


def _event(path: str) -> dict:
    return {"resource": "/", "path": "/", "httpMethod": "GET", "headers": {},
            "multiValueHeaders": {}, "queryStringParameters": None,
            "multiValueQueryStringParameters": None, "pathParameters": None,
            "stageVariables": None, "body": None, "isBase64Encoded": False,
            "requestContext": {"resourcePath": "/", "httpMethod": "GET", "path": path,
                               "stage": "api"}}


class _Context:
    aws_request_id = "test"
    function_name = "gpujobs"


@pytest.mark.usefixtures("services")
def test_the_stage_root_without_its_slash_redirects_so_relative_links_resolve():
    answer = app.app(_event("/api"), _Context())
    assert answer["statusCode"] == 301
    assert answer["headers"]["Location"] == "api/"
    page = app.app(_event("/api/"), _Context())
    assert page["statusCode"] == 200 and not page.get("isBase64Encoded")
    assert page["body"].startswith("<!doctype html>")


# -- the files themselves ------------------------------------------------------
def _sources(ext: str):
    return [(p.name, p.read_text(encoding="utf-8")) for p in sorted(web.STATIC_DIR.glob(f"*.{ext}"))]


def test_no_module_parses_html_or_evaluates_strings():
    """User strings reach the page only as text (textContent, text nodes)."""
    sink = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
                      r"createContextualFragment|DOMParser|setAttribute\(\s*['\"](style|on)")
    for name, text in _sources("js"):
        assert not sink.search(text), f"{name}: {sink.search(text).group(0)}"


def test_nothing_is_loaded_from_another_origin_and_nothing_is_inline():
    for ext in ("html", "css", "js"):
        for name, text in _sources(ext):
            # SVG's namespace is a name (createElementNS), never fetched
            text = text.replace("'http://www.w3.org/2000/svg'", "''")
            assert not re.search(r"(?<![\w.])(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
    html = (web.STATIC_DIR / web.INDEX).read_text(encoding="utf-8")
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline script"
    assert "<style" not in html and " style=" not in html and " on" + "click=" not in html


def test_resubmit_sends_back_exactly_the_members_a_create_accepts():
    """spec.js CREATE_FIELDS, the members of a job's spec the job page's
    Resubmit sends back to POST /v1/jobs, are JOB_CREATE's properties: a
    member added to the create body is resubmitted too, and nothing else is."""
    text = (web.STATIC_DIR / "spec.js").read_text(encoding="utf-8")
    listed = re.search(r"CREATE_FIELDS = \[([^\]]*)\]", text)
    assert listed, "spec.js has no CREATE_FIELDS"
    assert sorted(re.findall(r"'([a-z_]+)'", listed.group(1))) == sorted(schemas.JOB_CREATE["properties"])


LIFECYCLE_SCRIPT = """
import { exitText, decisionText, attemptText, timeLeftText } from './story.js';
import { createBody, retryPolicyText, limitsLines } from './spec.js';
const spec = { command: ['x'], ranks: 4, max_attempts: 3, max_runtime_s: 14400,
  warn_before_s: 300, warn_signal: 'SIGUSR1', max_pending_s: 1800, checkpoint_dir: '/c',
  retry: { rules: [{ exit_codes: [42], action: 'fail' },
                   { reasons: ['node_lost'], action: 'retry_uncounted' }],
           max_uncounted_retries: 10 } };
const exit = { reason: 'rank_failed', exit_code: 1, rank: 3, node_id: 'node-2',
  decision: 'rank_failed (rank 3, exit code 1): not retried (rule 1 says fail)' };
const now = Date.parse('2025-01-31T12:48:00Z');
console.log(JSON.stringify({
  policy: retryPolicyText(spec), defaults: retryPolicyText({}), limits: limitsLines(spec),
  exit: exitText(exit), decision: decisionText(exit),
  attempt: attemptText({ attempt: 3, uncounted_retries: 1, spec }),
  running: timeLeftText({ state: 'RUNNING', spec, started_at: '2025-01-31T12:00:00Z' }, now),
  pending: timeLeftText({ state: 'PENDING', spec, pending_since: '2025-01-31T12:36:00Z' }, now),
  body: Object.keys(createBody({ ...spec, uncounted_retries: 1, id: 'job_x' })).sort(),
}));
"""


def test_the_job_page_says_the_lifecycle_as_describe_does(tmp_path):
    """story.js and spec.js (pure functions) run under node (the machine's
    Node.js, as the browser tests use its Chromium):
    the retry policy, the limits, what is left and the exit's decision in the
    words `gpujobs describe` uses (gpujobs_client/lifecycle.py)."""
    said = run_under_node(tmp_path, LIFECYCLE_SCRIPT)
    assert said["policy"] == ("exit 42 → fail; node_lost → retry, not counted; then defaults "
                              "(infra causes not counted, up to 10)")
    assert said["defaults"] == "defaults (infra causes not counted, up to 10)"
    assert said["limits"] == ["max runtime 4 h per attempt (warning SIGUSR1 5 min before)",
                              "max pending 30 min"]
    assert said["exit"] == "rank_failed: rank 3 on node-2 exited with code 1"
    assert said["decision"] == "not retried (rule 1 says fail)"
    assert said["attempt"] == "3 (2 counted of max 3, 1 not counted)"
    assert said["running"] == "times out in 3 h 12 min"
    assert said["pending"] == "gives up waiting in 18 min"
    assert said["body"] == sorted(["command", "ranks", "max_attempts", "max_runtime_s",
                                   "warn_before_s", "warn_signal", "max_pending_s",
                                   "checkpoint_dir", "retry"])


PREEMPTION_SCRIPT = """
import { exitText, decisionText, cordonText } from './story.js';
const given = JSON.parse(process.argv[2]);
console.log(JSON.stringify({
  exits: given.exits.map((e) => [exitText(e), decisionText(e)]),
  cordons: given.cordons.map(cordonText), none: cordonText(null),
}));
"""


def test_the_dashboard_says_a_preemption_and_a_cordon(tmp_path):
    """story.js under node with what the server writes (domain/retry.py's
    decision, domain/nodes.py's cordon): a preempted attempt's detail and
    decision, cut after the whole cause as `gpujobs describe` cuts it
    (lifecycle.decision_rest), though the drain's reason holds ': ' and
    parentheses; a cordon's reason, who and drain mode."""

    from chalicelib.domain import nodes, retry
    from chalicelib.domain.spec import JobSpec
    from gpujobs_client import lifecycle
    spec = JobSpec(command=("x",), ranks=1)
    exits = []
    for why in ("bad ECC", "GPU 3 (ECC: double-bit) failing"):
        e = {"reason": "preempted", "exit_code": None, "node_id": "n1",
             "detail": f"node n1 drained: {why}"}
        exits.append({**e, "decision": retry.decide(spec, e, attempt=1, uncounted=0).text})
    cordons = [nodes.cordon_of("bad ECC", "ops-oncall", "2025-01-31T12:00:00.000Z", nodes.STOP),
               nodes.cordon_of(nodes.auto_cordon_reason(3, 2, 3600), nodes.AUTO,
                               "2025-01-31T12:00:00.000Z", auto=True),
               nodes.cordon_of("retire", "ops-oncall", "2025-01-31T12:00:00.000Z", nodes.WAIT)]
    said = run_under_node(tmp_path, PREEMPTION_SCRIPT, {"exits": exits, "cordons": cordons})
    assert said["exits"][0] == ["preempted: node n1 drained: bad ECC",
                                "retried, not counted (uncounted retry 1 of 10)"]
    assert said["exits"][1][0] == "preempted: node n1 drained: GPU 3 (ECC: double-bit) failing"
    for e, (_, decision) in zip(exits, said["exits"]):
        assert decision == lifecycle.decision_rest(e) == \
            "retried, not counted (uncounted retry 1 of 10)"
    assert said["cordons"] == [
        {"reason": "bad ECC", "who": "by ops-oncall",
         "mode": "drained: its jobs were preempted and requeued"},
        {"reason": "auto-cordoned: attempts of 3 jobs of 2 tenants ended rank_failed here within 3600 s",
         "who": "by gpujobs (automatic)", "mode": "cordoned: its jobs run on"},
        {"reason": "retire", "who": "by ops-oncall", "mode": "draining: its jobs may finish"}]
    assert said["none"] is None


PRIORITY_SCRIPT = """
import { exitText, decisionText, eventLabels, priorityText, preemptingOf, preemptingText,
  jobIdParts } from './story.js';
import { createBody, specPairs } from './spec.js';
const given = JSON.parse(process.argv[2]);
const waiting = { state: 'PENDING', preempting: given.preempting };
console.log(JSON.stringify({
  priority: [priorityText({ priority_class: 'urgent' }), priorityText({ priority: 5 }), priorityText(null)],
  preempting: [preemptingOf(waiting), preemptingText(waiting),
    preemptingOf({ ...waiting, state: 'SCHEDULED' }), preemptingOf({ state: 'PENDING', preempting: null })],
  labels: eventLabels('preempting', { attempt: 1, jobs: given.preempting.jobs }),
  victim: [exitText(given.exit), decisionText(given.exit)],
  parts: jobIdParts(given.exit.detail), none: jobIdParts(null), plain: jobIdParts('no job here'),
  resubmitted: createBody({ command: ['x'], ranks: 1, priority_class: 'urgent', preempting: {} }),
  spec: specPairs({ priority_class: 'urgent', priority: 0 }).map(([k]) => k),
}));
"""


def test_the_dashboard_says_a_priority_class_and_a_preemption(tmp_path):
    """story.js and spec.js under node with what the server writes: a job's
    class and priority as `gpujobs describe` says them, the preemption a
    PENDING job waits on (none once placed), the ``preempting`` event's jobs
    left to a line of their own, the victim's exit (detail "by job_X,
    priority class urgent") and decision (domain/retry.py), the job ids in
    free text cut out so the page links them, and Resubmit keeping the class."""

    from chalicelib.domain import retry
    from chalicelib.domain.spec import JobSpec
    urgent, victim, other = ("job_01JABCDEFGHJKMNPQRSTVWXYZ0", "job_01JABCDEFGHJKMNPQRSTVWXYZ1",
                             "job_01JABCDEFGHJKMNPQRSTVWXYZ2")
    spec = JobSpec(command=("x",), ranks=1)
    exit_ = {"reason": "preempted", "exit_code": None,
             "detail": f"by {urgent}, priority class urgent"}
    exit_["decision"] = retry.decide(spec, exit_, attempt=1, uncounted=0).text
    preempting = {"jobs": [victim, other], "at": "2025-01-31T12:00:00.000Z", "class": "urgent"}
    said = run_under_node(tmp_path, PRIORITY_SCRIPT, {"exit": exit_, "preempting": preempting})
    assert said["priority"] == ["class urgent, priority 0", "class default, priority 5",
                                "class default, priority 0"]
    assert said["preempting"] == [{"jobs": [victim, other], "cls": "urgent",
                                   "at": "2025-01-31T12:00:00.000Z"},
                                  f"preempting {victim}, {other} (urgent)", None, None]
    assert said["labels"] == ["attempt 1"], "the jobs: a line of their own, linked"
    assert said["victim"] == [f"preempted: by {urgent}, priority class urgent",
                              "retried, not counted (uncounted retry 1 of 10)"]
    assert said["parts"] == ["by ", {"job": urgent}, ", priority class urgent"]
    assert said["none"] == [] and said["plain"] == ["no job here"]
    assert said["resubmitted"] == {"command": ["x"], "ranks": 1, "priority_class": "urgent"}
    assert "priority_class" not in said["spec"], "said in the facts above the spec"


ARRAYS_SCRIPT = """
import { countsText, listText, arraySettingsText, childOf, dependenciesOf, waitingFor, IndexGrid,
  tally, agrees, cellTitle } from './arrays.js';
import { exitText } from './story.js';
import { createBody } from './spec.js';
const given = JSON.parse(process.argv[2]);
// an array of 1,200 indexes, 1,100 made, the first 700 ended; pages of 500 by token
const kids = Array.from({ length: 1100 }, (_, i) => ({ id: `c${i}`, array_index: i,
  state: i < 700 ? 'SUCCEEDED' : 'PENDING' }));
const asked = [];
const list = async (token) => {
  asked.push(token);
  const from = token ? Number(token) : 0;
  return { jobs: kids.slice(from, from + 500), next_page_token: from + 500 < kids.length ? String(from + 500) : null };
};
const byState = () => {
  const c = { PENDING: 100, RUNNING: 0, SUCCEEDED: 0, FAILED: 0, CANCELLED: 0 };
  for (const k of kids) c[k.state === 'SCHEDULED' ? 'RUNNING' : k.state] += 1;
  return c;
};
const parent = () => ({ state: 'RUNNING', array: { size: 1200, materialized: 1100, counts: byState() } });
const grid = new IndexGrid(1200, list);
const walks = [];
const walk = async () => { asked.length = 0; const did = await grid.refresh(parent()); walks.push([did, [...asked]]); };
await walk(); await walk();
kids[800].state = 'SCHEDULED'; await walk(); await walk();
kids[800].state = 'RUNNING'; await walk(); await walk();
// the counts say index 900 ended before the listing (an index, read eventually) does
kids[900].state = 'SUCCEEDED';
const ahead = parent();
kids[900].state = 'PENDING';
const lag = [];
for (const listed of ['PENDING', 'SUCCEEDED', 'SUCCEEDED']) {
  kids[900].state = listed;
  asked.length = 0;
  lag.push([await grid.refresh(ahead), [...asked], grid.cells[900].state]);
}
// an array of 5 cancelled with 2 made: the 3 never made are its cancelled too
const early = new IndexGrid(5, async () => ({ jobs: [0, 1].map((i) => ({ id: `e${i}`, array_index: i,
  state: 'CANCELLED' })), next_page_token: null }));
const cancelled = { state: 'CANCELLED', array: { size: 5, materialized: 2, counts: { PENDING: 0, RUNNING: 0,
  SUCCEEDED: 0, FAILED: 0, CANCELLED: 5 } } };
await early.refresh(cancelled);
const endedEarly = { tally: tally(early.cells), agrees: agrees(cancelled.array, early.cells),
  never: early.cells.filter((c) => c.never).length, again: await early.refresh(cancelled) };
const waiting = { state: 'PENDING', waiting_for: [given.a], pending_reason: given.reason,
  spec: { depends_on: [{ job_id: given.a, condition: 'succeeded' }, { job_id: given.b, condition: 'ended' }] } };
const failed = { state: 'FAILED', waiting_for: [given.a], exit: given.failed, spec: waiting.spec };
console.log(JSON.stringify({
  counts: given.views.map(countsText), list: given.views.map(listText),
  settings: [arraySettingsText({ size: 6, max_parallel: 2, env: { SEED: ['1'] } }, given.views[0]),
    arraySettingsText({ size: 6, max_failed_indexes: 0 }, given.views[1]),
    arraySettingsText({ size: 1200, max_parallel: 1200, max_failed_indexes: 3 }, { size: 1200, materialized: 1200 })],
  ended: [exitText(given.final), exitText(given.failed)],
  deps: [dependenciesOf(waiting), dependenciesOf(failed)], waitingFor: [waitingFor(waiting), waitingFor(failed)],
  child: [childOf({ parent_id: given.a, array_index: 3, spec: { env: { GPUJOBS_ARRAY_SIZE: '6' } } }), childOf({})],
  walks, lag, tally: tally(grid.cells), agrees: agrees(parent().array, grid.cells),
  titles: [cellTitle(3, 'RUNNING'), cellTitle(5, 'NOT_MADE'), cellTitle(4, 'CANCELLED', true)],
  endedEarly,
  body: Object.keys(createBody({ command: ['x'], ranks: 1, depends_on: [], array: { size: 2 }, waiting_for: [] })).sort(),
}));
"""


def test_the_dashboard_says_dependencies_and_arrays(tmp_path):
    """arrays.js and story.js under node with what the server writes
    (domain/arrays.py's counts and exits, domain/dependencies.py's waiting
    reason and dependency_failed exit): an array's counts and settings, the
    jobs list's "array 7/20 done", each dependency's status, a child's place;
    and the index grid's loader asking for the children only when they may
    have changed, from the first page holding an index not ended, and again
    while its cells and the counts disagree (the listing lags behind)."""

    from chalicelib.domain import arrays, dependencies as deps
    from chalicelib.domain.spec import JobSpec
    from chalicelib.domain.states import JobState
    a, b = "job_01JABCDEFGHJKMNPQRSTVWXYZ0", "job_01JABCDEFGHJKMNPQRSTVWXYZ1"
    spec = JobSpec.parse({"command": ["x"], "ranks": 1,
                          "array": {"size": 6, "max_failed_indexes": 0},
                          "depends_on": [{"job_id": a}]})
    running = arrays.Counts(materialized=4, placed=2, succeeded=1, failed=1)
    done = arrays.Counts(materialized=6, succeeded=5, failed=1)
    views = [{"size": 6, "materialized": c.materialized, "counts": c.by_state(6)}
             for c in (running, done)]
    _, final = arrays.final(spec.array, arrays.Counts(materialized=4, failed=1,
                                                                     succeeded=3), False)
    given = {"a": a, "b": b, "views": views, "final": final,
             "reason": deps.waiting_reason(spec, [a]),
             "failed": deps.failed_exit(deps.Dependency(a), JobState.FAILED)}
    said = run_under_node(tmp_path, ARRAYS_SCRIPT, given)
    assert said["counts"] == ["2 of 6 indexes done: 1 succeeded, 1 failed; 2 scheduled or "
                              "running, 2 pending",
                              "6 of 6 indexes done: 5 succeeded, 1 failed"]
    assert said["list"] == ["array 2/6 done, 1 failed", "array 6/6 done, 1 failed"]
    assert said["settings"] == [
        "6 indexes, at most 2 at once; 4 made so far; env by index: SEED (values are not shown)",
        "6 indexes, the array fails at the first index that fails",
        "1,200 indexes, the array fails once more than 3 indexes fail"]
    assert said["ended"] == [
        "max_failed_indexes: 1 indexes failed, more than max_failed_indexes 0; 3 of 6 indexes "
        "succeeded, 1 failed, 2 cancelled (2 never started)",
        f"dependency_failed: {a} ended FAILED; this job needed it to succeed"]
    assert said["deps"] == [
        [{"job": a, "condition": "succeeded", "needs": "to succeed", "status": "waiting"},
         {"job": b, "condition": "ended", "needs": "to end, however it ends", "status": "met"}],
        [{"job": a, "condition": "succeeded", "needs": "to succeed", "status": "never met"},
         {"job": b, "condition": "ended", "needs": "to end, however it ends", "status": "met"}]]
    assert said["waitingFor"] == [[a], []]
    assert said["child"] == [{"parent": a, "index": 3, "size": 6}, None]
    assert said["walks"] == [
        [True, [None, "500", "1000"]],  # the first time: every page
        [False, []],  # nothing changed
        [True, ["500", "1000"]],  # index 800 placed: from its page, not the first
        [True, ["500", "1000"]],  # SCHEDULED: asked again, it runs without the counts moving
        [True, ["500", "1000"]],
        [False, []]]
    assert said["lag"] == [[True, ["500", "1000"], "PENDING"],  # not yet: asked again
                           [True, ["500", "1000"], "SUCCEEDED"],  # caught up
                           [False, [], "SUCCEEDED"]]
    assert said["tally"] == {"NOT_MADE": 100, "PENDING": 398, "SCHEDULED": 0, "RUNNING": 1,
                             "SUCCEEDED": 701, "FAILED": 0, "CANCELLED": 0}
    assert said["agrees"] is True
    assert said["titles"] == ["index 3: running", "index 5: not started yet (pending)",
                              "index 4: never started (cancelled)"]
    # an array ended early: its never-made indexes are cancelled cells, as counted, so
    # the grid agrees with the counts and is not asked again
    assert said["endedEarly"]["never"] == 3 and said["endedEarly"]["agrees"] is True
    assert said["endedEarly"]["tally"]["CANCELLED"] == 5 and said["endedEarly"]["again"] is False
    assert said["body"] == ["array", "command", "depends_on", "ranks"]


@pytest.mark.parametrize("path", ["/", "/static/app.js", "/static/style.css"])
def test_head_answers_what_get_does_without_the_body(client, path):
    """HEAD / was 405 (issue 29): the pages answer HEAD like GET, no body."""
    get = client.http.get(path)
    head = client.http.head(path)
    assert head.status_code == 200 and head.body == b""
    assert head.headers["Content-Length"] == str(len(get.body))
    for name in ("Content-Type", "ETag", "Content-Security-Policy", "Cache-Control"):
        assert head.headers[name] == get.headers[name], name
    again = client.http.head(path, headers={"If-None-Match": get.headers["ETag"]})
    assert again.status_code == 304 and again.body == b""


def test_head_of_a_missing_file_is_a_404_without_a_body(client):
    r = client.http.head("/static/nope.js")
    assert r.status_code == 404 and r.body == b""


LOGS_SCRIPT = """
import { LogFollower, TAIL, PAGE, SHOWN } from './logs.js';
import { normaliseLogPage } from './api.js';
// /logs as the API answers it: lines by (time, rank, seq), page_size (default
// 1,000) at a time; a token is the position after the page's last line
// (next_page_token while more follow, follow_token always); tail the newest;
// a token of another attempt refused with a 400
const server = { attempt: 1, lines: [], asked: [], sent: 0, t: Date.UTC(2026, 0, 1), seq: {} };
const add = (n, { sameMs = false, rank = null, back = 0 } = {}) => {
  for (let i = 0; i < n; i++) {
    if (!sameMs) server.t += 1;
    const k = server.lines.length;
    const r = rank == null ? k % 2 : rank;
    server.seq[r] = (server.seq[r] || 0) + 10;
    server.lines.push({ rank: r, stream: 'stdout', time: new Date(server.t - back).toISOString(),
      seq: server.seq[r], line: `line ${k} of attempt ${server.attempt}`, id: `${server.attempt}-${k}` });
  }
};
const key = (l) => [l.time, l.rank, l.seq];
const after = (a, b) => { for (let i = 0; i < 3; i++) { if (a[i] !== b[i]) return a[i] > b[i]; } return false; };
const ordered = () => [...server.lines].sort((x, y) => (after(key(x), key(y)) ? 1 : after(key(y), key(x)) ? -1 : 0));
const read = async (query) => {
  server.asked.push(query);
  if (server.gone) return null;
  const list = ordered();
  let pos = null;
  if (query.page_token) {
    const t = JSON.parse(query.page_token);
    if (t.attempt !== server.attempt) { const e = new Error('invalid_page_token'); e.status = 400; throw e; }
    pos = t.pos;
  }
  let page, more = false;
  if (query.tail) page = list.slice(-query.tail);
  else {
    const rest = list.filter((l) => pos == null || after(key(l), pos));
    const size = query.page_size || 1000;
    page = rest.slice(0, size);
    more = rest.length > size;
  }
  server.sent += page.length;
  const at = page.length ? key(page[page.length - 1]) : pos;
  const token = JSON.stringify({ attempt: server.attempt, pos: at });
  return normaliseLogPage({ job_id: 'j', attempt: server.attempt, lines: page,
    next_page_token: more ? token : null, follow_token: token });
};
const f = new LogFollower(read);
const texts = () => f.lines.map((l) => l.text);
const out = { TAIL, PAGE, SHOWN };
add(5000);
await f.refresh();
out.caughtUp = { requests: f.requests, sent: server.sent, shown: texts(), behind: f.behind };
// a running job: 3 lines between refreshes, two of them in one millisecond
let before = server.sent;
const running = [];
for (let i = 0; i < 10; i++) {
  add(1); add(2, { sameMs: true });
  const v = f.version;
  await f.refresh();
  running.push([server.sent - before, f.version !== v]);
  before = server.sent;
}
out.running = running;
// nothing new: nothing sent
const idle = [];
for (let i = 0; i < 5; i++) { const v = f.version; await f.refresh(); idle.push([server.sent - before, f.version !== v]); before = server.sent; }
out.idle = idle;
// a burst of 1,200 lines: followed page by page, each line once
add(1200);
const burst = [];
do { await f.refresh(); burst.push(server.sent - before); before = server.sent; } while (f.behind);
out.burst = burst;
out.afterBurst = texts();
out.allLines = ordered().map((l) => l.line); // as the API orders them
out.unique = new Set(f.lines.map((l) => l.id)).size === f.lines.length;
out.queries = server.asked.map((q) => Object.keys(q).sort().join(','));
// a new attempt: the old token is refused, the view starts afresh from its tail
server.attempt = 2; server.lines = []; server.seq = {}; add(7);
await f.refresh();
out.attempt2 = texts();
server.gone = true; await f.refresh();
out.gone = f.lines;
console.log(JSON.stringify(out));
"""


def test_the_dashboard_reads_only_new_log_lines(tmp_path):
    """logs.js under node against a /logs that answers as the API does (lines
    by time, rank, seq; tokens as positions, a follow token on every page;
    ``tail`` the newest). Invariant: the job page's log view asks once for
    the latest TAIL lines, then each refresh makes one request with the
    token it holds: it follows next_page_token while more follow, then polls
    the follow token, which answers with new lines only. It never reads the
    whole log, and never a line twice (a quiet log costs nothing a refresh;
    it re-downloaded 1,000 lines every 1.5 s, then its last millisecond). It
    shows each line once, in order, the newest SHOWN of them; a new attempt
    (its token refused) starts afresh from its tail."""

    said = run_under_node(tmp_path, LOGS_SCRIPT)
    caught = said["caughtUp"]
    every = [f"line {k} of attempt 1" for k in range(5000)]
    assert caught == {"requests": 1, "sent": said["TAIL"], "shown": every[-said["TAIL"]:],
                      "behind": False}, "the latest lines at once, and nothing more to read"
    assert said["running"] == [[3, True]] * 10, "the new lines only"
    assert said["idle"] == [[0, False]] * 5, "a quiet log: nothing sent again"
    assert said["burst"] == [said["PAGE"], said["PAGE"], 200]
    # from the tail's first line on, every line once, in order (fewer than SHOWN)
    assert said["afterBurst"] == said["allLines"][5000 - said["TAIL"]:] and said["unique"]
    queries = said["queries"]
    assert queries[0] == "tail"
    assert set(queries[1:]) == {"page_size,page_token"}, queries
    assert said["attempt2"] == [f"line {k} of attempt 2" for k in range(7)]
    assert said["gone"] is None
