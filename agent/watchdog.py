"""Noticing an agent whose loops stopped moving.

The runner's main loop alone acts on the agent's state (runner.py): it hands
on inbox messages and ticks (rank exits, grace periods, reports). Its beat
loop posts the ranks' beats and calls in (``PUT /v1/nodes/{id}``, the node's
heartbeat), and stops doing both once the main loop has made no pass for
``MAIN_LOOP_GONE_S``. If a step of the main loop blocks (before rankfiles.py,
a rank that put a FIFO where its heartbeat file was made the loop wait for
ever in ``open``; a disk that hangs an fsync; a bug), the node so stops
calling in, goes DOWN, and nothing on it is launched, cancelled or stopped any
more. A blocked step of the beat loop (a post that waits out its timeout)
holds back beats and call-ins, never the main loop.

Each loop has a watchdog, a thread of its own, that makes it visible: a WARNING once the loop
has not completed a pass for ``stall_s`` (``--watchdog-s``), naming the step it
is in and for how long, the rank file it is opening if it is in one
(rankfiles.py), and the innermost frames of its stack; repeated every
``stall_s`` while it lasts, and an INFO once the loop moves again.

It does not call in for the stuck loop. A node whose main loop is stuck cannot
act on anything the server sends; calling in (or posting beats, which also
show the node alive) from elsewhere would keep it READY, so jobs would still
be placed on it and their LAUNCH never read, and cancels never done. DOWN is the truth: the server fails (or re-queues) its attempts
and places nothing there, and once the loop moves again its next call-in
stops every rank the server no longer counts (core.py, "Ranks never outlive
their attempt").
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from pathlib import PurePath
from typing import Callable

from . import rankfiles

log = logging.getLogger("gpujobs.agent.watchdog")

#: the default of ``--watchdog-s``: well over a slow pass (an API call may take
#: its 10 s timeout, stacks before a kill 3 s), well under the 60 s after
#: which a silent node is DOWN
STALL_S = 30.0
FRAMES = 4
#: what a stuck main loop costs, and a stuck beat loop (runner.py)
MAIN_STAKES = ("Nothing is launched, cancelled, stopped or reported meanwhile, and the "
               "node goes DOWN if it lasts (its beat loop stops calling in)")
BEAT_STAKES = ("No beat is posted and the node does not call in meanwhile: its jobs "
               "look stalled, and the node goes DOWN if it lasts")


class Watchdog:
    """Watches the loop of the thread that creates it (or ``thread_id``): the
    loop calls :meth:`step` as it starts each step and :meth:`passed` at the
    end of each pass; :meth:`check` (the watchdog thread's, every
    ``stall_s / 4`` at most one second) warns when a pass takes too long."""

    def __init__(self, stall_s: float = STALL_S, *, thread_id: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 loop: str = "main loop", stakes: str = MAIN_STAKES) -> None:
        self.stall_s = stall_s
        #: which loop it watches, and what its being stuck costs (in its warning)
        self.loop, self.stakes = loop, stakes
        self._clock = clock
        self._thread_id = threading.get_ident() if thread_id is None else thread_id
        now = clock()
        self._step = ("starting", now)  # what the loop does, since when
        self._passed = now               # the end of its last completed pass
        self._stuck_since: float | None = None  # its last pass's end, once warned
        self._warned_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- the loop's side

    def step(self, what: str) -> None:
        self._step = (what, self._clock())

    def passed(self) -> None:
        self._passed = self._clock()

    # ---------------------------------------------------------------- the watchdog's side

    def check(self) -> str | None:
        """One look: the warning it logged, if any."""
        now, passed = self._clock(), self._passed
        if self._stuck_since is not None and passed > self._stuck_since:
            log.info("the agent's %s moves again, after about %.1fs without a pass",
                     self.loop, passed - self._stuck_since)
            self._stuck_since = None
        late = now - passed
        if late < self.stall_s or (self._stuck_since is not None
                                   and now - self._warned_at < self.stall_s):
            return None
        what, since = self._step
        opening = rankfiles.opening(self._thread_id)
        message = (f"the agent's {self.loop} has not completed a pass for {late:.1f}s: "
                   f"{what} for {now - since:.1f}s"
                   + (f", opening {opening}" if opening else "")
                   + f"; at {self._where()}. {self.stakes}")
        log.warning("%s", message)
        if self._stuck_since is None:
            self._stuck_since = passed
        self._warned_at = now
        return message

    def _where(self) -> str:
        """The innermost frames of the loop's thread, innermost first."""
        frame = sys._current_frames().get(self._thread_id)
        if frame is None:
            return "?"
        frames = traceback.extract_stack(frame)[-FRAMES:]
        return " < ".join(f"{f.name} ({'/'.join(PurePath(f.filename).parts[-2:])}:{f.lineno})"
                          for f in reversed(frames))

    def start(self) -> "Watchdog":
        def run() -> None:
            while not self._stop.wait(min(1.0, self.stall_s / 4)):
                try:
                    self.check()
                except Exception:  # noqa: BLE001 - a watchdog never takes the agent down
                    log.exception("the watchdog's check failed")
        self._thread = threading.Thread(target=run, name="watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
