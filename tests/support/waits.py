"""Waiting in tests: one polling loop (:func:`wait_until`) and a wrapper that
reads better where the steps name their question first (:func:`poll`)."""
from __future__ import annotations

import time
from typing import Callable


def wait_until(condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition"):
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def poll(what: str, fn: Callable[[], object], timeout: float = 90, interval: float = 0.2):
    """:func:`wait_until` with the question first, as the end-to-end steps read."""
    return wait_until(fn, timeout, interval, what)
