"""Simulated host agents for the local stack: real agent processes
(``python -m agent``), each with its own node id, token, state directory and
GPU slots, stopped by their own pids when the stack stops. The ranks they
run outlive them, as on a real host, when the stack keeps its state: the
next stack's agents adopt them."""
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
