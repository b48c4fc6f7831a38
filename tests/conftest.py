"""Shared fixtures: one embedded moto server per session with the stack from
infra/ deployed into it; services bound to it per test with fresh tenants."""
from __future__ import annotations

import os
import uuid

import pytest

pytest_plugins = ["tests.iam_recorder"]

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def moto_server():
    from devstack.motoserver import MotoServer

    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


def _deploy(server, stage: str) -> dict:
    from devstack import resources

    env = resources.deploy(server.endpoint_url, stage=stage)
    env["GPUJOBS_PAGE_TOKEN_KEY"] = "test-page-token-key"
    env["GPUJOBS_SCAN_PERIOD_S"] = "60"
    # scans judge inline here: the shared stack's RUNNING jobs add up across
    # tests, and no consumer drains the scan queue (the fan-out has its own tests)
    env.pop("GPUJOBS_SCAN_QUEUE_URL", None)
    return env


@pytest.fixture(scope="session")
def aws_env(moto_server):
    """The environment that points the app at the shared test stack."""
    return _deploy(moto_server, "test")


@pytest.fixture
def fresh_env(moto_server):
    """A stack of its own, for tests that read whole tables (placement, nodes)."""
    return _deploy(moto_server, "t" + uuid.uuid4().hex[:10])


class Tenants:
    """Fresh tenant and agent tokens for one test, so tests share no data."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.a, self.b = f"acme-{tag}", f"other-{tag}"
        self.entries = [
            {"token": f"tok-a-{tag}", "tenant": self.a},
            {"token": f"tok-b-{tag}", "tenant": self.b},
            {"token": f"tok-agent-{tag}", "agent": "node-1"},
            {"token": f"tok-agents-{tag}", "agent": "*"},
        ]

    def headers(self, who: str = "a", **extra: str) -> dict[str, str]:
        token = {"a": self.entries[0], "b": self.entries[1],
                 "agent": self.entries[2], "agents": self.entries[3]}[who]["token"]
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                **extra}


@pytest.fixture
def tenants():
    return Tenants()


@pytest.fixture
def make_services(aws_env, tenants):
    """Build and install services on the moto stack; ``overrides`` swap adapters."""
    from chalicelib import bootstrap
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.config import Config

    def make(env=None, **overrides):
        s = bootstrap.build(Config.from_env(env or aws_env),
                            tokens=TokenStore.from_entries(tenants.entries), **overrides)
        bootstrap.install(s)
        return s

    yield make
    bootstrap.install(None)


@pytest.fixture
def services(make_services):
    return make_services()


@pytest.fixture
def client(services):
    from chalice.test import Client

    import app

    with Client(app.app) as c:
        yield c
