"""`gpujobs resubmit JOB [--with MEMBER=VALUE]` and submit's stall flags
(`--on-stall`, `--heartbeat-interval`; `--max-runtime`, `--max-pending`
beside them) against the fake server (issue 47): a resubmit sends the job's
spec as submitted, with its changes, under a fresh Idempotency-Key, and
prints the new job as submit does; a bad flag value is a usage error naming
the flag, and nothing is sent."""
from __future__ import annotations

import json

import pytest

from gpujobs_client.cli import CREATE_FIELDS


def posted(fake) -> list:
    return fake.sent("POST", "/v1/jobs")


def test_resubmit_sends_the_spec_as_submitted_under_a_new_key(run, fake):
    """Invariant: the body a resubmit sends is the original's spec (its
    create members, the server's defaults filled), each resubmit a new job
    under a key of its own, printed as submit prints a job."""
    old = fake.add_job(ranks=2, name="train", gpu_type="h100", env={"LR": "0.1"},
                       labels={"team": "nlp"}, max_runtime_s=600, on_stall="restart",
                       retry={"rules": [{"exit_codes": [42], "action": "fail"}]})
    r = run("resubmit", old["id"])
    assert r.exit_code == 0, r.output
    (first,) = posted(fake)
    assert first.json() == {k: v for k, v in old["spec"].items() if k in CREATE_FIELDS}
    new_id = next(j for j in fake.jobs if j != old["id"])
    out = r.stdout.splitlines()
    assert out[0] == f"Submitted: {new_id} PENDING"
    assert out[1].strip() == f"resubmitted from: {old['id']}, PENDING"
    assert f"idempotency key: {first.headers['idempotency-key']}" in r.stdout
    again = run("resubmit", old["id"], "-q")
    assert again.exit_code == 0
    second = posted(fake)[1]
    assert second.headers["idempotency-key"] != first.headers["idempotency-key"]
    assert again.stdout.strip() in fake.jobs and again.stdout.strip() != new_id
    assert len(fake.jobs) == 3


def test_resubmit_with_a_key_given_is_safe_to_repeat(run, fake):
    """Invariant: --idempotency-key makes a repeated resubmit the same job."""
    old = fake.add_job(ranks=1)
    first = run("resubmit", old["id"], "--idempotency-key", "again-1", "-o", "json")
    repeat = run("resubmit", old["id"], "--idempotency-key", "again-1")
    assert first.exit_code == 0 and repeat.exit_code == 0, repeat.output
    job = json.loads(first.stdout)
    assert repeat.stdout.startswith(f"Already submitted (same Idempotency-Key and body): "
                                    f"{job['id']}")
    assert len(fake.jobs) == 2


def test_resubmit_with_overrides_changes_only_those_members(run, fake):
    """Invariant: each --with sets one member or a path into one (JSON values,
    env and labels as text, a command as text split like a shell, null
    removes), the rest as submitted."""
    old = fake.add_job(ranks=2, name="train", env={"LR": "0.1"}, gpu_type="h100",
                       command=["python3", "train.py"])
    r = run("resubmit", old["id"], "--with", "ranks=4", "--with", "env.SEED=2",
            "--with", "heartbeat.interval_s=2.5", "--with", "gpu_type=null",
            "--with", "command=python3 train.py --lr '1e-4'", "--with", "labels.try=3")
    assert r.exit_code == 0, r.output
    body = posted(fake)[0].json()
    assert body["ranks"] == 4 and body["env"] == {"LR": "0.1", "SEED": "2"}
    assert body["heartbeat"]["interval_s"] == 2.5
    assert body["heartbeat"]["startup_grace_s"] == old["spec"]["heartbeat"]["startup_grace_s"]
    assert "gpu_type" not in body and body["name"] == "train"
    assert body["command"] == ["python3", "train.py", "--lr", "1e-4"]
    assert body["labels"] == {"try": "3"}
    dry = run("resubmit", old["id"], "--with", "max_pending_s=60", "--dry-run")
    assert json.loads(dry.stdout)["max_pending_s"] == 60 and len(posted(fake)) == 1


