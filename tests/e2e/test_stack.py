"""`make up`: the ready line, the variables it reads, a clean exit on signals."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import requests

from tests.support.stacks import ROOT, TOKENS, start_stack

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_stack_serves_then_exits_cleanly_on(sig, tmp_path):
    stack = start_stack(tmp_path, TOKENS, GPUJOBS_SCAN_PERIOD_S="0.2")
    try:
        assert requests.get(stack.api + "/v1/health", timeout=10).json() == {"status": "ok"}
        assert "agents 0 x 8 GPUs (none" in stack.ready_line, "GPUJOBS_AGENTS=0 honoured"
    finally:
        code = stack.stop(sig)
    assert code == 0


def test_without_a_tokens_file_fresh_tokens_are_made_and_printed(tmp_path):
    import json
    import os
    import re
    env = {k: v for k, v in os.environ.items() if k != "GPUJOBS_TOKENS_FILE"}
    proc = subprocess.Popen([sys.executable, "-m", "devstack"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**env, "PORT": "0", "GPUJOBS_AGENTS": "0",
                                 "GPUJOBS_STATE_DIR": str(tmp_path / "state")})
    try:
        first = proc.stdout.readline()
        path = re.search(r"written to (\S+)", first).group(1)
        tokens = json.loads(open(path).read())
        assert {"tenant", "agent"} <= {k for t in tokens for k in t if k != "token"}
        for line in proc.stdout:
            if "ready" in line:
                api = re.search(r"API (\S+)", line).group(1)
                break
        tenant = next(t["token"] for t in tokens if "tenant" in t)
        r = requests.get(api + "/v1/jobs", headers={"Authorization": f"Bearer {tenant}"},
                         timeout=10)
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("var, value", [("GPUJOBS_AGENTS", "two"), ("GPUJOBS_AGENTS", "-1"),
                                        ("GPUJOBS_SCAN_PERIOD_S", "0"), ("PORT", "http")])
def test_a_bad_setting_stops_the_stack_with_a_message(tmp_path, var, value):
    r = subprocess.run([sys.executable, "-m", "devstack"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={**__import__("os").environ, var: value})
    assert r.returncode != 0
    assert var in r.stderr


def test_settings_change_on_the_running_stack_and_come_back_after(stack):
    """Invariant (devstack/settings.py): what a test varies is set on the
    worker's running stack, not by starting another; a change takes effect on
    the next request, goes back when the block ends, and a refused change
    (a name that cannot change, a value the services refuse) is a 400 naming
    it that changes nothing. Without the stack's settings token the path is
    not there."""
    import json

    from tests.support.stacks import Api

    tenant = Api(stack.api, "e2e-tenant")
    job = {"command": ["true"], "ranks": 1, "gpu_type": "none-settings",
           "priority_class": "settings-test"}

    def created() -> int:
        return tenant.post("/v1/jobs", json=job).status_code

    assert created() == 400, "no such class yet"
    url = stack.api + "/_local/settings"
    for token in (None, "not-the-token", "e2e-ops"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = requests.put(url, json={"GPUJOBS_NODE_DOWN_AFTER_S": "1"}, headers=headers,
                         timeout=10)
        assert r.status_code == 404, r.text
    classes = json.dumps({"settings-test": {"value": 5}})
    with stack.settings(GPUJOBS_PRIORITY_CLASSES=classes) as now:
        assert now["GPUJOBS_PRIORITY_CLASSES"] == classes
        assert created() == 201, "the services were built again with the new classes"
        owner = {"Authorization": f"Bearer {stack.settings_token}"}
        for bad, named in (({"GPUJOBS_JOBS_TABLE": "x"}, "GPUJOBS_JOBS_TABLE"),
                           ({"GPUJOBS_PRIORITY_CLASSES": "{"}, "GPUJOBS_PRIORITY_CLASSES"),
                           ({"GPUJOBS_SCAN_PERIOD_S": "0"}, "GPUJOBS_SCAN_PERIOD_S"),
                           ({"GPUJOBS_NODE_DOWN_AFTER_S": 6}, "GPUJOBS_NODE_DOWN_AFTER_S")):
            r = requests.put(url, json=bad, headers=owner, timeout=10)
            assert r.status_code == 400 and named in r.json()["detail"], r.text
        assert created() == 201, "a refused change changed nothing"
    assert created() == 400, "the stack's own classes again after the block"
