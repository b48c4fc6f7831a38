"""Shared fixtures: one embedded moto server per session with the stack from
infra/ deployed into it; services bound to it per test with fresh tenants."""
from __future__ import annotations

import os
import uuid

import pytest

pytest_plugins = ["tests.iam_recorder"]

# the shared helpers' asserts explain their failures as a test's own do
pytest.register_assert_rewrite("tests.support", "tests.agent.harness", "tests.contract.ports",
                               "tests.service.helpers")

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


#: fixtures that start the moto server, or the local stack, for a test
_MOTO_FIXTURES = frozenset({"moto_server", "aws_env", "fresh_env", "_whole_table_env"})
_E2E_FIXTURES = frozenset({"stack", "nodes_stack", "agent_stack"})
_E2E_DIRS = frozenset({"e2e", "browser", "package"})


def pytest_collection_modifyitems(config, items):
    """Mark what a test needs, so `-m "not moto and not e2e"` (make test-fast)
    runs only tests that need neither: ``moto`` for tests whose fixtures start
    the moto server, ``e2e`` for tests of the local stack (by directory, or by
    its fixtures). A test that reaches moto some other way (a parametrised
    fixture's getfixturevalue) marks itself, as tests/contract does."""
    root = os.path.dirname(__file__)
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        parts = os.path.relpath(str(item.fspath), root).split(os.sep)
        if used & _E2E_FIXTURES or parts[0] in _E2E_DIRS:
            item.add_marker(pytest.mark.e2e)
        if used & _MOTO_FIXTURES:
            item.add_marker(pytest.mark.moto)


def pytest_terminal_summary(terminalreporter):
    """Say so when this host's ephemeral port range reaches the rendezvous
    ports (chalicelib/domain/wire.py): any outgoing connection may then hold
    an attempt's MASTER_PORT, and a torch test's job may need a second
    attempt (tests/e2e/test_torch_ddp.py, assert_ran_through_without_an_alarm)."""
    from agent.rendezvous import ephemeral_range
    from chalicelib.domain.wire import MASTER_PORT_MIN, MASTER_PORT_SPAN

    eph = ephemeral_range()
    last = MASTER_PORT_MIN + MASTER_PORT_SPAN - 1
    if eph is not None and eph[0] <= last and MASTER_PORT_MIN <= eph[1]:
        terminalreporter.write_line(
            f"host: ephemeral ports {eph[0]}-{eph[1]} (net.ipv4.ip_local_port_range) overlap "
            f"the rendezvous ports {MASTER_PORT_MIN}-{last}: an attempt's MASTER_PORT may be "
            "taken by an outgoing connection")


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
    # and jobs' follow-ups run in the call: no consumer drains that queue here
    # either (the local stack's does; tests/service/test_follow_ups.py)
    env.pop("GPUJOBS_FOLLOW_UP_QUEUE_URL", None)
    # webhook deliveries stay on their queue: no consumer here either, so
    # a test that delivers runs the local stack's (tests/api/test_webhooks.py)
    return env


@pytest.fixture(scope="session")
def aws_env(moto_server):
    """The environment that points the app at the shared test stack."""
    return _deploy(moto_server, "test")


@pytest.fixture(scope="session")
def _whole_table_env(moto_server):
    return _deploy(moto_server, "whole")


@pytest.fixture
def fresh_env(_whole_table_env):
    """The second shared stack, emptied before the test: for tests of code that
    reads whole tables (the placer, the reconciler, the scan), whose answers
    must not include other tests' jobs and nodes. Emptying a few items costs
    milliseconds; deploying a stack per test cost seconds."""
    empty_stack(_whole_table_env)
    return _whole_table_env


def empty_stack(env: dict) -> None:
    """Delete every item of the stack's tables, every node inbox, and every
    message on its pending queue."""
    import boto3

    from devstack.resources import OUTPUT_ENV

    session = boto3.session.Session()
    kw = {"endpoint_url": env["GPUJOBS_AWS_ENDPOINT_URL"], "region_name": "us-east-1"}
    ddb, sqs = session.client("dynamodb", **kw), session.client("sqs", **kw)
    for var in OUTPUT_ENV.values():
        if not var.endswith("_TABLE"):
            continue
        table = env[var]
        keys = [k["AttributeName"]
                for k in ddb.describe_table(TableName=table)["Table"]["KeySchema"]]
        for page in ddb.get_paginator("scan").paginate(
                TableName=table, ProjectionExpression=", ".join(f"#k{i}" for i in range(len(keys))),
                ExpressionAttributeNames={f"#k{i}": k for i, k in enumerate(keys)}):
            items = page["Items"]
            for i in range(0, len(items), 25):
                ddb.batch_write_item(RequestItems={table: [
                    {"DeleteRequest": {"Key": item}} for item in items[i:i + 25]]})
    prefix = env["GPUJOBS_INBOX_QUEUE_PREFIX"]
    for url in sqs.list_queues(QueueNamePrefix=prefix).get("QueueUrls", []):
        if url.rsplit("/", 1)[-1] != prefix + "dlq":
            sqs.delete_queue(QueueUrl=url)
    pending = env["GPUJOBS_PENDING_QUEUE_URL"]  # PurgeQueue is once a minute
    while msgs := sqs.receive_message(QueueUrl=pending, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=0).get("Messages"):
        sqs.delete_message_batch(QueueUrl=pending, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)])


