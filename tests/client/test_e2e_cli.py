"""The `gpujobs` CLI as a user runs it (a subprocess, `python -m
gpujobs_client.cli`) against the real local stack, started as the other
end-to-end tests start it and stopped by its own handle.

The stack runs with no agents (GPUJOBS_AGENTS=0), so jobs stay PENDING and a
cancel is carried out by the control plane at once. Commands that need running
jobs (ranks, watch, nodes, cancel --wait of a running job) are in
test_e2e_cli_agents.py, against a stack with real agents.
"""
from __future__ import annotations

import json

import pytest

from tests.support.cli import cli_runner

pytestmark = pytest.mark.e2e


@pytest.fixture
def gpujobs(stack, tmp_path):
    return cli_runner(stack.api, tmp_path / "xdg")


def submit_json(gpujobs, *args: str) -> dict:
    r = gpujobs("submit", "-o", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_health(gpujobs, stack):
    r = gpujobs("health")
    assert r.returncode == 0 and r.stdout.strip() == f"{stack.api}: ok"


def test_submit_then_get(gpujobs):
    r = gpujobs("submit", "--ranks", "2", "--gpu-type", "h100", "--name", "demo",
                "--label", "team=nlp", "--env", "SEED=1", "--", "python", "train.py",
                "--lr", "3e-4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Submitted: job_")
    job_id = r.stdout.split()[1]
    got = gpujobs("get", job_id, "-o", "json")
    assert got.returncode == 0
    job = json.loads(got.stdout)
    assert job["state"] == "PENDING"
    assert job["spec"]["command"] == ["python", "train.py", "--lr", "3e-4"]
    assert job["spec"]["ranks"] == 2 and job["spec"]["gpu_type"] == "h100"
    assert job["spec"]["labels"] == {"team": "nlp"} and job["spec"]["env"] == {"SEED": "1"}
    table = gpujobs("get", job_id)
    assert table.returncode == 0 and "demo" in table.stdout and "PENDING" in table.stdout


def test_a_repeated_submit_with_its_key_is_the_same_job(gpujobs):
    first = submit_json(gpujobs, "--ranks", "1", "--idempotency-key", "e2e-cli-key-1", "--",
                        "true")
    again = gpujobs("submit", "--ranks", "1", "--idempotency-key", "e2e-cli-key-1", "--", "true")
    assert again.returncode == 0
    assert again.stdout.startswith(f"Already submitted (same Idempotency-Key and body): "
                                   f"{first['id']}")
    other = gpujobs("submit", "--ranks", "2", "--idempotency-key", "e2e-cli-key-1", "--", "true")
    assert other.returncode == 1
    assert "Idempotency key reused (422 idempotency_key_reused)" in other.stderr


def test_list_all_follows_every_page(gpujobs):
    made = [submit_json(gpujobs, "--ranks", "1", "--name", f"page-{i}", "--", "true")["id"]
            for i in range(5)]
    r = gpujobs("list", "--all", "--page-size", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ids = [j["id"] for j in out["jobs"]]
    assert out["next_page_token"] is None
    assert len(ids) == len(set(ids))                 # each job once
    assert set(made) <= set(ids)                     # every job
    assert ids == sorted(ids, reverse=True)          # newest first
    limited = json.loads(gpujobs("list", "--limit", "2", "-o", "json").stdout)
    assert [j["id"] for j in limited["jobs"]] == ids[:2]
    assert limited["next_page_token"] is not None
    table = gpujobs("list", "--state", "pending")
    assert table.returncode == 0 and made[-1] in table.stdout


def test_cancel_wait_on_a_pending_job(gpujobs):
    job = submit_json(gpujobs, "--ranks", "1", "--", "sleep", "100")
    r = gpujobs("cancel", job["id"], "--reason", "e2e", "--wait", "--interval", "0.2",
                "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert f"Cancel accepted (202) for {job['id']}" in r.stdout
    assert f"Job {job['id']} is CANCELLED." in r.stdout
    final = json.loads(gpujobs("get", job["id"], "-o", "json").stdout)
    assert final["state"] == "CANCELLED" and final["cancel_reason"] == "e2e"
    again = gpujobs("cancel", job["id"], "-o", "json")  # a repeat is harmless
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "CANCELLED"
    # a cancelled job is terminal: watch shows it and ends at once, with
    # CANCELLED's own exit code (9), so a script can tell it from success
    watched = gpujobs("watch", job["id"], "--interval", "0")
    assert watched.returncode == 9 and "Job finished: CANCELLED" in watched.stdout


def test_attempts_of_a_job_never_placed(gpujobs):
    job = submit_json(gpujobs, "--ranks", "1", "--", "true")
    r = gpujobs("attempts", job["id"], "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"attempts": []}
    assert "No attempts yet" in gpujobs("attempts", job["id"]).stdout


def test_errors_from_the_real_server_are_readable_with_their_exit_codes(gpujobs, tmp_path):
    missing = gpujobs("get", "job_01JJ5D4Z7T3W9XKQ2M8N6P4R5S")
    assert missing.returncode == 3
    assert missing.stderr.startswith("Error: Not found (404 not_found):")
    spec = tmp_path / "bad.yaml"
    spec.write_text("ranks: 0\ncommand: [x]\n")
    bad = gpujobs("submit", "-f", str(spec), "-o", "json")
    assert bad.returncode == 1 and bad.stdout == ""
    err = json.loads(bad.stderr)["error"]
    assert err["code"] == "invalid_argument" and err["field"] == "ranks"
    assert gpujobs("list", GPUJOBS_TOKEN="not-a-token").returncode == 1
    forbidden = gpujobs("list", GPUJOBS_TOKEN="e2e-agent")
    assert forbidden.returncode == 1 and "403 forbidden" in forbidden.stderr


def test_another_tenant_cannot_see_the_job(gpujobs):
    job = submit_json(gpujobs, "--ranks", "1", "--", "true")
    assert gpujobs("get", job["id"], GPUJOBS_TOKEN="e2e-other").returncode == 3
    assert gpujobs("cancel", job["id"], GPUJOBS_TOKEN="e2e-other").returncode == 3


def test_the_config_file_is_used_when_nothing_else_is_set(gpujobs, stack):
    assert gpujobs("config", "set", "api_url", stack.api).returncode == 0
    assert gpujobs("config", "set", "token", "e2e-tenant").returncode == 0
    r = gpujobs("list", "--limit", "1", "-o", "json", GPUJOBS_API_URL="", GPUJOBS_TOKEN="")
    assert r.returncode == 0, r.stderr


def test_logs_with_a_since_the_server_refuses_exits_1_naming_since(gpujobs):
    """Invariant: a ``since`` outside its documented forms or bounds is the
    server's 400 naming ``since``, which the CLI shows and exits 1 for (it
    was exit 5: the server answered 500 to ``800000d``)."""
    job = submit_json(gpujobs, "--ranks", "1", "--", "true")
    for value in ("800000d", "0001-01-01T00:00:00Z", "\uff11\uff10m", "1e3m", "-5m"):
        r = gpujobs("logs", job["id"], "--since", value)
        assert r.returncode == 1, (value, r.returncode, r.stderr)
        assert "invalid_argument" in r.stderr and "[field: since]" in r.stderr, r.stderr
    r = gpujobs("-o", "json", "logs", job["id"], "--since", "800000d")
    assert r.returncode == 1 and json.loads(r.stderr)["error"]["field"] == "since"
    assert gpujobs("logs", job["id"], "--since", "10m").returncode == 0


def test_resubmit_sends_back_a_spec_the_real_server_takes_as_it_is(gpujobs, tmp_path):
    """Invariant: the real server's spec of a job, every create member set
    (limits, retry rules, the stall flags, heartbeat, dependencies, labels,
    env), is a body it accepts again: `resubmit` makes a new job whose spec
    equals the original's, and --with changes only what it names."""
    dep = submit_json(gpujobs, "--ranks", "1", "--", "true")
    job = submit_json(gpujobs, "--ranks", "2", "--name", "full", "--gpu-type", "h100",
                      "--max-attempts", "3", "--max-runtime", "1h", "--warn-before", "5m",
                      "--max-pending", "30m", "--on-stall", "restart",
                      "--heartbeat-interval", "2.5", "--retry-on", "exit:42=fail",
                      "--checkpoint-dir", "/tmp/ckpt", "--after", dep["id"],
                      "--label", "team=nlp", "--env", "SEED=1", "--", "python", "train.py")
    assert job["spec"]["on_stall"] == "restart"
    assert job["spec"]["heartbeat"]["interval_s"] == 2.5
    r = gpujobs("resubmit", job["id"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Submitted: job_")
    assert f"resubmitted from: {job['id']}, PENDING" in r.stdout
    new_id = r.stdout.split()[1]
    assert new_id != job["id"]
    again = json.loads(gpujobs("get", new_id, "-o", "json").stdout)
    assert again["spec"] == job["spec"]
    changed = gpujobs("resubmit", job["id"], "-o", "json", "--with", "ranks=1",
                      "--with", "env.SEED=2", "--with", "depends_on=null")
    assert changed.returncode == 0, changed.stderr
    spec = json.loads(changed.stdout)["spec"]
    assert spec["ranks"] == 1 and spec["env"] == {"SEED": "2"} and "depends_on" not in spec
    assert {k: v for k, v in spec.items() if k not in ("ranks", "env", "depends_on")} == {
        k: v for k, v in job["spec"].items() if k not in ("ranks", "env", "depends_on")}
    bad = gpujobs("resubmit", job["id"], "--with", "heartbeat.interval_s=0", "-o", "json")
    assert bad.returncode == 1 and json.loads(bad.stderr)["error"]["field"] == \
        "heartbeat.interval_s"
