"""Issue 24, item 8: walls between tenants on the system people run, tested
through ``make up``'s own agents (the session's ``agent_stack``: as root, each
job's ranks a uid of its own), not a fixture of their own.

Tenant e2e-other runs a victim: one rank that beats every 0.2 s, with a
secret in its environment. Tenant e2e then runs a hostile rank on the same
host, which

- finds the victim's processes by their command line (world-readable) and
  tries to read their ``/proc/<pid>/environ``, SIGSTOP and SIGKILL them;
- works out where the victim's heartbeat file is (its own path, with the
  victim's job id, under either agent) and tries to read it, write it,
  unlink it and put a frozen copy in its place;
- tries to steal an agent's token: its ``/proc/<pid>/environ`` and its token
  file (named on its command line);
- then replaces its own heartbeat file with a FIFO, which once blocked an
  agent's loop for good (and, in a test of their own, a link to /dev/zero
  and a 10 GiB sparse file).

It must manage none of it, and find the victim (the test could fail); the
victim's steps keep advancing, its health stays OK, and both nodes keep
calling in after the FIFO. Without rank isolation (not root) the walls are
not there, and the test is skipped, never passed.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import datetime

import pytest

from tests.hostile_ranks import HOSTILE as REPLACES, steady
from tests.support.stacks import Api
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

#: argv: victim marker, victim job id; prints "WALLS {...}", then a FIFO
HOSTILE = r'''
import json, os, signal, sys, time
marker, victim_job = sys.argv[1:3]
me = os.getuid()
out = {"victims": 0, "environ read": [], "signalled": [], "agents": 0,
       "agent environ read": [], "token read": [], "heartbeat": []}

def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")

for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        argv = cmdline(pid)
    except OSError:
        continue
    if marker.encode() in argv and int(pid) != os.getpid():
        out["victims"] += 1
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"SECRET_A" in f.read():
                    out["environ read"].append(pid)
        except OSError:
            pass
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(int(pid), sig)
                out["signalled"].append([pid, int(sig)])
            except OSError:
                pass
    elif argv[1:3] == [b"-m", b"agent"]:
        out["agents"] += 1
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                f.read(1)
            out["agent environ read"].append(pid)
        except OSError:
            pass
        if b"--token-file" in argv:
            path = argv[argv.index(b"--token-file") + 1].decode()
            try:
                with open(path) as f:
                    f.read(1)
                out["token read"].append(path)
            except OSError:
                pass

own = os.environ["GPUJOBS_HEARTBEAT_FILE"]
own_job = os.environ["GPUJOBS_JOB_ID"]
candidates = {own.replace(own_job, victim_job).replace(f"/{a}/", f"/{b}/")
              for a in ("local-1", "local-2") for b in ("local-1", "local-2")}
victim_files = [p.rsplit("/", 1)[0] + "/rank-0" for p in candidates]
frozen = own + ".frozen"  # a copy to put in the victim's place
with open(frozen, "wb") as f:
    f.write(b"\0" * 96)
for path in victim_files:
    for what, act in (("read", lambda p: open(p, "rb").read(1)),
                      ("write", lambda p: open(p, "r+b").write(b"\0")),
                      ("unlink", os.unlink),
                      ("replace", lambda p: os.rename(frozen, p))):
        try:
            act(path)
            out["heartbeat"].append([what, path])
        except OSError:
            pass
print("WALLS " + json.dumps(out), flush=True)
if os.path.lexists(own):
    os.unlink(own)
os.mkfifo(own)
print("FIFO in place", flush=True)
time.sleep(3600)
'''


def _lines(api: Api, job_id: str) -> list[str]:
    r = api.get(f"/v1/jobs/{job_id}/logs")
    return [x["line"] for x in r.json()["lines"]] if r.status_code == 200 else []


def _step(api: Api, job_id: str) -> int | None:
    ranks = api.get(f"/v1/jobs/{job_id}/ranks").json().get("ranks") or [{}]
    return ranks[0].get("step")


def _called_in_since(api: Api, t: float) -> bool:
    """Both of the stack's nodes READY, each having called in after ``t``."""
    return all(n["state"] == "READY" and datetime.fromisoformat(
        n["last_seen_at"].replace("Z", "+00:00")).timestamp() > t
        for n in api.get("/v1/nodes").json()["nodes"] if n["node_id"] in ("local-1", "local-2"))


def _isolated_or_skip(api: Api) -> None:
    nodes = api.get("/v1/nodes").json()["nodes"]
    if {n["isolation"] for n in nodes if n["node_id"] in ("local-1", "local-2")} != {"user"}:
        pytest.skip("the stack's agents isolate ranks only as root")


