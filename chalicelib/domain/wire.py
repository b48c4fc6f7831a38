"""The inbox messages LAUNCH and CANCEL (API.md, "Nodes"): one schema for both ends.

The control plane builds them with the classes here (domain/intents.py) and the
host agent parses them with the functions here (agent/messages.py re-exports
them), so field names, types, bounds and defaults live in this module only.
Standard library only: the agent imports it on GPU hosts, without boto3,
botocore or PynamoDB (tests/contract/test_wire.py checks).

A LAUNCH names the ranks of the one node it is sent to. The outbox keeps one
message per attempt, :class:`AttemptLaunch` (what every node gets alike), with
each node's ranks beside it; :func:`with_ranks` makes the node's message.
Outbox items already stored hold messages of this shape, so a field added later
must have a default the parser fills in when the message lacks it.

A message that fails parsing is never acted on: the agent leaves it in the
queue, whose redrive policy moves it to the dead-letter queue after a few
receives, where an operator can see it.
"""
from __future__ import annotations

import json
import re
import secrets
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from .spec import JobSpec

LAUNCH, CANCEL = "LAUNCH", "CANCEL"

#: job ids become directory names on the hosts (logs, exit files), so the agent
#: holds them to a conservative alphabet; every id ids.new_job_id makes fits it
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: rendezvous ports: 20000..32767, below
#: Linux's default ephemeral range (net.ipv4.ip_local_port_range, 32768-60999),
#: from which every outgoing connection on the host takes its local port, so
#: no connection can already hold the port by chance; the agent holding rank 0
#: still checks it is free and holds it (agent/rendezvous.py)
MASTER_PORT_MIN, MASTER_PORT_SPAN = 20000, 12768
#: what the agent takes when a LAUNCH does not say (for the port: master_port)
DEFAULT_GPUS_PER_RANK = 1
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
#: a job's working_dir: an absolute path of at most 4096 characters, no NUL
#: (the API's schema holds a spec to the same pattern)
WORKING_DIR_PATTERN = r"^/[^\x00]{0,4095}$"
WORKING_DIR_RE = re.compile(WORKING_DIR_PATTERN)


#: the LAUNCH's optional members: sent only when set, absent in older messages
_OPTIONAL = ("working_dir", "max_runtime_s", "warn_before_s", "warn_signal", "checkpoint_dir")
#: the signals a LAUNCH may name as its warning (the API's warn_signal)
WARN_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGALRM", "SIGTERM", "SIGWINCH",
                "SIGURG")


class MessageError(ValueError):
    """The message cannot be acted on as it is."""


def new_master_port(randbelow: Callable[[int], int] = secrets.randbelow) -> int:
    """A new attempt's rendezvous port, sent in its LAUNCH to every node: any
    of the range, drawn when the attempt is placed, so that nobody can tell
    it from the job id beforehand (job ids are visible in ``ps``) and hold it
    to fail another tenant's attempt."""
    return MASTER_PORT_MIN + randbelow(MASTER_PORT_SPAN)


def master_port(job_id: str, attempt: int) -> int:
    """The port an agent takes for a LAUNCH that names none (one sent before
    LAUNCHes carried the port). The same on every node without coordination
    (a CRC, not Python's ``hash()``, which is salted per process)."""
    return MASTER_PORT_MIN + zlib.crc32(f"{job_id}#{attempt}".encode()) % MASTER_PORT_SPAN


