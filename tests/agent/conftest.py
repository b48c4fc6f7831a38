"""Fixtures for the host agent's tests: agents over one state directory
(``world``, tests/agent/harness.py's World, cleaned up after the test), the
ranks a test started, the agent's loggers reaching caplog, and queues and log
groups on the session's moto server."""
from __future__ import annotations

import uuid

import pytest

from agent.ranks import Rank

from .harness import World


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.cleanup()


@pytest.fixture
def shared_world(shared_dir):
    """A World in a folder every uid reaches (pytest's are 0700): for agents
    whose ranks run as a pool's uid."""
    w = World(shared_dir)
    try:
        yield w
    finally:
        w.cleanup()


@pytest.fixture
def launched():
    """The ranks a test started (append them): each killed, and its shim
    waited for, also when the test fails."""
    ranks: list[Rank] = []
    try:
        yield ranks
    finally:
        for r in ranks:
            r.kill()
            if r._popen is not None:
                r._popen.wait(5)


@pytest.fixture(autouse=True)
def agent_logs_reach_caplog():
    """The agent's loggers (``gpujobs.agent.*``) reach the root logger, where
    caplog listens. An in-process app of an earlier test in this worker
    (chalicelib/adapters/telemetry.py's LambdaTelemetry) stops ``gpujobs``
    from propagating, as it must on Lambda, and sets its level (ERROR, in
    tests/api/test_handler_context.py); no agent runs under it. Every logger
    of the ``gpujobs`` tree propagates, is enabled and takes its level from
    the root for the test, and is put back after it."""
    import logging

    tree = [logging.getLogger("gpujobs")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("gpujobs.") and isinstance(logger, logging.Logger)]
    was = [(logger, logger.propagate, logger.disabled, logger.level) for logger in tree]
    for logger in tree:
        logger.propagate, logger.disabled = True, False
        logger.setLevel(logging.NOTSET)
    yield
    for logger, propagate, disabled, level in was:
        logger.propagate, logger.disabled = propagate, disabled
        logger.setLevel(level)


@pytest.fixture(scope="session")
def moto_endpoint(moto_server):
    """The session's one moto server (tests/conftest.py)."""
    return moto_server.endpoint_url


@pytest.fixture
def sqs(moto_endpoint, request):
    """A fresh queue on the moto server: (client, queue URL).

    Parametrise it (indirect) with a visibility timeout: a short one where a test
    kills an agent, since a long poll the dead agent left open can still take a
    message, which then comes back only after that timeout."""
    import boto3

    visibility = getattr(request, "param", 30)
    client = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    url = client.create_queue(QueueName=f"gpujobs-test-inbox-{uuid.uuid4().hex[:8]}",
                              Attributes={"VisibilityTimeout": str(visibility)})["QueueUrl"]
    return client, url


@pytest.fixture
def logs(aws_env):
    """A CloudWatch Logs client of the test's moto (the shipper's tests)."""
    import boto3
    return boto3.client("logs", endpoint_url=aws_env["GPUJOBS_AWS_ENDPOINT_URL"],
                        region_name="us-east-1")


@pytest.fixture
def group(aws_env):
    return aws_env["GPUJOBS_LOG_GROUP"]
