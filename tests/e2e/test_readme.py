"""The quickstarts run as written, and again: every shell block (and every
Python block) of README.md, client/README.md and agent/README.md is run
against the local stack, twice, and each command is checked to do what the
text says it does, both times, so the documentation cannot rot and a reader
can come back to it (issue 29: a fixed idempotency key or "the newest job"
broke the second run). No command names the stack's port: the CLI finds the
stack by itself.

How a README is run (these are the only liberties taken, all mechanical):

- Each README gets one bash, "the second terminal", at the repository's root;
  its blocks run in it one command at a time, in order, so variables and
  exports carry from block to block as they would for a reader. Its HOME and
  XDG_CONFIG_HOME are the test's own; no GPUJOBS_* or AWS_* variable is
  inherited.
- A line ``[VAR=value ...] make up`` is "the first terminal": instead of
  running make (which would install), the test starts the stack as `make up`
  does, ``python -m devstack`` with those variables, PORT=0 (any port: no
  command may depend on it) and a state folder of its own, which the
  terminal gets as GPUJOBS_STATE_DIR (for a reader it is the checkout's
  ``.gpujobs-local``). Identical lines share one stack.
- ``/tmp/`` becomes a directory of the test's own.
- The second run is a reader coming back: a new terminal, and each stack
  restarted (Ctrl-C, then its `make up` line again: same state, another
  port) when its `make up` line comes, unless it was restarted after that
  README's first run ended. Each run is a test of its own, in the order of
  RUNS: README.md's and client/README.md's first runs come before their
  second, so the stack they share is restarted once for both.
- A stack that no later line of the round names (this README's or a later
  run's of the same round) gets its Ctrl-C when the reader is done with it:
  at the next `make up` line, or at the README's end; it must exit 0, which
  is checked when its line comes again, or at the end.
- A command whose comment says ``until Ctrl-C`` runs as a process of its own
  (a third terminal) and must print a line with ``ready``; it gets SIGINT when
  its README is done and must exit 0.
- ``make test`` is not run: it is what runs this test.
- A Python block runs as ``python - <<'EOF'`` in the terminal.

Every command has an expectation in EXPECT (its exit status and what its
output must show), found by the longest key that starts it: a command with none
fails the test, so a new block cannot go unchecked (runs of spaces count as
one, so a key can take in the start of a comment to tell two alike apart).
"""
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
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import requests

from tests.support.stacks import ROOT, Stack, launch

pytestmark = pytest.mark.e2e

DEFAULT_PORT = ":8000"
MAKE_UP = re.compile(r"^((?:[A-Z_][A-Z0-9_]*=\S+\s+)*)make up\b")
EXPORT = re.compile(r"export GPUJOBS_API_URL=(\S+) GPUJOBS_TOKEN=(\S+)")
#: each README twice, in this order: README.md's and client/README.md's first
#: runs before their second (the stack they share is restarted once for both,
#: not once each), agent/README.md's last: its agent registers a node of its
#: own (node-1, 8 x a100) on that stack, which stays, DOWN once stopped, and a
#: README.md run after it reads "estimated start unknown" for $NEXT (the
#: queue's estimate counts that node's GPUs) where the text says "about 10 min"
RUNS = [(1, "README.md"), (1, "client/README.md"), (2, "README.md"), (2, "client/README.md"),
        (1, "agent/README.md"), (2, "agent/README.md")]


@dataclass
class Expect:
    rc: int = 0
    shows: tuple[str, ...] = ()          # regexes the output must match, in any order
    probe: str | None = None             # a command run after it ...
    probe_shows: str | None = None       # ... whose output must match this
    timeout: float = 90
    #: a read whose answer depends on how far a job just submitted has got
    #: (placed, finished): run again, as a reader would, until it shows
    #: what is expected or this many seconds passed
    again_s: float = 0


