"""`gpujobs` for pipelines and sweeps (issue 27) against the fake server: the
--after, --after-ok, --after-notok, --array, --array-env and
--max-failed-indexes options of submit, `list --parent`, and what describe,
list, watch and cancel say of dependencies and arrays."""
from __future__ import annotations

import json
import re

import pytest

from .test_cli import panel


def json_out(result):
    return json.loads(result.stdout)


def sent_body(fake, i: int = -1) -> dict:
    return fake.sent("POST", "/v1/jobs")[i].json()


def table(stdout: str) -> list[list[str]]:
    """A table's rows, split on runs of two spaces or more."""
    return [re.split(r" {2,}", line.strip()) for line in stdout.splitlines() if line.strip()]


# -- submit: dependencies ---------------------------------------------------------------
def test_submit_after_flags_send_depends_on_and_say_what_it_waits_for(run, fake):
    prep, train = fake.add_job(name="prepare"), fake.add_job(name="train")
    r = run("submit", "--ranks", "1", "--name", "evaluate", "--after", train["id"],
            "--after-ok", prep["id"], "--", "python", "eval.py")
    assert r.exit_code == 0, r.output
    assert sent_body(fake)["depends_on"] == [
        {"job_id": prep["id"], "condition": "succeeded"},
        {"job_id": train["id"], "condition": "ended"}]
    lines = r.stdout.splitlines()
    assert f"  after: {prep['id']} to succeed, {train['id']} to end" in lines
    assert f"  pending reason: waiting for {prep['id']} to succeed (and 1 more)" in lines
    r = run("submit", "--ranks", "1", "--after-notok", train["id"], "--", "python", "alert.py")
    assert sent_body(fake)["depends_on"] == [{"job_id": train["id"], "condition": "failed"}]
    assert f"  pending reason: waiting for {train['id']} to fail" in r.stdout.splitlines()


def test_a_dependency_already_failed_ends_the_job_at_once_and_submit_says_so(run, fake):
    train = fake.add_job(name="train")
    fake.end(train["id"], "FAILED", exit_code=3)
    r = run("submit", "--ranks", "1", "--after-ok", train["id"], "--", "python", "export.py")
    assert r.exit_code == 0, r.output
    assert re.search(r"^Submitted: job_\d+ FAILED$", r.stdout, re.M)
    assert (f"  ended FAILED: dependency_failed, {train['id']} ended FAILED; this job needed it "
            "to succeed") in r.stdout.splitlines()


def test_the_servers_400_on_a_dependency_says_which_flag_named_it(run, fake):
    mine = fake.add_job()
    theirs = fake.add_job(tenant="other")
    r = run("submit", "--ranks", "1", "--after", mine["id"], "--after-ok", theirs["id"], "--",
            "x")
    assert r.exit_code == 1
    error, hint = r.stderr.strip().splitlines()
    assert error == (f"Error: Invalid argument (400 invalid_argument): job {theirs['id']} not "
                     "found: a dependency must be an existing job of the same tenant "
                     "[field: depends_on.0.job_id]")
    assert hint == (f"Hint: each --after, --after-ok and --after-notok (--after-ok "
                    f"{theirs['id']}) must name an existing job of yours, once (`gpujobs list` "
                    "shows them)")
    assert len(fake.jobs) == 2
    j = run("-o", "json", "submit", "--ranks", "1", "--after-ok", "job_nope", "--", "x")
    err = json.loads(j.stderr)
    assert (err["exit_code"], err["error"]["field"]) == (1, "depends_on.0.job_id")
    assert "--after-ok job_nope" in err["error"]["hint"]


# -- submit: arrays -----------------------------------------------------------------------
@pytest.mark.parametrize("spec, array", [
    ("0-99%8", {"size": 100, "max_parallel": 8}),
    ("100%8", {"size": 100, "max_parallel": 8}),
    ("0-99", {"size": 100}),
    ("4", {"size": 4}),
])
def test_submit_array_sends_its_size_and_parallelism(run, fake, spec, array):
    r = run("submit", "--ranks", "1", "--array", spec, "--dry-run", "--", "python", "train.py")
    assert r.exit_code == 0, r.output
    assert json_out(r)["array"] == array
    assert fake.requests == []


