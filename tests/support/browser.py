"""Jobs the dashboard tests submit and wait for, as the signed-in tenant
(:data:`TENANT_TOKEN`) of the session's stack with real agents."""
from __future__ import annotations

import json
import uuid
from typing import Collection

from tests.support.agents import job, reached
from tests.support.stacks import Api

TENANT_TOKEN = "e2e-tenant"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def submit(api: Api, **spec) -> dict:
    body = {"command": ["sleep", "600"], "ranks": 1, "gpu_type": "h100", **spec}
    r = api.post("/v1/jobs", data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    return r.json()


def wait_state(api: Api, job_id: str, states: Collection[str], timeout: float = 60) -> dict:
    """The job once its state is one of ``states`` (:func:`tests.support.agents.reached`),
    or as it is at the deadline: the caller's assertion on its state says what it was."""
    try:
        return reached(api, job_id, states, timeout)
    except AssertionError:
        return job(api, job_id)
