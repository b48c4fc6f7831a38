"""Liveness from inside a training script: ``beat(step)`` once per step.

    from gpujobs_heartbeat import beat, pause

    for step in range(steps):
        train_step()
        beat(step)
    with pause("checkpoint", max_s=600):
        save_checkpoint()

It costs about a microsecond and makes no network call: it overwrites one small
record in the file named by GPUJOBS_HEARTBEAT_FILE (set by the host agent for
each rank), which the agent reads and posts every ``interval_s``. A rank whose
process is alive but stops calling ``beat`` goes silent; a declared pause does
not count as silence until ``max_s`` has passed. Outside the agent (no
variable set) both are no-ops, so a script runs unchanged anywhere.

The record is a seqlock: the sequence number is written before and after the
payload, and a reader that sees them differ reads again. Times are
CLOCK_MONOTONIC, shared by every process on the host, so the agent can tell how
much of a pause remains without trusting any wall clock.
"""
from __future__ import annotations

import contextlib
import os
import struct
import time
from typing import Iterator, NamedTuple

# seq, step, beat_ns, pause_deadline_ns, reason, seq
_FORMAT = struct.Struct("<QqQQ32sQ")
RECORD_SIZE = _FORMAT.size


class Record(NamedTuple):
    seq: int
    step: int
    beat_ns: int
    pause_deadline_ns: int
    pause_reason: str


class _Writer:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0
        self._step = 0
        self._pause = (0, b"")

    def write(self, step: int | None) -> None:
        self._seq += 1
        self._step = self._step + 1 if step is None else int(step)
        deadline, reason = self._pause
        os.pwrite(self._fd, _FORMAT.pack(self._seq, self._step, time.monotonic_ns(),
                                         deadline, reason, self._seq), 0)

    def set_pause(self, deadline_ns: int, reason: str) -> None:
        self._pause = (deadline_ns, reason.encode("utf-8")[:32])


_writer: _Writer | None = None
_checked = False


def _get() -> _Writer | None:
    global _writer, _checked
    if not _checked:
        _checked = True
        path = os.environ.get("GPUJOBS_HEARTBEAT_FILE")
        if path:
            _writer = _Writer(path)
    return _writer


def beat(step: int | None = None) -> None:
    """Say this rank is making progress (``step``: the training step, if known)."""
    w = _writer if _checked else _get()
    if w is not None:
        w.write(step)


@contextlib.contextmanager
def pause(reason: str, *, max_s: float) -> Iterator[None]:
    """A declared, bounded pause (a checkpoint, an evaluation): no beats are
    expected inside it, and silence counts only once ``max_s`` has passed."""
    w = _get()
    if w is None:
        yield
        return
    w.set_pause(time.monotonic_ns() + int(max_s * 1e9), reason)
    w.write(w._step)
    try:
        yield
    finally:
        w.set_pause(0, "")
        w.write(w._step)


def read(path: str) -> Record | None:
    """The agent's side: the rank's latest record, or None if it never beat."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        for _ in range(100):
            raw = os.pread(fd, RECORD_SIZE, 0)
            if len(raw) < RECORD_SIZE:
                return None
            seq, step, beat_ns, deadline, reason, seq_end = _FORMAT.unpack(raw)
            if seq == seq_end:
                return Record(seq, step, beat_ns, deadline,
                              reason.rstrip(b"\0").decode("utf-8", "replace"))
        return None
    finally:
        os.close(fd)
