"""The local stack as `make up` starts it (a real process, real HTTP), for the
end-to-end tests: started by tests/conftest.py once per session and stopped by
its own process id, also when a test fails."""
from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import requests

ROOT = pathlib.Path(__file__).resolve().parents[1]
READY = re.compile(r"ready: API (http://\S+) \| AWS \(moto\) (http://\S+)")


@dataclass
class Stack:
    proc: subprocess.Popen
    api: str
    aws: str
    lines: "queue.Queue[str]"
    ready_line: str = ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                # what the stack printed last (its thread dump, when it hung)
                # shows with the failing test's output
                while not self.lines.empty():
                    sys.stderr.write(self.lines.get_nowait())
        return self.proc.returncode


def start_stack(tmp: pathlib.Path, tokens: list[dict], **env: str) -> Stack:
    tokens_file = tmp / "tokens.json"
    tokens_file.write_text(json.dumps(tokens))
    return launch({**os.environ, "PORT": "0", "GPUJOBS_TOKENS_FILE": str(tokens_file),
                   "GPUJOBS_AGENTS": "0", "GPUJOBS_EPHEMERAL": "1", **env})


def launch(env: dict[str, str], *, timeout: float = 90,
           before_ready: Callable[[list[str]], None] | None = None, **popen) -> Stack:
    """``python -m devstack`` with exactly ``env``, once its ready line is out;
    ``before_ready`` sees every line printed until then. A stack that does not
    become ready is stopped, and what it printed is the error."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env, **popen)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    seen = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            seen.append(line)
            m = READY.search(line)
            if m:
                if before_ready is not None:
                    before_ready(seen)
                return Stack(proc, m.group(1), m.group(2), lines, line)
        raise RuntimeError("local stack did not become ready:\n" + "".join(seen))
    except BaseException:
        Stack(proc, "", "", lines).stop()
        raise


TOKENS = [{"token": "e2e-tenant", "tenant": "e2e"},
          {"token": "e2e-other", "tenant": "e2e-other"},
          {"token": "e2e-race", "tenant": "e2e-race"},
          {"token": "e2e-agent", "agent": "node-1"}]


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.s = requests.Session()
        self.s.headers.update({"Authorization": f"Bearer {token}"})

    def __getattr__(self, method):
        def call(path, **kw):
            return self.s.request(method.upper(), self.base + path, timeout=30, **kw)
        return call