def test_submit_a_sweep_with_values_by_index_and_a_failure_budget(run, fake):
    r = run("submit", "--ranks", "1", "--name", "sweep", "--array", "0-3%2",
            "--array-env", "LR=0.1,0.01,0.001,0.0001", "--array-env", "SEED=1,2,3,4",
            "--max-failed-indexes", "1", "--", "python", "train.py")
    assert r.exit_code == 0, r.output
    assert sent_body(fake)["array"] == {
        "size": 4, "max_parallel": 2, "max_failed_indexes": 1,
        "env": {"LR": ["0.1", "0.01", "0.001", "0.0001"], "SEED": ["1", "2", "3", "4"]}}
    parent = next(j for j in fake.jobs.values() if j["array"])
    lines = r.stdout.splitlines()
    assert lines[0] == f"Submitted: {parent['id']} PENDING"
    assert ("  array: 4 indexes (0-3), at most 2 at once, fails once more than 1 failed; "
            "env LR, SEED") in lines
    assert lines[-1] == f"  next: gpujobs list --parent {parent['id']}"


def test_the_flags_set_the_files_array_and_replace_its_depends_on(run, fake, tmp_path):
    prep, other = fake.add_job(), fake.add_job()
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"command: [python, train.py]\nranks: 1\n"
                    f"array: {{size: 3, max_parallel: 1, env: {{LR: ['1', '2', '3']}}}}\n"
                    f"depends_on: [{{job_id: {other['id']}}}]\n")
    r = run("submit", "-f", str(spec), "--array", "0-2%3", "--array-env", "SEED=7,8,9",
            "--after-ok", prep["id"], "--dry-run")
    assert r.exit_code == 0, r.output
    body = json_out(r)
    assert body["array"] == {"size": 3, "max_parallel": 3,
                             "env": {"LR": ["1", "2", "3"], "SEED": ["7", "8", "9"]}}
    assert body["depends_on"] == [{"job_id": prep["id"], "condition": "succeeded"}]
    kept = json_out(run("submit", "-f", str(spec), "--max-failed-indexes", "1", "--dry-run"))
    assert kept["array"]["max_failed_indexes"] == 1 and kept["array"]["size"] == 3
    assert kept["depends_on"] == [{"job_id": other["id"]}], "no --after: the file's"


@pytest.mark.parametrize("args, message", [
    (["--array", "1-100"], "'1-100' starts at 1, but an array's indexes always start at 0: "
                           "write 0-100 for 101 indexes, or 0-99 (or 100) for 100"),
    (["--array", "0"], "has 0 indexes"),
    (["--array", "0-99%0"], "%0 is not 1 to 10,000 at once"),
    (["--array", "10001"], "an array has 1 to 10,000"),
    (["--array", "1..5"], "is not an array range"),
    (["--array-env", "LR=1,2"], "needs --array (or array.size in --file)"),
    (["--max-failed-indexes", "1"], "needs --array"),
    (["--array", "0-2", "--array-env", "LR=1,2"],
     "LR has 2 values; the array has 3 indexes (0-2), one value each"),
    (["--array", "3", "--array-env", "1LR=1,2,3"], "not an environment variable name"),
    (["--array", "3", "--array-env", "LR"], "not NAME=V0,V1"),
    (["--array", "3", "--max-failed-indexes", "3"], "3 is not less than the array's 3 indexes"),
    (["--max-failed-indexes", "-1", "--array", "3"], "-1"),
    (["--after", "job_a", "--after-ok", "job_a"], "job_a is named twice (succeeded and ended)"),
])
def test_bad_pipeline_flags_are_usage_errors_naming_the_flag(run, fake, args, message):
    r = run("submit", "--ranks", "1", *args, "--", "x")
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.stderr.split()), r.stderr
    assert fake.requests == []


