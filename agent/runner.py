"""The agent's main loop: register, then poll the inbox, tick and beat until stopped.

Four threads: the inbox poller (inbox.Poller), which only receives; the main
loop, which alone acts on the agent's state: it hands each received message
to ``Agent.handle`` and calls ``Agent.tick`` about four times a second (rank
exits, grace deadlines, pending reports); the report sender (reports.py),
which does the reports' requests and hands back what came of them; and the
beat loop, which posts the ranks' beats (beats.py) and calls in as the
node's heartbeat: every ``node_heartbeat_s`` by ``PUT /v1/nodes/{id}`` while
idle; every ``busy_call_in_s`` while its ranks' heartbeat POSTs are answered
(they show the node alive), on one of those POSTs (one request an interval,
not two).

No loop waits on another's requests (issue 41): a report the server is slow
to answer (an end that released many dependents took 10 s) delayed another
job's beats past its stall threshold, and every inbox message and grace
period, when one loop did it all. What the beat loop learns that changes the
agent's state (an attempt the server no longer takes beats for, a call-in's
answer that stops attempts) it hands to the main loop, which applies it at
its next pass. It posts and calls in only while the main loop makes passes: a main
loop stuck for ``MAIN_LOOP_GONE_S`` cannot launch or cancel, and the node had
better go DOWN (watchdog.py). Each loop has a watchdog (watchdog.py) that
warns when a pass takes longer than ``--watchdog-s``.

One agent per state directory: a second one would launch the same messages
twice, so an exclusive ``flock`` on ``<state-dir>/agent.lock`` is held for the
agent's lifetime (released by the kernel if the process dies).
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .api import ApiClient, ApiError, call_in_body
from .backoff import retry_delay
from .beats import BeatPoster
from .cgroups import DEFAULT_PIDS_MAX, JobCgroups, Limits
from .core import Agent, Paths
from .inbox import Poller, SqsInbox, endpoint_from_queue_url
from .isolation import isolation_name, lock_down_state_dir
from .logship import LOG_QUOTA_BYTES, Shipper, emulator_endpoint, logs_client
from .ranks import Launcher, Rank
from .reports import ReportSender
from .stacks import StackSampler
from .state import StateFile
from .uidpool import UidPool, UidRange
from .watchdog import BEAT_STAKES, STALL_S, Watchdog

log = logging.getLogger("gpujobs.agent")

#: a main loop that made no pass for this long is stuck: the beat loop stops
#: posting and calling in, so the node goes DOWN (well inside the server's
#: 60 s, and far over a slow request's 10 s timeout)
MAIN_LOOP_GONE_S = 30.0

#: what the beat loop hands to the main loop to do
Handoff = Callable[[Callable[[], object]], object]


@dataclass
class Settings:
    node_id: str
    gpus: int
    gpu_type: str
    api: str
    token: str
    state_dir: str
    log_dir: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    grace_s: float = 10.0
    poll_wait_s: int = 20
    node_heartbeat_s: float = 10.0
    #: between call-ins while the ranks' heartbeat POSTs succeed: those show
    #: the node alive (the reconciler takes a node for DOWN only when its
    #: call-ins and its posts stopped)
    busy_call_in_s: float = 300.0
    tick_s: float = 0.25
    address: str | None = None
    #: the uids attempts run as, one each (uidpool.py, checked by the caller);
    #: None: ranks run as the agent (isolation "none")
    rank_uids: UidRange | None = None
    #: seconds a pass of the main loop may take before the watchdog warns; 0: none
    watchdog_s: float = STALL_S
    #: what each rank may ship to CloudWatch Logs in one attempt (logship.py)
    log_quota_bytes: int = LOG_QUOTA_BYTES
    #: folders in which the agent makes jobs' checkpoint directories as root
    #: (isolation.give_checkpoint_dir); elsewhere the ranks make their own
    job_roots: tuple[str, ...] = ()
    #: each job's cgroup limits here (cgroups.py): processes, and memory
    #: in bytes (None: none)
    job_pids_max: int = DEFAULT_PIDS_MAX
    job_memory_max: int | None = None


class StateDirBusy(RuntimeError):
    pass


class StateDirLock:
    def __init__(self, state_dir: str | os.PathLike) -> None:
        self._path = Path(state_dir) / "agent.lock"
        self._fd: int | None = None

    def __enter__(self) -> "StateDirLock":
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(f"another agent is using {self._path.parent}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def run(settings: Settings, stop: threading.Event, *,
        on_ready: Callable[[dict], None] | None = None) -> int:
    """Run until ``stop`` is set; returns the process exit status.

    Ranks are left running when it returns: the next agent on this state
    directory adopts them (see the package docstring). Raises ApiError when the
    API refuses the registration outright (a wrong token or URL)."""
    paths = Paths.under(settings.state_dir, settings.log_dir)
    isolated = settings.rank_uids is not None
    if isolated:
        lock_down_state_dir(paths.state_dir)
    with StateDirLock(paths.state_dir):
        api = ApiClient(settings.api, settings.token)
        rng = random.Random()
        shipper = None
        # the ranks' Python stacks (py-spy), for silent ranks and before a kill
        stacks = StackSampler(isolated=isolated)
        pool = UidPool(settings.rank_uids, paths.state_dir) \
            if settings.rank_uids is not None else None
        # a cgroup around every job, when the ranks run as uids of their own
        cgroups = JobCgroups.detect(f"gpujobs/{settings.node_id}", limits=Limits(
            settings.job_pids_max, settings.job_memory_max)) if pool is not None else None
        agent = Agent(node_id=settings.node_id, gpus=settings.gpus, api=api, inbox=None,
                      paths=paths, grace_s=settings.grace_s, rng=rng,
                      launcher=Launcher(), stacks=stacks, pool=pool,
                      job_roots=settings.job_roots, cgroups=cgroups,
                      reports=ReportSender(api, thread=True))
        watchdog = Watchdog(settings.watchdog_s).start() if settings.watchdog_s > 0 else None
        try:
            # adopted ranks are watched from the start, also while the API is away
            agent.recover()

            # what the beat loop learns that changes the agent's state, done
            # by the main loop
            handed: "queue.SimpleQueue[Callable[[], object]]" = queue.SimpleQueue()
            call_in = CallIn(agent, settings, isolation_name(isolated), hand=handed.put)

            def register() -> dict:
                body = call_in.body()
                return call_in.answered(api.call_in(body), body)

            node = _register(register, agent, stop, settings.tick_s, rng, watchdog=watchdog)
            if node is None:
                return 0  # stopped before the API ever answered
            inbox_url = node.get("inbox_queue_url")
            if not isinstance(inbox_url, str) or not inbox_url:
                raise ApiError(f"PUT /v1/nodes/{settings.node_id} named no inbox_queue_url")
            agent.inbox = SqsInbox(inbox_url, wait_s=settings.poll_wait_s)
            if node.get("log_group"):
                logs_at = emulator_endpoint(endpoint_from_queue_url(inbox_url))
                shipper = Shipper(paths.log_dir, paths.state_dir, node["log_group"],
                                  client_factory=lambda: logs_client(endpoint_url=logs_at),
                                  quota_bytes=settings.log_quota_bytes)
                shipper.start()
                agent.logs = shipper  # ends are reported once the ranks' logs are shipped
            poller = Poller(agent.inbox, stop, rng=rng)
            poller.start()
            if on_ready is not None:
                on_ready(node)
            beats = BeatPoster(api, stacks=stacks, on_gone=lambda job_id, attempt: handed.put(
                functools.partial(agent.attempt_gone, job_id, attempt)))
            agent.beats = beats  # a rank's last beats go before its end is reported

            def post_beats(carry: bool) -> bool:
                """The beats due; ``carry``: one of their posts carries the
                node's call-in (True: it did, and its answer was acted on)."""
                node = beats.tick(list(agent.state.attempts.values()),
                                  call_in=call_in if carry else None)
                if node is not None:
                    _check_inbox(node, inbox_url)
                return node is not None

            def resting() -> bool:
                """The call-in may wait: the ranks' posts show the node alive
                (one answered within 3 node heartbeats; the server hears of
                this node at least every 4, 40 s, inside its 60 s to DOWN).
                Only while an attempt is still posted for: once the last one
                ended or was cancelled here, the server no longer counts its
                posts, and the node calls in at its next node heartbeat
                (issue 41; the report that ended it counts as one)."""
                return beats.posting() and \
                    beats.posted_within(3 * settings.node_heartbeat_s) and \
                    call_in.age_s() < settings.busy_call_in_s and \
                    not getattr(agent.inbox, "missing", False)

            pulse = Pulse()
            beat_loop = threading.Thread(
                target=_beat_loop, name="beats", daemon=True,
                args=(stop, settings, lambda: _beat(register, inbox_url), post_beats),
                kwargs={"resting": resting, "main": pulse})
            beat_loop.start()
            try:
                _loop(agent, poller, stop, settings, handed, watchdog=watchdog, pulse=pulse)
            finally:
                stop.set()
                beat_loop.join(timeout=15)
        finally:
            if watchdog is not None:
                watchdog.stop()
            if shipper is not None:
                shipper.stop()
            stacks.close()
            agent.close()
        # let a receive still open return, so what it brings is handed back at once
        poller.join(timeout=settings.poll_wait_s + 5)
        return 0


