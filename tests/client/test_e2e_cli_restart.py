"""`gpujobs watch` and `gpujobs logs -f` ride through a restart of the local
stack (issue 47): a stack of its own that keeps its state (the restart is
SIGTERM, then a new `python -m devstack` on the same state folder, on a port
of the OS's choosing), a real agent whose job's ranks run on while the stack
is down, and the two commands started before the restart as a user starts
them: from a folder outside the checkout, finding the stack through its
cli.toml (GPUJOBS_STATE_DIR). Every process the test starts is stopped by its
own handle, also when the test fails."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from devstack.agents import agents_folder, sweep
from tests.support.cli import CLIENT_DIR
from tests.support.procs import stop_process
from tests.support.stacks import start_stack
from tests.support.waits import wait_until

pytestmark = pytest.mark.e2e

#: prints "tick <i>" every 0.2 s until its stop file appears (or 1,500 of
#: them, five minutes), then "printed <n>": the last line says what every
#: line before it must be
TICKS = """\
import os, sys, time
stop, i = sys.argv[1], 0
while i < 1500 and not os.path.exists(stop):
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.2)
print(f"printed {i}", flush=True)
"""


def cli_env(state: pathlib.Path, config_home: pathlib.Path) -> dict[str, str]:
    """A user's shell: no GPUJOBS_API_URL or token, the stack found through
    its file in ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_STATE_DIR": str(state), "XDG_CONFIG_HOME": str(config_home),
                "COLUMNS": "200", "NO_COLOR": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(CLIENT_DIR), env.get("PYTHONPATH")) if p)})
    return env


def ticks_of(text: str) -> dict[int, list[str]]:
    """Each rank's lines of `gpujobs logs` output, in the order printed."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"\[rank (\d+)\] (.*)", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def test_watch_and_logs_follow_ride_through_a_restart_losing_and_repeating_nothing(
        tmp_path, shared_dir):
    """Invariant: a restart of the stack while `watch` and `logs -f` run
    costs them a pause, not the command: each says on stderr that the API
    did not answer and then did, `logs -f` prints every line of each rank
    once and in order (ticks 0 to n-1, then "printed n", n read from the
    line itself, the same lines as a plain `gpujobs logs` after the end),
    and both end 0 once the job SUCCEEDED."""
    state = tmp_path / "state"
    script = shared_dir / "ticks.py"
    script.write_text(TICKS)
    stop_file = shared_dir / "stop"
    env = {"GPUJOBS_STATE_DIR": str(state), "GPUJOBS_EPHEMERAL": "0", "GPUJOBS_AGENTS": "1",
           "GPUJOBS_SCAN_PERIOD_S": "1"}
    tokens = [{"token": "restart-tk", "tenant": "restart"}]
    user = cli_env(state, tmp_path / "xdg")
    here = tmp_path / "elsewhere"  # outside the checkout: the state folder says where
    here.mkdir()

    def gpujobs(*args: str, **popen) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "gpujobs_client.cli", *args], cwd=here,
                                env=user, text=True, **popen)

    def run(*args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "gpujobs_client.cli", *args], cwd=here,
                           env=user, text=True, capture_output=True, timeout=120)
        assert "Traceback" not in r.stderr, r.stderr
        return r

    outs = {name: (tmp_path / f"{name}.out", tmp_path / f"{name}.err")
            for name in ("logs", "watch")}

    def read(name: str, which: int = 0) -> str:
        return outs[name][which].read_text()

    procs: dict[str, subprocess.Popen] = {}
    stacks = []
    try:
        stacks.append(start_stack(tmp_path, tokens, **env))
        r = run("submit", "-q", "--ranks", "2", "--name", "restart", "--",
                "python3", str(script), str(stop_file))
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip()
        for name, args in (("logs", ("logs", job_id, "-f", "--interval", "0.5")),
                           ("watch", ("watch", job_id, "--interval", "0.5"))):
            out, err = outs[name]
            with open(out, "w") as o, open(err, "w") as e:
                procs[name] = gpujobs(*args, stdout=o, stderr=e)
        wait_until(lambda: all(len(v) >= 5 for v in ticks_of(read("logs")).values())
                   and len(ticks_of(read("logs"))) == 2, 90, 0.2,
                   "logs -f printing both ranks' ticks")

        assert stacks[0].stop(signal.SIGTERM, timeout=60) == 0
        assert not (state / "cli.toml").exists()
        # meanwhile, a command that does not follow says the stack is down (exit 6)
        down_now = run("list")
        assert down_now.returncode == 6, down_now.stderr
        assert down_now.stderr.startswith(f"Error: The local stack is down: {state} has no "
                                          "cli.toml"), down_now.stderr
        down = {k: len(ticks_of(read("logs")).get(k, [])) for k in (0, 1)}
        stacks.append(start_stack(tmp_path, tokens, **env))
        for name in ("logs", "watch"):
            # (or to end: it gave up, which the asserts below show with what it said)
            wait_until(lambda name=name: "the API answers again" in read(name, 1)
                       or procs[name].poll() is not None, 90, 0.2,
                       f"{name} to say the API answers again")
        wait_until(lambda: all(len(ticks_of(read("logs")).get(k, [])) > down[k] + 5
                               for k in (0, 1)) or procs["logs"].poll() is not None, 60, 0.2,
                   "new ticks after the restart")
        stop_file.touch()
        for name in ("logs", "watch"):
            procs[name].wait(120)

        for name in ("logs", "watch"):
            assert procs[name].returncode == 0, (name, read(name), read(name, 1))
            said = read(name, 1)
            assert "does not answer" in said and "retrying for up to 60 s" in said, said
            assert not [ln for ln in said.splitlines() if ln.startswith("Error")], said
        assert "Job finished: SUCCEEDED" in read("watch")
        followed = ticks_of(read("logs"))
        assert set(followed) == {0, 1}
        for rank, lines in followed.items():
            last = lines[-1]
            assert last.startswith("printed "), (rank, lines[-3:])
            n = int(last.split()[1])
            assert lines == [f"tick {i}" for i in range(n)] + [last], \
                f"rank {rank}: lost or repeated lines around the restart"
            assert n > down[rank], "the job printed on through the restart"
        everything = run("logs", job_id)
        assert everything.returncode == 0, everything.stderr
        assert ticks_of(everything.stdout) == followed
    finally:
        for proc in procs.values():
            stop_process(proc)
        for stack in stacks:
            stack.stop(signal.SIGTERM, timeout=60)
        sweep(agents_folder(state, state))  # whatever a failure left running
