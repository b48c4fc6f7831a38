"""The local stack as `make up` starts it (``python -m devstack``: a real
process, real HTTP), started from Python: ``start_stack`` runs it on a free
port with the given tokens and returns once its ready line is out, ``Api``
calls it as a tenant or agent. The end-to-end tests (tests/support/stacks.py) and the
benchmarks (bench/dashboard.py) start it this way; stop it by its
``Stack.stop``, which signals its own process only."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import requests

from devstack.settings import PATH as SETTINGS_PATH, TOKEN_ENV as SETTINGS_TOKEN_ENV

ROOT = pathlib.Path(__file__).resolve().parents[1]
READY = re.compile(r"ready: API (http://\S+) \| AWS \(moto\) (http://\S+)")


@dataclass
class Stack:
    proc: subprocess.Popen
    api: str
    aws: str
    lines: "queue.Queue[str]"
    ready_line: str = ""
    #: the bearer of PUT /_local/settings (devstack/settings.py); "": not served
    settings_token: str = ""

    @contextlib.contextmanager
    def settings(self, **values: str) -> Iterator[dict[str, str | None]]:
        """The stack runs with ``values`` (devstack/settings.py RUNTIME) inside
        the block, and with its own again after it, also when the block fails."""
        try:
            yield self._put_settings(values)
        finally:
            self._put_settings(dict.fromkeys(values))

    def _put_settings(self, values: Mapping[str, str | None]) -> dict[str, str | None]:
        r = requests.put(self.api + SETTINGS_PATH, json=values, timeout=30,
                         headers={"Authorization": f"Bearer {self.settings_token}"})
        if r.status_code != 200:
            raise RuntimeError(f"the stack refused the settings {values}: {r.text}")
        return r.json()

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
    """A throwaway stack with ``tokens`` and ``env``, no agents unless ``env``
    says, whose settings :meth:`Stack.settings` can change while it runs."""
    tokens_file = tmp / "tokens.json"
    tokens_file.write_text(json.dumps(tokens))
    token = secrets.token_urlsafe(16)
    stack = launch({**os.environ, "PORT": "0", "GPUJOBS_TOKENS_FILE": str(tokens_file),
                    "GPUJOBS_AGENTS": "0", "GPUJOBS_EPHEMERAL": "1", SETTINGS_TOKEN_ENV: token,
                    **env})
    stack.settings_token = token
    return stack


def launch(env: dict[str, str], *, timeout: float = 90,
           before_ready: Callable[[list[str]], None] | None = None, **popen: Any) -> Stack:
    """``python -m devstack`` with exactly ``env``, once its ready line is out;
    ``before_ready`` sees every line printed until then. A stack that does not
    become ready is stopped, and what it printed is the error."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env, **popen)
    lines: queue.Queue[str] = queue.Queue()
    out = proc.stdout
    assert out is not None  # stdout=PIPE

    def pump() -> None:
        for line in out:
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


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.s = requests.Session()
        self.s.headers.update({"Authorization": f"Bearer {token}"})

    def __getattr__(self, method: str) -> Callable[..., requests.Response]:
        def call(path: str, **kw: Any) -> requests.Response:
            return self.s.request(method.upper(), self.base + path, timeout=30, **kw)
        return call