def test_submit_help_documents_pipelines_and_sweeps(run):
    out = " ".join(run("submit", "--help").stdout.split())
    for text in ("--after JOB", "--after-ok JOB", "--after-notok JOB", "--array 0-N[%P]",
                 "--array-env NAME=V0,V1,...", "--max-failed-indexes N", "afterok", "afterany",
                 "dependency_failed", "GPUJOBS_ARRAY_INDEX", "0-99%8, 100%8 (the same) or 0-99",
                 "start at 0", "gpujobs list --parent JOB", "--after-ok $PREP"):
        assert text in out, text


# -- list --parent ----------------------------------------------------------------------------
def sweep(fake, size=6, **array):
    parent = fake.add_job(name="sweep", array={"size": size, **array})
    return parent, fake.children(parent["id"])


def test_list_parent_shows_the_indexes_in_order_with_their_index(run, fake):
    parent, kids = sweep(fake)
    fake.place(kids[2]["id"], ["node-1"])
    fake.end(kids[1]["id"], "FAILED", exit_code=1)
    r = run("list", "--parent", parent["id"])
    assert r.exit_code == 0, r.output
    rows = table(r.stdout)
    assert rows[0] == ["INDEX", "ID", "NAME", "STATE", "RANKS", "ATTEMPT", "HEALTH", "CREATED"]
    assert [(x[0], x[1], x[2], x[3]) for x in rows[1:]] == [
        (str(k["array_index"]), k["id"], f"sweep[{k['array_index']}]", k["state"])
        for k in kids]
    assert [x[3] for x in rows[1:4]] == ["PENDING", "FAILED", "RUNNING"]
    assert fake.sent("GET", "/v1/jobs")[0].query["parent"] == [parent["id"]]
    failed = table(run("list", "--parent", parent["id"], "--state", "failed").stdout)
    assert [x[0] for x in failed[1:]] == ["1"]
    out = json_out(run("list", "--parent", parent["id"], "-o", "json"))
    assert [j["array_index"] for j in out["jobs"]] == list(range(6))


def test_list_parent_offers_the_rest_with_the_same_parent(run, fake):
    parent, kids = sweep(fake)
    r = run("list", "--parent", parent["id"], "--limit", "2")
    assert [x[0] for x in table(r.stdout)[1:3]] == ["0", "1"]
    more = r.stdout.strip().splitlines()[-1]
    token = re.search(r"--page-token (\S+)", more).group(1)
    assert more == (f"More indexes: gpujobs list --parent {parent['id']} --page-token {token}  "
                    "(or --all)")
    rest = run("list", "--parent", parent["id"], "--page-token", token, "--all")
    assert [x[0] for x in table(rest.stdout)[1:]] == ["2", "3", "4", "5"]


def test_list_parent_of_no_array_or_of_none_made_yet(run, fake):
    plain = fake.add_job()
    r = run("list", "--parent", plain["id"])
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        f"Error: Invalid argument (400 invalid_argument): job {plain['id']} is not an array "
        "[field: parent]",
        "Hint: --parent takes an array's job id (one submitted with --array); `gpujobs list` "
        "shows your jobs"]
    assert run("list", "--parent", "job_nope").exit_code == 3
    prep = fake.add_job()
    waiting = fake.add_job(array={"size": 3}, depends_on=[{"job_id": prep["id"]}])
    assert run("list", "--parent", waiting["id"]).stdout == \
        f"No indexes of {waiting['id']} made yet.\n"
    assert run("list", "--parent", waiting["id"], "--state", "FAILED").stdout == \
        f"No FAILED indexes of {waiting['id']}.\n"


