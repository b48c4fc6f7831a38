"""Simulated host agents for the local stack: real agent processes
(``python -m agent``), each with its own node id, token, state directory and
GPU slots, stopped by their own pids when the stack stops. The ranks they
run outlive them, as on a real host, when the stack keeps its state: the
next stack's agents adopt them.

Each agent reads its token from ``<workdir>/<node>/token`` (mode 0600, in
its own folder of mode 0700) through ``--token-file``, never from its
environment: a process's starting environment stays readable in
``/proc/<pid>/environ`` for its whole life, whatever it removes from
``os.environ`` (a rank running as root read it there, issue 24). Nor does the
agent's environment carry the API's own secrets (the tokens file, the
page-token key), which an agent has no use for."""
from __future__ import annotations

import ctypes
import os
import pathlib
import secrets
import signal
import stat
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1
TOKEN_FILE = "token"
#: the API's settings an agent must not hold: the stack's own secrets, and
#: the token variable (each agent has its file)
NOT_FOR_AGENTS = ("GPUJOBS_TOKENS_FILE", "GPUJOBS_PAGE_TOKEN_KEY", "GPUJOBS_AGENT_TOKEN")


def agent_command(node: str, gpus: int, gpu_type: str, api_url: str,
                  state_dir: pathlib.Path, token_file: pathlib.Path, *,
                  grace_s: float | str, node_heartbeat_s: float | str, log_level: str,
                  extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of one agent process (``python -m agent``), as
    ``make up`` starts its own and the end-to-end tests theirs; ``extra``
    are more of its options."""
    return [sys.executable, "-m", "agent", "--node-id", node, "--gpus", str(gpus),
            "--gpu-type", gpu_type, "--api", api_url, "--state-dir", str(state_dir),
            "--token-file", str(token_file), "--poll-wait-s", "1",
            "--grace-s", str(grace_s), "--node-heartbeat-s", str(node_heartbeat_s),
            "--log-level", log_level, *extra]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the stack dies, however it dies
    (the ranks it leaves are stopped by the sweep at the next start)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the sweep at the next start stops what is left


def sweep(workdir: pathlib.Path, keep: tuple[str, ...] = ()) -> int:
    """Stop the ranks that agents of an earlier stack left behind, but those
    of the nodes in ``keep`` (their agents adopt them); the number of agent
    folders swept."""
    from agent.runner import kill_recorded_ranks

    swept = 0
    for state in sorted(workdir.glob("*/state")):
        if state.parent.name not in keep and (state / "state.json").exists():
            kill_recorded_ranks(state)
            swept += 1
    return swept


#: the agents' folder: a rank's uid passes through it (never lists it) to the
#: heartbeat folder and HOME its agent made for it (agent/isolation.py)
AGENTS_DIR_MODE = 0o711


def agents_folder(root: pathlib.Path, state: pathlib.Path) -> pathlib.Path:
    """Where a stack's agents keep their homes (token, state, logs): beside
    the stack's state folder ``root`` (``<root>-agents``), never in it, so
    that stays 0700 while a rank's uid passes through this one; a throwaway
    stack's (``state``, below ``root``) in a folder of its name there. One
    the checkout would hold, in a checkout out of the ranks' reach, is in
    its folder of devstack/reach.py, under the same name."""
    from devstack import reach

    base = root.with_name(root.name + "-agents")
    if base.resolve().is_relative_to(ROOT):
        base = reach.place(str(base.resolve().relative_to(ROOT)))
    return base if state == root else base / state.name


def agent_environment(environ: dict[str, str]) -> dict[str, str]:
    """What an agent process starts with: the stack's environment, less what
    is not for agents (:data:`NOT_FOR_AGENTS`), with ``/tmp`` as the root of
    jobs' checkpoint directories unless the stack names others. As root, each job's ranks
    run as a uid of the agent's default pool (agent/uidpool.py; the agents
    of one host share it, each uid claimed host-wide); only
    ``GPUJOBS_AGENT_RANK_UIDS=''`` turns that off, and the agents say so
    loudly (docs/security.md).

    Its PATH starts with the stack's own interpreter's folder (the
    virtualenv's ``bin``, its real path: not through the checkout's ``.venv``
    link, devstack/reach.py), so a job's ``python`` is that one: made from a
    python3 every user can run (devstack/interpreter.py), which a rank's uid
    can start, and what ``make up``'s user has in mind."""
    env = {k: v for k, v in environ.items() if k not in NOT_FOR_AGENTS}
    # /tmp is the local stack's shared storage: checkpoint directories there
    # are made by the agents (walked without following links), given to each
    # job's uid with what an earlier attempt's uid wrote (agent/isolation.py)
    env.setdefault("GPUJOBS_AGENT_JOB_ROOTS", "/tmp")
    own = own_bin()
    env["PATH"] = os.pathsep.join(
        [own, *(p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p != own)])
    return env


