"""Fakes and fixtures for the host agent's tests.

Every rank a test starts goes through ``RecordingLauncher`` (or is found in a
state file), and the fixtures' teardown SIGKILLs each such process group by its
recorded id, after the same ownership check the agent itself makes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from agent.api import ApiError, AttemptGone
from agent.core import Agent, Paths
from agent.inbox import InboxMessage
from agent.ranks import Launcher, ProcTable, Rank, read_stat
from agent.runner import kill_recorded_ranks

PY = sys.executable


def wait_until(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition"):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.alive


def group_commands(rank: Rank) -> list[str]:
    """Command names (``/proc/<pid>/comm``) of the live processes in a rank's group."""
    names = []
    for pid in rank.members(ProcTable.read()):
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


def message(body: dict | str, n: int = 0) -> InboxMessage:
    text = body if isinstance(body, str) else json.dumps(body)
    return InboxMessage(body=text, receipt_handle=f"rh-{n}-{time.monotonic_ns()}",
                        message_id=f"m-{n}")


def launch(job_id: str = "job_a", attempt: int = 1, ranks=(0,), world_size: int | None = None,
           command=("sleep", "30"), **extra) -> dict:
    return {"type": "LAUNCH", "job_id": job_id, "attempt": attempt, "ranks": list(ranks),
            "world_size": world_size or (max(ranks) + 1), "command": list(command),
            "env": extra.pop("env", {}), **extra}


def cancel(job_id: str = "job_a", attempt: int = 1, reason: str = "test") -> dict:
    return {"type": "CANCEL", "job_id": job_id, "attempt": attempt, "reason": reason}


class FakeApi:
    """Records posted events; ``fail_with`` makes the next calls raise."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, dict]] = []
        self.calls = 0
        self.fail_with: ApiError | None = None
        self.gone: set[tuple[str, int]] = set()

    def post_event(self, job_id: str, attempt: int, event: dict) -> dict:
        self.calls += 1
        if self.fail_with is not None:
            raise self.fail_with
        if (job_id, attempt) in self.gone:
            raise AttemptGone("HTTP 409 stale_attempt", status=409, code="stale_attempt")
        self.events.append((job_id, attempt, dict(event)))
        return {"id": job_id}

    def of(self, kind: str, job_id: str | None = None) -> list[dict]:
        return [e for j, _, e in self.events if e["type"] == kind and job_id in (None, j)]


class FakeInbox:
    """Records deletes and defers in order; ``on_delete`` sees the agent's world at that moment."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.on_delete: Callable[[InboxMessage], None] | None = None

    def delete(self, msg: InboxMessage) -> None:
        if self.on_delete is not None:
            self.on_delete(msg)
        self.log.append(("delete", msg.message_id))

    def defer(self, msg: InboxMessage, seconds: int) -> None:
        self.log.append(("defer", msg.message_id))

    @property
    def deleted(self) -> list[str]:
        return [m for what, m in self.log if what == "delete"]


class RecordingLauncher(Launcher):
    """The real launcher, remembering every rank it started (for assertions and teardown)."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[Rank] = []

    def launch(self, command, env, log_file, exit_file, cwd=None, identity=None) -> Rank:
        rank = super().launch(command, env, log_file, exit_file, cwd=cwd, identity=identity)
        self.launched.append(rank)
        return rank


def kill_ranks_in_state(state_dir: Path) -> None:
    kill_recorded_ranks(state_dir)


class World:
    """Agents over one state directory, with the fakes they share."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.paths = Paths.under(tmp / "state", tmp / "logs")
        self.api, self.inbox = FakeApi(), FakeInbox()
        self.launchers: list[RecordingLauncher] = []
        self.now: float | None = None  # set to drive the agent's clock by hand

    def clock(self) -> float:
        return time.time() if self.now is None else self.now

    def agent(self, *, gpus: int = 8, grace_s: float = 10.0, api=None,
              base_env: dict | None = None, launcher: RecordingLauncher | None = None,
              pool=None) -> Agent:
        launcher = launcher or RecordingLauncher()
        self.launchers.append(launcher)
        return Agent(node_id="node-1", gpus=gpus, api=api or self.api, inbox=self.inbox,
                     paths=self.paths, launcher=launcher, grace_s=grace_s, clock=self.clock,
                     backoff_base=0.01, backoff_cap=0.05, pool=pool,
                     base_env=base_env if base_env is not None else dict(os.environ))

    def state(self) -> dict:
        return json.loads(self.paths.state_file.read_text())

    def cleanup(self) -> None:
        for launcher in self.launchers:
            for rank in launcher.launched:
                rank.kill()
        kill_ranks_in_state(self.paths.state_dir)
        for launcher in self.launchers:
            for rank in launcher.launched:
                if rank._popen is not None:
                    try:
                        rank._popen.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.cleanup()


def run_until(agent: Agent, condition: Callable[[], object], timeout: float = 10.0,
              what: str = "condition"):
    """Tick the agent until ``condition`` holds."""
    def step():
        agent.tick()
        return condition()
    return wait_until(step, timeout=timeout, what=what)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a process a test started, by its own pid: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_agent(proc: subprocess.Popen, state_dir: Path) -> None:
    """Stop an agent process a test started, by its own pid (resumed first: a
    paused process would not act on SIGTERM), then every rank its state file
    records, also the ranks of a test that failed half-way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
    stop_process(proc, 15)
    if (state_dir / "state.json").exists():
        kill_recorded_ranks(state_dir)


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
    from propagating, as it must on Lambda; no agent runs under it. Every
    logger of the ``gpujobs`` tree propagates and is enabled for the test,
    and is put back after it."""
    import logging

    tree = [logging.getLogger("gpujobs")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("gpujobs.") and isinstance(logger, logging.Logger)]
    was = [(logger, logger.propagate, logger.disabled) for logger in tree]
    for logger in tree:
        logger.propagate, logger.disabled = True, False
    yield
    for logger, propagate, disabled in was:
        logger.propagate, logger.disabled = propagate, disabled


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
