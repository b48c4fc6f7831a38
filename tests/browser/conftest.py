"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against the local stack, which the session starts as ``make up``
does, with real agents. Every process is stopped by its own handle."""
from __future__ import annotations

import pytest

from tests.support.browser import TENANT_TOKEN
from tests.support.stacks import Api


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def browser_stack(agent_stack):
    """The session's stack with real agents (tests/conftest.py)."""
    return agent_stack


@pytest.fixture
def tenant(browser_stack):
    return Api(browser_stack.api, TENANT_TOKEN)


@pytest.fixture
def page(chrome, browser_stack):
    """The dashboard, signed in (sessionStorage holds the token). The
    browser is the session's: what an earlier test left in its console log
    is read away first, so each test's console errors are its own."""
    from tests.browser import ui
    chrome.get_log("browser")
    ui.sign_in(chrome, browser_stack.api + "/", TENANT_TOKEN)
    return chrome
