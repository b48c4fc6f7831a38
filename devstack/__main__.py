"""``make up``: the whole system on one machine, in the foreground.

Reads PORT, GPUJOBS_TOKENS_FILE, GPUJOBS_AGENTS, GPUJOBS_GPUS_PER_AGENT and
GPUJOBS_SCAN_PERIOD_S (API.md, "The local stack"). Prints a line containing
``ready`` once GET /v1/health answers; exits cleanly on SIGINT or SIGTERM.

State (tables, queues, generated tokens, the page-token key, agents' folders)
lives in ``.gpujobs-local/`` in the checkout (GPUJOBS_STATE_DIR to move it),
snapshotted at most a second after each change: a restart, also after
``kill -9``, comes back with every job, node and token. Running ranks run
on while the stack is down, as on a real host, and the next stack's agents
adopt them. GPUJOBS_EPHEMERAL=1 runs a throwaway stack in a folder of its
own, whose ranks stop with it and which is removed when it stops (and by the
next start if it was killed). Nothing is written to the system's temporary
folder. As root in a checkout other users cannot reach, the agents' folders
(which ranks pass through) are in its folder of devstack/reach.py instead,
and the agents run there, beside a copy of examples/ (devstack/agents.py,
ranks_side); the stack says so in one line as it starts them.
"""
from __future__ import annotations

import faulthandler
import fcntl
import json
import logging
import os
import pathlib
import secrets
import shutil
import signal
import sys
import threading
import time
import urllib.request

from chalicelib.domain.errors import ServiceUnavailable
from devstack.logs import quiet_repeats

log = logging.getLogger("devstack")


