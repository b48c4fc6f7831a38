"""What the CLI prints of text it did not write cannot drive the terminal:
rank output, job names, event reasons and stacks reach it with every escape
sequence but colour shown as text (^[ for ESC, as cat -v shows it); colour
only on a terminal or when asked; `gpujobs logs --raw` prints the rank's
bytes untouched. Run as a user runs it: in-process (click's CliRunner, piped),
and as a subprocess on a pipe and on a pseudo-terminal."""
from __future__ import annotations

import itertools
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.support.cli import CLIENT_DIR, cli_runner

_ids = itertools.count(1)

OSC52 = "copy \x1b]52;c;cm0gLXJmIH4K\x07 done"          # write the clipboard
TITLE = "title \x1b]0;owned\x1b\\ and \x1b]2;again\x07"    # set the window title, ST and BEL
CURSOR = "up \x1b[2A\x1b[2K\x1b[1;1H gone"                # cursor up, erase, home
COLOUR = "\x1b[31mred\x1b[0m and \x1b[1;38;5;208mbold orange"
C1 = "eight-bit \x9b2J csi \x9d0;t\x9c c1 \x90dcs\x9c"     # C1 CSI, OSC, ST, DCS
OTHER = "bell\x07 nul\x00 cr\r del\x7f bs\x08\ttab kept \x1bP1$r\x1b\\ \x1b_apc\x1b\\"
LINES = [OSC52, TITLE, CURSOR, COLOUR, C1, OTHER]


def shown(text: str) -> str:
    """What the CLI shows of ``text``: every control character but tab in
    caret notation (the notation client/README.md documents)."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch == "\t" or 0x20 <= o < 0x7f or o > 0x9f:
            out.append(ch)
        elif o == 0x7f:
            out.append("^?")
        elif o >= 0x80:
            out.append("M-^" + chr(o - 0x80 + 0x40))
        else:
            out.append("^" + chr(o + 0x40))
    return "".join(out)


def controls(text: str) -> set[str]:
    """The control characters in ``text`` a terminal could act on (all but
    tab and the newlines that end lines)."""
    return {ch for ch in text if (ord(ch) < 0x20 and ch not in "\t\n") or 0x7f <= ord(ch) <= 0x9f}


@pytest.fixture
def job(fake):
    job = fake.add_job(ranks=1, name="name \x1b]0;pwned\x07 \x1b[2J")
    fake.place(job["id"], ["n1"])
    fake.logs[job["id"]] = [
        {"rank": 0, "stream": "stdout", "time": f"2030-01-01T00:00:0{i}.000Z", "line": text,
         "id": f"e{next(_ids)}", "attempt": 1} for i, text in enumerate(LINES)]
    return job


def test_piped_logs_show_every_escape_sequence_as_text_and_drop_colour(run, job):
    """Invariant: piped, `gpujobs logs` writes no control character but tab
    and newline: OSC 52 (clipboard), OSC 0/2 (title), CSI cursor moves, C1
    controls, DCS/APC strings are shown in caret notation, colour is dropped."""
    r = run("logs", job["id"], "--rank", "0")
    assert r.exit_code == 0, r.output
    assert controls(r.stdout) == set(), repr(r.stdout)
    out = r.stdout.splitlines()
    assert out == ["copy ^[]52;c;cm0gLXJmIH4K^G done",
                   "title ^[]0;owned^[\\ and ^[]2;again^G",
                   "up ^[[2A^[[2K^[[1;1H gone",
                   "red and bold orange",
                   "eight-bit M-^[2J csi M-^]0;tM-^\\ c1 M-^PdcsM-^\\",
                   "bell^G nul^@ cr^M del^? bs^H\ttab kept ^[P1$r^[\\ ^[_apc^[\\"]
    assert out == [shown(x) for x in LINES[:3]] + ["red and bold orange"] + \
        [shown(x) for x in LINES[4:]]


def test_colour_is_kept_when_asked_and_nothing_else(run, job):
    """Invariant: --color always keeps SGR colour (and resets it at the end of
    the line) but still shows every other sequence as text."""
    r = run("logs", job["id"], "--rank", "0", "--color", "always")
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert out[3] == COLOUR + "\x1b[0m"
    assert out[0] == shown(OSC52) and out[2] == shown(CURSOR)
    assert controls("\n".join(out[:3] + out[4:])) == set()
    never = run("logs", job["id"], "--rank", "0", "--color", "never", env={"NO_COLOR": None})
    assert never.stdout.splitlines()[3] == "red and bold orange"


def test_raw_prints_the_ranks_bytes_untouched(run, job):
    """Invariant: --raw is the rank's output exactly, escape sequences and all."""
    r = run("logs", job["id"], "--rank", "0", "--raw")
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(f"{x}\n" for x in LINES)


