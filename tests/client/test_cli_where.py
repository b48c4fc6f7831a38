"""The CLI says what went wrong where the user can act on it (issue 47): no
local stack found, the stack down (or still starting), a folder outside the
checkout, a token the API does not know, each with its own message, its own
``-o json`` code and its documented exit code; and with ``-o json`` every
error, usage errors included, is the one JSON object on stderr, never the
usage text."""
from __future__ import annotations

import fcntl
import json
import socket

import pytest

from gpujobs_client.config import save_file

NOTHING_SET = {"GPUJOBS_STATE_DIR": None}


def checkout(root):
    """The bones of a gpujobs checkout (config.py ``_is_checkout``)."""
    (root / "devstack").mkdir(parents=True)
    (root / "devstack" / "__main__.py").write_text("")
    (root / "client" / "gpujobs_client").mkdir(parents=True)
    (root / "Makefile").write_text("")
    return root


def error_json(r) -> dict:
    """stderr as -o json promises it: one JSON object, nothing else; stdout empty."""
    assert r.stdout == "", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    out = json.loads(lines[0])
    assert set(out) == {"error", "exit_code"} and out["exit_code"] == r.exit_code
    return out["error"]


def no_usage_text(r) -> None:
    assert "Usage:" not in r.output and "Try 'gpujobs" not in r.output, r.output


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_outside_the_checkout_says_so_and_exits_2(run, fake, tmp_path, monkeypatch):
    """Invariant: with nothing configured, from a folder outside any
    checkout, the error names the folder and says the stack is found only
    from inside its checkout (exit 2, configuration), not "no API token"."""
    monkeypatch.chdir(tmp_path)
    r = run("list", url=False, token=False, env=NOTHING_SET)
    assert r.exit_code == 2
    no_usage_text(r)
    assert r.stderr.startswith(
        f"Error: No API configured, and no local stack to find from here: {tmp_path} is "
        "outside a gpujobs checkout")
    assert "Hint: run the command from inside the checkout" in r.stderr
    err = error_json(run("list", "-o", "json", url=False, token=False, env=NOTHING_SET))
    assert err["code"] == "outside_checkout" and str(tmp_path) in err["detail"]
    assert fake.requests == []


def test_a_checkout_where_no_stack_ever_ran_says_no_stack_found(run, fake, tmp_path,
                                                                 monkeypatch):
    """Invariant: inside a checkout without a state folder, the error is
    "No local stack found" naming the checkout and `make up` (exit 6: there
    is no API to reach), from any folder below its root."""
    root = checkout(tmp_path / "co")
    monkeypatch.chdir(root / "client")
    r = run("list", url=False, token=False, env=NOTHING_SET)
    assert r.exit_code == 6
    no_usage_text(r)
    assert r.stderr.startswith(f"Error: No local stack found: no `make up` has run in the "
                               f"checkout {root}")
    assert f"Hint: start one with `make up` at {root}" in r.stderr
    err = error_json(run("-o", "json", "list", url=False, token=False, env=NOTHING_SET))
    assert err["code"] == "no_stack"


def test_a_stopped_stack_says_the_stack_is_down(run, fake, tmp_path, monkeypatch):
    """Invariant: a checkout whose stack has run (its .gpujobs-local is
    there) but has no cli.toml and no process holding it: "The local stack
    is down" (exit 6), with the command that starts it again."""
    root = checkout(tmp_path / "co")
    (root / ".gpujobs-local").mkdir()
    (root / ".gpujobs-local" / "lock").write_text("")
    monkeypatch.chdir(root)
    r = run("list", url=False, token=False, env=NOTHING_SET)
    assert r.exit_code == 6
    no_usage_text(r)
    assert r.stderr.startswith(f"Error: The local stack is down: {root / '.gpujobs-local'} "
                               "has no cli.toml")
    assert f"start it again with `make up` at {root}" in r.stderr
    assert error_json(run("list", "-o", "json", url=False, token=False,
                          env=NOTHING_SET))["code"] == "stack_down"