J = r"job_[0-9A-Z]{26}"
EXPECT: dict[str, Expect] = {
    # -- README.md -------------------------------------------------------------
    "echo '[{\"token\": \"t1\"": Expect(),
    ". .venv/bin/activate": Expect(probe="command -v gpujobs", probe_shows=r"/\.venv/bin/gpujobs"),
    "gpujobs config show": Expect(shows=(r"^api_url +http://127\.0\.0\.1:\d+ +\(local stack\)",
                                         r"^token +\S+ +\(local stack\)")),
    "JOB=$(gpujobs submit -q --ranks 2 --gpu-type h100 --name demo":
        Expect(probe="echo $JOB", probe_shows=rf"^{J}$"),
    "gpujobs watch $JOB": Expect(shows=(r"SUCCEEDED",)),
    "gpujobs logs $JOB -f": Expect(shows=(r"\[rank 0\] hello", r"\[rank 1\] hello")),
    "gpujobs describe $JOB": Expect(shows=(r"SUCCEEDED", r"local-\d", r"created", r"finished")),
    # client/README.md lists right after submitting: demo may not have run yet
    "gpujobs list": Expect(shows=(r"demo", r"SUCCEEDED"), again_s=30),
    "LONG=$(gpujobs submit -q --ranks 2 -- sleep 600)":
        Expect(probe="echo $LONG", probe_shows=rf"^{J}$"),
    "gpujobs ranks $LONG": Expect(shows=(r"RANK +NODE", r"local-\d"), again_s=30),
    # cancel --wait: CANCELLED is what was asked, so exit 0 (watch would say 9)
    "gpujobs cancel $LONG --wait": Expect(rc=0, shows=(r"CANCELLED",)),
    "gpujobs nodes": Expect(shows=(r"local-1", r"local-2", r"h100")),
    "BIG=$(gpujobs submit -q --ranks 2 --gpus-per-rank 8":
        Expect(probe="echo $BIG", probe_shows=rf"^{J}$"),
    "NEXT=$(gpujobs submit -q --ranks 1": Expect(probe="echo $NEXT", probe_shows=rf"^{J}$"),
    # a placement run orders it within a scan period (and BIG must be placed)
    "gpujobs describe $NEXT": Expect(shows=(
        r"in line +1st of 1 for GPUs of any type", rf"waiting for +{J} \(16 GPUs\)",
        r"estimated start +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(about (9|10) min, "
        rf"when {J} reaches its 10 min limit\)"), again_s=30),
    "gpujobs cancel $BIG --wait": Expect(shows=(r"CANCELLED",)),
    "gpujobs resubmit $JOB --with name=demo-again": Expect(
        shows=(rf"Submitted: {J}", rf"resubmitted from: {J}", r"demo-again")),
    "API=$(gpujobs config get api_url) TOKEN=$(gpujobs config get token)":
        Expect(probe="echo $API $TOKEN", probe_shows=r"^http://127\.0\.0\.1:\d+ t1$"),
    "KEY=$(python3 -c": Expect(probe="echo $KEY", probe_shows=r"^[0-9a-f-]{36}$"),
    "SPEC='{\"name\": \"llama-ft\"": Expect(),
    "JOB=$(curl -s -X POST $API/v1/jobs": Expect(probe="echo $JOB", probe_shows=rf"^{J}$"),
    # the retry replays the job just made, whatever the runs before made
    "curl -si -X POST $API/v1/jobs -H": Expect(
        shows=(r"^HTTP/1\.1 201", r"(?i)^idempotent-replayed: true", r'"name": ?"llama-ft"'),
        probe='curl -s $API/v1/jobs/$JOB -H "Authorization: Bearer $TOKEN" | jq -r .name',
        probe_shows=r"^llama-ft$"),
    "curl -s \"$API/v1/jobs?page_size=20\"": Expect(shows=(r'"jobs": ?\[', r"llama-ft")),
    "until curl -s $API/v1/jobs/$JOB ": Expect(),
    "curl -s \"$API/v1/jobs?state=RUNNING\"":
        Expect(shows=(r'"state": ?"RUNNING"', r"llama-ft")),
    "curl -s $API/v1/jobs/$JOB/logs": Expect(shows=(r'"lines": ?\[',)),
    "curl -s $API/v1/jobs/$JOB/events":
        Expect(shows=(r'"type": ?"created"', r'"type": ?"placed"', r'"type": ?"started"')),
    "curl -si -X POST $API/v1/jobs/$JOB/cancel":
        Expect(shows=(r"^HTTP/1\.1 202", r'"cancel_requested_at": ?"')),
    "JOB=$(gpujobs submit -q --file - <<'SPEC'": Expect(probe="echo $JOB", probe_shows=rf"^{J}$"),
    "gpujobs watch $JOB --timeout 20": Expect(rc=7, shows=(r"Verdict: rank 3 on local-\d", r"STALLED")),
    "gpujobs ranks $JOB # Verdict": Expect(shows=(r"Verdict: rank 3 on local-\d",
                                                  r"silence order \(evidence, not the verdict\): "
                                                  r"rank 3 silent longest\b")),
    "gpujobs cancel $JOB --wait": Expect(shows=(r"CANCELLED",)),
    # a pipeline: train fails on purpose, evaluate (--after) runs, export (--after-ok) cannot
    "PREP=$(gpujobs submit -q --ranks 1 --name prepare":
        Expect(probe="echo $PREP", probe_shows=rf"^{J}$"),
    "TRAIN=$(gpujobs submit -q --ranks 2 --name train --after-ok $PREP":
        Expect(probe="echo $TRAIN", probe_shows=rf"^{J}$"),
    "EVAL=$(gpujobs submit -q --ranks 1 --name evaluate --after $TRAIN":
        Expect(probe="echo $EVAL", probe_shows=rf"^{J}$"),
    "EXPORT=$(gpujobs submit -q --ranks 1 --name export --after-ok $TRAIN":
        Expect(probe="echo $EXPORT", probe_shows=rf"^{J}$"),
    # waiting, unless prepare and train were already done (a very fast machine)
    "gpujobs describe $EVAL": Expect(shows=(rf"^dependencies +{J} to end: (waiting|met)\b",
                                            r"^name +evaluate\b")),
    "gpujobs watch $EVAL": Expect(shows=(r"Job finished: SUCCEEDED",)),
    "gpujobs describe $EXPORT": Expect(shows=(
        r"^state +FAILED\b",
        rf"^exit +dependency_failed, {J} ended FAILED; this job needed it to succeed",
        rf"^dependencies +{J} to succeed: can no longer be met")),
    "gpujobs list --limit 4": Expect(shows=(r"export +FAILED", r"evaluate +SUCCEEDED",
                                            r"train +FAILED", r"prepare +SUCCEEDED")),
    # a sweep
    "SWEEP=$(gpujobs submit -q --ranks 1 --name sweep --array 0-5%2":
        Expect(probe="echo $SWEEP", probe_shows=rf"^{J}$"),
    "gpujobs watch $SWEEP": Expect(shows=(r"indexes 6: 6 succeeded",
                                          r"Job finished: SUCCEEDED")),
    "gpujobs list --parent $SWEEP": Expect(shows=(
        r"^ *INDEX +ID +NAME +STATE", *(rf"^ *{i} +{J} +sweep\[{i}\] +SUCCEEDED"
                                         for i in range(6)))),
    "gpujobs describe $SWEEP": Expect(shows=(
        r"^state +SUCCEEDED\b", r"^indexes +6: 6 succeeded\b",
        r"^array +6 indexes \(0-5\), at most 2 at once; env LR\b")),
    "CHILD=$(gpujobs list --parent $SWEEP -o json":
        Expect(probe="echo $CHILD", probe_shows=rf"^{J}$"),
    "gpujobs logs $CHILD -f": Expect(shows=(r"^\[rank 0\] index 3 of 6, lr 0\.003$",)),
    # -- client/README.md --------------------------------------------------------
    "gpujobs submit --ranks 2 --gpu-type h100 --name demo":
        Expect(shows=(rf"Submitted: {J} PENDING", r"idempotency key: ")),
    "JOB=$(gpujobs submit -q --ranks 2 --name slow":
        Expect(probe="echo $JOB", probe_shows=rf"^{J}$"),
    "gpujobs attempts $JOB": Expect(shows=(r"local-\d",)),
    "gpujobs watch $JOB --timeout 5": Expect(rc=7, shows=(r"RUNNING",)),
    "gpujobs ranks $JOB # every rank": Expect(shows=(r"local-\d",)),
    "gpujobs describe $JOB # spec, pending reason":
        Expect(shows=(r"RUNNING", r"local-\d", r"started")),
    "gpujobs logs $JOB --all-ranks": Expect(shows=(r"\[rank 0\] started", r"\[rank 1\] started")),
    "gpujobs cancel $JOB --reason": Expect(shows=(r"CANCELLED",)),
    "python - <<'EOF'": Expect(shows=(r"hello", r"SUCCEEDED", r"404 not_found")),
    # the tenant's feed and webhooks (issue 45)
    "gpujobs events --job $JOB": Expect(shows=(
        rf"^.*Z +{J} +job\.created +created$",
        rf"^.*Z +{J} +job\.state_changed +PENDING -> SCHEDULED \(attempt 1\)",
        rf"^.*Z +{J} +job\.state_changed +\w+ -> CANCELLED \(attempt 1\)")),
    "WH=$(gpujobs webhooks add http://127.0.0.1:9/gpujobs":
        Expect(probe="echo $WH", probe_shows=r"^wh_[0-9A-Z]{26}$"),
    "gpujobs webhooks list": Expect(shows=(r"^wh_\S+ +enabled +http://127\.0\.0\.1:9/gpujobs",)),
    "gpujobs webhooks test $WH": Expect(),
    "gpujobs webhooks deliveries $WH": Expect(shows=(r"evt_\S+ +attempt 1 +failed",),
                                              again_s=60),
    "gpujobs webhooks rm $WH": Expect(),
    "python - <<'EOF' # a receiver that verifies": Expect(shows=(
        r"^verified webhook\.test evt_\S+$", r"^delivered$")),
    # -- agent/README.md ---------------------------------------------------------
    "export AWS_ACCESS_KEY_ID=local": Expect(),
    "(umask 077; echo a1 > /tmp/gpujobs-agent-node-1.token)": Expect(),
    ".venv/bin/python -m agent --token-file": Expect(),  # until Ctrl-C: see below
    "JOB=$(gpujobs submit -q --ranks 1 --gpu-type a100":
        Expect(probe="echo $JOB", probe_shows=rf"^{J}$"),
    "gpujobs attempts $JOB # rank 0 on node-1": Expect(shows=(r"SUCCEEDED +node-1: 0",)),
    "gpujobs logs $JOB": Expect(shows=(r"hello from node-1",)),
}


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def commands(body: str) -> list[str]:
    """The block's commands: comment and blank lines dropped, a trailing
    backslash continues a command, a heredoc runs to its terminator, and a
    `$(...)` open at the end of a line runs to the line that closes it."""
    out, lines, i = [], body.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cmd = [line]
        while cmd[-1].rstrip().endswith("\\") and i < len(lines):
            cmd.append(lines[i])
            i += 1
        heredoc = re.search(r"<<-?'?(\w+)'?", "\n".join(cmd))
        if heredoc:
            while i < len(lines):
                cmd.append(lines[i])
                i += 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
            if cmd[0].count("$(") > cmd[0].count(")") and i < len(lines):
                cmd.append(lines[i])  # the closing `)`
                i += 1
        out.append("\n".join(cmd))
    return out