@dataclass(frozen=True)
class AttemptLaunch:
    """The LAUNCH of an attempt as every node of it gets it, but for ``ranks``."""
    job_id: str
    attempt: int
    world_size: int
    command: tuple[str, ...]
    env: dict[str, str]
    gpus_per_rank: int
    master_addr: str
    master_port: int
    #: how often the agent posts the attempt's rank beats
    heartbeat_interval_s: float
    #: the directory the ranks run in (the spec's working_dir); None: the agent's
    working_dir: str | None = field(default=None, kw_only=True)
    #: the attempt's time limit, from its launch (the spec's max_runtime_s;
    #: None: none), and the warning ``warn_signal`` every rank gets
    #: ``warn_before_s`` ahead of it (None: no warning)
    max_runtime_s: int | None = field(default=None, kw_only=True)
    warn_before_s: int | None = field(default=None, kw_only=True)
    warn_signal: str | None = field(default=None, kw_only=True)
    #: the job's checkpoint directory, the same in every attempt
    #: (``<spec's checkpoint_dir>/<job_id>``; None: the spec names none)
    checkpoint_dir: str | None = field(default=None, kw_only=True)

    @classmethod
    def of_spec(cls, job_id: str, attempt: int, spec: JobSpec, *, master_addr: str,
                master_port: int) -> "AttemptLaunch":
        """The LAUNCH of a job's attempt, from its spec (defaults filled): the
        one place a spec field becomes a message field."""
        return cls(job_id=job_id, attempt=attempt, world_size=spec.ranks,
                   command=spec.command, env=dict(spec.env),
                   gpus_per_rank=spec.gpus_per_rank, master_addr=master_addr,
                   master_port=master_port, heartbeat_interval_s=spec.heartbeat.interval_s,
                   working_dir=spec.working_dir, max_runtime_s=spec.max_runtime_s,
                   warn_before_s=spec.warn_before_s,
                   warn_signal=spec.warn_signal if spec.warn_before_s else None,
                   checkpoint_dir=(f"{spec.checkpoint_dir.rstrip('/')}/{job_id}"
                                   if spec.checkpoint_dir else None))

    def to_message(self) -> dict[str, Any]:
        """The message as the outbox keeps it (numbers as given: JSON ``10``
        stays ``10``); an optional field only when set, so a message without
        it is the one sent before the field existed."""
        message = {"type": LAUNCH, "job_id": self.job_id, "attempt": self.attempt,
                   "world_size": self.world_size, "command": list(self.command),
                   "env": dict(self.env), "gpus_per_rank": self.gpus_per_rank,
                   "master_addr": self.master_addr, "master_port": self.master_port,
                   "heartbeat_interval_s": self.heartbeat_interval_s}
        for name in _OPTIONAL:
            if getattr(self, name) is not None:
                message[name] = getattr(self, name)
        return message


@dataclass(frozen=True)
class Launch(AttemptLaunch):
    """One node's LAUNCH: the attempt's, and the global ranks this node runs."""
    #: ascending, so LOCAL_RANK follows the global order
    ranks: tuple[int, ...]

    def to_message(self) -> dict[str, Any]:
        return with_ranks(super().to_message(), self.ranks)


def with_ranks(message: dict[str, Any], ranks: Sequence[int]) -> dict[str, Any]:
    """A node's LAUNCH: the attempt's ``message`` naming the node's ``ranks``."""
    return {**message, "ranks": list(ranks)}


@dataclass(frozen=True)
class Cancel:
    job_id: str
    attempt: int
    reason: str | None = None

    def to_message(self) -> dict[str, Any]:
        return {"type": CANCEL, "job_id": self.job_id, "attempt": self.attempt,
                "reason": self.reason}


# -- parsing (the agent's side) ------------------------------------------------
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
    """Strings as they are; other scalars as JSON text; nulls dropped."""
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
    master_addr = msg.get("master_addr") or DEFAULT_MASTER_ADDR
    if not isinstance(master_addr, str):
        raise MessageError("master_addr must be a string")
    port = msg.get("master_port")
    if port is None:
        port = master_port(job_id, attempt)
    elif isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise MessageError(f"master_port must be in 1..65535, got {port!r}")
    interval = msg.get("heartbeat_interval_s", DEFAULT_HEARTBEAT_INTERVAL_S)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise MessageError(f"heartbeat_interval_s must be a positive number, got {interval!r}")
    working_dir, checkpoint_dir = msg.get("working_dir"), msg.get("checkpoint_dir")
    for name, path in (("working_dir", working_dir), ("checkpoint_dir", checkpoint_dir)):
        if path is not None and not (isinstance(path, str) and WORKING_DIR_RE.fullmatch(path)):
            raise MessageError(f"{name} must be an absolute path, got {path!r}")
    limit = msg.get("max_runtime_s")
    if limit is not None:
        limit = _int(msg, "max_runtime_s", 1)
    warn = _int(msg, "warn_before_s", 1) if msg.get("warn_before_s") is not None else None
    warn_signal = msg.get("warn_signal")
    if warn_signal is not None and warn_signal not in WARN_SIGNALS:
        raise MessageError(f"warn_signal must be one of {', '.join(WARN_SIGNALS)}, "
                           f"got {warn_signal!r}")
    return Launch(job_id=job_id, attempt=attempt, ranks=tuple(sorted(ranks)),
                  world_size=world_size, command=tuple(command), env=_env(msg.get("env")),
                  gpus_per_rank=_int(msg, "gpus_per_rank", 0, default=DEFAULT_GPUS_PER_RANK),
                  master_addr=master_addr, master_port=port,
                  heartbeat_interval_s=float(interval), working_dir=working_dir,
                  max_runtime_s=limit, warn_before_s=warn,
                  warn_signal=(warn_signal or "SIGUSR1") if warn is not None else None,
                  checkpoint_dir=checkpoint_dir)


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
    if kind == LAUNCH:
        return parse_launch(msg)
    if kind == CANCEL:
        return parse_cancel(msg)
    raise MessageError(f"unknown message type {kind!r}")
