"""Clients of the session's local stack (tests/conftest.py starts it)."""
from __future__ import annotations

import pytest

from tests.stacks import Api


@pytest.fixture
def api(stack):
    return Api(stack.api, "e2e-tenant")


@pytest.fixture
def other(stack):
    return Api(stack.api, "e2e-other")


@pytest.fixture
def agent(stack):
    return Api(stack.api, "e2e-agent")