def test_a_stack_that_holds_its_folder_but_is_not_ready_is_starting(run, fake, tmp_path,
                                                                     monkeypatch):
    """Invariant: the state folder's lock held by a process (a `make up`
    that has not written its address yet) reads "starting", not "down"."""
    root = checkout(tmp_path / "co")
    (root / ".gpujobs-local").mkdir()
    monkeypatch.chdir(root)
    with open(root / ".gpujobs-local" / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run("list", url=False, token=False, env=NOTHING_SET)
        j = run("list", "-o", "json", url=False, token=False, env=NOTHING_SET)
    assert r.exit_code == 6
    assert r.stderr.startswith("Error: The local stack is starting: a `make up` holds")
    assert 'Hint: wait for its line with "ready"' in r.stderr
    assert error_json(j)["code"] == "stack_starting"


def test_a_stack_file_left_behind_by_a_killed_stack_reads_stack_down(run, fake, tmp_path,
                                                                     monkeypatch):
    """Invariant: a cli.toml whose address answers nothing (kill -9 leaves
    it) is "The local stack is down" naming the address and the file (exit
    6), not a bare connection error."""
    root = checkout(tmp_path / "co")
    url = f"http://127.0.0.1:{closed_port()}"
    save_file(root / ".gpujobs-local" / "cli.toml", {"api_url": url, "token": "t1"})
    monkeypatch.chdir(root)
    r = run("list", "--retries", "0", url=False, token=False, env=NOTHING_SET)
    assert r.exit_code == 6
    assert r.stderr.startswith(f"Error: The local stack is down: nothing answers at {url}, the "
                               f"address in {root / '.gpujobs-local' / 'cli.toml'}")
    assert "kill -9" in r.stderr
    j = run("list", "--retries", "0", "-o", "json", url=False, token=False, env=NOTHING_SET)
    assert error_json(j)["code"] == "stack_down"


def test_a_token_the_api_does_not_know_names_where_it_came_from(run, fake, tmp_path):
    """Invariant: a 401 keeps exit 1 and the server's problem, and the hint
    says the token was refused by that API and where the token came from;
    when a running local stack has a token of its own, it says so."""
    r = run("list", env={"GPUJOBS_TOKEN": "bogus-token"})
    assert r.exit_code == 1
    assert r.stderr.splitlines()[0].startswith("Error: Unauthenticated (401 unauthenticated)")
    assert (f"Hint: the API at {fake.url} does not know the token from GPUJOBS_TOKEN (bogu…); "
            "pass one it knows") in r.stderr
    state = tmp_path / "state"
    save_file(state / "cli.toml", {"api_url": fake.url, "token": "t1"})
    r = run("list", env={"GPUJOBS_TOKEN": "bogus-token", "GPUJOBS_STATE_DIR": str(state)})
    assert r.exit_code == 1
    assert (f"the running local stack's own token is in {state / 'cli.toml'}: leave out "
            "GPUJOBS_TOKEN to use it") in r.stderr
    err = error_json(run("-o", "json", "list", env={"GPUJOBS_TOKEN": "bogus-token"}))
    assert err["code"] == "unauthenticated" and err["status"] == 401
    assert "does not know the token from GPUJOBS_TOKEN" in err["hint"]


def test_the_four_situations_have_four_codes(run, fake, tmp_path, monkeypatch):
    """Invariant: a script reading -o json tells the four apart by code."""
    codes = set()
    monkeypatch.chdir(tmp_path)
    codes.add(error_json(run("list", "-o", "json", url=False, token=False,
                             env=NOTHING_SET))["code"])
    root = checkout(tmp_path / "co")
    monkeypatch.chdir(root)
    codes.add(error_json(run("list", "-o", "json", url=False, token=False,
                             env=NOTHING_SET))["code"])
    (root / ".gpujobs-local").mkdir()
    codes.add(error_json(run("list", "-o", "json", url=False, token=False,
                             env=NOTHING_SET))["code"])
    codes.add(error_json(run("list", "-o", "json", env={"GPUJOBS_TOKEN": "x"}))["code"])
    assert codes == {"outside_checkout", "no_stack", "stack_down", "unauthenticated"}


def test_no_token_for_a_named_api_says_just_that(run, fake):
    """Invariant: with an API named (here GPUJOBS_API_URL) and no token, the
    error is the missing token for that API, and where its address came
    from: exit 2, no usage text, no request sent."""
    r = run("list", token=False)
    assert r.exit_code == 2
    no_usage_text(r)
    assert r.stderr.startswith(f"Error: No API token: nothing gives a token for {fake.url} "
                               "(from GPUJOBS_API_URL)")
    assert error_json(run("list", "-o", "json", token=False))["code"] == "no_token"
    assert fake.requests == []


@pytest.mark.parametrize("args, field", [
    (["-o", "json", "list", "--bogus"], None),
    (["list", "--state", "sleeping", "-o", "json"], "--state"),
    (["-o", "json", "frobnicate"], None),
    (["--output", "json", "--bogus"], None),
    (["submit", "--max-runtime", "0", "-o", "json", "--", "true"], "--max-runtime"),
    (["-o", "json", "submit", "--", "true"], None),
    (["-o", "json", "logs"], "JOB_ID"),
])
def test_with_json_output_a_usage_error_is_the_json_error(run, fake, args, field):
    """Invariant: with -o json anywhere before `--`, a usage error is
    {"error": {"code": "usage", ...}, "exit_code": 2} on stderr and nothing
    else (the flag in ``field`` when one is at fault); nothing is sent."""
    r = run(*args)
    assert r.exit_code == 2
    no_usage_text(r)
    err = error_json(r)
    assert err["code"] == "usage" and err["detail"]
    assert err.get("field") == field
    assert fake.requests == []
