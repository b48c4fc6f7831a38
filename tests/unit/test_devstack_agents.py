"""The local stack's agents hold their token in a private file, not in their
environment (issue 24, item 1): devstack/agents.py's pieces, without a stack
(tests/e2e/test_agent_walls.py checks the running agents)."""
from __future__ import annotations

import stat

import pytest

from devstack.agents import NOT_FOR_AGENTS, agent_environment, write_token_file


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
    rest of the stack's settings pass, and ranks run as the agent by default."""
    stack = {"GPUJOBS_TOKENS_FILE": "/s/tokens.json", "GPUJOBS_PAGE_TOKEN_KEY": "k" * 64,
             "GPUJOBS_AGENT_TOKEN": "sim_secret", "AWS_ACCESS_KEY_ID": "local",
             "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": "http://127.0.0.1:5000", "PATH": "/bin"}
    env = agent_environment(stack)
    assert not set(NOT_FOR_AGENTS) & set(env)
    assert {"GPUJOBS_TOKENS_FILE", "GPUJOBS_PAGE_TOKEN_KEY", "GPUJOBS_AGENT_TOKEN"} <= \
        set(NOT_FOR_AGENTS)
    assert env["AWS_ENDPOINT_URL_CLOUDWATCH_LOGS"] == "http://127.0.0.1:5000"
    assert env["GPUJOBS_AGENT_RANK_USER"] == ""
    assert agent_environment({"GPUJOBS_AGENT_RANK_USER": "gpujobs-rank"})[
        "GPUJOBS_AGENT_RANK_USER"] == "gpujobs-rank"