def _recorded_ranks(state_dir: str | os.PathLike):
    """(attempt key, rank number, handle) of every rank the state file in
    ``state_dir`` records as not ended."""
    state = StateFile(Paths.under(state_dir).state_file).load()
    for key, rec in state.attempts.items():
        for r, p in rec.procs.items():
            if p.pgid is not None and not p.ended:
                yield key, r, Rank(pid=p.pid, pgid=p.pgid, start_time=p.start_time,
                                   exit_file=p.exit_file)


def running_recorded_ranks(state_dir: str | os.PathLike) -> dict[str, list[int]]:
    """The ranks still running that the state file in ``state_dir`` records, by
    attempt key (``<job>/<attempt>``): what the next agent on it adopts."""
    out: dict[str, list[int]] = {}
    for key, r, rank in _recorded_ranks(state_dir):
        if rank.shim_alive():
            out.setdefault(key, []).append(r)
    return {k: sorted(v) for k, v in sorted(out.items())}


def kill_recorded_ranks(state_dir: str | os.PathLike) -> int:
    """SIGKILL every rank group the state file in ``state_dir`` records; returns how
    many groups were signalled.

    For a throwaway stack (``make up``, tests) that, unlike a real host, must not
    leave ranks behind once its agents stopped: call it after the agent exited.
    Each group is checked as the agent checks it (ranks.group_is_ours)."""
    killed = 0
    for _key, _r, rank in _recorded_ranks(state_dir):
        rank.kill()
        killed += 1
    return killed


