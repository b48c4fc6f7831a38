"""The host agent's tests' own harness: fakes of its API and inbox, a
launcher that records every rank it starts, agents over one state directory
(``World``, the ``world`` fixture's), and the inbox messages they are fed.

Every rank a test starts goes through ``RecordingLauncher`` (or is found in a
state file), and ``World.cleanup`` SIGKILLs each such process group by its
recorded id, after the same ownership check the agent itself makes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from agent.api import ApiError, AttemptGone
from agent.core import Agent, Paths
from agent.inbox import InboxMessage
from agent.ranks import Launcher, ProcTable, Rank
from agent.uidpool import UidPool, UidRange
from tests.support.ports import free_port
from tests.support.procs import kill_ranks_in_state
from tests.support.waits import wait_until

PY = sys.executable


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
    """A LAUNCH; its rendezvous port the OS's unless ``extra`` names one (a
    job id's port is the same in both pytest workers, whose agents hold it)."""
    extra.setdefault("master_port", free_port())
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

    def launch(self, command, env, log_file, exit_file, cwd=None, identity=None,
               make_dir=None, cgroup=()) -> Rank:
        rank = super().launch(command, env, log_file, exit_file, cwd=cwd, identity=identity,
                              make_dir=make_dir, cgroup=cgroup)
        self.launched.append(rank)
        return rank


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
              pool=None, job_roots: tuple[str, ...] = (), cgroups=None) -> Agent:
        launcher = launcher or RecordingLauncher()
        self.launchers.append(launcher)
        return Agent(node_id="node-1", gpus=gpus, api=api or self.api, inbox=self.inbox,
                     paths=self.paths, launcher=launcher, grace_s=grace_s, clock=self.clock,
                     backoff_base=0.01, backoff_cap=0.05, pool=pool, job_roots=job_roots,
                     cgroups=cgroups,
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


def pooled_agent(world: World, identity, **kw) -> Agent:
    """An agent whose ranks run as ``identity``'s uid, a pool of that one
    uid (``world`` in a folder that uid reaches: the ``shared_world``
    fixture); ``kw`` as :meth:`World.agent` takes them."""
    pool = UidPool(UidRange(identity.uid, identity.uid), world.paths.state_dir,
                   claims=world.tmp / "claims")
    return world.agent(base_env={"PATH": "/usr/bin:/bin"}, pool=pool, **kw)


def run_until(agent: Agent, condition: Callable[[], object], timeout: float = 10.0,
              what: str = "condition"):
    """Tick the agent until ``condition`` holds."""
    def step():
        agent.tick()
        return condition()
    return wait_until(step, timeout=timeout, what=what)