def test_json_lines_hold_the_same_text_and_no_control_character(run, job):
    """Invariant: -o json prints the lines' exact text as JSON, in which no
    control character (C1 and DEL included) appears unescaped."""
    r = run("-o", "json", "logs", job["id"], "--rank", "0")
    assert r.exit_code == 0, r.output
    assert controls(r.stdout) == set(), repr(r.stdout)
    assert [json.loads(x)["line"] for x in r.stdout.splitlines()] == LINES


def test_describe_and_list_show_names_reasons_and_stacks_as_text(run, fake, job):
    """Invariant: job names, event reasons and stacks (rank-written text) in
    `describe`, `get` and `list` reach the terminal with no control sequence."""
    fake.events[job["id"]] = [
        {"type": "rank_stopped", "time": "2030-01-01T00:00:01.000Z", "attempt": 1,
         "reason": "stopped \x1b]52;c;aGk=\x07", "stacks": [
             {"rank": 0, "where": "train.py:1 in \x1b]0;t\x07f \x9b6n"}]}]
    for args in (("describe", job["id"]), ("get", job["id"]), ("list",)):
        r = run(*args)
        assert r.exit_code == 0, r.output
        assert controls(r.stdout) == set(), (args, repr(r.stdout))
        assert "name ^[]0;pwned^G ^[[2J" in r.stdout, args
    r = run("describe", job["id"])
    assert "stopped ^[]52;c;aGk=^G" in r.stdout and "in ^[]0;t^Gf M-^[6n" in r.stdout


# -- as a user runs it: a subprocess on a pipe, and on a terminal ---------------------------
def test_a_subprocess_on_a_pipe_drops_colour(fake, job, tmp_path):
    """Invariant: `gpujobs logs | less`: colour dropped and every other
    sequence shown as text, with NO_COLOR unset."""
    gpujobs = cli_runner(fake.url, tmp_path / "xdg")
    r = gpujobs("logs", job["id"], "--rank", "0", GPUJOBS_TOKEN="t1", NO_COLOR="")
    assert r.returncode == 0, r.stderr
    assert controls(r.stdout) == set(), repr(r.stdout)
    assert r.stdout.splitlines()[3] == "red and bold orange"


def on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    """``gpujobs ARGS`` with stdout and stderr on a pseudo-terminal; what it wrote."""
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpujobs_client.cli", *args],
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    finally:
        os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if p.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert p.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, b"".join(chunks)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


def test_on_a_terminal_colour_is_kept_and_nothing_else_and_raw_is_raw(fake, job, tmp_path):
    """Invariant: on a terminal (NO_COLOR unset) `gpujobs logs` keeps colour,
    shows the OSC 52, title and cursor sequences as text; --raw passes them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")
           and k != "NO_COLOR"}
    env.update({"GPUJOBS_API_URL": fake.url, "GPUJOBS_TOKEN": "t1", "TERM": "xterm",
                "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "GPUJOBS_STATE_DIR": str(tmp_path / "no-local-stack"),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(CLIENT_DIR), env.get("PYTHONPATH")) if p)})
    out = on_a_terminal(["logs", job["id"], "--rank", "0"], env).splitlines()
    assert out[3] == COLOUR + "\x1b[0m", "colour kept on a terminal"
    assert out[:3] == [shown(x) for x in LINES[:3]]
    assert controls("\n".join(out[:3] + out[4:])) == set(), out
    raw = on_a_terminal(["logs", job["id"], "--rank", "0", "--raw"], env)
    assert raw.splitlines()[:4] == LINES[:4]


def test_only_well_formed_sgr_counts_as_colour():
    """Invariant: colour is exactly ``ESC [`` digits, ``;`` and ``:`` then
    ``m``; CSI sequences ending in ``m`` with private parameters (xterm's
    modifyOtherKeys, ``ESC [ > 4 ; 2 m``), cut-off ones and the 8-bit CSI
    are shown as text even with colour on."""
    from gpujobs_client.term import clean

    assert clean("\x1b[38:2::255:0:0mx", colour=True) == "\x1b[38:2::255:0:0mx\x1b[0m"
    assert clean("\x1b[>4;2mx", colour=True) == "^[[>4;2mx"
    assert clean("\x1b[?25l\x1b[31", colour=True) == "^[[?25l^[[31"
    assert clean("\x9b31mx", colour=True) == "M-^[31mx"
    assert clean("two\nlines", newlines=True) == "two\nlines"
    assert clean("two\nlines") == "two^Jlines"
    plain = "plain text, tabs\tand unicode: é ✓"
    assert clean(plain) is plain