def own_bin() -> str:
    """The real folder of the stack's own interpreter: a job's ``python``."""
    return os.path.realpath(os.path.dirname(sys.executable))


def unreachable_python(python: str) -> str | None:
    """What to tell the user when a job's ``python`` (the stack's own, first
    on the agents' PATH) is one a rank's uid cannot start: a virtualenv made
    before the Makefile chose a python3 every user can run, or in a checkout
    out of other users' reach (devstack/reach.py)."""
    from devstack.interpreter import reachable_by_others

    if reachable_by_others(python, want=stat.S_IXOTH):
        return None
    return (f"gpujobs: WARNING: ranks run as uids of their own, and cannot start this "
            f"stack's python ({python} is out of other users' reach): a job's `python` "
            f"will fail with 'Permission denied'. Make the virtualenvs again where every "
            f"user can run them: rm -rf .venv .venv-torch && make up")


def ranks_side(env: dict[str, str]) -> tuple[pathlib.Path, str | None]:
    """The agents' working directory (a rank's, unless its job names one)
    and what to tell the user at start. In a checkout others can reach, or
    not as root: the checkout, nothing to say. Else (devstack/reach.py) its
    folder there, which holds a copy of ``examples/`` (a job's ``python3
    examples/hang.py`` runs it), and ``env`` gets the checkout on its
    PYTHONPATH (``python -m agent`` no longer starts in it; the agent's
    PYTHONPATH never reaches a rank)."""
    from devstack import reach

    if not reach.needed():
        return ROOT, None
    where = reach.examples().parent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    walled = "; a job's ranks, uids of their own, cannot read any other file of the checkout"
    return where, (
        f"gpujobs: this checkout is out of other users' reach ({reach.out_of_reach()} lacks "
        f"o+x): the virtualenvs, the agents' folders and a copy of examples/ (the agents' "
        f"working directory) are in {where}{walled if isolated(env) else ''}")


def isolated(env: dict[str, str]) -> bool:
    """Whether agents started with ``env`` run ranks as uids of their own."""
    return os.geteuid() == 0 and env.get("GPUJOBS_AGENT_RANK_UIDS") != ""


def write_token_file(home: pathlib.Path, token: str, *, traversable: bool) -> pathlib.Path:
    """The agent's token at ``home/token``, mode 0600, written whole (a new
    file renamed over the old). ``home`` is made 0700, or 0711 when
    ``traversable``: ranks that run as a rank user of their own must pass
    through it to their heartbeat directory (``home/state/heartbeats/...``)
    and HOME (``home/state/homes/<uid>``),
    and still cannot list it, nor read the token."""
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o711 if traversable else 0o700)
    path = home / TOKEN_FILE
    tmp = home / f".{TOKEN_FILE}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return path


def make_traversable(workdir: pathlib.Path) -> None:
    """Let the ranks' uids pass through (never list) the folders down to
    ``workdir``: those the stack made, below the repository or the system's
    temporary folder (pytest's are 0700); never one outside them."""
    import tempfile

    workdir.mkdir(parents=True, exist_ok=True)
    tops = [pathlib.Path(tempfile.gettempdir()).resolve(), ROOT]
    for folder in (workdir.resolve(), *workdir.resolve().parents):
        if folder in tops or not any(top in folder.parents for top in tops):
            break
        mode = stat.S_IMODE(folder.stat().st_mode)
        if mode & 0o011 != 0o011:
            os.chmod(folder, mode | 0o011)


