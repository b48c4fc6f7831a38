"""Ports for the tests: the OS's, never one derived from an id (a job id's
fixed port is the same in both pytest workers, and anything on the host may
hold it)."""
from __future__ import annotations

import socket


def free_port(host: str = "0.0.0.0") -> int:
    """A port free on ``host`` now, as the OS hands one out."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
