"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against the local stack, which the session starts as ``make up``
does, with real agents. Every process is stopped by its own handle."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.stacks import Api

TENANT_TOKEN = "e2e-tenant"


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
    """The dashboard, signed in (sessionStorage holds the token)."""
    from tests.browser import ui
    ui.sign_in(chrome, browser_stack.api + "/", TENANT_TOKEN)
    return chrome


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def submit(api: Api, **spec) -> dict:
    body = {"command": ["sleep", "600"], "ranks": 1, "gpu_type": "h100", **spec}
    r = api.post("/v1/jobs", data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    return r.json()


def wait_state(api: Api, job_id: str, states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = api.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.2)
