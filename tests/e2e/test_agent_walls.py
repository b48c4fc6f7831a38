"""Issue 24, item 1, with the local stack's real agents (the session's
``agent_stack``, two agents): what a rank can read of its agent.

- The agents hold their token in a private file, never in their environment:
  a process's starting environment stays in ``/proc/<pid>/environ`` for its
  whole life (removing it from ``os.environ`` changes nothing there), and a
  rank running as root read it there and forged reports.

Reading another process's environ takes root (the agents are non-dumpable),
as CI runs; elsewhere these tests skip.
"""
from __future__ import annotations

import os
import stat

import pytest

from tests.stacks import Api

pytestmark = pytest.mark.e2e

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
    its own folder of mode 0700, holding the token the agent registered with;
    its /proc/<pid>/environ holds neither the token nor GPUJOBS_AGENT_TOKEN,
    nor the API's own secrets (tokens file, page-token key), and its
    command line names only the file."""
    tenant = Api(agent_stack.api, "e2e-tenant")
    for node, pid in agents.items():
        path = token_file_of(pid)
        st, folder = os.stat(path), os.stat(os.path.dirname(path))
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert st.st_uid == os.geteuid()
        assert stat.S_IMODE(folder.st_mode) == 0o700, oct(folder.st_mode)
        with open(path) as f:
            token = f.read().strip()
        assert token
        env = environ_of(pid)
        assert not [k for k, v in env.items() if token in v], f"{node}'s token in its environ"
        assert not {"GPUJOBS_AGENT_TOKEN", "GPUJOBS_TOKENS_FILE", "GPUJOBS_PAGE_TOKEN_KEY"} & set(env)
        assert not any(token in a for a in argv_of(pid))
        # the token it read from the file is the one it registered with
        assert tenant.get(f"/v1/nodes/{node}").json()["state"] == "READY"
