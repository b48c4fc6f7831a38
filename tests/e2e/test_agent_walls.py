"""Issue 24, item 1, with the local stack's real agents (the session's
``agent_stack``, two agents): what a rank can read of its agent.

- The agents hold their token in a private file, never in their environment:
  a process's starting environment stays in ``/proc/<pid>/environ`` for its
  whole life (removing it from ``os.environ`` changes nothing there), and a
  rank running as root read it there and forged reports.
- A rank's environment holds none of its agent's configuration: no AWS
  endpoint, credential or table name, no GPUJOBS_* setting but the ones the
  agent sets for it, and never the token.

Reading another process's environ takes root (the agents are non-dumpable),
as CI runs; elsewhere these tests skip.
"""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from agent.uidpool import DEFAULT_RANK_UIDS, parse_range
from tests.support.agents import ended
from tests.support.procs import alive
from tests.support.stacks import Api
from tests.support.waits import poll

pytestmark = pytest.mark.e2e

#: the only GPUJOBS_* variables a rank has: the agent sets them for it
RANK_GPUJOBS = {"GPUJOBS_JOB_ID", "GPUJOBS_ATTEMPT", "GPUJOBS_NODE_ID", "GPUJOBS_HEARTBEAT_FILE"}

DUMP = ("import json, os\n"
        "import gpujobs_heartbeat  # on every rank's PYTHONPATH\n"
        "print('ENV ' + json.dumps(dict(os.environ)), flush=True)\n")


