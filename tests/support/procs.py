"""Processes a test started, stopped by their own ids (never by a name): an
agent, its ranks (by the pids its state file records), any subprocess."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from agent.ranks import read_stat
from agent.runner import kill_recorded_ranks


def alive(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.alive


def kill_ranks_in_state(state_dir: Path) -> None:
    kill_recorded_ranks(state_dir)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop a process a test started, by its own pid: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_agent(proc: subprocess.Popen, state_dir: Path) -> None:
    """Stop an agent process a test started, by its own pid (resumed first: a
    paused process would not act on SIGTERM), then every rank its state file
    records, also the ranks of a test that failed half-way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
    stop_process(proc, 15)
    if (state_dir / "state.json").exists():
        kill_recorded_ranks(state_dir)