def expectation(cmd: str) -> Expect:
    flat = " ".join(cmd.split())  # keys are written with single spaces
    keys = [k for k in EXPECT if flat.startswith(k)]
    assert keys, f"no expectation for this README command; add one to EXPECT:\n{cmd}"
    return EXPECT[max(keys, key=len)]


class Terminal:
    """One bash fed commands one at a time; its state carries over."""

    def __init__(self, env: dict) -> None:
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout],
                         daemon=True).start()

    def run(self, cmd: str, timeout: float) -> tuple[int, str]:
        mark = f"@@done-{uuid.uuid4().hex}@@"
        # stdin is the script itself: a command reading stdin must not eat it
        self.proc.stdin.write(f"{{ {cmd}\n}} </dev/null\nprintf '\\n{mark} %s\\n' $?\n")
        self.proc.stdin.flush()
        out, deadline = [], time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"still running after {timeout:g}s:\n{cmd}\n"
                                     + "".join(out)) from None
            if line.startswith(mark):
                text = "".join(out)
                return int(line.split()[1]), text[:-1] if text.endswith("\n") else text
            out.append(line)

    def env(self) -> dict:
        _, text = self.run("env -0 | base64 -w0", 30)
        import base64
        pairs = base64.b64decode(text.strip()).split(b"\0")
        return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _start(tmp: pathlib.Path, env: dict) -> Stack:
    """`make up` as the README gives it: python -m devstack with the line's
    variables; the changes are PORT=0 and a state folder of the test's own
    (GPUJOBS_STATE_DIR: several stacks at once, none in the checkout's
    .gpujobs-local). 2 agents: make up's default."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "AWS_"))}

    def quiet(seen: list[str]) -> None:
        assert not _noise(seen), "before ready:\n" + "".join(seen)

    return launch({**base, **env, "PORT": "0", "GPUJOBS_STATE_DIR": str(tmp / "state")},
                  timeout=120, before_ready=quiet, start_new_session=True)


NOISE = re.compile(r'Traceback|"_aws"|"level": ?"INFO"| INFO ')


def _noise(lines: list[str]) -> list[str]:
    """What `make up` must not print unless run with -v: tracebacks, EMF metric
    records, INFO logs."""
    return [x for x in lines if NOISE.search(x)]


def _drained(q: "queue.Queue[str]") -> list[str]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def _stack_said(s: "Session") -> str:
    """For a failure message: what the stack printed meanwhile (its warnings:
    a scan that convicts nobody says why)."""
    printed = _drained(s.stack.lines) if s.stack else []
    return "\n--- the stack printed:\n" + "".join(printed[-40:]) if printed else ""


class Stacks:
    """Stacks by their `make up` line, each with a folder of its own; and the
    directory that stands for /tmp/ in every README."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.started: dict[str, Stack] = {}
        self.folders: dict[str, pathlib.Path] = {}
        #: Ctrl-C'd (:meth:`let_go`), not yet seen to exit; by when they must
        self.stopping: dict[str, tuple[Stack, float]] = {}
        #: an event count: when each stack last started, when each run ended
        self.clock = 0
        self.started_at: dict[str, int] = {}
        self.ended_at: dict[tuple[str, int], int] = {}
        self.ran: defaultdict[int, set[str]] = defaultdict(set)

    def get(self, key: str, env: dict, *, restart: bool = False) -> Stack:
        """The stack of this line; ``restart``: Ctrl-C it first (it must exit
        0) and run its line again, on the same state."""
        if restart:
            self.let_go(key)
        if key not in self.started:
            self.stop(key)  # Ctrl-C'd: it must have exited 0 before it starts again
            folder = self.folders.setdefault(key, self.tmp / f"stack-{len(self.folders)}")
            self.started[key] = _start(folder, env)
            self.clock += 1
            self.started_at[key] = self.clock
        return self.started[key]

    def let_go(self, key: str) -> None:
        """Ctrl-C the stack now, as a reader done with it; :meth:`stop` sees
        it exit."""
        if key in self.started:
            st = self.started.pop(key)
            st.proc.send_signal(signal.SIGINT)
            self.stopping[key] = (st, time.monotonic() + 60)

    def stop(self, key: str) -> None:
        """The Ctrl-C'd stack's exit, which must be 0."""
        if key in self.stopping:
            st, deadline = self.stopping.pop(key)
            code = _exited(st, deadline)
            assert code == 0, f"make up exited {code} on Ctrl-C"

    def state_dir(self, key: str) -> pathlib.Path:
        return self.folders[key] / "state"


