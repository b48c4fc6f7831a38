"""`gpujobs` as a user runs it (a subprocess against a stack's API) and its
logs polled; importing this puts the client package on ``sys.path`` when it
is not installed into this interpreter (before `pip install -e`)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from tests.support.waits import wait_until

CLIENT_DIR = pathlib.Path(__file__).resolve().parents[2] / "client"
try:
    import gpujobs_client  # noqa: F401
except ImportError:  # not installed into this interpreter: use the source tree
    sys.path.insert(0, str(CLIENT_DIR))


def cli_runner(api_url: str, config_home):
    """Run ``gpujobs`` as a user does: a subprocess with the API URL and a tenant
    token from the environment and an empty config directory. No traceback may
    ever reach the user: ``ranks_output=True`` only where what is printed is
    the ranks' own output (``gpujobs logs``), whose tracebacks are the job's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_API_URL": api_url, "GPUJOBS_TOKEN": "e2e-tenant",
                "XDG_CONFIG_HOME": str(config_home), "XDG_STATE_HOME": str(config_home),
                "COLUMNS": "200", "NO_COLOR": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(CLIENT_DIR), env.get("PYTHONPATH")) if p)})

    def run(*args: str, ranks_output: bool = False,
            **extra_env: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "gpujobs_client.cli", *args],
                           capture_output=True, text=True, timeout=120,
                           env={**env, **extra_env})
        assert ranks_output or "Traceback" not in r.stderr + r.stdout, r.stdout + r.stderr
        return r
    return run


def logs_until(gpujobs, job_id: str, pattern: str, count: int, timeout: float = 60,
               args: tuple[str, ...] = ()) -> str:
    """`gpujobs logs JOB [args]` once it shows ``count`` lines matching
    ``pattern`` (the agents ship the ranks' output every second or two), polled;
    a failure shows what the logs last said."""
    shown = ""

    def enough() -> subprocess.CompletedProcess | None:
        nonlocal shown
        r = gpujobs("logs", job_id, *args, ranks_output=True)
        shown = r.stdout + r.stderr
        return r if r.returncode != 0 or len(re.findall(pattern, shown)) >= count else None

    try:
        r = wait_until(enough, timeout, 0.5, f"{count} lines of {pattern!r} in the logs")
    except AssertionError:
        raise AssertionError(f"never {count} lines of {pattern!r} in the logs:\n{shown}") from None
    assert r.returncode == 0, r.stderr
    return shown


def stall_lines(describe_out: str) -> list[str]:
    """The lines of a `gpujobs describe` that tell of a stall (a STALLED
    health, a stalled or recovered event, a verdict), leaving out the spec's
    own policy row ``on stall ...``, which every job has: a healthy run
    answers []."""
    return [line for line in describe_out.splitlines()
            if "stall" in line.lower() and not line.lstrip().lower().startswith("on stall")]
