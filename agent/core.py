"""What the agent does with inbox messages and rank exits: the ``Agent`` class.

It takes its collaborators (API client, inbox, launcher, state file, clock) as
parameters, so tests drive it with fakes and real processes, and it is
single-threaded: the runner calls ``handle`` for each message and ``tick`` a
few times a second; nothing else touches its state.

Order of effects, which is what makes at-least-once delivery and restarts safe:

1. what is about to be done is recorded in the state file;
2. it is done (processes started, signals sent);
3. the result and the reports it calls for are recorded;
4. only then is the SQS message deleted; the reports are sent afterwards, and
   are removed from the state file only once the API took them.

A message redelivered after any of these steps finds its attempt in the state
file and is not acted on twice; a crash between 1 and 3 is repaired at start-up
(``recover``), which finds shims launched but not yet recorded by their exit
file (ranks.find_shims).

Message rules:
- LAUNCH of an attempt already known: ignored (never a second launch), except
  that a tombstoned attempt (below) answers with STOPPED for the LAUNCH's ranks.
- CANCEL of an attempt never launched here: a tombstone is recorded, so a later
  LAUNCH never runs, and STOPPED with empty ranks is reported at once (the
  server then confirms every rank it placed on this node).
- CANCEL of a running attempt (a user's cancel, or a stall restart): every live
  rank's Python stack is taken first (stacks.py, concurrently, bounded by its
  timeout), then SIGTERM to every rank's group, SIGKILL to the groups still
  alive after the grace period, STOPPED with all the node's ranks of the
  attempt once no process of theirs is left; the STOPPED report carries the
  stacks (``stacks: [{"rank", "where", "frames"}]``, kept in the state file
  with the attempt until then). Exits seen after a CANCEL
  are not reported as EXITED: they are the cancel's doing.
- A CANCEL of an attempt that already ended here answers STOPPED again (the
  server's reconciler resends intents it has not seen acknowledged).
- Time limits (a LAUNCH's ``max_runtime_s``, ``warn_before_s``, ``warn_signal``)
  are copied into the attempt's record at its launch, as deadlines on this
  agent's clock, so a restarted agent enforces the same ones. At the limit less
  ``warn_before_s`` every live rank's group gets ``warn_signal`` once (recorded
  before it is sent). At the limit, an attempt still running reports TIMED_OUT
  with all the node's ranks of it, then its ranks are stopped as a CANCEL
  stops them (stacks, SIGTERM, grace period, SIGKILL; no EXITED; STOPPED once
  they are gone). The server's CANCEL that follows starts no second stop.
- A LAUNCH's ``checkpoint_dir`` is created before its ranks start (given to
  the attempt's uid, if any) and is each rank's ``GPUJOBS_CHECKPOINT_DIR``.
- With a uid pool (uidpool.py; the agent runs as root), each attempt takes a
  uid no other attempt here holds (its job's of choice, the same on every
  node), recorded with the intent before any rank starts; all its ranks here
  run as it. None free: its ranks are not started (exit code
  127, the reason in their logs). The uid goes back once the attempt is DONE
  and no process of it is left (leftovers are SIGKILLed: they are the
  job's); a record is never forgotten while it holds its uid.
- A LAUNCH that needs more GPU slots than are free is put back on the queue for
  a few seconds (slots held by ranks still being stopped free up soon); if it
  can never fit, it ends in the dead-letter queue with an error in the log.

Attempts the server no longer cares about (a report or a beat answered ``409
stale_attempt`` / ``already_finished``, or an older attempt of a job whose newer
attempt is launched here) are stopped quietly: their ranks would otherwise hold
GPUs the server counts as free. Nothing more is reported for them.

Ranks never outlive their attempt: each registration (``PUT /v1/nodes``, also
the node's heartbeat) lists the attempts still running here, and the server
answers with those it still waits for. An attempt listed but not in the answer
is over for the server (failed while this node was DOWN: the agent was paused,
cut off, or restarted late): it is stopped as a CANCEL would stop it, and
STOPPED tells the server its GPUs are free. Only attempts listed in the request
are judged, so a LAUNCH handled while the call was on its way is never stopped
by an answer that could not know it.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from .backoff import retry_delay
from .cgroups import JobCgroups, cgroup_name
from .inbox import InboxMessage
from .isolation import give_checkpoint_dir, give_rank_dir, job_root
from .messages import Cancel, Launch, MessageError, parse, parse_launch
from .procs import own_processes
from .ranks import Launcher, ProcTable, Rank, open_log_file, read_stat
from .records import agent_record
from .rendezvous import HOLD_PORT_ENV, PORT_IN_USE, PortInUse, PortReservations
from .reports import Item, ReportSender, Sent
from .shim import CANNOT_START, write_exit_file
from .stacks import StackSampler, report_stacks
from .state import (
    ACTIVE_PHASES,
    DONE,
    LAUNCHING,
    RUNNING,
    STOPPING,
    AgentState,
    AttemptRecord,
    PendingReport,
    RankRecord,
    StateFile,
    attempt_key,
)
from .uidpool import PoolExhausted, UidPool

log = logging.getLogger("gpujobs.agent")
#: the rank-side helper's directory (gpujobs_heartbeat), as this agent is installed
RANKSIDE = str(Path(__file__).resolve().parent / "rankside")
HELPER = "gpujobs_heartbeat.py"


def publish_rankside(folder: Path) -> str:
    """``folder``, holding the agent's copy of the rank-side helper, which is
    put first on every rank's PYTHONPATH: the agent's own files may be out of
    a rank's reach (a checkout under a 0700 home, as root, while ranks run as
    uids of their own), ``folder`` in the agent's state folder is not (ranks
    pass through it to their heartbeat folders). Root's when the agent is,
    0755 and 0644; the copy is written whole and renamed over the last one.
    Ranks cannot write in the state folder, so nothing there is theirs."""
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    tmp = folder / f".{HELPER}.{os.getpid()}"
    shutil.copyfile(Path(RANKSIDE) / HELPER, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, folder / HELPER)
    return str(folder)

#: all a rank keeps of the agent's own environment: the host's basics. Nothing
#: else of it reaches a rank (an allow-list, issue 24): not the agent's AWS
#: credentials, profile or endpoints, not its GPUJOBS_* settings (the API's
#: tables, the moto endpoint of the local stack, the token), not its PYTHONPATH
RANK_HOST_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR",
                           "LANG", "LANGUAGE", "TZ"})
RANK_HOST_ENV_PREFIXES = ("LC_",)  # the locale's categories
#: the cancel_reason of an attempt stopped here at its max_runtime_s
TIMEOUT = "timeout"
#: the reports that say ranks ended, held until their log files are shipped
ENDS = ("EXITED", "STOPPED")
#: how long such a report waits for that, at most (agent's clock, from its queueing)
LOG_WAIT_S = 5.0


class LogShipping(Protocol):
    """What the agent asks of the log shipper (logship.Shipper), from its own thread."""

    def settled(self, log_file: str | os.PathLike) -> bool: ...

    def wake(self) -> None: ...


class LastBeats(Protocol):
    """What the agent asks of the heartbeat poster (beats.BeatPoster), from its own loop."""

    def final(self, rec: AttemptRecord, ranks: list[int]) -> bool: ...


class Outcome(Enum):
    DONE = "done"    # acted on: delete the message
    DEFER = "defer"  # not yet: make it visible again soon
    LEAVE = "leave"  # cannot act on it: leave it for the dead-letter queue


@dataclass(frozen=True)
class Paths:
    """Where per-rank files go. Job ids are checked (messages.JOB_ID_RE) before use here."""
    state_dir: Path
    log_dir: Path

    @classmethod
    def under(cls, state_dir: str | os.PathLike, log_dir: str | os.PathLike | None = None
              ) -> "Paths":
        state = Path(state_dir).resolve()
        return cls(state, Path(log_dir).resolve() if log_dir else state / "logs")

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def log_file(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.log_dir / job_id / str(attempt) / f"rank-{rank}.log"

    def exit_file(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "exits" / job_id / str(attempt) / f"rank-{rank}.json"

    @property
    def rankside_dir(self) -> Path:
        """The agent's copy of the rank-side helper (:func:`publish_rankside`)."""
        return self.state_dir / "rankside"

    def heartbeat_file(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "heartbeats" / job_id / str(attempt) / f"rank-{rank}"

    def attempt_dirs(self, job_id: str, attempt: int) -> list[Path]:
        """Agent-owned files of an attempt, removed when it is forgotten (logs stay)."""
        return [self.state_dir / kind / job_id / str(attempt) for kind in ("exits", "heartbeats")]


def visible_devices(gpus_per_rank: int, local_rank: int, slots: list[int],
                    node_slots: list[int]) -> list[int]:
    """The GPU slots a rank sees (CUDA_VISIBLE_DEVICES), in order.

    One GPU a rank (DDP's layout): every slot of the attempt on this node, in
    local-rank order, as torchrun shows every GPU of the node to each local
    process; device ``LOCAL_RANK`` is then the rank's own, so
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` works. Slots other
    jobs hold on the node are never shown. Several GPUs a rank (no torchrun
    convention): only the rank's own, as devices 0..k-1, so nothing that takes
    "all visible GPUs" (``device_map="auto"``) spreads onto a neighbour's."""
    if gpus_per_rank == 1 and node_slots[local_rank:local_rank + 1] == slots:
        return list(node_slots)
    return list(slots)


def rank_env(base: Mapping[str, str], launch: Launch, rank: int, local_rank: int,
             slots: list[int], heartbeat_file: str, node_id: str,
             identity=None, node_slots: list[int] | None = None,
             rankside: str = RANKSIDE) -> dict[str, str]:
    """The rank's environment: the host's basics from ``base``, the agent's
    environment (:data:`RANK_HOST_ENV`, nothing else of it), the job's, then
    ours: torchrun's variables (agent/README.md, "What a rank gets", says what
    reads each), the rendezvous and our own. ``node_slots``: every slot of the
    attempt on this node in local-rank order (default: the rank's own);
    ``rankside``: where the rank imports the helper from (:func:`publish_rankside`)."""
    env = {k: v for k, v in base.items()
           if k in RANK_HOST_ENV or k.startswith(RANK_HOST_ENV_PREFIXES)}
    env.update(launch.env)
    if identity is not None:  # the attempt's uid's own, not the agent's
        if "TMPDIR" not in launch.env:  # removed with its HOME when the uid is freed
            env["TMPDIR"] = identity.home
        env.update({"HOME": identity.home, "USER": identity.name, "LOGNAME": identity.name})
    local_world = len(launch.ranks)
    # the node's index among the attempt's nodes: ranks fill nodes in order
    # (domain/placement.py), so this is exact when every node holds as many
    # ranks as this one (the layout torchrun and Lightning assume); the node
    # holding rank 0 is always 0
    group_rank = min(launch.ranks) // local_world
    group_world = -(-launch.world_size // local_world)
    visible = visible_devices(launch.gpus_per_rank, local_rank, slots,
                              slots if node_slots is None else node_slots)
    # torchrun's defaults; the job's env wins
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(launch.world_size), "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group_rank), "NODE_RANK": str(group_rank),
        "GROUP_WORLD_SIZE": str(group_world),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(launch.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": launch.master_addr, "MASTER_PORT": str(launch.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(launch.attempt - 1),
        "TORCHELASTIC_RUN_ID": launch.job_id,
        "GPUJOBS_JOB_ID": launch.job_id, "GPUJOBS_ATTEMPT": str(launch.attempt),
        "GPUJOBS_NODE_ID": node_id,
        "CUDA_VISIBLE_DEVICES": ",".join(str(s) for s in visible),
        "GPUJOBS_HEARTBEAT_FILE": heartbeat_file,
        # `from gpujobs_heartbeat import beat` works in every rank
        "PYTHONPATH": os.pathsep.join(p for p in (rankside, env.get("PYTHONPATH")) if p),
    })
    if launch.checkpoint_dir is not None:  # the job's, the same in every attempt
        env["GPUJOBS_CHECKPOINT_DIR"] = launch.checkpoint_dir
    # never the agent store: no torchrun agent runs a store for these ranks
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return env


class Agent:
    def __init__(self, *, node_id: str, gpus: int, api, inbox, paths: Paths,
                 state_file: StateFile | None = None, launcher: Launcher | None = None,
                 grace_s: float = 10.0, defer_s: int = 5, retain_s: float = 14 * 86400,
                 backoff_base: float = 0.5, backoff_cap: float = 30.0,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 base_env: Mapping[str, str] | None = None,
                 ports: PortReservations | None = None,
                 stacks: StackSampler | None = None, logs: LogShipping | None = None,
                 pool: UidPool | None = None, job_roots: tuple[str, ...] = (),
                 cgroups: JobCgroups | None = None,
                 reports: ReportSender | None = None) -> None:
        self.node_id, self.gpus = node_id, gpus
        #: does the reports' requests (reports.py): the runner's on a thread
        #: of its own; by default in the call
        self._sender = reports if reports is not None else ReportSender(api)
        #: a cgroup around each attempt's ranks here (cgroups.py); None: none
        self.cgroups = cgroups
        #: folders the operator allows the agent to make jobs' checkpoint
        #: directories in, as root (isolation.give_checkpoint_dir)
        self._job_roots = job_roots
        #: the uids attempts run as (uidpool.py); None: as the agent (isolation "none")
        self.pool = pool
        #: ships the ranks' log files (logship.Shipper); None: nothing to wait for.
        #: May come later: the runner learns the log group from the API
        self.logs = logs
        #: posts the ranks' last beats before their end is reported
        #: (beats.BeatPoster.final); None: none. Set by the runner
        self.beats: LastBeats | None = None
        #: takes the ranks' stacks before a CANCEL's SIGTERM; None: no stacks
        self._stacks = stacks
        #: MASTER_PORT of the attempts whose rank 0 runs here (rendezvous.py)
        self._ports = ports if ports is not None else PortReservations()
        self._api, self._paths = api, paths
        self.inbox = inbox  # may come later: the runner learns its URL from the API
        self._file = state_file or StateFile(paths.state_file)
        self._launcher = launcher or Launcher()
        self._grace_s, self._defer_s, self._retain_s = grace_s, defer_s, retain_s
        self._backoff = (backoff_base, backoff_cap)
        self._clock, self._rng = clock, rng or random.Random()
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._rankside = publish_rankside(paths.rankside_dir)
        self.state: AgentState = self._file.load()
        self._ranks: dict[tuple[str, int], Rank] = {}
        self._api_failures = 0
        self._api_not_before = 0.0
        self._next_prune = 0.0
        self._next_uid_check = 0.0

    # ---------------------------------------------------------------- start-up

    def recover(self) -> None:
        """Adopt what an earlier agent process left: finish interrupted launches,
        re-attach to running ranks (they are not launched again), re-send SIGTERM
        to attempts that were being stopped, and resume pending reports."""
        shims = None
        for rec in list(self.state.attempts.values()):
            if rec.phase == LAUNCHING:
                if shims is None:
                    shims = self._launcher.find_shims()
                self._start_ranks(rec, _recorded_launch(rec.launch), shims)
                self._mark_running(rec)
                log.info("%s: finished a launch interrupted by a restart", rec.key)
            if rec.phase in (RUNNING, STOPPING) and any(not p.ended for p in rec.procs.values()):
                log.info("%s: adopted %s ranks %s", rec.key, rec.phase.lower(),
                         sorted(r for r, p in rec.procs.items() if not p.ended))
            if rec.phase == STOPPING and not rec.killed:
                self._terminate(rec)
        if self.cgroups is not None:
            owned = [r.cgroup for r in self.state.attempts.values() if r.cgroup is not None]
            for name in self.cgroups.remove_leftovers(owned):
                log.info("removed cgroup %s, which no attempt here owns and nothing runs in",
                         name)
        self._save()

    # ---------------------------------------------------------------- messages

    def handle(self, message: InboxMessage) -> Outcome:
        """Act on one inbox message, then delete it (or put it back, or leave it)."""
        try:
            parsed = parse(message.body)
        except MessageError as e:
            log.error("inbox message %s (received %s times) cannot be acted on, left for the "
                      "dead-letter queue: %s", message.message_id, message.receive_count, e)
            return Outcome.LEAVE
        if isinstance(parsed, Launch):
            outcome = self._on_launch(parsed)
        else:
            outcome = self._on_cancel(parsed)
        if outcome is Outcome.DONE:
            self._inbox_call("delete", message)
        elif outcome is Outcome.DEFER:
            self._inbox_call("defer", message, self._defer_s)
        self._flush_reports()
        return outcome

    def _inbox_call(self, what: str, message: InboxMessage, *args) -> None:
        try:
            getattr(self.inbox, what)(message, *args)
        except Exception as e:  # noqa: BLE001 - redelivery is harmless, see module doc
            log.warning("inbox %s of message %s failed (%s); it will come back and be "
                        "recognised", what, message.message_id, e)

    def _on_launch(self, m: Launch) -> Outcome:
        key = attempt_key(m.job_id, m.attempt)
        rec = self.state.attempts.get(key)
        if rec is not None and rec.phase == LAUNCHING:
            # an earlier try at this launch failed half-way (an error, not a crash)
            self._start_ranks(rec, m, self._launcher.find_shims())
            self._mark_running(rec)
            self._save()
            log.info("%s: finished a launch that had failed half-way", key)
            return Outcome.DONE
        if rec is not None:
            if rec.is_tombstone:
                rec.ranks = sorted(set(rec.ranks) | set(m.ranks))
                self._report(rec, "STOPPED", list(m.ranks))
                self._save()
                log.info("%s: LAUNCH after CANCEL: not launched, reported STOPPED %s",
                         key, list(m.ranks))
            else:
                log.info("%s: duplicate LAUNCH ignored (%s)", key, rec.phase)
            return Outcome.DONE
        now = self._clock()
        same_job = [a for a in self.state.attempts.values() if a.job_id == m.job_id]
        if any(a.attempt > m.attempt for a in same_job):
            self.state.attempts[key] = AttemptRecord(
                job_id=m.job_id, attempt=m.attempt, phase=DONE, ranks=list(m.ranks),
                quiet=True, created_at=now, finished_at=now)
            self._save()
            log.info("%s: LAUNCH of a superseded attempt: not launched", key)
            return Outcome.DONE
        for older in same_job:
            if older.phase in ACTIVE_PHASES and not older.quiet:
                log.info("%s: superseded by attempt %s: stopping it", older.key, m.attempt)
                self._stop_quietly(older)
        need = len(m.ranks) * m.gpus_per_rank
        free = self._free_slots()
        if len(free) < need:
            (log.error if need > self.gpus else log.warning)(
                "%s: needs %s GPU slots, %s of %s free: LAUNCH put back for %ss",
                key, need, len(free), self.gpus, self._defer_s)
            self._save()
            return Outcome.DEFER
        rec = AttemptRecord(job_id=m.job_id, attempt=m.attempt, phase=LAUNCHING,
                            ranks=list(m.ranks), launch=m.to_message(), created_at=now,
                            heartbeat_interval_s=m.heartbeat_interval_s,
                            **time_limits(m, now))
        exhausted = None
        if self.pool is not None:
            try:
                rec.uid = self.pool.allocate(m.job_id, m.attempt, self.state.held_uids())
            except PoolExhausted as e:
                exhausted = str(e)
        for local_rank, r in enumerate(m.ranks):
            slots = free[local_rank * m.gpus_per_rank:(local_rank + 1) * m.gpus_per_rank]
            rec.procs[r] = RankRecord(
                rank=r, local_rank=local_rank, slots=slots,
                exit_file=str(self._paths.exit_file(m.job_id, m.attempt, r)),
                log_file=str(self._paths.log_file(m.job_id, m.attempt, r)),
                heartbeat_file=str(self._paths.heartbeat_file(m.job_id, m.attempt, r)))
        self.state.attempts[key] = rec
        self._save()                     # 1. the intent (with its uid)
        if exhausted is not None:        # never two jobs on one uid
            self._not_started(rec, exhausted, CANNOT_START)
            self._mark_running(rec)
            self._save()
            return Outcome.DONE
        self._start_ranks(rec, m, {})    # 2. the processes
        self._mark_running(rec)
        self._save()                     # 3. their pids and the STARTED report
        log.info("%s: launched ranks %s (pids %s)", key, list(m.ranks),
                 [p.pid for p in rec.procs.values()])
        return Outcome.DONE

    def _start_ranks(self, rec: AttemptRecord, m: Launch, shims: dict[str, int]) -> None:
        node_slots = [s for p in sorted(rec.procs.values(), key=lambda p: p.local_rank)
                      for s in p.slots]
        untouched = all(p.pid is None and not p.ended and p.exit_file not in shims
                        and not os.path.exists(p.exit_file) for p in rec.procs.values())
        cgroup: list[str] = []
        if self.cgroups is not None:
            # its cgroup before any rank (cgroups.py); made again, as it was,
            # when a restarted agent finishes the launch
            rec.cgroup = cgroup_name(rec.job_id, rec.attempt)
            try:
                cgroup = self.cgroups.make(rec.cgroup)
            except OSError as e:
                if untouched:
                    self._not_started(rec, f"cannot make the attempt's cgroup: {e}",
                                      CANNOT_START)
                    return
                log.error("%s: cannot make the attempt's cgroup again: %s", rec.key, e)
        if 0 in rec.procs and untouched:
            # rank 0 is ours and nothing of the attempt started yet: its
            # rendezvous port must be free, and is held from here on
            try:
                self._ports.reserve(rec.key, m.master_port)
            except PortInUse as e:
                self._not_started(rec, str(e))
                return
            if m.env.get(HOLD_PORT_ENV) == "0":  # checked, but not held (rendezvous.py)
                self._ports.release(rec.key)
        checkpoints_ready, identity, make_dir = False, None, None
        for r, p in rec.procs.items():
            if p.pid is not None or p.ended:
                continue
            if p.exit_file in shims:  # launched just before a crash: adopt it
                stat = read_stat(shims[p.exit_file])
                if stat is not None:
                    p.pid, p.pgid, p.start_time = stat.pid, stat.pgrp, stat.start_time
                    continue
            if os.path.exists(p.exit_file):  # it even ran to its end already
                continue
            if not checkpoints_ready:  # once, before the first rank that starts
                checkpoints_ready = True
                identity = self._identity(rec)
                make_dir = self._make_checkpoint_dir(rec, m, identity)
            try:
                give_rank_dir(Path(p.heartbeat_file).parent, self._paths.state_dir, identity)
            except OSError as e:  # the rank can run without; its heartbeats cannot
                log.warning("%s rank %s: no heartbeat directory: %s", rec.key, r, e)
            env = rank_env(self._base_env, m, r, p.local_rank, p.slots, p.heartbeat_file,
                           self.node_id, identity, node_slots=node_slots,
                           rankside=self._rankside)
            rank = self._launcher.launch(list(m.command), env, p.log_file, p.exit_file,
                                         cwd=m.working_dir, identity=identity,
                                         make_dir=make_dir, cgroup=cgroup)
            p.pid, p.pgid, p.start_time = rank.pid, rank.pgid, rank.start_time
            self._ranks[(rec.key, r)] = rank

    def _identity(self, rec: AttemptRecord):
        """Who the attempt's ranks run as (isolation.RankIdentity), its HOME
        made fresh; None: as the agent. Called once, before its first rank
        starts (also when a restart finishes its launch: HOME is made again,
        nothing of the attempt having run yet)."""
        if self.pool is None or rec.uid is None:
            return None
        self.pool.make_home(rec.uid)
        return self.pool.identity(rec.uid)

    def _make_checkpoint_dir(self, rec: AttemptRecord, m: Launch, identity) -> str | None:
        """The job's checkpoint directory, if the LAUNCH names one. Under a
        root the operator allows (``--job-roots``) the agent makes it (and
        gives it to the attempt's uid, with what earlier attempts' uids left
        in it), walking it without following links; a failure is logged and
        the ranks start anyway: it may be on shared storage already, or the
        job may not need it. Outside every root it is the ranks' own to make,
        as their uid: returned, for the shims (issue 41)."""
        if m.checkpoint_dir is None:
            return None
        root = job_root(m.checkpoint_dir, self._job_roots)
        if root is None:
            return m.checkpoint_dir
        try:
            give_checkpoint_dir(m.checkpoint_dir, m.job_id, identity,
                                self.pool.range if self.pool is not None else None,
                                root=root, state_dir=self._paths.state_dir)
        except OSError as e:
            log.warning("%s: cannot prepare the checkpoint directory %s (%s); the ranks "
                        "start anyway", rec.key, m.checkpoint_dir, e)
        return None

    def _not_started(self, rec: AttemptRecord, why: str, code: int = PORT_IN_USE) -> None:
        """Record every rank of ``rec`` here as exited with ``code`` without
        starting it (PORT_IN_USE: rendezvous.py says why none starts; 127: no
        uid free), the reason in its log; the next tick reports them EXITED."""
        log.error("%s: %s: ranks %s not started (exit code %s)", rec.key, why,
                  sorted(rec.procs), code)
        if code == PORT_IN_USE:
            rec.not_started = "port_in_use"
        for p in rec.procs.values():
            try:
                for path in (p.log_file, p.exit_file):
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                out = open_log_file(p.log_file)
                try:
                    os.write(out, agent_record(
                        "stderr", f"gpujobs-agent: {why}: the attempt's ranks on this node "
                                  f"were not started (exit code {code})"))
                finally:
                    os.close(out)
                write_exit_file(p.exit_file, code)
            except OSError as e:  # exit_code() then says CANNOT_START: still not started
                log.error("%s rank %s: cannot record the port failure: %s", rec.key, p.rank, e)

    def _mark_running(self, rec: AttemptRecord) -> None:
        rec.phase, rec.launch = RUNNING, None  # the LAUNCH (with its env) is not kept
        self._report(rec, "STARTED", rec.ranks)

    def _on_cancel(self, m: Cancel) -> Outcome:
        key = attempt_key(m.job_id, m.attempt)
        rec = self.state.attempts.get(key)
        now = self._clock()
        if rec is None:
            rec = AttemptRecord(job_id=m.job_id, attempt=m.attempt, phase=DONE, cancelled=True,
                                cancel_reason=m.reason, created_at=now, finished_at=now)
            self.state.attempts[key] = rec
            self._report(rec, "STOPPED", [])
            self._save()
            log.info("%s: CANCEL before LAUNCH: tombstone recorded, reported STOPPED", key)
            return Outcome.DONE
        first = not rec.cancelled
        rec.cancelled, rec.quiet = True, False  # the server asks: it wants the answer
        rec.cancel_reason = rec.cancel_reason or m.reason
        if rec.phase == RUNNING:
            self._stop_ranks(rec, f"CANCEL ({m.reason})")
        elif rec.phase == DONE and not self._has_pending(rec, "STOPPED"):
            self._report(rec, "STOPPED", rec.ranks, stacks=rec.stop_stacks)
            log.info("%s: CANCEL of an attempt that ended here: reported STOPPED %s",
                     key, rec.ranks)
        elif first:
            log.info("%s: CANCEL while %s: STOPPED follows when its ranks are gone",
                     key, rec.phase.lower())
        self._save()
        return Outcome.DONE

    def _stop_ranks(self, rec: AttemptRecord, why: str) -> None:
        """Stop a RUNNING attempt's ranks as a CANCEL does (the caller has set
        ``cancelled``, so their exits are not reported and STOPPED follows once
        every rank is gone): the stop is recorded, then every live rank's stack
        is taken, then SIGTERM; the tick sends SIGKILL after the grace period."""
        rec.phase, rec.stop_deadline = STOPPING, self._clock() + self._grace_s
        self._save()            # the stop is recorded before anything is signalled
        rec.stop_stacks = self._stacks_before_kill(rec)
        rec.stop_deadline = self._clock() + self._grace_s
        self._terminate(rec)
        log.info("%s: %s: SIGTERM sent, SIGKILL in %ss", rec.key, why, self._grace_s)

    # ---------------------------------------------------------------- the tick

    def tick(self) -> None:
        """Notice rank exits, enforce grace periods, send reports, forget old attempts."""
        now = self._clock()
        table: ProcTable | None = None
        changed = False
        for rec in list(self.state.attempts.values()):
            if rec.phase not in (RUNNING, STOPPING):
                continue
            exits: dict[int, list[int]] = defaultdict(list)
            for r, p in rec.procs.items():
                if p.ended:
                    continue
                rank = self._rank(rec, p)
                if p.exit_code is None:
                    p.exit_code = rank.exit_code()
                    if p.exit_code is None:
                        continue
                    changed = True
                    if rec.phase == RUNNING:
                        exits[p.exit_code].append(r)
                table = table or self._launcher.proc_table()
                members = rank.members(table)
                if [pid for pid in members if pid != rank.pid]:
                    # the command ended, processes it left behind would hold the GPUs
                    log.warning("%s rank %s: killing leftover processes %s", rec.key, r, members)
                    rank.kill()
                elif not members:
                    p.ended, changed = True, True
                    self._ranks.pop((rec.key, r), None)
            if exits and self.logs is not None:
                self.logs.wake()  # their last lines: shipped before EXITED goes
            for code, ranks in sorted(exits.items()):
                self._report(rec, "EXITED", ranks, exit_code=code)
                log.info("%s: ranks %s exited with %s", rec.key, ranks, code)
            if all(p.ended for p in rec.procs.values()):
                self._finish(rec, now)
                changed = True
            elif rec.phase == STOPPING and rec.stop_deadline is not None \
                    and now >= rec.stop_deadline:
                first = not rec.killed
                if first:
                    log.info("%s: grace period over: SIGKILL", rec.key)
                rec.killed, changed = True, True
                for p in rec.procs.values():
                    if not p.ended:
                        self._rank(rec, p).kill()
                if first:  # what left the ranks' groups, once; the end empties the rest
                    self._kill_cgroup(rec)
            elif rec.phase == RUNNING:
                changed |= self._enforce_time_limit(rec, now)
        changed |= self._release_uids(now)
        if now >= self._next_prune:
            changed |= self._prune(now)
            self._next_prune = now + 60
        if changed:
            self._save()
        self._flush_reports()

    def _enforce_time_limit(self, rec: AttemptRecord, now: float) -> bool:
        """The attempt's max_runtime_s, on this agent's clock from the launch:
        its warning once it is due, then, at the limit, TIMED_OUT and the stop
        of its ranks. Whether the record changed."""
        if rec.runtime_deadline is not None and now >= rec.runtime_deadline:
            self._time_out(rec)
            return True
        if rec.warn_at is not None and rec.warned_at is None and now >= rec.warn_at:
            return self._warn(rec, now)
        return False

    def _warn(self, rec: AttemptRecord, now: float) -> bool:
        """``warn_signal`` once to every live rank (checkpoint now: the limit is
        near), recorded before it is sent, so a restart never sends it twice."""
        try:
            sig = signal.Signals[rec.warn_signal or ""]
        except KeyError:
            log.error("%s: warn_signal %r is no signal: no warning before the limit",
                      rec.key, rec.warn_signal)
            rec.warned_at = now
            return True
        live = [(p.rank, self._rank(rec, p)) for p in rec.procs.values() if not p.ended]
        if not all(rank.ready_for(sig) for _, rank in live):
            return False  # a shim still starting would die of it: the next tick
        rec.warned_at = now
        self._save()
        for _, rank in live:
            rank.signal(sig)
        left = (rec.runtime_deadline or now) - now
        log.info("%s: %s sent to ranks %s: %.0f s left of its max_runtime_s (%s s)",
                 rec.key, sig.name, sorted(r for r, _ in live), left, rec.max_runtime_s)
        return True

    def _time_out(self, rec: AttemptRecord) -> None:
        """The attempt reached its max_runtime_s here: TIMED_OUT with all the
        node's ranks of it (the server ends the attempt, reason ``timeout``,
        and stops its ranks on the other nodes), then its ranks are stopped as
        a CANCEL's are, and STOPPED follows. An attempt already cancelled (a
        CANCEL that came while it was launching) is only stopped: the server
        has ended it."""
        if not rec.cancelled:
            rec.cancelled, rec.cancel_reason = True, TIMEOUT
            self._report(rec, "TIMED_OUT", rec.ranks)
        self._stop_ranks(rec, f"over its max_runtime_s ({rec.max_runtime_s} s)")

    def _finish(self, rec: AttemptRecord, now: float) -> None:
        if rec.phase == STOPPING and rec.cancelled:
            self._report(rec, "STOPPED", rec.ranks, stacks=rec.stop_stacks)
            log.info("%s: every rank stopped: reported STOPPED %s", rec.key, rec.ranks)
        rec.phase, rec.finished_at, rec.stop_deadline = DONE, now, None
        self._ports.release(rec.key)

    def _rank(self, rec: AttemptRecord, p: RankRecord) -> Rank:
        """The handle on a rank: the one from its launch, or one adopted from its
        record (ranks that an earlier agent process started)."""
        rank = self._ranks.get((rec.key, p.rank))
        if rank is None:
            rank = self._ranks[(rec.key, p.rank)] = self._launcher.adopt(
                pid=p.pid, pgid=p.pgid, start_time=p.start_time, exit_file=p.exit_file)
        return rank

    def _stacks_before_kill(self, rec: AttemptRecord) -> list[dict] | None:
        """Every live rank's stack (its own command's, the shim's child), taken
        concurrently and at most the sampler's timeout, else the last one
        sampled of it, for the STOPPED report; None when there is none (no
        py-spy, no Python, no rights)."""
        if self._stacks is None:
            return None
        pgids = {p.rank: p.pgid for p in rec.procs.values() if not p.ended and p.pgid}
        try:
            own = own_processes(set(pgids.values()))
            by_rank = self._stacks.capture({r: own[g] for r, g in pgids.items() if g in own})
        except Exception:  # noqa: BLE001 - stacks are evidence: the stop goes on without
            log.exception("%s: taking the ranks' stacks before SIGTERM failed", rec.key)
            return None
        if by_rank:
            log.info("%s: stacks of ranks %s taken before SIGTERM", rec.key, sorted(by_rank))
        # a rank whose dump missed the deadline (a loaded host) keeps the last
        # stack the heartbeat poster sampled of it while it was silent
        for r in pgids:
            if r not in by_rank and (last := self._stacks.latest((rec.key, r))) is not None:
                by_rank[r] = last
        return report_stacks(by_rank) or None

    def _terminate(self, rec: AttemptRecord) -> None:
        for p in rec.procs.values():
            if not p.ended:
                self._rank(rec, p).terminate()

    def _stop_quietly(self, rec: AttemptRecord) -> None:
        rec.quiet = True
        if rec.phase == RUNNING:
            rec.phase, rec.stop_deadline = STOPPING, self._clock() + self._grace_s
            self._save()
            self._terminate(rec)

    def _free_slots(self) -> list[int]:
        used = {s for rec in self.state.attempts.values() if rec.phase in ACTIVE_PHASES
                for p in rec.procs.values() if not p.ended for s in p.slots}
        return [s for s in range(self.gpus) if s not in used]

    def _kill_cgroup(self, rec: AttemptRecord) -> list[int]:
        """SIGKILL what is in the attempt's cgroup but its ranks' shims (they
        write the exit files): daemons that left the ranks' process groups."""
        if self.cgroups is None or rec.cgroup is None:
            return []
        shims = {p.pid for p in rec.procs.values() if p.pid is not None and not p.ended}
        killed = self.cgroups.kill(rec.cgroup, spare=shims)
        if killed:
            log.warning("%s: SIGKILLed %d process(es) left in its cgroup (pids %s)", rec.key,
                        len(killed), killed[:10])
        return killed

    def _release_uids(self, now: float) -> bool:
        """Give back the uids of attempts that are DONE once no process of
        theirs is left: their cgroup's first (killed, then the cgroup
        removed), then any other of their uid (killed too); at most once a
        second. (Cgroups are made only with the pool: every attempt in one
        has a uid.)"""
        if self.pool is None or now < self._next_uid_check:
            return False
        waiting = [rec for rec in self.state.attempts.values()
                   if rec.phase == DONE and rec.uid is not None and not rec.uid_freed]
        if not waiting:
            return False
        self._next_uid_check = now + 1.0
        busy = self.pool.busy()
        changed = False
        for rec in waiting:
            assert rec.uid is not None
            if rec.cgroup is not None and self.cgroups is not None:
                self._kill_cgroup(rec)
                if not self.cgroups.remove(rec.cgroup):
                    continue  # the kills land by the next check
                rec.cgroup, changed = None, True
            if self.pool.release(rec.uid, busy):
                rec.uid_freed, changed = True, True
                log.info("%s: uid %s back in the pool", rec.key, rec.uid)
        return changed

    def _prune(self, now: float) -> bool:
        """Forget attempts that ended more than ``retain_s`` ago (duplicate messages
        arrive within SQS's retention period, 14 days at most); logs are kept."""
        busy = {attempt_key(p.job_id, p.attempt) for p in self.state.pending}
        old = [k for k, a in self.state.attempts.items()
               if a.phase == DONE and k not in busy and (a.finished_at or 0) < now - self._retain_s
               and (a.uid is None or a.uid_freed)]
        for k in old:
            rec = self.state.attempts.pop(k)
            for d in self._paths.attempt_dirs(rec.job_id, rec.attempt):
                shutil.rmtree(d, ignore_errors=True)
        return bool(old)

    # ---------------------------------------------------------------- reports

    def _report(self, rec: AttemptRecord, kind: str, ranks, exit_code: int | None = None,
                stacks: list[dict] | None = None) -> None:
        """Queue an event durably (saved with the caller's next save); sent by _flush_reports."""
        if rec.quiet:
            return
        event: dict[str, Any] = {"type": kind, "ranks": sorted(ranks), "node_id": self.node_id}
        if exit_code is not None:
            event["exit_code"] = exit_code
        if kind == "EXITED" and rec.not_started is not None:
            event["not_started"] = rec.not_started
        if stacks:
            event["stacks"] = stacks
        self.state.pending.append(PendingReport(job_id=rec.job_id, attempt=rec.attempt,
                                                event=event, queued_at=self._clock()))

    def _has_pending(self, rec: AttemptRecord, kind: str) -> bool:
        return any(p.job_id == rec.job_id and p.attempt == rec.attempt
                   and p.event["type"] == kind for p in self.state.pending)

    def _flush_reports(self) -> None:
        """Apply what came of the reports sent, then send the pending ones in
        order (reports.py), unless a batch is still in flight. A retryable
        failure pauses all sending for a jittered, growing delay, so per
        attempt the order STARTED, EXITED..., STOPPED is kept. A report of
        ranks' ends waits for their logs to be shipped (here) and their last
        beats to be posted (by the sender), each for a bounded time."""
        idle = not self._sender.busy()  # first: an idle sender's outcomes are all out
        self._apply(self._sender.outcomes())
        if not idle or not self.state.pending or self._clock() < self._api_not_before:
            return
        batch: list[Item] = []
        held: set[tuple[str, int]] = set()  # attempts with a report waiting for its logs
        for report in self.state.pending:
            attempt = (report.job_id, report.attempt)
            if attempt in held or not self._logs_shipped(report):
                held.add(attempt)  # that attempt's later reports wait with it
                continue
            batch.append(self._item(report))
        if batch:
            self._sender.send(batch)
            self._apply(self._sender.outcomes())  # an inline sender's, at once

    def _apply(self, outcomes: list[Sent]) -> None:
        changed = False
        for o in outcomes:
            report = o.report
            if o.held or report not in self.state.pending:  # dropped with its attempt
                continue
            if o.gone:
                log.info("%s/%s: the server no longer cares about it; its reports stop",
                         report.job_id, report.attempt)
                self._attempt_gone(report.job_id, report.attempt)
            elif o.error is None:
                self._api_failures = 0
                self.state.pending.remove(report)
            elif o.error.retryable:
                self._api_failures += 1
                delay = retry_delay(self._api_failures, *self._backoff, self._rng,
                                    retry_after=o.error.retry_after)
                self._api_not_before = self._clock() + delay
                log.warning("reporting %s for %s/%s failed (%s); %s report(s) kept, "
                            "next try in %.1fs", report.event["type"], report.job_id,
                            report.attempt, o.error, len(self.state.pending), delay)
                continue
            else:
                log.error("report %s for %s/%s refused, dropped: %s", report.event,
                          report.job_id, report.attempt, o.error)
                self.state.pending.remove(report)
            changed = True
        if changed:
            self._save()

    def _item(self, report: PendingReport) -> Item:
        """``report`` to send; one that ranks ended (EXITED, STOPPED) first has
        what they beat since the last post (their last step) posted, so the
        server's view of a finished job ends at its last step, not at the
        step of the last interval's post: held back while that fails, at most
        LOG_WAIT_S after it was queued."""
        beats = self.beats
        rec = self.state.attempts.get(attempt_key(report.job_id, report.attempt))
        if beats is None or rec is None or report.event.get("type") not in ENDS \
                or not report.event.get("ranks"):
            return Item(report)
        ranks = list(report.event["ranks"])
        return Item(report, final=lambda: beats.final(rec, ranks),
                    may_wait=self._clock() < report.queued_at + LOG_WAIT_S)

    def _logs_shipped(self, report: PendingReport) -> bool:
        """Whether ``report`` may go as far as the ranks' logs are concerned:
        a report that ranks ended (EXITED, STOPPED) waits until the shipper
        shipped their log files to their ends (a rank's file is complete once
        its exit is known: shim.py), at most LOG_WAIT_S after it was queued, so
        a reader of the logs may stop once the job ended. Never waits without
        a shipper, or for one that cannot ship (Shipper.settled). The agent's
        loop is never blocked: the report is only held back."""
        if self.logs is None or report.event.get("type") not in ENDS \
                or self._clock() >= report.queued_at + LOG_WAIT_S:
            return True
        files = [self._paths.log_file(report.job_id, report.attempt, r)
                 for r in report.event.get("ranks", [])]
        try:
            if all(self.logs.settled(f) for f in files):
                return True
            self.logs.wake()
        except Exception:  # noqa: BLE001 - a shipper's failure never holds a report
            log.exception("asking the log shipper failed; reporting anyway")
            return True
        return False

    def attempt_gone(self, job_id: str, attempt: int) -> None:
        """The server answered 409 stale_attempt / already_finished for the attempt
        (to a beat): stop its ranks quietly."""
        self._attempt_gone(job_id, attempt)
        self._save()

    def running_attempts(self) -> list[dict]:
        """The attempts this node still runs (or stops) ranks of, for the registration."""
        return [{"job_id": rec.job_id, "attempt": rec.attempt}  # a copy: the beat loop asks
                for rec in list(self.state.attempts.values()) if rec.phase in ACTIVE_PHASES]

    def registered(self, node: Mapping, sent: list[dict]) -> list[str]:
        """Act on the answer to a registration that listed ``sent`` as running:
        stop, as a CANCEL would, every attempt in ``sent`` that the server no
        longer waits for on this node; returns their keys. An answer without
        ``attempts`` (an older server) stops nothing."""
        live = node.get("attempts")
        if not isinstance(live, list):
            return []
        waited = {attempt_key(str(a.get("job_id")), int(a.get("attempt") or 0))
                  for a in live if isinstance(a, dict)}
        over = []
        for a in sent:
            key = attempt_key(a["job_id"], a["attempt"])
            rec = self.state.attempts.get(key)
            if key in waited or rec is None or rec.phase not in ACTIVE_PHASES:
                continue
            log.warning("%s: the server no longer counts this attempt on this node (it was "
                        "lost, or ended): stopping its ranks", key)
            self._on_cancel(Cancel(rec.job_id, rec.attempt, "not_live_on_server"))
            over.append(key)
        if over:
            self._flush_reports()
        return over

    def _attempt_gone(self, job_id: str, attempt: int) -> None:
        self.state.pending = [p for p in self.state.pending
                              if (p.job_id, p.attempt) != (job_id, attempt)]
        rec = self.state.attempts.get(attempt_key(job_id, attempt))
        if rec is not None:
            rec.quiet = True
            if rec.phase == RUNNING:
                log.info("%s: stopping its ranks, which nobody waits for", rec.key)
            self._stop_quietly(rec)

    # ---------------------------------------------------------------- misc

    def _save(self) -> None:
        self._file.save(self.state)

    def close(self) -> None:
        """Save and let go; running ranks are left running, to be adopted next time
        (their rank 0 holds its rendezvous port itself by then)."""
        self._save()
        self._ports.close()
        self._sender.close()


def time_limits(m: Launch, now: float) -> dict[str, Any]:
    """The record's time limits for an attempt launched at ``now`` (state.py,
    AttemptRecord): the limit's deadline and the warning's, each None without."""
    if m.max_runtime_s is None:
        return {}
    limits: dict[str, Any] = {"max_runtime_s": m.max_runtime_s,
                              "runtime_deadline": now + m.max_runtime_s}
    if m.warn_before_s is not None:
        limits["warn_at"] = now + m.max_runtime_s - m.warn_before_s
        limits["warn_signal"] = m.warn_signal or "SIGUSR1"
    return limits


def _recorded_launch(launch: dict | None) -> Launch:
    """The LAUNCH the state file kept (its message), read as the inbox's are."""
    if launch is None:
        raise MessageError("no LAUNCH recorded for an attempt that was launching")
    return parse_launch(launch)