def test_a_hostile_rank_cannot_read_kill_frame_or_rob_another_job_or_stall_its_node(
        agent_stack):
    victim_api, hostile_api = Api(agent_stack.api, "e2e-other"), Api(agent_stack.api,
                                                                     "e2e-tenant")
    _isolated_or_skip(victim_api)
    marker = f"victim-{uuid.uuid4().hex[:12]}"
    victim = victim_api.post("/v1/jobs", json={
        "name": "walls-victim", "command": [sys.executable, "-c", steady(0.2), marker],
        "ranks": 1, "env": {"SECRET_A": "hunter2-acme"},
        "heartbeat": {"interval_s": 0.5}}).json()
    hostile = None
    try:
        poll("the victim beats", lambda: (_step(victim_api, victim["id"]) or 0) > 3)
        hostile = hostile_api.post("/v1/jobs", json={
            "name": "walls-hostile",
            "command": [sys.executable, "-c", HOSTILE, marker, victim["id"]],
            "ranks": 1}).json()
        try:
            lines = poll("the hostile rank's report and its FIFO", lambda: (
                ls := _lines(hostile_api, hostile["id"])) and "FIFO in place" in ls and ls)
        except AssertionError as e:
            raise AssertionError(f"{e}: {hostile_api.get('/v1/jobs/' + hostile['id']).json()}"
                                 f" {_lines(hostile_api, hostile['id'])}") from None
        [seen] = [json.loads(x[6:]) for x in lines if x.startswith("WALLS ")]
        assert seen["victims"] >= 1 and seen["agents"] >= 2, f"it found no one: {seen}"
        assert seen["environ read"] == [] and seen["signalled"] == [], seen
        assert seen["agent environ read"] == [] and seen["token read"] == [], seen
        assert seen["heartbeat"] == [], seen
        fifo_at = time.time()

        # the victim runs on, beating; both agents' loops keep calling in
        before = _step(victim_api, victim["id"])
        poll("the victim's steps advance", lambda: (
            _step(victim_api, victim["id"]) or 0) > (before or 0) + 10)

        poll("both nodes call in after the FIFO",
             lambda: _called_in_since(victim_api, fifo_at + 5), 60)
        job = victim_api.get(f"/v1/jobs/{victim['id']}").json()
        assert job["state"] == "RUNNING" and job["attempt"] == 1, job
        assert job["health"]["status"] == "OK", job["health"]
    finally:
        for api, j in ((victim_api, victim), (hostile_api, hostile)):
            if j is not None:
                api.post(f"/v1/jobs/{j['id']}/cancel", json={"reason": "test over"})


@pytest.mark.parametrize("kind", ["devzero", "sparse"])
def test_a_heartbeat_file_made_a_link_to_dev_zero_or_a_sparse_file_stalls_no_node(
        agent_stack, kind):
    """The FIFO's siblings (tests/hostile_ranks.py), through make up's own
    agents: a rank replaces its heartbeat file with a link to /dev/zero or a
    10 GiB sparse file; both nodes keep calling in, the other tenant's job
    keeps beating with health OK, and the hostile job's beats stop there."""
    victim_api, hostile_api = Api(agent_stack.api, "e2e-other"), Api(agent_stack.api,
                                                                     "e2e-tenant")
    _isolated_or_skip(victim_api)
    victim = victim_api.post("/v1/jobs", json={
        "name": f"walls-{kind}-victim", "command": [sys.executable, "-c", steady(0.2)],
        "ranks": 1, "heartbeat": {"interval_s": 0.5}}).json()
    hostile = None
    try:
        poll("the victim beats", lambda: (_step(victim_api, victim["id"]) or 0) > 3)
        hostile = hostile_api.post("/v1/jobs", json={
            "name": f"walls-{kind}", "command": [sys.executable, "-c", REPLACES, kind],
            "ranks": 1, "heartbeat": {"interval_s": 0.5}}).json()
        poll(f"the hostile rank's {kind} in place",
             lambda: f"REPLACED {kind}" in _lines(hostile_api, hostile["id"]))
        replaced_at = time.time()
        before = _step(victim_api, victim["id"])
        poll("the victim's steps advance", lambda: (
            _step(victim_api, victim["id"]) or 0) > (before or 0) + 10)
        poll(f"both nodes call in after the {kind}",
             lambda: _called_in_since(victim_api, replaced_at + 5), 60)
        job = victim_api.get(f"/v1/jobs/{victim['id']}").json()
        assert job["state"] == "RUNNING" and job["health"]["status"] == "OK", job
        rank = hostile_api.get(f"/v1/jobs/{hostile['id']}/ranks").json()["ranks"][0]
        assert (rank["step"] or 0) <= 4 and rank["silence_s"] >= 5, (
            "no record read from that file", rank)
    finally:
        for api, j in ((victim_api, victim), (hostile_api, hostile)):
            if j is not None:
                api.post(f"/v1/jobs/{j['id']}/cancel", json={"reason": "test over"})
