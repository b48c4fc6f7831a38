"""The local stack's agents hold their token in a private file, not in their
environment (issue 24, item 1): devstack/agents.py's pieces, without a stack
(tests/e2e/test_agent_walls.py checks the running agents)."""
from __future__ import annotations

import os
import stat

import pytest

from devstack.agents import NOT_FOR_AGENTS, agent_environment, isolated, write_token_file


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("traversable, folder", [(False, 0o700), (True, 0o711)])
def test_the_token_file_is_0600_in_a_folder_no_one_else_lists(tmp_path, traversable, folder):
    """The token is written whole at <home>/token, mode 0600; <home> is 0700,
    or 0711 (pass through, never list) when ranks run as a rank user who
    must reach their heartbeat directory below it."""
    home = tmp_path / "local-1"
    home.mkdir(mode=0o755)
    path = write_token_file(home, "sim_secret", traversable=traversable)
    assert path == home / "token" and path.read_text() == "sim_secret\n"
    assert (mode(path), mode(home)) == (0o600, folder)
    # a restart rewrites it, also over a file someone loosened
    path.chmod(0o644)
    assert mode(write_token_file(home, "sim_other", traversable=traversable)) == 0o600
    assert path.read_text() == "sim_other\n"
    assert sorted(p.name for p in home.iterdir()) == ["token"], "no temporary file left"


def test_an_agent_starts_without_the_apis_secrets_or_a_token_variable():
    """The agent's starting environment (which /proc/<pid>/environ keeps for
    its whole life) holds no token, no tokens file and no page-token key; the
    rest of the stack's settings pass, and, as root, ranks run as uids of the
    agent's pool unless GPUJOBS_AGENT_RANK_UIDS='' says otherwise."""
    stack = {"GPUJOBS_TOKENS_FILE": "/s/tokens.json", "GPUJOBS_PAGE_TOKEN_KEY": "k" * 64,
             "GPUJOBS_AGENT_TOKEN": "sim_secret", "AWS_ACCESS_KEY_ID": "local",
             "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": "http://127.0.0.1:5000", "PATH": "/bin"}
    env = agent_environment(stack)
    assert not set(NOT_FOR_AGENTS) & set(env)
    assert {"GPUJOBS_TOKENS_FILE", "GPUJOBS_PAGE_TOKEN_KEY", "GPUJOBS_AGENT_TOKEN"} <= \
        set(NOT_FOR_AGENTS)
    assert env["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] == "http://127.0.0.1:5000"
    # isolation is not turned off: as root the agents use their uid pool
    assert not [k for k in env if "RANK_U" in k]
    assert isolated(env) == (os.geteuid() == 0)
    assert not isolated({**env, "GPUJOBS_AGENT_RANK_UIDS": ""}), "only an explicit opt-out"


def test_a_job_s_python_is_the_stack_s_own_interpreter():
    """The agents' PATH (a rank's, too) starts with the folder of the stack's
    interpreter, once; the rest of the PATH follows in its order."""
    import sys

    own = os.path.realpath(os.path.dirname(sys.executable))  # not through a .venv link
    env = agent_environment({"PATH": f"/usr/bin:{own}:/bin"})
    assert env["PATH"] == f"{own}:/usr/bin:/bin"


def _recorded_sleeper(workdir, node: str):
    """A real process group recorded as rank 0 of job_x/1 in ``node``'s agent
    state, as an agent leaves it when it stops; the process."""
    import subprocess

    from agent.ranks import read_stat
    from agent.state import AgentState, AttemptRecord, RankRecord, StateFile

    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    stat = read_stat(proc.pid)
    rank = RankRecord(rank=0, local_rank=0, slots=[0], exit_file=str(workdir / f"{node}.exit"),
                      log_file="", heartbeat_file="", pid=proc.pid, pgid=proc.pid,
                      start_time=stat.start_time if stat else None)
    record = AttemptRecord(job_id="job_x", attempt=1, phase="RUNNING", ranks=[0],
                           procs={0: rank})
    StateFile(workdir / node / "state" / "state.json").save(
        AgentState(attempts={"job_x/1": record}))
    return proc


def test_a_restart_keeps_its_agents_ranks_for_adoption_and_stops_the_rest(tmp_path):
    """Invariant (issue 29): ranks a stack left running are its successor's
    to adopt when it runs an agent for their node; those of a node it no
    longer runs (fewer GPUJOBS_AGENTS) are stopped, never left orphaned."""
    from devstack.agents import Agents, describe, sweep

    kept, orphan = (_recorded_sleeper(tmp_path, n) for n in ("local-1", "local-2"))
    try:
        agents = Agents(1, 8, tmp_path)
        running = agents.running()
        assert describe(running) == "job_x (attempt 1): rank 0 on local-1"
        assert sweep(tmp_path, keep=tuple(agents.nodes)) == 1
        assert orphan.wait(10) == -9, "the ranks of a node no agent runs are stopped"
        assert kept.poll() is None, "the ranks an agent adopts run on"
    finally:
        for p in (kept, orphan):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_python_no_rank_can_start_is_said_with_the_fix(tmp_path):
    """make up warns when a job's `python` would fail under the uid pool (a
    virtualenv made from pyenv's under a 0700 /root), naming the fix."""
    from devstack.agents import unreachable_python

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    python = private / "python3"
    python.write_text("")
    os.chmod(python, 0o755)
    said = unreachable_python(str(python))
    assert said and "Permission denied" in said and "rm -rf .venv .venv-torch && make up" in said
    assert unreachable_python("/bin/sh") is None