def test_list_shows_an_arrays_indexes_by_state_and_what_a_job_waits_for(run, fake):
    plain = fake.add_job(name="plain")
    head = table(run("list").stdout)[0]
    assert "INDEXES" not in head and "PENDING REASON" not in head, "as it was"
    parent, kids = sweep(fake, max_parallel=2)
    fake.place(kids[0]["id"], ["node-1"])
    waiting = fake.add_job(name="report", depends_on=[{"job_id": parent["id"],
                                                       "condition": "ended"}])
    rows = {x[0]: x for x in table(run("list").stdout)}
    assert rows["ID"][-2:] == ["INDEXES", "PENDING REASON"]
    assert rows[parent["id"]][-1] == "6: 5 pending, 1 running"
    assert rows[waiting["id"]][-1] == f"waiting for {parent['id']} to end"
    assert rows[plain["id"]][-1] == "2025-01-31 12:00:00Z"


# -- describe -----------------------------------------------------------------------------------
def test_describe_of_a_waiting_job_says_what_it_waits_for_and_each_dependency(run, fake):
    prep, train = fake.add_job(name="prepare"), fake.add_job(name="train")
    job = fake.add_job(depends_on=[{"job_id": prep["id"]},
                                   {"job_id": train["id"], "condition": "ended"}])
    fake.end(prep["id"], "SUCCEEDED")
    r = run("describe", job["id"])
    assert r.exit_code == 0, r.output
    rows = panel(r.stdout)
    assert rows["pending reason"] == f"waiting for {train['id']} to end"
    assert rows["waiting for"] == train["id"]
    assert rows["dependencies"] == (f"{prep['id']} to succeed: met | "
                                    f"{train['id']} to end: waiting")
    assert "parent" not in rows and "array" not in rows and "indexes" not in rows
    assert panel(run("get", job["id"]).stdout)["waiting for"] == train["id"]


def test_describe_of_a_job_whose_dependency_failed_says_which_and_why(run, fake):
    train = fake.add_job(name="train")
    export = fake.add_job(name="export", depends_on=[{"job_id": train["id"]}])
    fake.place(train["id"], ["node-1"])
    fake.end(train["id"], "FAILED", exit_code=3)
    r = run("describe", export["id"])
    assert r.exit_code == 0, r.output
    rows = panel(r.stdout)
    assert rows["state"] == "FAILED"
    assert rows["exit"] == (f"dependency_failed, {train['id']} ended FAILED; this job needed "
                            "it to succeed")
    assert rows["dependencies"] == f"{train['id']} to succeed: can no longer be met"
    assert "pending reason" not in rows and "waiting for" not in rows
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    at = next(i for i, ln in enumerate(lines) if re.search(r"finished +dependency_failed$", ln))
    assert lines[at + 1] == f"{train['id']} ended FAILED; this job needed it to succeed"


def test_describe_of_an_index_names_its_parent_and_index(run, fake):
    parent, kids = sweep(fake)
    rows = panel(run("describe", kids[3]["id"]).stdout)
    assert (rows["name"], rows["parent"], rows["index"]) == ("sweep[3]", parent["id"],
                                                             "3 of 0-5")
    assert "indexes" not in rows


def test_describe_of_an_array_counts_its_indexes_by_state(run, fake):
    parent, _ = sweep(fake, size=100, max_parallel=12, max_failed_indexes=2)
    for state in ["SUCCEEDED"] * 7 + ["FAILED"]:
        kid = next(k for k in fake.children(parent["id"]) if k["state"] == "PENDING")
        fake.place(kid["id"], ["node-1"])
        fake.end(kid["id"], state, exit_code=None if state == "SUCCEEDED" else 1)
    for kid in [k for k in fake.children(parent["id"]) if k["state"] == "PENDING"][:4]:
        fake.place(kid["id"], ["node-1"])
    r = run("describe", parent["id"])
    assert r.exit_code == 0, r.output
    rows = panel(r.stdout)
    assert rows["state"] == "RUNNING"
    assert rows["indexes"] == "100: 88 pending, 4 running, 7 succeeded, 1 failed | " \
                              "20 of 100 made so far"
    assert rows["array"] == ("100 indexes (0-99), at most 12 at once, fails once more than 2 "
                             "failed")
    assert rows["attempt"] == "none of its own (each index: max 1)"
    assert f"Its indexes: gpujobs list --parent {parent['id']}" in r.stdout


