"""The command line: options, their GPUJOBS_AGENT_* environment variables, errors."""
from __future__ import annotations

import pytest

from agent.__main__ import parse_settings
from agent.uidpool import UidRange

REQUIRED = ["--node-id", "node-1", "--gpus", "8", "--gpu-type", "h100",
            "--api", "http://127.0.0.1:8000", "--state-dir", "/tmp/s"]
TOKEN = {"GPUJOBS_AGENT_TOKEN": "t"}


def test_defaults():
    settings, level = parse_settings(REQUIRED, environ=TOKEN)
    assert (settings.node_id, settings.gpus, settings.gpu_type, settings.token) == \
        ("node-1", 8, "h100", "t")
    assert (settings.grace_s, settings.poll_wait_s, settings.node_heartbeat_s) == (10.0, 20, 10.0)
    assert settings.log_dir is None and settings.labels == {} and level == "INFO"
    assert settings.log_quota_bytes == 1 << 30, "each rank may ship 1 GiB an attempt"
    assert settings.job_roots == (), "no folder where the agent makes jobs' folders as root"


def test_job_roots_are_absolute_folders_from_the_command_line_or_the_environment():
    env = {**TOKEN, "GPUJOBS_AGENT_JOB_ROOTS": "/mnt/ckpt/:/scratch"}
    assert parse_settings(REQUIRED, environ=env)[0].job_roots == ("/mnt/ckpt", "/scratch")
    assert parse_settings(REQUIRED + ["--job-roots", "/data"],
                          environ=env)[0].job_roots == ("/data",)


def test_the_log_quota_comes_from_the_command_line_or_the_environment():
    """Invariant: the per-rank, per-attempt log quota is the agent's to set:
    --log-quota-bytes, or GPUJOBS_AGENT_LOG_QUOTA_BYTES (the command line wins)."""
    env = {**TOKEN, "GPUJOBS_AGENT_LOG_QUOTA_BYTES": "5000000"}
    assert parse_settings(REQUIRED, environ=env)[0].log_quota_bytes == 5_000_000
    assert parse_settings(REQUIRED + ["--log-quota-bytes", "1024"],
                          environ=env)[0].log_quota_bytes == 1024


def test_every_option_can_come_from_the_environment():
    env = {"GPUJOBS_AGENT_NODE_ID": "n7", "GPUJOBS_AGENT_GPUS": "4",
           "GPUJOBS_AGENT_GPU_TYPE": "a100", "GPUJOBS_AGENT_API": "http://api",
           "GPUJOBS_AGENT_TOKEN": "secret", "GPUJOBS_AGENT_STATE_DIR": "/var/lib/a",
           "GPUJOBS_AGENT_LOG_DIR": "/var/log/a", "GPUJOBS_AGENT_GRACE_S": "2.5",
           "GPUJOBS_AGENT_POLL_WAIT_S": "5", "GPUJOBS_AGENT_NODE_HEARTBEAT_S": "3",
           "GPUJOBS_AGENT_LOG_LEVEL": "debug", "GPUJOBS_AGENT_LABELS": "zone=a,rack=7"}
    settings, level = parse_settings([], environ=env)
    assert (settings.node_id, settings.gpus, settings.gpu_type, settings.api, settings.token,
            settings.state_dir, settings.log_dir, settings.grace_s, settings.poll_wait_s,
            settings.node_heartbeat_s, level) == \
        ("n7", 4, "a100", "http://api", "secret", "/var/lib/a", "/var/log/a", 2.5, 5, 3.0,
         "DEBUG")
    assert settings.labels == {"zone": "a", "rack": "7"}


def test_the_command_line_wins_over_the_environment():
    settings, _ = parse_settings(REQUIRED + ["--labels", "zone=b", "--label", "pool=x",
                                             "--node-id", "n9"],
                                 environ={"GPUJOBS_AGENT_TOKEN": "env", "GPUJOBS_AGENT_LABELS":
                                          "zone=a", "GPUJOBS_AGENT_NODE_ID": "n1"})
    assert settings.node_id == "n9" and settings.labels == {"zone": "b", "pool": "x"}


@pytest.mark.parametrize("argv,env", [
    (REQUIRED[2:], {}),                                      # no --node-id
    (REQUIRED + ["--gpus", "0"], {}),
    (REQUIRED + ["--poll-wait-s", "21"], {}),
    (REQUIRED + ["--grace-s", "-1"], {}),
    (REQUIRED + ["--label", "novalue"], {}),
    (REQUIRED + ["--log-level", "chatty"], {}),
    (REQUIRED + ["--log-quota-bytes", "0"], {}),
    (REQUIRED + ["--log-quota-bytes", "1GiB"], {}),
    (REQUIRED, {"GPUJOBS_AGENT_LOG_QUOTA_BYTES": "-1"}),
    (REQUIRED, {"GPUJOBS_AGENT_GPUS": "many"}),
    (REQUIRED, {"GPUJOBS_AGENT_LABELS": "zone"}),
    (REQUIRED + ["--job-roots", "/mnt:relative"], {}),
    (REQUIRED, {"GPUJOBS_AGENT_JOB_ROOTS": "relative"}),
])
def test_bad_arguments_exit_with_status_2(argv, env, capsys):
    with pytest.raises(SystemExit) as e:
        parse_settings(argv, environ={**TOKEN, **env})
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


