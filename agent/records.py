"""A rank's log file, one record a line, as agent/shim.py writes it (the CRI
log format of kubelet and containerd)::

    2026-12-02T03:04:05.123456789Z stdout F the line, without its newline

:func:`parse` reads one line of such a file back; :func:`parse_file` all of
them (tests); :func:`agent_record` is how the agent itself writes a line
there (a rank that could not start). The time may have 0 to 9 fraction digits
(containerd trims trailing zeros); the shim always writes 9.
"""
from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass

from .shim import record

STREAMS = ("stdout", "stderr")
_RECORD_RE = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z "
                        rb"(stdout|stderr) ([FP]) ")


@dataclass(frozen=True)
class Record:
    time_ns: int
    stream: str      # "stdout" or "stderr"
    full: bool       # F: the end of a line; P: a piece of one
    content: bytes   # without the record's newline
    #: where the content starts in the line parsed (the length of the prefix)
    content_start: int

    @property
    def time_ms(self) -> int:
        return self.time_ns // 1_000_000


def parse(line: bytes) -> Record | None:
    """The record ``line`` holds (its newline, if any, dropped), or None when
    it is no record (something else than the shim wrote it)."""
    m = _RECORD_RE.match(line)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    fraction = m.group(7) or b""
    ns = int(fraction.ljust(9, b"0")) if fraction else 0
    content = line[m.end():]
    if content.endswith(b"\n"):
        content = content[:-1]
    return Record(seconds * 1_000_000_000 + ns, m.group(8).decode(), m.group(9) == b"F",
                  content, m.end())


def parse_file(data: bytes) -> list[Record]:
    """Every record of a log file's bytes; a line that is no record is an error."""
    out = []
    lines = data.split(b"\n")
    if lines.pop():
        raise ValueError(f"a last line without its newline: {lines[-1][:200]!r}")
    for line in lines:  # on newlines only: a record's content may hold a \r
        got = parse(line)
        if got is None:
            raise ValueError(f"not a record: {line[:200]!r}")
        out.append(got)
    return out


def lines_of(data: bytes, stream: str | None = None) -> list[str]:
    """The lines the records of ``data`` hold (P pieces joined to their F),
    decoded, of ``stream`` only when given (tests)."""
    out: list[str] = []
    pending: dict[str, bytes] = {}
    for r in parse_file(data):
        joined = pending.pop(r.stream, b"") + r.content
        if not r.full:
            pending[r.stream] = joined
        elif stream in (None, r.stream):
            out.append(joined.decode("utf-8", "replace"))
    return out


def agent_record(stream: str, text: str, time_ns: int | None = None) -> bytes:
    """A line of the agent's own in a rank's log file, as a full record."""
    return record(time.time_ns() if time_ns is None else time_ns, stream, True,
                  text.replace("\n", " ").encode("utf-8", "replace"))