def _register(register: Callable[[], dict], agent: Agent, stop: threading.Event,
              tick_s: float, rng: random.Random, *, base: float = 0.5,
              cap: float = 30.0, watchdog: Watchdog | None = None) -> dict | None:
    """The node, once ``PUT /v1/nodes/{id}`` answers; None if stopped first.

    Retryable failures are retried with capped, jittered backoff (Retry-After
    as a floor) while the agent keeps ticking: exits are recorded and grace
    periods enforced for adopted ranks even when the API is down."""
    failures, next_try = 0, 0.0
    step = watchdog.step if watchdog is not None else lambda what: None
    while not stop.is_set():
        if time.monotonic() >= next_try:
            step("registering the node (PUT /v1/nodes)")
            try:
                return register()
            except ApiError as e:
                if not e.retryable:
                    raise
                failures += 1
                delay = retry_delay(failures, base, cap, rng, retry_after=e.retry_after)
                next_try = time.monotonic() + delay
                log.warning("registering the node failed (%s); retry %s in %.1fs",
                            e, failures, delay)
        step("tick (rank exits, grace periods, reports)")
        _step(agent.tick, stop)
        if watchdog is not None:
            watchdog.passed()
        stop.wait(tick_s)
    return None


class Pulse:
    """When a loop last completed a pass (monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at = clock()

    def passed(self) -> None:
        self._at = self._clock()

    def age_s(self) -> float:
        return self._clock() - self._at


def _loop(agent: Agent, poller: Poller, stop: threading.Event, settings: Settings,
          handed: "queue.SimpleQueue[Callable[[], object]] | None" = None,
          watchdog: Watchdog | None = None, pulse: Pulse | None = None) -> None:
    """The main loop: inbox messages, what the beat loop ``handed`` over, ticks."""
    step = watchdog.step if watchdog is not None else lambda what: None
    while not stop.is_set():
        step("waiting for the inbox")
        message = poller.get(timeout=settings.tick_s)
        if message is not None:
            step(f"handling inbox message {message.message_id}")
            try:
                _step(functools.partial(agent.handle, message), stop)
            finally:
                poller.done()
        while handed is not None and not handed.empty():
            fn = handed.get()
            step(f"acting on what the beat loop learnt: {getattr(fn, 'func', fn).__name__}")
            _step(fn, stop)
        step("tick (rank exits, grace periods, reports)")
        _step(agent.tick, stop)
        if watchdog is not None:
            watchdog.passed()
        if pulse is not None:
            pulse.passed()


def _beat_loop(stop: threading.Event, settings: Settings, beat: Callable[[], None],
               post_beats: Callable[[bool], bool], *,
               resting: Callable[[], bool] = lambda: False, main: Pulse | None = None,
               watchdog: Watchdog | None = None) -> None:
    """The beat loop: ``post_beats(carry)``, the ranks' beats, and with
    ``carry`` the node's call-in on one of their posts (True: it went out so),
    so that a busy node makes one request an interval; ``beat``, the call-in
    by ``PUT /v1/nodes``; ``resting()``: a call-in due may wait one more
    ``node_heartbeat_s``. Neither goes out while the ``main`` loop is stuck.
    Its watchdog (``watchdog``, else one of ``--watchdog-s``) is made here, on
    the thread it watches."""
    if watchdog is None and settings.watchdog_s > 0:
        watchdog = Watchdog(settings.watchdog_s, loop="beat loop", stakes=BEAT_STAKES).start()
    step = watchdog.step if watchdog is not None else lambda what: None
    next_beat = time.monotonic() + settings.node_heartbeat_s
    stuck = False
    try:
        while not stop.wait(settings.tick_s):
            if main is not None and main.age_s() > MAIN_LOOP_GONE_S:
                if not stuck:
                    log.error("the agent's main loop made no pass for %.0fs: no beats and no "
                              "call-ins until it does, so the node goes DOWN", main.age_s())
                stuck = True
                continue
            stuck = False
            due = time.monotonic() >= next_beat
            if due and resting():
                due, next_beat = False, time.monotonic() + settings.node_heartbeat_s
            step("posting the ranks' beats" + (" with the node's call-in" if due else ""))
            carried = _step(functools.partial(post_beats, due), stop)
            if due:
                next_beat = time.monotonic() + settings.node_heartbeat_s
                if not carried:  # no beat went out to carry it (or its post failed)
                    step("calling in (PUT /v1/nodes)")
                    _step(beat, stop)
            if watchdog is not None:
                watchdog.passed()
    finally:
        if watchdog is not None:
            watchdog.stop()


def _step(fn: Callable[[], object], stop: threading.Event) -> object:
    """One step of the agent, and what it returned; an unexpected error (a
    full disk, a bug) is logged, the step returns None and the agent goes on:
    ranks keep being watched, a message not deleted comes back."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("agent step failed; going on")
        stop.wait(1.0)
        return None


