"""Fixtures for the SDK and CLI tests: a fake API server per test, stopped by
its own handle; the client package importable even before `pip install -e`."""
from __future__ import annotations

import pathlib
import sys

import pytest

CLIENT_DIR = pathlib.Path(__file__).resolve().parents[2] / "client"
try:
    import gpujobs_client  # noqa: F401
except ImportError:  # not installed into this interpreter: use the source tree
    sys.path.insert(0, str(CLIENT_DIR))

from .fakeserver import FakeApi  # noqa: E402


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


def cli_runner(api_url: str, config_home):
    """Run ``gpujobs`` as a user does: a subprocess with the API URL and a tenant
    token from the environment and an empty config directory. No traceback may
    ever reach the user: ``ranks_output=True`` only where what is printed is
    the ranks' own output (``gpujobs logs``), whose tracebacks are the job's."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_API_URL": api_url, "GPUJOBS_TOKEN": "e2e-tenant",
                "XDG_CONFIG_HOME": str(config_home), "COLUMNS": "200", "NO_COLOR": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(CLIENT_DIR), env.get("PYTHONPATH")) if p)})

    def run(*args: str, ranks_output: bool = False,
            **extra_env: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "gpujobs_client.cli", *args],
                           capture_output=True, text=True, timeout=120,
                           env={**env, **extra_env})
        assert ranks_output or "Traceback" not in r.stderr + r.stdout
        return r
    return run


def logs_until(gpujobs, job_id: str, pattern: str, count: int, timeout: float = 60,
               args: tuple[str, ...] = ()) -> str:
    """`gpujobs logs JOB [args]` once it shows ``count`` lines matching
    ``pattern`` (the agents ship the ranks' output every second or two), polled."""
    import re
    import time

    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        r = gpujobs("logs", job_id, *args, ranks_output=True)
        assert r.returncode == 0, r.stderr
        out = r.stdout + r.stderr
        if len(re.findall(pattern, out)) >= count:
            return out
        time.sleep(0.5)
    raise AssertionError(f"never {count} lines of {pattern!r} in the logs:\n{out}")
