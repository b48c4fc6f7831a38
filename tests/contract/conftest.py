"""The contract suite: every test runs against the in-memory fake of a port
(tests/fakes.py) and against its real adapter on moto, so the two cannot
drift. The real adapters share the session's stack, isolated by fresh ids,
tenants and GPU types; the ``whole`` fixture gives tests that read whole
tables (the queue, due intents, silent nodes, the collector) the stack that is
emptied before each test."""
from __future__ import annotations

import pytest

from tests.contract.ports import IMPLEMENTATIONS, Ports, fake_ports, real_ports


@pytest.fixture(params=IMPLEMENTATIONS)
def ports(request) -> Ports:
    """The fakes, or the real adapters on the session's shared stack."""
    if request.param == "fake":
        return fake_ports()
    return real_ports(request.getfixturevalue("aws_env"))


@pytest.fixture(params=IMPLEMENTATIONS)
def whole(request) -> Ports:
    """The fakes, or the real adapters on a stack emptied for this test: for
    tests that read whole tables."""
    if request.param == "fake":
        return fake_ports()
    return real_ports(request.getfixturevalue("fresh_env"))
