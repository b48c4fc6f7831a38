"""Job dependencies (``depends_on``): what each condition needs, what a
waiting job says, and when a dependency can no longer be met.

A dependency names a job that already exists (so no cycle can form) and a
condition on how it ends:

- ``succeeded``: it ends SUCCEEDED (Slurm's afterok);
- ``failed``: it ends without succeeding, FAILED or CANCELLED (afternotok);
- ``ended``: it ends at all (afterany).

A job waits (PENDING, out of the placement queue) while any dependency has
not ended; the moment one ends the wrong way the job ends FAILED with reason
``dependency_failed`` naming it, and so on down the chain. Pure: the
pipelines service (service/pipelines.py) applies these answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

from .states import JobState

#: how many jobs one job may depend on
MAX_DEPENDENCIES = 100
#: how many jobs may wait on one job (its dependents live on its item)
MAX_DEPENDENTS = 1000
CONDITIONS = ("succeeded", "failed", "ended")
DEFAULT_CONDITION = "succeeded"
#: the verb of a waiting job's pending_reason, by condition
_WAITING = {"succeeded": "succeed", "failed": "fail", "ended": "end"}
#: a reason an exit gives when a dependency can no longer be met
DEPENDENCY_FAILED = "dependency_failed"


@dataclass(frozen=True)
class Dependency:
    job_id: str
    condition: str = DEFAULT_CONDITION

    def met_by(self, state: JobState) -> bool | None:
        """True once ``state`` meets the condition, False once it never can,
        None while the job has not ended."""
        if not state.terminal:
            return None
        if self.condition == "ended":
            return True
        succeeded = state is JobState.SUCCEEDED
        return succeeded if self.condition == "succeeded" else not succeeded


class Depends(Protocol):
    """What these functions read of a spec (domain/spec.py JobSpec)."""
    @property
    def depends_on(self) -> tuple[Dependency, ...] | None: ...


def by_id(spec: Depends) -> dict[str, Dependency]:
    return {d.job_id: d for d in spec.depends_on or ()}


def waiting_reason(spec: Depends, waiting_for: Iterable[str]) -> str | None:
    """The pending_reason of a job waiting for ``waiting_for``, the first of
    them named: ``waiting for job_x to succeed (and 2 more)``."""
    waiting = list(waiting_for)
    if not waiting:
        return None
    first = by_id(spec).get(waiting[0], Dependency(waiting[0]))
    reason = f"waiting for {first.job_id} to {_WAITING[first.condition]}"
    if len(waiting) > 1:
        reason += f" (and {len(waiting) - 1} more)"
    return reason


@dataclass(frozen=True)
class Outcome:
    """What the dependencies' states say: ``failed`` names the dependency that
    can no longer be met (the job ends); else ``waiting_for`` lists those not
    ended yet, in the spec's order (empty: the job may be placed)."""
    waiting_for: tuple[str, ...] = ()
    failed: Dependency | None = None
    failed_state: JobState | None = None

    @property
    def ready(self) -> bool:
        return self.failed is None and not self.waiting_for


def judge(spec: Depends, states: Mapping[str, JobState],
          only: Iterable[str] | None = None) -> Outcome:
    """The outcome of the dependencies named in ``only`` (default: all of
    the spec's), each in the state ``states`` gives it (a job absent from
    ``states`` has not ended)."""
    deps = list(spec.depends_on or ())
    if only is not None:
        keep = set(only)
        deps = [d for d in deps if d.job_id in keep]
    waiting = []
    for dep in deps:
        state = states.get(dep.job_id, JobState.PENDING)
        met = dep.met_by(state)
        if met is False:
            return Outcome(failed=dep, failed_state=state)
        if met is None:
            waiting.append(dep.job_id)
    return Outcome(waiting_for=tuple(waiting))


def failed_exit(dep: Dependency, state: JobState) -> dict:
    """The exit of a job whose dependency ``dep`` ended in ``state``, which
    it could never meet."""
    need = {"succeeded": "it to succeed", "failed": "it to fail"}.get(dep.condition, "it")
    return {"reason": DEPENDENCY_FAILED, "exit_code": None, "dependency": dep.job_id,
            "detail": f"{dep.job_id} ended {state.value}; this job needed {need}"}
