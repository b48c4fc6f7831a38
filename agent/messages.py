"""Inbox messages (API.md, "Nodes"), parsed and checked before anything acts on them.

The schema is the control plane's own, chalicelib/domain/wire.py (standard
library only, so importing it here pulls in nothing of AWS): the agent parses
with the same definitions the messages are built with.
"""
from __future__ import annotations

from chalicelib.domain.wire import (
    JOB_ID_RE,
    Cancel,
    Launch,
    MessageError,
    master_port,
    parse,
    parse_launch,
)

__all__ = ["JOB_ID_RE", "Cancel", "Launch", "MessageError", "master_port", "parse",
           "parse_launch"]