@pytest.mark.parametrize("item, says", [
    ("gpus=4", "'gpus' is not a member of a job's spec"),
    ("ranks", "is not MEMBER=VALUE"),
    ("command.x=1", "command is not an object"),
])
def test_a_bad_with_is_a_usage_error_naming_it(run, fake, item, says):
    old = fake.add_job(ranks=1)
    r = run("resubmit", old["id"], "--with", item)
    assert r.exit_code == 2 and "--with" in r.stderr and says in r.stderr, r.output
    err = json.loads(run("resubmit", old["id"], "--with", item, "-o", "json").stderr)
    assert err["error"]["field"] == "--with" and err["exit_code"] == 2
    assert posted(fake) == []


def test_resubmit_of_a_job_that_is_not_yours_is_not_found(run, fake):
    other = fake.add_job(tenant="other", ranks=1)
    r = run("resubmit", other["id"])
    assert r.exit_code == 3 and "404 not_found" in r.stderr and "gpujobs list" in r.stderr
    assert posted(fake) == []


# -- submit's stall flags ----------------------------------------------------------------
def test_on_stall_and_heartbeat_interval_fill_the_spec(run, fake, tmp_path):
    """Invariant: --on-stall sets on_stall and --heartbeat-interval
    heartbeat.interval_s (seconds, fractions and units), beside the
    heartbeat members of --file; submit and describe say what a stall does."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("ranks: 2\ncommand: [python, train.py]\nheartbeat: {startup_grace_s: 30}\n")
    r = run("submit", "-f", str(spec), "--on-stall", "RESTART", "--heartbeat-interval", "500ms",
            "--max-runtime", "1h", "--max-pending", "10m", "--max-attempts", "3")
    assert r.exit_code == 0, r.output
    body = posted(fake)[0].json()
    assert body["on_stall"] == "restart" and body["max_attempts"] == 3
    assert body["heartbeat"] == {"startup_grace_s": 30, "interval_s": 0.5}
    assert body["max_runtime_s"] == 3600 and body["max_pending_s"] == 600
    assert ("on stall: stop the attempt and start a new one while attempts remain"
            in r.stdout)
    (job_id,) = fake.jobs
    described = run("describe", job_id).stdout
    assert "on stall" in described and "stop the attempt and start a new one" in described
    for given, seconds in (("10", 10), ("2.5s", 2.5), ("2m", 120), ("0.01", 0.01)):
        assert run("submit", "--ranks", "1", "--heartbeat-interval", given, "--dry-run", "--",
                   "true").stdout.count(f'"interval_s": {seconds}') == 1, given


@pytest.mark.parametrize("flag, value, says", [
    ("--on-stall", "kill", "'kill' is not one of 'report', 'restart'"),
    ("--heartbeat-interval", "0", "outside 0.01 s to 3600 s"),
    ("--heartbeat-interval", "2h", "outside 0.01 s to 3600 s"),
    ("--heartbeat-interval", "often", "is not a number of seconds"),
    ("--heartbeat-interval", "nan", "is not a number of seconds"),
    ("--max-runtime", "0", "not a duration of at least 1 s"),
    ("--max-runtime", "400d", "longer than a year"),
    ("--max-pending", "soon", "is not a duration"),
])
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(run, fake, flag, value, says):
    """Invariant: a value outside what the spec allows is exit 2 with the
    flag named (and in ``field`` with -o json); nothing is sent."""
    r = run("submit", "--ranks", "1", flag, value, "--", "true")
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{flag}'" in r.stderr and says in r.stderr, r.stderr
    err = json.loads(run("submit", "--ranks", "1", flag, value, "-o", "json", "--",
                         "true").stderr)
    assert err["error"]["field"] == flag and err["exit_code"] == 2
    assert posted(fake) == []