class Agents:
    def __init__(self, count: int, gpus: int, workdir: pathlib.Path,
                 tokens: dict[str, str] | None = None) -> None:
        self.nodes = [f"local-{i + 1}" for i in range(count)]
        tokens = tokens or {}
        self.tokens = {n: tokens.get(n) or "sim_" + secrets.token_urlsafe(24)
                       for n in self.nodes}
        self._gpus, self._workdir = gpus, workdir
        self._procs: list[subprocess.Popen] = []

    def token_entries(self) -> list[dict]:
        """Each agent's token, bound to its node, for the API's token file."""
        return [{"token": t, "agent": n} for n, t in self.tokens.items()]

    def start(self, api_url: str) -> None:
        env = agent_environment(dict(os.environ))
        traversable = isolated(env)
        cwd, notice = ranks_side(env) if self.nodes else (ROOT, None)
        if notice:
            print(notice, flush=True)
        if traversable:
            make_traversable(self._workdir)
            warning = unreachable_python(os.path.join(own_bin(), os.path.basename(sys.executable)))
            if warning:
                print(warning, file=sys.stderr, flush=True)
        for node in self.nodes:
            home = self._workdir / node
            token_file = write_token_file(home, self.tokens[node], traversable=traversable)
            self._procs.append(subprocess.Popen(
                agent_command(node, self._gpus, os.environ.get("GPUJOBS_AGENT_GPU_TYPE", "h100"),
                              api_url, home / "state", token_file,
                              grace_s=os.environ.get("GPUJOBS_AGENT_GRACE_S", "3"),
                              node_heartbeat_s=os.environ.get(
                                  "GPUJOBS_AGENT_NODE_HEARTBEAT_S", "5"),
                              log_level=os.environ.get("GPUJOBS_AGENT_LOG_LEVEL", "WARNING"),
                              extra=("--log-dir", str(home / "logs"), "--address", "127.0.0.1")),
                cwd=cwd, env=env, preexec_fn=_die_with_parent))

    def stop(self, timeout: float = 10, *, keep_ranks: bool = False) -> None:
        """Stop the agents. Their ranks keep running, as on a real host, for
        the next stack's agents to adopt (``keep_ranks``, a stack that keeps
        its state); a throwaway stack kills them."""
        from agent.runner import kill_recorded_ranks

        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        if keep_ranks:
            return
        for node in self.nodes:
            state = self._workdir / node / "state"
            if (state / "state.json").exists():
                kill_recorded_ranks(state)

    def running(self) -> dict[str, dict[str, list[int]]]:
        """The ranks running now that the agents' state files record, by node,
        then by attempt key (``<job>/<attempt>``)."""
        return running_in(self._workdir, self.nodes)


def running_in(workdir: pathlib.Path, nodes: list[str]) -> dict[str, dict[str, list[int]]]:
    from agent.runner import running_recorded_ranks

    out = {}
    for node in nodes:
        state = workdir / node / "state"
        if (state / "state.json").exists():
            ranks = running_recorded_ranks(state)
            if ranks:
                out[node] = ranks
    return out


def describe(running: dict[str, dict[str, list[int]]]) -> str:
    """``job_x (attempt 1): ranks 0-1 on local-1; ...`` for a person."""
    from chalicelib.domain.verdict import span

    by_attempt: dict[str, list[str]] = {}
    for node, attempts in running.items():
        for key, ranks in attempts.items():
            word = "ranks" if len(ranks) > 1 else "rank"
            by_attempt.setdefault(key, []).append(f"{word} {span(ranks)} on {node}")
    parts = []
    for key, where in sorted(by_attempt.items()):
        job, _, attempt = key.rpartition("/")
        parts.append(f"{job} (attempt {attempt}): {', '.join(where)}")
    return "; ".join(parts)
