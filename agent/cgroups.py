"""A cgroup around every attempt's ranks on a node (issue 41, item 2).

A rank's processes are not only its process group: a daemon it starts may
leave the group and the session (``setsid``) and live on under the rank's
uid, or fork until the host has no pids left. A cgroup holds every process a
rank ever starts, whatever it does, and nothing else:

- **Made** by the agent (root) before the attempt's first rank starts here,
  ``<hierarchy>/gpujobs/<node>/<job_id>.<attempt>``, with the node's limits
  (``--job-pids-max``, ``--job-memory-max``): one job's fork bomb or leak
  stops at its own cgroup, not at the agent or the next job.
- **Joined** by each rank's shim, as root, before it starts the command
  (shim.py ``--cgroup``): the command and all it forks are born inside.
  The shims stay in it (they are few and small); they are spared when the
  cgroup's processes are killed, to write their ranks' exit files.
- **Emptied**: a stop's SIGKILL, and the end of the attempt here, freeze the
  cgroup (nothing forks meanwhile), SIGKILL every process in it but the
  shims, and thaw it, so the kills land. A uid goes back to the pool only
  once its attempt's cgroup is empty and removed (core.py). An agent that
  starts removes the empty ones no attempt of its state owns (an agent
  stopped mid-attempt, whose ranks someone else killed, left them).

cgroup v2 where the host mounts it with the ``pids`` controller at
``/sys/fs/cgroup``; otherwise v1's ``pids``, ``freezer`` and ``memory``
hierarchies, each with a directory of the same name (these machines have
v1). Without either, or not root, there are no cgroups: the agent says so
once, and the uid rules (uidpool.py) are the wall, as before.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

log = logging.getLogger("gpujobs.agent.cgroups")

ROOT = Path("/sys/fs/cgroup")
#: the v1 hierarchies a job's cgroup has a directory in: counting, freezing, memory
V1 = ("pids", "freezer", "memory")
#: a pids limit a training job's ranks and their threads stay far below
DEFAULT_PIDS_MAX = 32768
#: an empty job cgroup no attempt owns is a leftover once this old
LEFTOVER_AGE_S = 600.0


@dataclass(frozen=True)
class Limits:
    pids_max: int | None = DEFAULT_PIDS_MAX
    #: bytes; None: no limit
    memory_max: int | None = None


class JobCgroups:
    """The cgroups of one agent's attempts, under ``<hierarchy>/<base>``."""

    def __init__(self, base: str, *, v2: bool, root: Path = ROOT,
                 limits: Limits = Limits()) -> None:
        self.base, self.v2, self.root, self.limits = base, v2, root, limits

    @classmethod
    def detect(cls, base: str, root: Path = ROOT, limits: Limits = Limits()
               ) -> JobCgroups | None:
        """The host's cgroups, v2 first, when this process may make them; None
        (said once) otherwise."""
        if os.geteuid() != 0:
            return None
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "pids" in controllers.read_text().split():
            found = cls(base, v2=True, root=root, limits=limits)
        elif all((root / c).is_dir() for c in V1):
            found = cls(base, v2=False, root=root, limits=limits)
        else:
            log.warning("no cgroup v2 with pids, nor v1 pids, freezer and memory under %s: "
                        "jobs are not contained in cgroups", root)
            return None
        try:
            for d in found.bases():
                d.mkdir(parents=True, exist_ok=True)
            if found.v2:
                found._enable(root)
        except OSError as e:
            log.warning("cannot make the agent's cgroups under %s (%s): jobs are not "
                        "contained in cgroups", root, e)
            return None
        return found

    # -- paths ----------------------------------------------------------------
    def bases(self) -> list[Path]:
        return [self.root / self.base] if self.v2 else [self.root / c / self.base for c in V1]

    def dirs(self, name: str) -> list[Path]:
        """The job cgroup's directories: one (v2), or one a v1 hierarchy."""
        return [b / name for b in self.bases()]

    def _counting(self, name: str) -> Path:
        return self.dirs(name)[0]  # v2's one, or v1's pids

    def _freezing(self, name: str) -> tuple[Path, str, str]:
        if self.v2:
            return self.dirs(name)[0] / "cgroup.freeze", "1", "0"
        return self.dirs(name)[V1.index("freezer")] / "freezer.state", "FROZEN", "THAWED"

    # -- lifecycle -------------------------------------------------------------
    def make(self, name: str) -> list[str]:
        """Make the job's cgroup with the limits (there already: kept); its
        directories, for the shims to join. OSError when it cannot."""
        for d in self.dirs(name):
            d.mkdir(exist_ok=True)
        counting = self._counting(name)
        if self.limits.pids_max is not None:
            (counting / "pids.max").write_text(str(self.limits.pids_max))
        if self.limits.memory_max is not None:
            memory = counting / "memory.max" if self.v2 else \
                self.dirs(name)[V1.index("memory")] / "memory.limit_in_bytes"
            memory.write_text(str(self.limits.memory_max))
        return [str(d) for d in self.dirs(name)]

    def members(self, name: str) -> list[int]:
        """The pids in the job's cgroup (none when it is gone)."""
        try:
            text = (self._counting(name) / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return sorted(int(p) for p in text.split())

    def kill(self, name: str, spare: Iterable[int] = ()) -> list[int]:
        """Freeze the cgroup, SIGKILL every process in it but ``spare`` (the
        shims), thaw it; the pids signalled."""
        spared = set(spare)
        state, frozen, thawed = self._freezing(name)
        killed = []
        try:
            state.write_text(frozen)
        except FileNotFoundError:
            return []
        try:
            for pid in self.members(name):
                if pid in spared:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        finally:
            state.write_text(thawed)
        return killed

    def remove(self, name: str) -> bool:
        """Remove the job's cgroup once no process is left in it; True once
        it is gone."""
        if self.members(name):
            return False
        for d in self.dirs(name):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:  # EBUSY: a process joined meanwhile
                log.warning("cannot remove cgroup %s yet: %s", d, e)
                return False
        return True

    def remove_leftovers(self, keep: Iterable[str], now: float | None = None,
                         min_age_s: float = LEFTOVER_AGE_S) -> list[str]:
        """Remove the empty job cgroups here that no attempt of ``keep`` owns
        (an agent stopped mid-attempt, whose ranks were killed by someone
        else, left them) and that were made ``min_age_s`` or more before
        ``now``; the names removed. One with processes stays, and so does a
        young one (another agent of the same node name on this host, a test
        stack's, may have just made it for its ranks)."""
        kept, now = set(keep), time.time() if now is None else now
        names = {d.name for b in self.bases() if b.is_dir()
                 for d in b.iterdir() if d.is_dir() and not d.is_symlink()
                 and now - d.stat().st_mtime >= min_age_s}
        return sorted(n for n in names - kept if self.remove(n))

    def _enable(self, root: Path) -> None:
        """v2: the pids and memory controllers on from the root down to the
        agent's base, so its jobs' cgroups have them."""
        wanted = {"pids", "memory"} & set((root / "cgroup.controllers").read_text().split())
        parts = Path(self.base).parts
        for here in (root.joinpath(*parts[:n]) for n in range(len(parts) + 1)):
            control = here / "cgroup.subtree_control"
            for c in sorted(wanted - set(control.read_text().split())):
                control.write_text(f"+{c}")


def cgroup_name(job_id: str, attempt: int) -> str:
    return f"{job_id}.{attempt}"
