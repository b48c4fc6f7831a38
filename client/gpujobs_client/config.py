"""Where the API URL and the token come from.

Precedence, highest first: command-line flags (``--api-url``, ``--token``),
the environment (``GPUJOBS_API_URL``, ``GPUJOBS_TOKEN``), the config file
``$XDG_CONFIG_HOME/gpujobs/config.toml`` (``~/.config/gpujobs/config.toml``
when ``XDG_CONFIG_HOME`` is unset or not absolute), the local stack's file,
then the default ``http://127.0.0.1:8000`` (and no token). An empty value
counts as unset.

The local stack's file is the one a running ``make up`` writes, ``cli.toml``
in its state folder: ``$GPUJOBS_STATE_DIR`` when set, else the nearest
``.gpujobs-local/`` from the working directory up (anywhere in the
checkout). It holds the stack's address, whatever its ``PORT``, and a tenant
token of its tokens file, and is removed when the stack stops.

Both files are TOML with two string keys::

    api_url = "http://127.0.0.1:41234"
    token = "t1"

``gpujobs config set`` writes the config file with mode 0600, since it holds
a token; so does the stack its own.

When nothing names an API, :func:`local_stack` says where the local stack
stands from here, for the CLI's errors: running (its file is there),
starting (its process holds the state folder's lock, no file yet), down
(a state folder, no file, no process), none (a checkout where no stack has
run) or outside (no checkout from here up).
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import Mapping

from .errors import GpujobsError

DEFAULT_API_URL = "http://127.0.0.1:8000"
KEYS = ("api_url", "token")
LOCAL_STATE_DIR = ".gpujobs-local"
LOCAL_STACK_FILE = "cli.toml"
#: the file a running stack holds an flock on (devstack/__main__.py ``_lock``)
LOCAL_STACK_LOCK = "lock"
ENV_VARS = {"api_url": "GPUJOBS_API_URL", "token": "GPUJOBS_TOKEN"}


class ConfigError(GpujobsError):
    """The config file cannot be read or written, or a key is unknown."""


def config_dir(env: Mapping[str, str] | None = None) -> pathlib.Path:
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".config"
    return base / "gpujobs"


def state_dir(env: Mapping[str, str] | None = None) -> pathlib.Path:
    """Where the CLI keeps what it resumes from (``gpujobs events -f``'s
    cursors): ``$XDG_STATE_HOME/gpujobs`` (``~/.local/state/gpujobs``)."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_STATE_HOME", "")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else \
        pathlib.Path.home() / ".local" / "state"
    return base / "gpujobs"


def config_path(env: Mapping[str, str] | None = None) -> pathlib.Path:
    return config_dir(env) / "config.toml"


def local_stack_path(env: Mapping[str, str] | None = None,
                     cwd: str | os.PathLike | None = None) -> pathlib.Path | None:
    """The file a running local stack wrote for the CLI, or None."""
    env = os.environ if env is None else env
    state = env.get("GPUJOBS_STATE_DIR", "")
    if state:
        candidates = [pathlib.Path(state) / LOCAL_STACK_FILE]
    else:
        here = pathlib.Path(cwd or os.getcwd()).resolve()
        candidates = [d / LOCAL_STATE_DIR / LOCAL_STACK_FILE for d in (here, *here.parents)]
    return next((p for p in candidates if p.is_file()), None)


@dataclass(frozen=True)
class LocalStack:
    """Where the local stack stands, seen from a folder (:func:`local_stack`)."""

    state: str
    """``running``, ``starting``, ``down``, ``none`` or ``outside``."""
    checkout: pathlib.Path | None = None
    """The checkout found from the folder up (its root), if any."""
    state_dir: pathlib.Path | None = None
    """The state folder: ``$GPUJOBS_STATE_DIR`` or the checkout's ``.gpujobs-local``."""
    cwd: pathlib.Path | None = None

    @property
    def file(self) -> pathlib.Path | None:
        return None if self.state_dir is None else self.state_dir / LOCAL_STACK_FILE


