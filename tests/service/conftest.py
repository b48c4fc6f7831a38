"""Service logic on the in-memory fakes of tests/fakes.py: no moto, no AWS, so
`make test-fast` runs it in seconds. What needs DynamoDB's own semantics (real
conditional writes racing, indexes, lost answers) is tested in tests/api
on moto; the fakes keep the adapters' contract (tests/contract)."""
from __future__ import annotations

import pytest

from tests.clock import FakeClock
from tests.fakes import World


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def world(clock):
    return World(clock)


@pytest.fixture
def svc(world):
    return world.services()
