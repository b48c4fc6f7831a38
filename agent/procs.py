"""Evidence from the host: what each rank's processes are doing.

Every interval the agent samples each rank's process group (the shim leads it
and the rank's command and children share it, see ranks.py): CPU time and bytes
read and written (``/proc/<pid>/stat``, ``/proc/<pid>/io``: ``rchar`` and
``wchar``, every read and write the processes made, to local disks, network
filesystems and pipes alike), the busiest process state, and, where a GPU and
its driver are present, GPU utilisation and memory through NVML (``pynvml``,
optional). It posts the rates over the last interval with the beats, so the
server can tell a silent rank writing a checkpoint (``busy``) from one that
hangs. The state posted is the rank's own: that of the shim's child (the
rank's command), since the shim itself always sleeps in ``wait`` and would
hide a SIGSTOPped rank's ``T``; the group's busiest state stands in only when
the shim has no child (the command ended or never started). With the state
goes the kernel function that child sleeps in (``wchan``, /proc/<pid>/wchan:
``futex_do_wait`` for a gloo wait, ``hrtimer_nanosleep`` for a sleep) when it
can be read, and :attr:`ProcSampler.own_pids` keeps the child's pid for
stacks.py. Rates come from this host's monotonic clock and need two samples; a
process that vanished between them takes its counts with it, so a rate never
goes below zero.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable, Hashable

from .stacks import read_wchan

log = logging.getLogger("gpujobs.agent.procs")

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: the busiest state of a group wins: running, then disk sleep, then the rest
_STATE_ORDER = {"R": 0, "D": 1, "S": 2, "I": 3, "T": 4, "t": 4, "Z": 5, "X": 6}


class _Nvml:
    """GPU utilisation and memory by pid, or nothing when NVML is absent."""

    def __init__(self, module=None) -> None:
        self._nv = module
        self._ok = module is not None
        self._tried = module is not None

    def _init(self) -> bool:
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # noqa: PLC0415 - optional
                pynvml.nvmlInit()
                self._nv, self._ok = pynvml, True
            except Exception:  # noqa: BLE001 - no library, no driver, no GPU: fine
                self._ok = False
        return self._ok

    def by_pid(self) -> dict[int, tuple[float, int]]:
        """pid -> (utilisation % of its busiest GPU, bytes of GPU memory it holds)."""
        if not self._init():
            return {}
        nv = self._nv
        out: dict[int, tuple[float, int]] = {}
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
                    u, m = out.get(p.pid, (0.0, 0))
                    out[p.pid] = (max(u, util), m + int(p.usedGpuMemory or 0))
        except Exception as e:  # noqa: BLE001 - a driver hiccup costs only the GPU fields
            log.debug("NVML sample failed: %s", e)
            return {}
        return out


def _read_stat(proc: Path, pid: str) -> tuple[int, str, int, int] | None:
    """(process group, state, utime + stime in ticks, parent pid)."""
    try:
        raw = (proc / pid / "stat").read_text()
    except (OSError, ValueError):
        return None
    f = raw[raw.rfind(")") + 2:].split()
    try:
        return int(f[2]), f[0], int(f[11]) + int(f[12]), int(f[1])
    except (IndexError, ValueError):
        return None


def _read_io(proc: Path, pid: str) -> tuple[int, int] | None:
    """(rchar + wchar, wchar), or None when not readable (another user's process)."""
    try:
        text = (proc / pid / "io").read_text()
    except (OSError, ValueError):
        return None
    total = written = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            total += int(value)
            if key == "wchar":
                written += int(value)
    return total, written


def own_processes(pgids, proc: Path = Path("/proc")) -> dict[int, int]:
    """``{pgid: pid}``: the rank's own command (the child of the group's
    leader, the shim) of each process group in ``pgids`` that has one."""
    wanted = set(pgids)
    out: dict[int, int] = {}
    if not wanted or not proc.is_dir():
        return out
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        st = _read_stat(proc, entry.name)
        if st is not None and st[0] in wanted and st[3] == st[0] and st[1] not in ("Z", "X"):
            out[st[0]] = int(entry.name)
    return out


class ProcSampler:
    def __init__(self, *, proc: Path = Path("/proc"),
                 monotonic_ns: Callable[[], int] = time.monotonic_ns, nvml=None) -> None:
        self._proc, self._mono = proc, monotonic_ns
        self._nvml = _Nvml(nvml)
        # key -> (ns, ticks, io bytes, bytes written)
        self._last: dict[Hashable, tuple[int, int, int, int]] = {}
        #: key -> pid of the rank's own command (the shim's child), as last sampled
        self.own_pids: dict[Hashable, int] = {}

    def sample(self, groups: dict[Hashable, int]) -> dict[Hashable, dict]:
        """Sample the process groups ``{key: pgid}``: ``{key: summary}`` for
        each key seen at least twice (a rate needs two samples)."""
        if not groups or not self._proc.is_dir():
            return {}
        wanted = set(groups.values())
        members: dict[int, list[tuple[str, str, int]]] = {g: [] for g in wanted}
        own: dict[int, tuple[str, int]] = {}  # pgid -> state, pid of the shim's child
        for entry in os.scandir(self._proc):
            if not entry.name.isdigit():
                continue
            st = _read_stat(self._proc, entry.name)
            if st is not None and st[0] in wanted and st[1] not in ("Z", "X"):
                members[st[0]].append((entry.name, st[1], st[2]))
                if st[3] == st[0]:
                    own[st[0]] = (st[1], int(entry.name))
        gpu = self._nvml.by_pid()
        now = self._mono()
        out = {}
        for key, pgid in groups.items():
            procs = members.get(pgid, [])
            child = own.get(pgid)
            if child is not None:
                self.own_pids[key] = child[1]
            else:
                self.own_pids.pop(key, None)
            ticks = sum(t for _, _, t in procs)
            ios = [_read_io(self._proc, pid) for pid, _, _ in procs]
            io = sum(i[0] for i in ios if i is not None)
            written = sum(i[1] for i in ios if i is not None)
            prev = self._last.get(key)
            self._last[key] = (now, ticks, io, written)
            if prev is None or now <= prev[0]:
                continue
            dt = (now - prev[0]) / 1e9
            summary = {
                "cpu": round(max(0, ticks - prev[1]) / CLK_TCK / dt, 3),
                "io_bps": round(max(0, io - prev[2]) / dt),
                # writes alone: a checkpoint writes, a data loader reads
                "write_bps": round(max(0, written - prev[3]) / dt),
                "state": child[0] if child else min((s for _, s, _ in procs),
                                              key=lambda s: _STATE_ORDER.get(s, 9), default="X"),
                "procs": len(procs),
            }
            wchan = read_wchan(child[1], self._proc) if child else None
            if wchan:
                summary["wchan"] = wchan
            held = [gpu[int(pid)] for pid, _, _ in procs if int(pid) in gpu]
            if held:
                summary["gpu_util"] = max(u for u, _ in held)
                summary["gpu_mem_b"] = sum(m for _, m in held)
            out[key] = summary
        return out

    def forget(self, keys) -> None:
        for key in list(keys):
            self._last.pop(key, None)
            self.own_pids.pop(key, None)

    def keys(self) -> list[Hashable]:
        return list(self._last)