def _exited(st: Stack, deadline: float) -> int:
    """The exit status of a stack sent SIGINT, killed at ``deadline``."""
    try:
        return st.proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        st.proc.kill()
        st.proc.wait()
        # what it printed last (its thread dump, when it hung) shows with the failure
        sys.stderr.write("".join(_drained(st.lines)))
        return st.proc.returncode


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    st = Stacks(tmp_path_factory.mktemp("readme-tmp"))
    try:
        yield st
    finally:
        for key in list(st.started):  # Ctrl-C all at once, then wait for each
            st.let_go(key)
        failed = []
        for key in list(st.stopping):
            try:
                st.stop(key)
            except AssertionError as e:
                failed.append(e)
        if failed:
            raise failed[0]


@dataclass
class Session:
    tmp: pathlib.Path
    shared_tmp: pathlib.Path
    terminal: Terminal
    where: str
    stack: Stack | None = None
    background: list = field(default_factory=list)


def _in_tmp(text: str, shared_tmp: pathlib.Path) -> str:
    return text.replace("/tmp/", f"{shared_tmp}/")


def _substitute(text: str, s: Session) -> str:
    return _in_tmp(text, s.shared_tmp)


def _line_env(assignments: str, shared_tmp: pathlib.Path) -> tuple[str, dict]:
    """A `make up` line's variables, and the key its stack is shared by."""
    env = dict(a.split("=", 1) for a in assignments.split())
    env = {k: _in_tmp(v, shared_tmp) for k, v in env.items()}
    return json.dumps(sorted(env.items())), env


