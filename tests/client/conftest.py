"""Fixtures for the SDK and CLI tests: a fake API server per test, stopped by
its own handle; the client package importable even before `pip install -e`
(tests/support/cli.py puts it on ``sys.path``)."""
from __future__ import annotations

import pytest

import tests.support.cli  # noqa: F401 - the client package on sys.path, if not installed

from .fakeserver import FakeApi


@pytest.fixture
def fake():
    server = FakeApi().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def xdg(tmp_path):
    d = tmp_path / "xdg"
    d.mkdir()
    return d


class Run:
    """`gpujobs` in-process (click's CliRunner) against the fake server, with its own
    config directory (the `run` fixture; test_cli.py and test_cli_logs.py use it)."""

    def __init__(self, fake: FakeApi, xdg) -> None:
        self.fake, self.xdg = fake, xdg

    def __call__(self, *args: str, env: dict | None = None, input: str | None = None,
                 url: bool = True, token: bool = True):
        base = {"GPUJOBS_API_URL": self.fake.url if url else None,
                "GPUJOBS_TOKEN": "t1" if token else None, "XDG_CONFIG_HOME": str(self.xdg),
                "GPUJOBS_RETRIES": None, "GPUJOBS_DEBUG": None, "COLUMNS": "200",
                # no local stack's cli.toml, even with a `make up` running here
                "GPUJOBS_STATE_DIR": str(self.xdg.parent / "no-local-stack"),
                "NO_COLOR": "1", **(env or {})}
        from click.testing import CliRunner

        from gpujobs_client.cli import cli
        result = CliRunner().invoke(cli, list(args), env=base, input=input)
        # never a traceback, whatever happened
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), \
            repr(result.exception)
        return result


@pytest.fixture
def run(fake, xdg):
    return Run(fake, xdg)


class Recorder:
    """A RetryPolicy clock and sleep that record the waits and never sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def waits():
    return Recorder()


@pytest.fixture
def policy(waits):
    from gpujobs_client import RetryPolicy

    def make(**kw):
        return RetryPolicy(**{"max_attempts": 5, "max_elapsed_s": 30.0, "base_delay_s": 0.01,
                              "max_delay_s": 0.05, "sleep": waits.sleep, "clock": waits.clock,
                              **kw})
    return make


@pytest.fixture
def sdk(fake, policy):
    from gpujobs_client import Client
    c = Client(fake.url, "t1", timeout=5, retry=policy())
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def agent_sdk(fake, policy):
    from gpujobs_client import Client
    c = Client(fake.url, "a1", timeout=5, retry=policy())
    try:
        yield c
    finally:
        c.close()
