"""Settings a running local stack takes without a restart, for the tests.

The tests of the node-loss timeout, the priority classes, the auto-cordon or
the scan period each need other values than ``make up``'s. They share one
stack per pytest worker and set what they need on it (tests/support/stacks.py
``Stack.settings``), instead of starting a stack process of their own.

Served only when the stack was started with ``GPUJOBS_LOCAL_SETTINGS_TOKEN``
(never by ``make up`` as a user runs it), on the stack's own loopback address,
to a request that carries that token as its bearer:

    PUT /_local/settings   {"GPUJOBS_NODE_DOWN_AFTER_S": "6", "GPUJOBS_SCAN_PERIOD_S": null}

A value replaces the variable; ``null`` puts back the stack's value at start.
The answer is every runtime setting's value now. A name outside
:data:`RUNTIME`, or a value the services' ``Config`` refuses, is a 400 and
changes nothing. The services are then built again from the new environment
(chalicelib/bootstrap.py builds them on first use), and the timers run at the
new scan period from their next start.
"""
from __future__ import annotations

import hmac
import os
import threading
from typing import Callable, Iterable, Mapping

#: what may change on a running stack: the names of chalicelib/config.py's
#: variables that tests vary, and the scan period the timers run at
RUNTIME = ("GPUJOBS_SCAN_PERIOD_S", "GPUJOBS_NODE_DOWN_AFTER_S", "GPUJOBS_AUTO_CORDON_FAILURES",
           "GPUJOBS_AUTO_CORDON_TENANTS", "GPUJOBS_AUTO_CORDON_WINDOW_S", "GPUJOBS_AUTO_CORDON_MAX_FRACTION",
           "GPUJOBS_PRIORITY_CLASSES", "GPUJOBS_PREEMPT_MIN_RUNTIME_S",
           "GPUJOBS_CANCEL_RESEND_AFTER_S", "GPUJOBS_TENANT_LIMITS",
           "GPUJOBS_TENANT_MAX_PENDING_JOBS", "GPUJOBS_TENANT_MAX_RUNNING_GPUS")
PATH = "/_local/settings"
TOKEN_ENV = "GPUJOBS_LOCAL_SETTINGS_TOKEN"


class SettingsError(ValueError):
    """The change names a setting that cannot change, or a value the services refuse."""


class Settings:
    """The runtime settings of one stack process: ``apply`` changes them in
    its environment, builds the services again and tells the timers."""

    def __init__(self, token: str, on_scan_period: Callable[[float], None]) -> None:
        self._token = token
        self._on_scan_period = on_scan_period
        self._initial = {name: os.environ.get(name) for name in RUNTIME}
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, on_scan_period: Callable[[float], None]) -> "Settings | None":
        token = os.environ.pop(TOKEN_ENV, "")
        return cls(token, on_scan_period) if token else None

    def allows(self, authorization: str | None) -> bool:
        return hmac.compare_digest((authorization or "").encode(),
                                   f"Bearer {self._token}".encode())

    def current(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in RUNTIME}

    def apply(self, changes: Mapping[str, object]) -> dict[str, str | None]:
        from chalicelib import bootstrap
        from chalicelib.config import Config, ConfigError

        unknown = sorted(set(changes) - set(RUNTIME))
        if unknown:
            raise SettingsError(f"not a runtime setting: {', '.join(unknown)} "
                                f"(these are: {', '.join(RUNTIME)})")
        bad = sorted(name for name, value in changes.items()
                     if value is not None and not isinstance(value, str))
        if bad:
            raise SettingsError(f"a setting's value is a string or null: {', '.join(bad)}")
        wanted = {name: self._initial[name] if value is None else str(value)
                  for name, value in changes.items()}
        with self._lock:
            env = dict(os.environ)
            _merge(env, wanted.items())
            period = env.get("GPUJOBS_SCAN_PERIOD_S") or ""
            try:
                if not 0 < float(period) < float("inf"):
                    raise ValueError
            except ValueError:
                raise SettingsError(f"GPUJOBS_SCAN_PERIOD_S must be a positive number of "
                                    f"seconds, got {period!r}") from None
            try:
                config = Config.from_env(env)
            except (ConfigError, ValueError) as e:
                raise SettingsError(str(e)) from None
            _merge(os.environ, wanted.items())
            bootstrap.install(None)  # the next call builds them from the new environment
            self._on_scan_period(config.scan_period_s)
            return self.current()


def _merge(env: dict | os._Environ, changes: Iterable[tuple[str, str | None]]) -> None:
    for name, value in changes:
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