def _is_checkout(folder: pathlib.Path) -> bool:
    """A gpujobs checkout's root: its Makefile beside devstack/ and client/."""
    return ((folder / "Makefile").is_file() and (folder / "devstack" / "__main__.py").is_file()
            and (folder / "client" / "gpujobs_client").is_dir())


def _locked(path: pathlib.Path) -> bool | None:
    """Whether a process holds an flock on ``path``, read from /proc/locks
    (never by taking the lock, which a starting stack would then find taken);
    None where that cannot be told."""
    try:
        inode = path.stat().st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF" (a blocked waiter: "->")
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue
        if parts[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def local_stack(env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike | None = None) -> LocalStack:
    """Where the local stack stands from ``cwd`` (the working directory)."""
    env = os.environ if env is None else env
    here = pathlib.Path(cwd or os.getcwd()).resolve()
    checkout = next((d for d in (here, *here.parents) if _is_checkout(d)), None)
    state = env.get("GPUJOBS_STATE_DIR", "")
    if state:
        state_dir: pathlib.Path | None = pathlib.Path(state)
    else:
        state_dir = next((d / LOCAL_STATE_DIR for d in (here, *here.parents)
                          if (d / LOCAL_STATE_DIR).is_dir()), None)
        if state_dir is not None and checkout is None:
            checkout = state_dir.parent
    if state_dir is None or not state_dir.is_dir():
        return LocalStack("none" if checkout is not None or state else "outside",
                          checkout, state_dir, here)
    if (state_dir / LOCAL_STACK_FILE).is_file():
        return LocalStack("running", checkout, state_dir, here)
    held = _locked(state_dir / LOCAL_STACK_LOCK)
    return LocalStack("starting" if held else "down", checkout, state_dir, here)


def load_file(path: pathlib.Path) -> dict[str, str]:
    """The file's known keys; ``{}`` when there is no file."""
    import tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    out: dict[str, str] = {}
    for key in KEYS:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"config file {path}: {key} must be a string")
        if value:
            out[key] = value
    return out


def save_file(path: pathlib.Path, values: Mapping[str, str]) -> None:
    """Write ``values`` (known keys only) atomically, readable by the owner only."""
    unknown = set(values) - set(KEYS)
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(sorted(unknown))}")
    lines = ["# gpujobs CLI configuration (gpujobs config set KEY VALUE)"]
    # A JSON string with ASCII escapes is a valid TOML basic string.
    lines += [f"{k} = {json.dumps(values[k])}" for k in KEYS if values.get(k)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise ConfigError(f"cannot write config file {path}: {e}") from e


@dataclass
class Resolved:
    api_url: str
    token: str | None
    path: pathlib.Path
    sources: dict[str, str] = field(default_factory=dict)
    """For each key: ``flag``, ``env``, ``file``, ``local stack`` or ``default``."""
    local_path: pathlib.Path | None = None
    """The local stack's file, when one was found."""


def resolve(api_url: str | None = None, token: str | None = None,
            env: Mapping[str, str] | None = None) -> Resolved:
    env = os.environ if env is None else env
    path = config_path(env)
    local = local_stack_path(env)
    flags = {"api_url": api_url, "token": token}
    files: list[tuple[str, dict[str, str]]] | None = None  # read only when needed
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        if flags[key]:
            values[key], sources[key] = flags[key], "flag"
            continue
        if env.get(ENV_VARS[key]):
            values[key], sources[key] = env[ENV_VARS[key]], "env"
            continue
        if files is None:
            files = [("file", load_file(path))]
            if local is not None:
                files.append(("local stack", load_file(local)))
        found = next(((where, vals[key]) for where, vals in files if vals.get(key)), None)
        if found:
            sources[key], values[key] = found
            continue
        values[key] = DEFAULT_API_URL if key == "api_url" else None
        sources[key] = "default"
    return Resolved(api_url=str(values["api_url"]).rstrip("/"), token=values["token"],
                    path=path, sources=sources, local_path=local)
