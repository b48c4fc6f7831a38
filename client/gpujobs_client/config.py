"""Where the API URL and the token come from.

Precedence, highest first: command-line flags (``--api-url``, ``--token``),
the environment (``GPUJOBS_API_URL``, ``GPUJOBS_TOKEN``), the config file
``$XDG_CONFIG_HOME/gpujobs/config.toml`` (``~/.config/gpujobs/config.toml``
when ``XDG_CONFIG_HOME`` is unset or not absolute), then the default
``http://127.0.0.1:8000`` (and no token). An empty value counts as unset.

The file is TOML with two string keys::

    api_url = "http://127.0.0.1:8000"
    token = "t1"

``gpujobs config set`` writes it with mode 0600, since it holds a token.
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
ENV_VARS = {"api_url": "GPUJOBS_API_URL", "token": "GPUJOBS_TOKEN"}


class ConfigError(GpujobsError):
    """The config file cannot be read or written, or a key is unknown."""


def config_dir(env: Mapping[str, str] | None = None) -> pathlib.Path:
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME", "")
    base = pathlib.Path(xdg) if xdg and os.path.isabs(xdg) else pathlib.Path.home() / ".config"
    return base / "gpujobs"


def config_path(env: Mapping[str, str] | None = None) -> pathlib.Path:
    return config_dir(env) / "config.toml"


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
    """For each key: ``flag``, ``env``, ``file`` or ``default``."""


def resolve(api_url: str | None = None, token: str | None = None,
            env: Mapping[str, str] | None = None) -> Resolved:
    env = os.environ if env is None else env
    path = config_path(env)
    flags = {"api_url": api_url, "token": token}
    file_values: dict[str, str] | None = None
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for key in KEYS:
        if flags[key]:
            values[key], sources[key] = flags[key], "flag"
            continue
        if env.get(ENV_VARS[key]):
            values[key], sources[key] = env[ENV_VARS[key]], "env"
            continue
        if file_values is None:
            file_values = load_file(path)
        if file_values.get(key):
            values[key], sources[key] = file_values[key], "file"
            continue
        values[key] = DEFAULT_API_URL if key == "api_url" else None
        sources[key] = "default"
    return Resolved(api_url=str(values["api_url"]).rstrip("/"), token=values["token"],
                    path=path, sources=sources)