def _commands_of(readme: str) -> list[str]:
    """The README's commands in order: each Python block as one."""
    out = []
    for lang, body in blocks((ROOT / readme).read_text()):
        if lang == "python":
            out.append(f"python - <<'EOF'\n{body}EOF")
        elif lang in ("sh", "bash", "shell", "console"):
            out.extend(commands(body))
    return out


def _first(cmd: str) -> str:
    return cmd.splitlines()[0].split("#")[0].strip()


def _lines_up(readme: str, shared_tmp: pathlib.Path) -> list[str]:
    """The stacks the README's `make up` lines name, in order."""
    ups = (MAKE_UP.match(_first(cmd)) for cmd in _commands_of(readme))
    return [_line_env(up.group(1), shared_tmp)[0] for up in ups if up]


def _run_background(cmd: str, s: Session) -> None:
    log = s.tmp / f"bg-{len(s.background)}.log"
    out = open(log, "w")
    proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", cmd], cwd=ROOT,
                            env=s.terminal.env(), stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    s.background.append((proc, log, cmd))
    deadline = time.monotonic() + 60
    while "ready" not in log.read_text():
        assert proc.poll() is None, f"{cmd}\nexited {proc.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"{cmd}\nnot ready:\n{log.read_text()}"
        time.sleep(0.2)