def test_describe_of_an_array_that_failed_fast_shows_its_exit_detail(run, fake):
    parent, kids = sweep(fake, size=10, max_parallel=3, max_failed_indexes=1)
    for kid in kids[:2]:
        fake.place(kid["id"], ["node-1"])
        fake.end(kid["id"], "FAILED", exit_code=1)
    rows = panel(run("describe", parent["id"]).stdout)
    assert rows["state"] == "FAILED"
    # 4 made (one more after the first failure), 2 cancelled on the second;
    # the 6 never made are counted cancelled, and said so
    assert rows["indexes"] == "10: 2 failed, 8 cancelled (6 never started)"
    assert rows["exit"] == ("max_failed_indexes, 2 indexes failed, more than "
                            "max_failed_indexes 1; 0 of 10 indexes succeeded, 2 failed, "
                            "8 cancelled (6 never started)")


# -- watch, submit --wait, cancel ---------------------------------------------------------------
def test_watch_of_a_waiting_job_says_what_it_waits_for_and_ends_with_why(run, fake):
    train = fake.add_job(name="train")
    export = fake.add_job(depends_on=[{"job_id": train["id"]}])
    r = run("watch", export["id"], "--interval", "0", "--timeout", "0")
    assert r.exit_code == 7
    assert f"waiting for {train['id']} to succeed" in r.stdout
    fake.on_get_job.append(lambda j: j["id"] == export["id"] and train["state"] == "PENDING"
                           and fake.end(train["id"], "FAILED", exit_code=3))
    r = run("watch", export["id"], "--interval", "0")
    assert r.exit_code == 8
    assert r.stdout.splitlines()[-1] == (f"Job finished: FAILED (dependency_failed: "
                                         f"{train['id']} ended FAILED; this job needed it to "
                                         "succeed)")


def test_watch_of_an_array_shows_its_indexes_until_it_ends(run, fake):
    parent, kids = sweep(fake, size=2)
    fake.place(kids[0]["id"], ["node-1"])
    r = run("watch", parent["id"], "--interval", "0", "--timeout", "0")
    assert r.exit_code == 7
    assert "indexes 2: 1 pending, 1 running" in r.stdout

    def finish(j):  # every index of an array read ends
        if j["array"] is not None:
            for k in fake.children(j["id"]):
                if k["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    fake.end(k["id"], "SUCCEEDED")
    fake.on_get_job.append(finish)
    r = run("submit", "--ranks", "1", "--array", "2", "--wait", "--interval", "0", "--",
            "true")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "Job finished: SUCCEEDED"
    r = run("watch", parent["id"], "--interval", "0")
    assert r.exit_code == 0 and "indexes 2: 2 succeeded" in r.stdout


def test_cancel_of_an_array_says_every_index_is_cancelled(run, fake):
    parent, kids = sweep(fake, size=3)
    fake.place(kids[0]["id"], ["node-1"])
    r = run("cancel", parent["id"], "--reason", "wrong grid")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1] == ("  every index is cancelled too (as intents); the array "
                                        "ends CANCELLED once they all have ended")
    assert fake.jobs[kids[0]["id"]]["cancel_requested_at"] is not None
    assert [fake.jobs[k["id"]]["state"] for k in kids[1:]] == ["CANCELLED", "CANCELLED"]
    fake.on_get_job.append(lambda j: j["id"] == kids[0]["id"] or fake.jobs[kids[0]["id"]][
        "state"] == "CANCELLED" or fake.end(kids[0]["id"], "CANCELLED"))
    r = run("cancel", parent["id"], "--wait", "--interval", "0")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == f"Job {parent['id']} is CANCELLED."
    rows = panel(run("describe", parent["id"]).stdout)
    assert rows["exit"] == "cancelled, 0 of 3 indexes succeeded, 3 cancelled"