@pytest.fixture
def clock():
    """The services' time: real time, moved on by ``clock.advance(seconds)``."""
    from tests.clock import ShiftedClock

    return ShiftedClock()


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
            {"token": f"tok-ops-{tag}", "operator": f"ops-{tag}"},
        ]

    def headers(self, who: str = "a", **extra: str) -> dict[str, str]:
        token = {"a": self.entries[0], "b": self.entries[1],
                 "agent": self.entries[2], "agents": self.entries[3],
                 "ops": self.entries[4]}[who]["token"]
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                **extra}


@pytest.fixture
def tenants():
    return Tenants()


@pytest.fixture
def make_services(aws_env, tenants, clock):
    """Build and install services on the moto stack; ``overrides`` swap adapters
    (or the clock, which is the test's ``clock`` fixture by default)."""
    from chalicelib import bootstrap
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.config import Config

    def make(env=None, **overrides):
        overrides.setdefault("clock", clock)
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


# -- the local stack, as `make up` runs it: each kind started once per session ----
@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """No agents: jobs stay PENDING, and a cancel is the control plane's alone."""
    from tests.support.stacks import running

    with running(tmp_path_factory.mktemp("stack")) as s:
        yield s


@pytest.fixture(scope="session")
def nodes_stack(tmp_path_factory):
    """For the modules that start real agents of their own, each for nodes
    and a GPU type no other test uses (tests/support/agents.py), and set
    what they vary on it while they run (tests/support/stacks.py borrowed).
    Not ``stack``: other tests' jobs that take any GPU type wait there, and
    would take these nodes the moment they register."""
    from tests.support.stacks import running

    with running(tmp_path_factory.mktemp("nodes")) as s:
        yield s


@pytest.fixture(scope="session")
def agent_stack(tmp_path_factory):
    """Two real agents of 4 GPUs each, scanning every second: jobs really run,
    as make up runs them: as root, each job's ranks as a uid of its own.

    Its nodes never cordon themselves: the tests sharing it end many jobs
    ``rank_failed`` on purpose, and three of them on one node would take it
    out of service (issue 28's FailureWatch) for every later test of the
    session, which then waits for GPUs that never come. tests/e2e/test_drain.py
    tests the auto-cordon on ``nodes_stack``, with its own setting. Not
    ``stack``: its jobs that take any GPU type would run here."""
    from tests.support.stacks import running

    with running(tmp_path_factory.mktemp("agents"), GPUJOBS_AGENTS="2",
                 GPUJOBS_GPUS_PER_AGENT="4", GPUJOBS_SCAN_PERIOD_S="1",
                 GPUJOBS_AGENT_GRACE_S="2", GPUJOBS_AUTO_CORDON_FAILURES="0",
                 # a busy node calls in every 2 s, not 5 minutes: the
                 # walls tests read its call-ins as its loop going on
                 # (tests/e2e/test_node_loss.py keeps the default)
                 GPUJOBS_AGENT_BUSY_CALL_IN_S="2") as s:
        yield s


@pytest.fixture
def shared_dir():
    """A folder every job's ranks may read and write, as shared storage is:
    mode 1777 under /tmp. pytest's own folders are 0700, out of the reach of
    a rank that runs as a uid of its own (make up's agents, as root). Removed
    after the test."""
    import pathlib
    import shutil
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp(prefix="gpujobs-test-", dir="/tmp"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_python() -> str:
    """The python of the cached torch virtualenv that real-torch tests run
    their ranks with: GPUJOBS_TORCH_PYTHON, else the repository's .venv-torch
    (`make torch-venv`). Missing, the tests skip, except under `make test`
    (GPUJOBS_REQUIRE_TORCH=1), which never skips them silently."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("GPUJOBS_TORCH_PYTHON") or os.path.join(root, ".venv-torch", "bin",
                                                                  "python")
    if not os.access(path, os.X_OK):
        why = f"no torch virtualenv at {path} (make torch-venv builds it)"
        if os.environ.get("GPUJOBS_REQUIRE_TORCH") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def chrome():
    """One headless Chromium a worker session (tests/browser, e2e pages),
    stopped by its own handle."""
    import shutil
    import tempfile

    from devstack.browser import CHROMEDRIVER, CHROMIUM, start_chrome

    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("!!! BROWSER TESTS NOT RUN: chromium and chromedriver are not installed; "
                    "`make test` installs them (apt-get install chromium chromium-driver) !!!")
    profile = tempfile.mkdtemp(prefix="gpujobs-chromium-")
    driver, service = start_chrome(profile, browser_log=True)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            service.stop()
            shutil.rmtree(profile, ignore_errors=True)