# -- issue 9: the token never on argv, only from a private file, stdin or the env ---
def test_a_token_on_the_command_line_is_refused(capsys):
    for argv in (REQUIRED + ["--token", "t"], REQUIRED + ["--token=t"]):
        with pytest.raises(SystemExit) as e:
            parse_settings(argv, environ={})
        assert e.value.code == 2
        assert "--token-file" in capsys.readouterr().err


def test_no_token_at_all_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        parse_settings(REQUIRED, environ={})
    assert e.value.code == 2 and "no agent token" in capsys.readouterr().err


def test_the_token_file_must_be_private(tmp_path, capsys):
    f = tmp_path / "token"
    f.write_text("secret-token\n")
    f.chmod(0o600)
    settings, _ = parse_settings(REQUIRED + ["--token-file", str(f)], environ={})
    assert settings.token == "secret-token"
    f.chmod(0o640)
    with pytest.raises(SystemExit) as e:
        parse_settings(REQUIRED + ["--token-file", str(f)], environ={})
    assert e.value.code == 2 and "chmod 600" in capsys.readouterr().err


def test_the_token_can_come_from_stdin():
    import io
    settings, _ = parse_settings(REQUIRED + ["--token-file", "-"], environ={},
                                 stdin=io.StringIO("from-stdin\n"))
    assert settings.token == "from-stdin"


def test_ranks_run_as_a_pool_of_uids_by_default_and_only_an_empty_one_turns_it_off():
    settings, _ = parse_settings(REQUIRED, environ=TOKEN)
    assert settings.rank_uids == UidRange(70000, 70999)
    settings, _ = parse_settings(REQUIRED + ["--rank-uids", "80000-80015"], environ=TOKEN)
    assert settings.rank_uids == UidRange(80000, 80015) and len(settings.rank_uids) == 16
    settings, _ = parse_settings(REQUIRED, environ={**TOKEN, "GPUJOBS_AGENT_RANK_UIDS": ""})
    assert settings.rank_uids is None
    for bad in ("70999-70000", "root", "-5", "1-2-3"):
        with pytest.raises(SystemExit):
            parse_settings(REQUIRED + ["--rank-uids", bad], environ=TOKEN)


def test_no_aws_credentials_exit_2_at_once_saying_what_to_give(tmp_path):
    """Without credentials every receive would fail and be retried for ever
    ("Unable to locate credentials" in a loop): the agent says so once instead."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GPUJOBS_AGENT_"))}
    env.update(AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true", **TOKEN)
    argv = [a if a != "/tmp/s" else str(tmp_path / "s") for a in REQUIRED]
    r = subprocess.run([sys.executable, "-m", "agent", *argv], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "no AWS credentials" in r.stderr and "AWS_ACCESS_KEY_ID=local" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_token_file_others_may_read_stops_the_agent_with_exit_2_naming_it(tmp_path, mode):
    """Issue 24: ``python -m agent --token-file F`` with F readable by the group
    or by others exits 2 at once, saying which file and how to fix it, with no
    traceback, and never starts (no state directory is made)."""
    import os
    import subprocess
    import sys

    token = tmp_path / "token"
    token.write_text("secret-token\n")
    token.chmod(mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_AGENT_")}
    state = tmp_path / "s"
    argv = [a if a != "/tmp/s" else str(state) for a in REQUIRED]
    r = subprocess.run([sys.executable, "-m", "agent", *argv, "--token-file", str(token)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert str(token) in r.stderr and f"{mode:04o}" in r.stderr and "chmod 600" in r.stderr
    assert "Traceback" not in r.stderr and "secret-token" not in r.stderr + r.stdout
    assert not state.exists()


def test_the_help_says_the_token_file_must_be_private():
    """``python -m agent --help`` documents --token-file and its mode."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "agent", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "--token-file" in text and "mode 0600" in text and "refused" in text


@pytest.mark.parametrize("uids, said", [
    ("0-9", "--rank-uids 0-9 holds uid 0 (root)"),
    ("1-3", "--rank-uids 1-3 holds uid 1, user 'daemon': the pool's uids must belong to no "
            "user"),
])
def test_a_pool_holding_root_or_a_user_stops_the_agent_with_exit_2(tmp_path, uids, said):
    """As root the pool's uids must be no one's: a range that holds root or an
    existing user is refused at start, before anything runs as it."""
    import os
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("the pool is checked only when the agent runs as root")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_AGENT_")}
    env.update(AWS_ACCESS_KEY_ID="local", AWS_SECRET_ACCESS_KEY="local", **TOKEN)
    argv = [a if a != "/tmp/s" else str(tmp_path / "s") for a in REQUIRED]
    r = subprocess.run([sys.executable, "-m", "agent", *argv, "--rank-uids", uids], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"gpujobs-agent: {said}; name a free range with --rank-uids FIRST-LAST\n"