class CallIn:
    """The node's call-in: its body, made as it goes out (PUT /v1/nodes/{id},
    or carried by a heartbeat POST), and what the agent does with the answer."""

    def __init__(self, agent: Agent, settings: Settings, isolation: str,
                 monotonic: Callable[[], float] = time.monotonic,
                 hand: Handoff = lambda fn: fn()) -> None:
        self._agent, self._settings, self._isolation = agent, settings, isolation
        self._mono, self._answered = monotonic, -float("inf")
        #: acting on an answer changes the agent's state: the main loop does it
        self._hand = hand

    def age_s(self) -> float:
        """Seconds since a call-in was last answered (inf: never)."""
        return self._mono() - self._answered

    def body(self) -> dict:
        s = self._settings
        # what runs here, as it was when the call went out: the answer
        # judges only these (ranks never outlive their attempt); the inbox is
        # made once per node: one deleted by hand comes back when the agent
        # says its receive found no queue
        return call_in_body(s.node_id, s.gpus, s.gpu_type, s.labels, address=s.address,
                            isolation=self._isolation, running=self._agent.running_attempts(),
                            inbox_missing=bool(getattr(self._agent.inbox, "missing", False)))

    def answered(self, node: dict, body: dict) -> dict:
        """Hands acting on the answer ``node`` to the call-in ``body`` to the
        main loop; returns it."""
        self._answered = self._mono()
        self._hand(functools.partial(self._registered, node, body["running"]))
        return node

    def _registered(self, node: dict, running: list[dict]) -> None:
        try:
            self._agent.registered(node, running)
        except Exception:  # noqa: BLE001 - the call-in itself succeeded
            log.exception("acting on the call-in's answer failed; the next one tries again")


def _beat(register: Callable[[], dict], inbox_url: str) -> None:
    try:
        node = register()
    except ApiError as e:
        log.warning("node heartbeat failed: %s", e)
        return
    _check_inbox(node, inbox_url)


def _check_inbox(node: dict, inbox_url: str) -> None:
    if node.get("inbox_queue_url") not in (None, inbox_url):
        log.error("the server now names inbox %s, not %s: restart the agent to follow it",
                  node.get("inbox_queue_url"), inbox_url)
