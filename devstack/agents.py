"""Simulated host agents for the local stack: real agent processes
(``python -m agent``), each with its own node id, token, state directory and
GPU slots, stopped by their own pids when the stack stops."""
from __future__ import annotations

import ctypes
import os
import pathlib
import secrets
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the stack dies, however it dies
    (the ranks it leaves are stopped by the sweep at the next start)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the sweep at the next start stops what is left


def sweep(workdir: pathlib.Path) -> int:
    """Stop the ranks that agents of an earlier stack left behind (a crash
    gives them no chance to be stopped); the number of agent folders swept."""
    from agent.runner import kill_recorded_ranks

    swept = 0
    for state in sorted(workdir.glob("*/state")):
        if (state / "state.json").exists():
            kill_recorded_ranks(state)
            swept += 1
    return swept


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
        for node in self.nodes:
            home = self._workdir / node
            home.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "GPUJOBS_AGENT_TOKEN": self.tokens[node]}
            # a throwaway stack in private temporary directories: ranks run as the
            # agent (isolation "none") unless a rank user is named (docs/security.md)
            env.setdefault("GPUJOBS_AGENT_RANK_USER", "")
            self._procs.append(subprocess.Popen(
                [sys.executable, "-m", "agent", "--node-id", node, "--gpus", str(self._gpus),
                 "--gpu-type", os.environ.get("GPUJOBS_AGENT_GPU_TYPE", "h100"),
                 "--api", api_url, "--state-dir", str(home / "state"),
                 "--log-dir", str(home / "logs"), "--poll-wait-s", "1",
                 "--address", "127.0.0.1",
                 "--grace-s", os.environ.get("GPUJOBS_AGENT_GRACE_S", "3"),
                 "--node-heartbeat-s", os.environ.get("GPUJOBS_AGENT_NODE_HEARTBEAT_S", "5"),
                 "--log-level", os.environ.get("GPUJOBS_AGENT_LOG_LEVEL", "WARNING")],
                cwd=ROOT, env=env, preexec_fn=_die_with_parent))

    def stop(self, timeout: float = 10) -> None:
        """Stop the agents, then the ranks they leave running: a real host keeps
        them for the next agent to adopt; a throwaway local stack must not."""
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
        for node in self.nodes:
            state = self._workdir / node / "state"
            if (state / "state.json").exists():
                kill_recorded_ranks(state)
        self._procs.clear()