def _stop_background(s: Session, check: bool) -> None:
    for proc, log, cmd in s.background:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if check:
            text = log.read_text()
            assert proc.returncode == 0, f"{cmd}\nexited {proc.returncode}:\n{text}"
            assert "Traceback" not in text and "Unable to locate credentials" not in text, text


@pytest.mark.parametrize(("round_", "readme"), RUNS, ids=[f"run{r}-{m}" for r, m in RUNS])
def test_every_command_of_the_readme_runs_as_written(round_, readme, stacks, tmp_path):
    """One run of the README, in the order of RUNS. A second run selected
    without its first runs the first before it: it is always a reader coming
    back."""
    for earlier in range(1, round_ + 1):
        if earlier < round_ and readme in stacks.ran[earlier]:
            continue
        stacks.ran[earlier].add(readme)
        ran = _run_readme(readme, stacks, tmp_path / f"run-{earlier}", earlier)
        assert ran >= 5, f"{readme}: only {ran} commands found; are the blocks still ```sh?"


def _run_readme(readme: str, stacks: Stacks, tmp: pathlib.Path, round_: int) -> int:
    """Every command of ``readme`` in a new terminal; the commands run."""
    home = tmp / "home"
    (home / "xdg").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJOBS_", "AWS_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"), TERM="dumb",
               COLUMNS="200", NO_COLOR="1")
    s = Session(tmp, stacks.tmp, Terminal(env), f"{readme} (run {round_})")
    ups = _lines_up(readme, stacks.tmp)
    this = RUNS.index((round_, readme))
    later = {k for r, m in RUNS[this + 1:] if r == round_ for k in _lines_up(m, stacks.tmp)}
    ran = 0
    ok = False
    try:
        for cmd in _commands_of(readme):
            first = _first(cmd)
            if first == "make test":
                continue
            assert DEFAULT_PORT not in cmd, \
                f"{readme}: a command names the port; the CLI finds the stack:\n{cmd}"
            where = f"{s.where}: {cmd}"
            up = MAKE_UP.match(first)
            if up:
                key, line_env = _line_env(up.group(1), stacks.tmp)
                ups.pop(0)
                for other in list(stacks.started):  # done with: the reader's Ctrl-C
                    if other not in {key, *ups, *later} and not s.background:
                        stacks.let_go(other)
                s.stack = _make_up(key, line_env, s, stacks, readme, round_)
                ran += 1
                continue
            exp = expectation(cmd)
            real = _substitute(cmd, s)
            if "until Ctrl-C" in cmd:
                _run_background(real, s)
                ran += 1
                continue
            rc, out = s.terminal.run(real, exp.timeout)
            until = time.monotonic() + exp.again_s
            while rc == exp.rc and time.monotonic() < until and not all(
                    re.search(pattern, out, re.M) for pattern in exp.shows):
                rc, out = s.terminal.run(real, exp.timeout)
            where += f"\n--- exit {rc}, output:\n{out}"
            assert rc == exp.rc, where + _stack_said(s)
            for pattern in exp.shows:
                assert re.search(pattern, out, re.M), \
                    f"no /{pattern}/ in\n{where}" + _stack_said(s)
            if exp.probe:
                _, probed = s.terminal.run(exp.probe, 10)
                assert re.search(exp.probe_shows, probed, re.M), f"{exp.probe}: {probed}\n{where}"
            ran += 1
        for st in {id(x): x for x in [s.stack] if x}.values():
            printed = _drained(st.lines)
            assert not _noise(printed), "`make up` printed, unasked:\n" + "".join(printed)
        ok = True
    finally:
        s.terminal.close()
        _stop_background(s, check=ok)
        for other in list(stacks.started):
            if other not in later:
                stacks.let_go(other)
        stacks.clock += 1
        stacks.ended_at[(readme, round_)] = stacks.clock
    return ran


def _make_up(key: str, env: dict, s: Session, stacks: Stacks, readme: str,
             round_: int) -> Stack:
    """The line's stack, restarted in a second run unless it has (re)started
    since this README's first run ended; the terminal gets its state folder,
    where the CLI finds it, as a reader's CLI finds the checkout's
    .gpujobs-local."""
    before = stacks.ended_at.get((readme, round_ - 1))
    again = before is not None and stacks.started_at.get(key, 0) < before
    stack = stacks.get(key, env, restart=again)
    offered = EXPORT.search(stack.ready_line)
    assert offered, f"the ready line offers no export of the API URL and a token:\n" \
                    f"{stack.ready_line}"
    assert offered.group(1) == stack.api
    r = requests.get(stack.api + "/v1/jobs", timeout=30,
                     headers={"Authorization": f"Bearer {offered.group(2)}"})
    assert r.status_code == 200, f"the ready line's token is refused: {r.text}"
    state = stacks.state_dir(key)
    assert (state / "cli.toml").is_file(), "make up wrote no cli.toml for the CLI"
    rc, out = s.terminal.run(f"export GPUJOBS_STATE_DIR={state}", 10)
    assert rc == 0, out
    return stack
