"""The agent's local state: every attempt it knows and every report not yet sent.

One JSON file in the state directory, replaced atomically on every change
(write a temporary file, fsync it, ``os.replace`` it over the old one, fsync the
directory), so after a crash or power loss it is the old or the new version,
never a mixture. It is what makes a restart safe:

- attempts with their ranks' pid, pgid and process start time, so a restarted
  agent adopts ranks that are still running instead of launching them again;
- tombstones (a CANCEL seen before its LAUNCH), so that LAUNCH is never run;
- pending reports, so an event is not lost while the API is down or the agent
  restarts: an event is durable here before it is sent, and is removed only
  once the API took it (a crash in between sends it again; repeats are harmless).

A state file that cannot be read is not silently replaced: starting empty would
orphan running ranks and launch duplicates, so the agent refuses to start and
says which file to look at.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1

# attempt phases
LAUNCHING = "LAUNCHING"  # intent recorded, processes being started
RUNNING = "RUNNING"
STOPPING = "STOPPING"    # SIGTERM sent, waiting for the groups to end (SIGKILL at the deadline)
DONE = "DONE"            # no process left; kept to recognise duplicate messages
ACTIVE_PHASES = (LAUNCHING, RUNNING, STOPPING)


class StateError(RuntimeError):
    pass


@dataclass
class RankRecord:
    rank: int
    local_rank: int
    slots: list[int]
    exit_file: str
    log_file: str
    heartbeat_file: str
    pid: int | None = None         # the shim's pid, which is also the group id
    pgid: int | None = None
    start_time: int | None = None  # /proc/<pid>/stat starttime: tells our pid from a reused one
    exit_code: int | None = None
    ended: bool = False            # exit known and no process of the group left: slots are free


@dataclass
class AttemptRecord:
    job_id: str
    attempt: int
    phase: str
    ranks: list[int] = field(default_factory=list)  # this node's ranks of the attempt
    procs: dict[int, RankRecord] = field(default_factory=dict)
    launch: dict[str, Any] | None = None  # the LAUNCH, kept only while LAUNCHING
    cancelled: bool = False   # a CANCEL was seen: report STOPPED when the ranks are gone
    cancel_reason: str | None = None
    quiet: bool = False       # the server no longer cares (stale, superseded): report nothing
    stop_deadline: float | None = None  # wall clock, so it survives a restart
    killed: bool = False
    created_at: float = 0.0
    finished_at: float | None = None
    heartbeat_interval_s: float = 10.0  # how often this attempt's beats are posted
    #: the ranks' stacks taken just before a CANCEL's SIGTERM, for its STOPPED
    #: report (stacks.report_stacks: [{"rank", "where", "frames"}])
    stop_stacks: list[dict[str, Any]] | None = None
    #: the attempt's time limit (the LAUNCH's max_runtime_s; None: none) and
    #: when it is reached, on this agent's clock from the launch; its warning
    #: (the LAUNCH's warn_signal, due at ``warn_at``: the limit less
    #: warn_before_s) and when it was sent. Kept here, as the LAUNCH is not,
    #: so a restarted agent enforces the same deadlines; absent (None) in the
    #: records of an agent that knew no time limits
    max_runtime_s: int | None = None
    runtime_deadline: float | None = None
    warn_at: float | None = None
    warn_signal: str | None = None
    warned_at: float | None = None
    #: the uid its ranks run as on this node (uidpool.py), recorded before any
    #: starts; None: ranks run as the agent (isolation "none"), or none was free
    uid: int | None = None
    #: the uid went back to the pool (no process of it was left)
    uid_freed: bool = False
    #: the name of its cgroup here while it exists (cgroups.py); None: none,
    #: or removed once empty
    cgroup: str | None = None
    #: why its ranks were not started here, for a cause outside the job
    #: (``port_in_use``: rendezvous.py), said in its EXITED report; None: they were
    not_started: str | None = None

    @property
    def key(self) -> str:
        return attempt_key(self.job_id, self.attempt)

    @property
    def is_tombstone(self) -> bool:
        """A CANCEL came first: nothing was (or will ever be) launched for this attempt."""
        return self.cancelled and not self.procs and self.phase == DONE

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["procs"] = {str(r): asdict(p) for r, p in self.procs.items()}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AttemptRecord":
        d = dict(d)
        procs = {int(r): RankRecord(**p) for r, p in d.pop("procs", {}).items()}
        return cls(**d, procs=procs)


@dataclass
class PendingReport:
    job_id: str
    attempt: int
    event: dict[str, Any]
    queued_at: float


@dataclass
class AgentState:
    attempts: dict[str, AttemptRecord] = field(default_factory=dict)
    pending: list[PendingReport] = field(default_factory=list)

    def held_uids(self) -> set[int]:
        """The pool's uids attempts here hold: not yet back in the pool."""
        return {a.uid for a in self.attempts.values() if a.uid is not None and not a.uid_freed}

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION,
                "attempts": {k: a.to_json() for k, a in self.attempts.items()},
                "pending": [asdict(p) for p in self.pending]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AgentState":
        if d.get("version") != VERSION:
            raise StateError(f"unsupported state version {d.get('version')!r}")
        return cls(attempts={k: AttemptRecord.from_json(a) for k, a in d["attempts"].items()},
                   pending=[PendingReport(**p) for p in d["pending"]])


def attempt_key(job_id: str, attempt: int) -> str:
    return f"{job_id}/{attempt}"


class StateFile:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def load(self) -> AgentState:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return AgentState()
        try:
            return AgentState.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError, StateError) as e:
            raise StateError(f"cannot read the agent state {self.path}: {e}; move it away "
                             "only after making sure no rank it lists is still running") from e

    def save(self, state: AgentState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        data = json.dumps(state.to_json(), separators=(",", ":"), sort_keys=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # env may hold secrets
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
