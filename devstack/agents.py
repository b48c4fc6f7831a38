"""Simulated host agents for the local stack: real agent processes
(``python -m agent``), each with its own node id, token, state directory and
GPU slots, stopped by their own pids when the stack stops."""
from __future__ import annotations

import os
import pathlib
import secrets
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Agents:
    def __init__(self, count: int, gpus: int, workdir: pathlib.Path) -> None:
        self.nodes = [f"local-{i + 1}" for i in range(count)]
        self.tokens = {n: "sim_" + secrets.token_urlsafe(24) for n in self.nodes}
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
                cwd=ROOT, env=env))

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
