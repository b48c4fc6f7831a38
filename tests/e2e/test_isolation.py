"""Issue 9, item 1 with real processes: a hostile rank cannot become the agent.

A real agent (``python -m agent``, as root when the tests run as root) runs two
tenants' ranks on one node of a local stack of its own. Tenant A's rank is
hostile: it reads every ``/proc/*/environ`` and ``cmdline`` it can, walks its
parents, the agent's state directory and its own environment, and then tries
every string it found as a bearer token to fail tenant B's running job. It must
find no agent credential, and B's job must keep running.
"""
from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.support.agents import reached
from tests.support.procs import stop_agent
from tests.support.stacks import ROOT, Api, running
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

AGENT_TOKEN = "agent-" + secrets.token_urlsafe(24)
NODE = "iso-node"
TOKENS = [{"token": "iso-a", "tenant": "iso-a"}, {"token": "iso-b", "tenant": "iso-b"},
          {"token": AGENT_TOKEN, "agent": NODE}]

HOSTILE = r'''
import json, os, re, sys, urllib.request
found, read = set(), []
def take(source, data):
    read.append(source)
    for s in re.split(rb"[\0\n=\s\"',:{}]+", data):
        if 6 <= len(s) <= 200:
            found.add(s.decode("utf-8", "replace"))
def try_read(path, source=None):
    try:
        with open(path, "rb") as f:
            take(source or path, f.read(1 << 20))
    except OSError:
        pass
for k, v in os.environ.items():
    take("own env " + k, v.encode())
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for what in ("environ", "cmdline", "mem"):
            try_read(f"/proc/{pid}/{what}")
pid = os.getppid()
while pid > 1:
    try_read(f"/proc/{pid}/environ", f"parent {pid} environ")
    with open(f"/proc/{pid}/stat") as f:
        pid = int(f.read().rsplit(")", 1)[1].split()[1])
state = os.environ["GPUJOBS_HEARTBEAT_FILE"]
for _ in range(4):
    state = os.path.dirname(state)
for top, dirs, files in os.walk(state):
    for name in files:
        try_read(os.path.join(top, name))
try:
    os.listdir(state)
    listable = True
except OSError:
    listable = False
api, victim = os.environ["API"], os.environ["VICTIM"]
statuses = set()
for token in sorted(found):
    for path, body in ((f"/v1/jobs/{victim}/attempts/1/events",
                        {"type": "EXITED", "ranks": [0], "exit_code": 1}),
                       (f"/v1/jobs/{victim}/heartbeats", {"attempt": 1, "ranks": [{"rank": 0}]})):
        req = urllib.request.Request(api + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + token,
                                              "Content-Type": "application/json"})
        try:
            statuses.add(urllib.request.urlopen(req, timeout=10).status)
        except urllib.error.HTTPError as e:
            statuses.add(e.code)
        except OSError:
            statuses.add(0)
print("REPORT " + json.dumps({"uid": os.getuid(), "read": read, "found": sorted(found),
                              "state_listable": listable, "statuses": sorted(statuses)}),
      flush=True)
'''


@pytest.fixture(scope="module")
def iso_stack(tmp_path_factory):
    # a stack of its own: the agent's token is made afresh here, so that no
    # file a rank could read (this repository's) names it
    with running(tmp_path_factory.mktemp("iso"), TOKENS, GPUJOBS_SCAN_PERIOD_S="1") as s:
        yield s


@pytest.fixture
def node_agent(iso_stack):
    """A real agent for NODE, its token in a 0600 file, state in a traversable place."""
    user = os.geteuid() == 0  # ranks then run as uids of the default pool
    home = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-iso-"))
    os.chmod(home, 0o711)
    secret_dir = home / "secret"
    secret_dir.mkdir(mode=0o700)
    token_file = secret_dir / "token"
    token_file.write_text(AGENT_TOKEN + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"})
    log = open(home / "agent.out", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--node-id", NODE, "--gpus", "2", "--gpu-type", "iso",
         "--api", iso_stack.api, "--state-dir", str(home / "state"), "--poll-wait-s", "1",
         "--address", "127.0.0.1", "--token-file", str(token_file),
         "--grace-s", "1"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, home, user
    finally:
        stop_agent(proc, home / "state")
        log.seek(0)
        print("--- agent output ---\n" + log.read())
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def test_a_hostile_rank_finds_no_agent_credential_and_cannot_fail_another_tenants_job(
        iso_stack, node_agent):
    proc, home, user = node_agent
    a, b = Api(iso_stack.api, "iso-a"), Api(iso_stack.api, "iso-b")
    node = poll("the node to register",
                lambda: (r := b.get(f"/v1/nodes/{NODE}")).status_code == 200 and r.json(), 60)
    assert node["isolation"] == ("user" if user else "none")

    victim = b.post("/v1/jobs", json={"command": ["sleep", "600"], "ranks": 1,
                                      "gpu_type": "iso"}).json()["id"]
    poll("victim runs", lambda: b.get(f"/v1/jobs/{victim}").json()["state"] == "RUNNING", 60)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    hostile = a.post("/v1/jobs", json={
        "command": [python, "-c", HOSTILE], "ranks": 1, "gpu_type": "iso",
        "env": {"API": iso_stack.api, "VICTIM": victim, "PLANTED": "planted-secret-42"}}
    ).json()["id"]
    done = reached(a, hostile, {"SUCCEEDED", "FAILED"}, timeout=120)
    log = (home / "state" / "logs" / hostile / "1" / "rank-0.log").read_text()
    assert done["state"] == "SUCCEEDED", log
    report = json.loads(log.split("REPORT ", 1)[1])

    # the scan was real: it read its own environment and other processes' files
    assert "planted-secret-42" in report["found"]
    assert any(r.startswith("/proc/") for r in report["read"])
    # ... and found no agent credential anywhere, nor any other token of the stack
    leaked = {t["token"] for t in TOKENS} & set(report["found"])
    assert not leaked and AGENT_TOKEN not in log
    assert not any(AGENT_TOKEN in s for s in report["found"])
    # every attempt with what it found failed: 401 (unknown) or 403
    assert report["statuses"] and set(report["statuses"]) <= {401, 403}, report["statuses"]
    assert b.get(f"/v1/jobs/{victim}").json()["state"] == "RUNNING"
    if user:  # root: ranks ran unprivileged, the agent's files closed to them
        # as its attempt's uid of the pool, not the victim's (a user per job)
        uids = {k: a["uid"] for k, a in json.loads(
            (home / "state" / "state.json").read_text())["attempts"].items()}
        assert report["uid"] == uids[f"{hostile}/1"] != uids[f"{victim}/1"]
        assert 70000 <= report["uid"] <= 70999
        assert not report["state_listable"]
        assert not any(str(home / "state") in r and "heartbeats" not in r
                       for r in report["read"]), report["read"]
        # the agent's environ and memory were closed (its cmdline is public, and clean)
        assert f"/proc/{proc.pid}/cmdline" in report["read"]
        assert not {f"/proc/{proc.pid}/environ", f"/proc/{proc.pid}/mem",
                    f"parent {proc.pid} environ"} & set(report["read"])
