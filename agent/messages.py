"""Inbox messages (API.md, "Nodes"), parsed and checked before anything acts on them.

A message that fails these checks is never acted on; the agent leaves it in the
queue, whose redrive policy moves it to the dead-letter queue after a few
receives, where an operator can see it. Job ids become directory names (logs,
exit files), so they are held to a conservative alphabet.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MASTER_PORT_MIN, MASTER_PORT_SPAN = 20000, 20000  # default ports 20000..39999


class MessageError(ValueError):
    """The message cannot be acted on as it is."""


def default_master_port(job_id: str, attempt: int) -> int:
    """The same port on every node of an attempt, without any coordination.

    Derived from a hash of ``job_id/attempt`` (not Python's ``hash()``, which is
    salted per process, so agents would disagree)."""
    digest = hashlib.sha256(f"{job_id}/{attempt}".encode()).digest()
    return MASTER_PORT_MIN + int.from_bytes(digest[:8], "big") % MASTER_PORT_SPAN


@dataclass(frozen=True)
class Launch:
    job_id: str
    attempt: int
    ranks: tuple[int, ...]  # this node's global ranks, ascending
    world_size: int
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    gpus_per_rank: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    #: how often the agent posts this attempt's rank beats
    heartbeat_interval_s: float = 10.0

    def to_dict(self) -> dict[str, Any]:
        return {"type": "LAUNCH", "job_id": self.job_id, "attempt": self.attempt,
                "ranks": list(self.ranks), "world_size": self.world_size,
                "command": list(self.command), "env": dict(self.env),
                "gpus_per_rank": self.gpus_per_rank, "master_addr": self.master_addr,
                "master_port": self.master_port,
                "heartbeat_interval_s": self.heartbeat_interval_s}


@dataclass(frozen=True)
class Cancel:
    job_id: str
    attempt: int
    reason: str | None = None


def _int(msg: dict, name: str, minimum: int, default: int | None = None) -> int:
    value = msg.get(name, default)
    if value is None:
        raise MessageError(f"{name} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MessageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _job_id(msg: dict) -> str:
    job_id = msg.get("job_id")
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise MessageError(f"job_id must match {JOB_ID_RE.pattern}, got {job_id!r}")
    return job_id


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MessageError("env must be an object")
    env = {}
    for k, v in value.items():
        if v is None:
            continue
        if isinstance(v, (dict, list)):
            raise MessageError(f"env value of {k!r} must be a string")
        env[str(k)] = v if isinstance(v, str) else json.dumps(v)
    return env


def parse_launch(msg: dict) -> Launch:
    job_id, attempt = _job_id(msg), _int(msg, "attempt", 1)
    world_size = _int(msg, "world_size", 1)
    ranks = msg.get("ranks")
    if (not isinstance(ranks, list) or not ranks
            or any(isinstance(r, bool) or not isinstance(r, int) for r in ranks)):
        raise MessageError("ranks must be a non-empty list of integers")
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world_size for r in ranks):
        raise MessageError(f"ranks must be distinct and in 0..{world_size - 1}, got {ranks}")
    command = msg.get("command")
    if (not isinstance(command, list) or not command
            or not all(isinstance(c, str) for c in command) or not command[0]):
        raise MessageError("command must be a non-empty list of strings")
    master_addr = msg.get("master_addr") or "127.0.0.1"
    if not isinstance(master_addr, str):
        raise MessageError("master_addr must be a string")
    port = msg.get("master_port")
    if port is None:
        port = default_master_port(job_id, attempt)
    elif isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MessageError(f"master_port must be in 1..65535, got {port!r}")
    interval = msg.get("heartbeat_interval_s", 10.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise MessageError(f"heartbeat_interval_s must be a positive number, got {interval!r}")
    return Launch(job_id=job_id, attempt=attempt, ranks=tuple(sorted(ranks)),
                  world_size=world_size, command=tuple(command), env=_env(msg.get("env")),
                  gpus_per_rank=_int(msg, "gpus_per_rank", 0, default=1),
                  master_addr=master_addr, master_port=port,
                  heartbeat_interval_s=float(interval))


def parse_cancel(msg: dict) -> Cancel:
    reason = msg.get("reason")
    return Cancel(job_id=_job_id(msg), attempt=_int(msg, "attempt", 1),
                  reason=reason if isinstance(reason, str) else None)


def parse(body: str) -> Launch | Cancel:
    """The message in an SQS body, or MessageError saying what is wrong with it."""
    try:
        msg = json.loads(body)
    except ValueError as e:
        raise MessageError(f"not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise MessageError("not a JSON object")
    kind = msg.get("type")
    if kind == "LAUNCH":
        return parse_launch(msg)
    if kind == "CANCEL":
        return parse_cancel(msg)
    raise MessageError(f"unknown message type {kind!r}")
