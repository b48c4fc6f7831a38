"""Clients of the session's local stack (tests/conftest.py starts it): the
API as a tenant or an agent, and ``gpujobs`` as a user runs it against the
stack with real agents (a module with a stack of its own defines its own)."""
from __future__ import annotations

import pytest

from tests.support.cli import cli_runner
from tests.support.stacks import Api


@pytest.fixture
def api(stack):
    return Api(stack.api, "e2e-tenant")


@pytest.fixture
def other(stack):
    return Api(stack.api, "e2e-other")


@pytest.fixture
def agent(stack):
    return Api(stack.api, "e2e-agent")


@pytest.fixture
def gpujobs(agent_stack, tmp_path):
    return cli_runner(agent_stack.api, tmp_path / "xdg")