def _int_env(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        sys.exit(f"{name} must be an integer, got {raw!r}")
    if value < minimum:
        sys.exit(f"{name} must be at least {minimum}, got {value}")
    return value


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        sys.exit(f"{name} must be a number, got {raw!r}")
    if value <= 0:
        sys.exit(f"{name} must be positive, got {value}")
    return value


ROOT = pathlib.Path(__file__).resolve().parent.parent


def _private(path: pathlib.Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _kept(path: pathlib.Path, make) -> str:
    """The secret kept at ``path``, made by ``make()`` the first time."""
    if path.exists():
        return path.read_text().strip()
    value = make()
    _private(path, value)
    return value


def _tokens_file(state: pathlib.Path) -> str:
    path = os.environ.get("GPUJOBS_TOKENS_FILE")
    if path:
        if not os.path.isfile(path):
            sys.exit(f"GPUJOBS_TOKENS_FILE={path} does not exist")
        return path
    kept = state / "tokens.json"
    if kept.exists():
        print(f"gpujobs: no GPUJOBS_TOKENS_FILE given; tokens kept in {kept}", flush=True)
        return str(kept)
    tokens = [{"token": "t_" + secrets.token_urlsafe(24), "tenant": "default"},
              {"token": "a_" + secrets.token_urlsafe(24), "agent": "*"},
              {"token": "o_" + secrets.token_urlsafe(24), "operator": "local-operator"}]
    _private(kept, json.dumps(tokens, indent=2))
    print(f"gpujobs: no GPUJOBS_TOKENS_FILE given; fresh tokens written to {kept}", flush=True)
    return str(kept)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: the state folders (the snapshot, the tokens, the page-token key): their
#: owner's alone; the agents' homes are beside them (devstack.agents.agents_folder)
STATE_DIR_MODE = 0o700


def _state_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPUJOBS_STATE_DIR") or ROOT / ".gpujobs-local")


def _state_dir() -> tuple[pathlib.Path, bool]:
    """(the folder this stack keeps its state in, whether to remove it at the end)."""
    root = _state_root()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, STATE_DIR_MODE)
    from devstack.agents import agents_folder, sweep

    # throwaway stacks that were killed: stop what they left, remove them
    for old in root.glob("ephemeral-*"):
        pid = old.name.rpartition("-")[2]
        if pid.isdigit() and not _pid_alive(int(pid)):
            sweep(agents_folder(root, old))
            shutil.rmtree(agents_folder(root, old), ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    if (root / "agents").is_dir():  # an older checkout kept them in the state folder
        sweep(root / "agents")
        shutil.rmtree(root / "agents", ignore_errors=True)
    if os.environ.get("GPUJOBS_EPHEMERAL", "") not in ("", "0"):
        state = root / f"ephemeral-{os.getpid()}"
        state.mkdir()
        os.chmod(state, STATE_DIR_MODE)
        return state, True
    return root, False


def _lock(state: pathlib.Path):
    f = open(state / "lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"gpujobs: another local stack is running on {state}; stop it, or set "
                 "GPUJOBS_EPHEMERAL=1 or GPUJOBS_STATE_DIR for a stack of its own")
    return f


def _tenant_token(path: str) -> str | None:
    """The first tenant token of the file, for the CLI and the ready line."""
    try:
        with open(path, encoding="utf-8") as f:
            tokens = json.load(f)
        return next(t["token"] for t in tokens if isinstance(t, dict) and t.get("tenant"))
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


def _write_cli_file(state: pathlib.Path, api_url: str, token: str | None) -> pathlib.Path:
    """Where ``gpujobs`` (and ``Client.from_config()``) find this stack by
    themselves, whatever its PORT: ``cli.toml`` in the state folder
    (gpujobs_client/config.py looks there), removed when the stack stops."""
    from gpujobs_client.config import LOCAL_STACK_FILE, save_file

    path = state / LOCAL_STACK_FILE
    save_file(path, {"api_url": api_url, **({"token": token} if token else {})})
    return path


def _with_agent_tokens(path: str, entries: list[dict], merged: str) -> str:
    """The API reads the user's tokens plus one per simulated agent, from
    ``merged`` (0600); the user's file is left as it is."""
    if not entries:
        return path
    with open(path, encoding="utf-8") as f:
        tokens = json.load(f)
    with open(os.open(merged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(tokens + entries, f)
    return merged


#: how often the local stack's feed timer numbers and pushes events
FEED_PERIOD_S = 1.0


class Timer(threading.Thread):
    """Runs a scheduled function every ``period_s`` until stopped, as EventBridge would."""

    def __init__(self, name: str, period_s: float, fn, stop: threading.Event) -> None:
        super().__init__(name=f"timer-{name}", daemon=True)
        self._period, self._fn, self._halt = period_s, fn, stop
        self._next_at = time.monotonic() + period_s

    def set_period(self, period_s: float) -> None:
        """Runs every ``period_s`` from now on (devstack/settings.py); the next
        run is no later than one new period away."""
        self._period = period_s
        self._next_at = min(self._next_at, time.monotonic() + period_s)

    def run(self) -> None:
        event = {"version": "0", "detail-type": "Scheduled Event", "source": "aws.events",
                 "account": "123456789012", "region": "us-east-1", "resources": [],
                 "detail": {}, "id": "local", "time": ""}
        # runs start at fixed period boundaries, as EventBridge's do: a slow run
        # shortens the wait before the next one instead of pushing it back (a
        # run that overran whole periods skips the starts it missed); the wait
        # is cut in half-seconds so that a shorter period (set_period) applies
        while not self._halt.wait(min(0.5, max(0.0, self._next_at - time.monotonic()))):
            if time.monotonic() < self._next_at:
                continue
            try:
                self._fn(event, None)
            except ServiceUnavailable as e:
                log.warning("scheduled function %s: %s", self.name, e.detail)
            except Exception:  # noqa: BLE001 - keep the timer alive, say what broke
                log.exception("scheduled function %s failed", self.name)
            self._next_at = next_period_start(self._next_at, self._period, time.monotonic())


def next_period_start(last_start: float, period: float, now: float) -> float:
    """The first period boundary after ``now`` on the grid that ``last_start`` is on."""
    missed = max(0, int((now - last_start) // period))
    return last_start + (missed + 1) * period


class Halt:
    """What SIGINT and SIGTERM ask for. The handler only sets a plain
    attribute: Python runs it in the main thread between two bytecodes, and a
    handler calling ``Event.set()`` deadlocks when the main thread was inside
    that Event's own ``wait()`` (it holds the condition's lock), after which
    the stack ignored every signal. The main thread polls :meth:`requested`,
    which sets the Event the timer threads wait on."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._asked = False

    def handler(self, signum, frame) -> None:  # noqa: ARG002 - signal.signal's signature
        self._asked = True

    def requested(self) -> bool:
        if self._asked and not self.event.is_set():
            self.event.set()
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` (main thread only), True once asked to stop."""
        deadline = time.monotonic() + seconds
        while not self.requested():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.05, left))
        return True


def _wait_healthy(url: str, halt: Halt, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not halt.requested():
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        halt.wait(0.05)
    return False


def _verbose(argv: list[str]) -> bool:
    """-v (or GPUJOBS_VERBOSE=1): the services' INFO logs, their EMF metric
    records and the agents' INFO logs too; by default only warnings."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m devstack", description=__doc__.split("\n")[0])
    p.add_argument("-v", "--verbose", action="store_true",
                   help="INFO logs and EMF metrics of the API, timers and agents "
                        "[GPUJOBS_VERBOSE=1]")
    verbose = p.parse_args(argv).verbose or \
        os.environ.get("GPUJOBS_VERBOSE", "").lower() in ("1", "true", "yes")
    os.environ.setdefault("GPUJOBS_LOG_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("GPUJOBS_AGENT_LOG_LEVEL", "INFO" if verbose else "WARNING")
    # EMF records are for CloudWatch; on a terminal they are noise
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "false" if verbose else "true")
    return verbose


def main(argv: list[str] | None = None) -> int:
    _verbose(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("GPUJOBS_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's access log
    quiet_repeats("")  # a warning repeated word for word prints once, then its count
    port = _int_env("PORT", 8000)
    agents_count = _int_env("GPUJOBS_AGENTS", 2)
    gpus_per_agent = _int_env("GPUJOBS_GPUS_PER_AGENT", 8, minimum=1)
    scan_period_s = _float_env("GPUJOBS_SCAN_PERIOD_S", 5)
    from devstack.agents import agents_folder
    from devstack.reach import Refused

    try:
        state, ephemeral = _state_dir()
        workdir = agents_folder(_state_root(), state)
    except Refused as e:  # devstack/reach.py: a folder there not to trust
        sys.exit(f"gpujobs: {e}")
    try:
        return _run(port, agents_count, gpus_per_agent, scan_period_s, state, workdir,
                    ephemeral)
    finally:
        if ephemeral:
            shutil.rmtree(workdir, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
        # stopping already: Python's finalization puts back the default action
        # of a signal it handled, so a repeated SIGTERM would turn this clean
        # exit into a death by signal; an ignored one stays ignored
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def _run(port: int, agents_count: int, gpus_per_agent: int, scan_period_s: float,
         state: pathlib.Path, workdir: pathlib.Path, ephemeral: bool) -> int:
    held = _lock(state)  # noqa: F841 - held until the process ends
    tokens_file = _tokens_file(state)

    halt = Halt()
    stop = halt.event  # what the timer threads wait on
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, halt.handler)

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    from devstack import resources
    from devstack.agents import AGENTS_DIR_MODE, Agents, describe, sweep
    from devstack.motoauth import owners
    from devstack.motoserver import MotoServer
    from devstack.persist import Snapshots

    workdir.mkdir(parents=True, exist_ok=True)
    for folder in (workdir, workdir.parent) if ephemeral else (workdir,):
        os.chmod(folder, AGENTS_DIR_MODE)  # a throwaway stack's is in a shared one
    agent_tokens = state / "agent-tokens.json"
    agents = Agents(agents_count, gpus_per_agent, workdir,
                    json.loads(agent_tokens.read_text()) if agent_tokens.exists() else None)
    _private(agent_tokens, json.dumps(agents.tokens))
    # ranks the last stack left running (it stopped, or was killed): as on a
    # real host, they ran on meanwhile, and its agents' successors adopt them
    adopted = agents.running()
    sweep(workdir, keep=tuple(agents.nodes))  # a node no agent runs now adopts nothing
    keep_ranks = not ephemeral
    snapshots = None
    # answers its owner's processes alone, never a rank's (motoauth.py)
    moto = MotoServer(on_change=lambda: snapshots and snapshots.changed(),
                      owners=owners()).start()
    try:
        os.environ.update(resources.deploy(moto.endpoint_url))
        # a throwaway stack's state folder is its process's alone and goes
        # with it: nothing would ever read a snapshot of it, and each one
        # holds every write back while it pickles the whole emulator
        snapshots = None if ephemeral else Snapshots(state, moto.app.lock)
        restored = snapshots is not None and snapshots.restore()
        if restored:  # saved by an older checkout: the indexes added or changed since
            for index in resources.add_missing_indexes(moto.endpoint_url):
                log.info("made the index %s of the restored state", index)
        if snapshots is not None:
            snapshots.start()
        os.environ.update({
            "GPUJOBS_TOKENS_FILE": _with_agent_tokens(tokens_file, agents.token_entries(),
                                                      str(state / "api-tokens.json")),
            "GPUJOBS_SCAN_PERIOD_S": str(scan_period_s),
            # the agents ship rank logs to the embedded moto (botocore's own variable)
            "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": moto.endpoint_url,
            "GPUJOBS_CANCEL_RESEND_AFTER_S": os.environ.get("GPUJOBS_CANCEL_RESEND_AFTER_S",
                                                            str(max(2 * scan_period_s, 5))),
        })
        # webhooks may go to http:// and loopback receivers here (docs/openapi.yaml)
        os.environ.setdefault("GPUJOBS_WEBHOOK_ALLOW_LOCAL", "1")
        os.environ.setdefault("GPUJOBS_PAGE_TOKEN_KEY", _kept(
            state / "page-token-key", lambda: secrets.token_hex(32)))

        import app as gpujobs  # the same app object Lambda runs
        from devstack.server import make_server
        from devstack.settings import Settings

        timers: list[Timer] = []
        # tests set what they vary on a running stack (devstack/settings.py)
        def scan_period(period_s: float) -> None:
            for timer in timers:
                timer.set_period(period_s)

        settings = Settings.from_env(scan_period)
        server = make_server(gpujobs.app, "127.0.0.1", port, settings=settings)
        port = server.server.server_address[1]
        threading.Thread(target=server.server.serve_forever, name="api", daemon=True).start()
        from chalicelib.bootstrap import services
        from chalicelib.domain.clock import utcnow
        from devstack.queues import ConcurrentQueueConsumer, QueueConsumer

        if not _wait_healthy(f"http://127.0.0.1:{port}/v1/health", halt):
            if halt.requested():
                return 0
            print("gpujobs: the API did not become healthy", file=sys.stderr, flush=True)
            return 1
        # real agent processes; 0 leaves the nodes to an outside program. The
        # scheduled functions start once every agent has called in: a node
        # last seen before a restart must not be judged DOWN meanwhile
        since = utcnow()
        agents.start(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while not all((n := services().node_store.get(node)) and n.last_seen_at >= since
                      for node in agents.nodes):
            if halt.wait(0.1) or time.monotonic() > deadline:
                if halt.requested():
                    return 0
                print("gpujobs: the simulated agents did not register", file=sys.stderr,
                      flush=True)
                return 1
        timers += [Timer("place", scan_period_s, gpujobs.place, stop),
                   Timer("reconcile", scan_period_s, gpujobs.reconcile, stop),
                   Timer("scan", scan_period_s, gpujobs.scan, stop)]
        workers = [
            *timers,
            # the event feed's pushes (EventBridge, webhooks) follow within a
            # second here; deployed, the feed timer runs every minute
            Timer("feed", FEED_PERIOD_S, gpujobs.feed, stop),
            QueueConsumer("place_on_nudge", os.environ["GPUJOBS_PENDING_QUEUE_URL"],
                          gpujobs.place_on_nudge, stop, endpoint_url=moto.endpoint_url),
            QueueConsumer("scan_shard", os.environ["GPUJOBS_SCAN_QUEUE_URL"],
                          gpujobs.scan_shard, stop, endpoint_url=moto.endpoint_url,
                          batch_size=1),
            QueueConsumer("follow_up", os.environ["GPUJOBS_FOLLOW_UP_QUEUE_URL"],
                          gpujobs.follow_up, stop, endpoint_url=moto.endpoint_url),
            ConcurrentQueueConsumer("deliver_webhook", os.environ["GPUJOBS_WEBHOOK_QUEUE_URL"],
                                    gpujobs.deliver_webhook, stop,
                                    endpoint_url=moto.endpoint_url),
        ]
        for w in workers:
            w.start()
        if adopted:
            print(f"gpujobs: the agents adopted the ranks the last stack left running: "
                  f"{describe(adopted)}", flush=True)
        # the services are built now, with their own log handlers: quiet those too
        quieted = quiet_repeats("", "gpujobs", "chalicelib", "devstack")
        token = _tenant_token(tokens_file)
        cli_file = _write_cli_file(state, f"http://127.0.0.1:{port}", token)
        print(f"gpujobs ready: API http://127.0.0.1:{port} | AWS (moto) {moto.endpoint_url} | "
              f"tokens {tokens_file} | agents {agents_count} x {gpus_per_agent} GPUs "
              f"({', '.join(agents.nodes) or 'none'}; logs under {workdir}) | "
              f"scan every {scan_period_s:g}s | state {state} "
              f"({'restored' if restored else 'new'}) | gpujobs finds it through "
              f"{cli_file}; other tools: export GPUJOBS_API_URL=http://127.0.0.1:{port} "
              f"GPUJOBS_TOKEN={token or '<a tenant token of the tokens file>'}", flush=True)
        # never a wait without a timeout, and none on a lock the handler takes:
        # the kernel hands SIGTERM to any of the stack's threads, and only a
        # main thread that wakes up runs Python's handler (see Halt)
        while not halt.wait(0.5):
            pass
        # a shutdown that takes long says where it is
        faulthandler.dump_traceback_later(45, exit=False)
        for f in quieted:
            f.flush()  # the repeats not yet said
        agents.stop(keep_ranks=keep_ranks)
        left = agents.running() if keep_ranks else {}
        if left:
            print(f"gpujobs: stopping; these ranks run on, and the next `make up` adopts "
                  f"them: {describe(left)}", flush=True)
        cli_file.unlink(missing_ok=True)  # the CLI must not find a stack that is gone
        server.shutdown()
        server.server.server_close()
        return 0
    finally:
        agents.stop(keep_ranks=keep_ranks)
        if snapshots is not None:
            snapshots.stop()
        moto.stop()
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    sys.exit(main())