def argv_of(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def agents_of(stack) -> dict[str, int]:
    """The stack's agent processes: node id -> pid (its children running ``-m agent``)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            pid = int(entry)
            if parent_of(pid) != stack.proc.pid:
                continue
            argv = argv_of(pid)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if argv[1:3] == ["-m", "agent"]:
            found[argv[argv.index("--node-id") + 1]] = pid
    return found


def environ_of(pid: int) -> dict[str, str]:
    """The process's starting environment, as ``/proc/<pid>/environ`` keeps it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except PermissionError:
        pytest.skip("reading a non-dumpable agent's /proc/<pid>/environ takes root")
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def token_file_of(pid: int) -> str:
    argv = argv_of(pid)
    assert "--token-file" in argv, f"agent {pid} was not given its token in a file: {argv}"
    return argv[argv.index("--token-file") + 1]


@pytest.fixture
def agents(agent_stack) -> dict[str, int]:
    found = agents_of(agent_stack)
    assert sorted(found) == ["local-1", "local-2"], found
    return found


def test_the_agents_hold_their_token_in_a_0600_file_and_not_in_their_environment(
        agent_stack, agents):
    """Each agent was started with ``--token-file``: a file of mode 0600 in
    its own folder of mode 0700 (0711 when its ranks run as uids of their own), holding the token the agent registered with;
    its /proc/<pid>/environ holds neither the token nor GPUJOBS_AGENT_TOKEN,
    nor the API's own secrets (tokens file, page-token key), and its
    command line names only the file."""
    tenant = Api(agent_stack.api, "e2e-tenant")
    for node, pid in agents.items():
        path = token_file_of(pid)
        st, folder = os.stat(path), os.stat(os.path.dirname(path))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert st.st_uid == os.geteuid()
        # 0711 as root: its ranks, each a uid of its own, pass through to
        # their heartbeat folders, and still cannot list it
        assert stat.S_IMODE(folder.st_mode) == (0o711 if os.geteuid() == 0 else 0o700), \
            oct(folder.st_mode)
        with open(path) as f:
            token = f.read().strip()
        assert token
        env = environ_of(pid)
        assert not [k for k, v in env.items() if token in v], f"{node}'s token in its environ"
        assert not {"GPUJOBS_AGENT_TOKEN", "GPUJOBS_TOKENS_FILE", "GPUJOBS_PAGE_TOKEN_KEY"} & set(env)
        assert not any(token in a for a in argv_of(pid))
        # the token it read from the file is the one it registered with
        assert tenant.get(f"/v1/nodes/{node}").json()["state"] == "READY"


def test_a_rank_gets_no_endpoint_table_credential_or_token_of_its_agent(
        agent_stack, agents, tmp_path):
    """A real rank that dumps its environment: no AWS_* variable, no GPUJOBS_*
    but the four the agent sets for ranks, no value of its agent's GPUJOBS_*
    and AWS_* settings (the moto endpoint, table and queue names, keys), no
    token; and what agent/README.md, "What a rank gets", lists is there (the
    torch variables, the heartbeat file, PATH and HOME, the job's own env,
    gpujobs_heartbeat importable)."""
    tenant = Api(agent_stack.api, "e2e-tenant")
    job = tenant.post("/v1/jobs", json={"command": [sys.executable, "-c", DUMP],
                                        "ranks": 1, "name": "walls-env",
                                        "env": {"JOB_OWN": "mine"}}).json()
    state = ended(tenant, job["id"], 60)["state"]
    assert state == "SUCCEEDED", tenant.get(f"/v1/jobs/{job['id']}/logs").text
    lines = [x["line"] for x in tenant.get(f"/v1/jobs/{job['id']}/logs").json()["lines"]]
    [rank] = [json.loads(x[4:]) for x in lines if x.startswith("ENV ")]
    [attempt] = tenant.get(f"/v1/jobs/{job['id']}/attempts").json()["attempts"]
    node = attempt["placement"][0]["node_id"]
    agent_env = environ_of(agents[node])
    with open(token_file_of(agents[node])) as f:
        token = f.read().strip()
    config = {k: v for k, v in agent_env.items() if k.startswith(("GPUJOBS_", "AWS_"))}
    # the agent really has what must not pass: the test would see it leak
    assert "AWS_ACCESS_KEY_ID" in config and any(k.endswith("_TABLE") for k in config), config
    assert any(agent_stack.aws in v for v in config.values()), "the moto endpoint"

    assert not [k for k in rank if k.startswith("AWS_")]
    assert {k for k in rank if k.startswith("GPUJOBS_")} == RANK_GPUJOBS
    values = {k: v for k, v in rank.items() if k not in ("GPUJOBS_HEARTBEAT_FILE", "PATH")}
    # (the event bus is named "gpujobs-<stage>", the stage's own prefix, which
    # paths of the stack's files hold too: its name is no secret, and not
    # found by its value; the tables, queues, endpoint and keys are)
    leaked = {k: v for k, v in config.items() if k != "GPUJOBS_EVENT_BUS"
              and len(v) >= 6 and any(v in value for value in values.values())}
    assert not leaked, leaked
    assert not [k for k, v in rank.items() if agent_stack.aws in v or token in v]

    assert (rank["RANK"], rank["LOCAL_RANK"], rank["WORLD_SIZE"]) == ("0", "0", "1")
    assert rank["MASTER_ADDR"] and rank["MASTER_PORT"].isdigit()
    assert "CUDA_VISIBLE_DEVICES" in rank and rank["GPUJOBS_JOB_ID"] == job["id"]
    assert rank["GPUJOBS_NODE_ID"] == node and rank["GPUJOBS_ATTEMPT"] == "1"
    assert rank["PATH"] == agent_env["PATH"]
    if [n["isolation"] for n in tenant.get("/v1/nodes").json()["nodes"]
            if n["node_id"] == node] == ["user"]:  # a home of the job's uid, not the agent's
        assert rank["HOME"] != agent_env["HOME"] and "/homes/" in rank["HOME"], rank["HOME"]
        assert rank["USER"].startswith("gpujobs-"), rank["USER"]
    else:
        assert rank["HOME"] == agent_env["HOME"]
    assert rank["JOB_OWN"] == "mine"
    # the agent's copy of the helper, in its state folder (agent/core.py publish_rankside)
    assert rank["PYTHONPATH"].split(os.pathsep)[0].endswith(os.path.join("state", "rankside"))


#: a rank that found the stack's moto (a port scan would) and its state
#: folder, and tries its way in; stdlib only
INTO_MOTO = r'''
import json, os, sys, urllib.error, urllib.request
endpoint, state = sys.argv[1:3]

def post(path, headers):
    req = urllib.request.Request(endpoint + path, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

fake = ("AWS4-HMAC-SHA256 Credential=testing/20261202/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64)
seen = {"reset": post("/moto-api/reset", {}),
        "list tables": post("/", {"X-Amz-Target": "DynamoDB_20120810.ListTables",
                                  "Content-Type": "application/x-amz-json-1.0",
                                  "Authorization": fake})}
for name in ("moto-state.pickle", "agent-tokens.json", "page-token-key", "tokens.json",
             "api-tokens.json"):
    try:
        with open(os.path.join(state, name), "rb") as f:
            f.read(1)
        seen[name] = "read"
    except OSError as e:
        seen[name] = type(e).__name__
try:
    seen["state folder"] = sorted(os.listdir(state))
except OSError as e:
    seen["state folder"] = type(e).__name__
print("SEEN " + json.dumps(seen), flush=True)
'''


def test_a_rank_that_finds_the_moto_endpoint_and_the_state_gets_nothing(agent_stack, agents):
    """Issue 24, items 1 and 8: the moto endpoint and the state are out of a
    rank's reach on make up's own agents. A rank given the endpoint (a port
    scan finds it) and the state folder is refused by moto, with any key and
    on ``/moto-api/reset`` (403 each); it can neither list the state folder
    nor read the snapshot, the tokens or the page-token key; the stack works
    on."""
    import re

    tenant = Api(agent_stack.api, "e2e-tenant")
    state = re.search(r"\| state (\S+) \(", agent_stack.ready_line).group(1)
    job = tenant.post("/v1/jobs", json={
        "command": [sys.executable, "-I", "-c", INTO_MOTO, agent_stack.aws, state],
        "ranks": 1, "name": "walls-moto"}).json()
    state_now = ended(tenant, job["id"], 60)["state"]
    lines = [x["line"] for x in tenant.get(f"/v1/jobs/{job['id']}/logs").json()["lines"]]
    assert state_now == "SUCCEEDED", lines
    [seen] = [json.loads(x[5:]) for x in lines if x.startswith("SEEN ")]
    assert (seen["reset"], seen["list tables"]) == (403, 403), seen
    assert seen["state folder"] == "PermissionError", seen
    assert not [k for k, v in seen.items() if v == "read"], seen
    nodes = tenant.get("/v1/nodes").json()["nodes"]
    assert {n["isolation"] for n in nodes if n["node_id"] in agents} == {"user"}
    assert tenant.get(f"/v1/jobs/{job['id']}").status_code == 200, "moto was not reset"


#: argv: a folder every uid may write. Leaves a daemon of its uid behind, out
#: of its group and session (double fork, setsid, every descriptor closed),
#: writes "<its pid> <its uid>" to daemon.pid there, and exits 0
LEAVES_A_DAEMON = r'''
import os, sys, time
path = os.path.join(sys.argv[1], "daemon.pid")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(path + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {os.getuid()}")
        os.replace(path + ".tmp", path)
        os.closerange(0, 1024)
        time.sleep(600)
    os._exit(0)
os.wait()
while not os.path.exists(path):
    time.sleep(0.05)
print("left a daemon as uid", os.getuid(), flush=True)
'''


def test_a_uid_returns_to_the_pool_only_after_every_process_of_it_is_gone(
        agent_stack, agents, shared_dir):
    """Issue 24, items 2 and 8, on make up's own agents: a job's rank leaves
    a daemon of its uid that its process group and session do not reach. The
    job succeeds; the agent kills the daemon, and only then marks the uid
    free in its state: at no look is the uid free while the daemon lives."""
    tenant = Api(agent_stack.api, "e2e-tenant")
    if os.geteuid() != 0:
        pytest.skip("the stack's agents run ranks as pool uids only as root")
    job = tenant.post("/v1/jobs", json={
        "command": [sys.executable, "-c", LEAVES_A_DAEMON, str(shared_dir)],
        "ranks": 1, "name": "walls-daemon"}).json()
    daemon = None
    try:
        done = ended(tenant, job["id"], 60)
        assert done["state"] == "SUCCEEDED", done
        pid, uid = map(int, (shared_dir / "daemon.pid").read_text().split())
        daemon = pid
        assert uid in parse_range(DEFAULT_RANK_UIDS), f"the rank ran as uid {uid}, not the pool's"
        [attempt] = tenant.get(f"/v1/jobs/{job['id']}/attempts").json()["attempts"]
        [node] = {p["node_id"] for p in attempt["placement"]}
        argv = argv_of(agents[node])
        state_file = os.path.join(argv[argv.index("--state-dir") + 1], "state.json")

        def freed() -> bool:
            with open(state_file) as f:
                record = json.load(f)["attempts"].get(f"{job['id']}/1")
            is_free = record is None or record["uid_freed"]
            assert not (is_free and alive(pid)), f"uid {uid} free while its daemon {pid} lives"
            return is_free
        poll("the attempt's uid freed", freed, 60)
        assert not alive(pid), "the daemon was killed"
    finally:
        if daemon is not None and alive(daemon):
            os.kill(daemon, 9)
