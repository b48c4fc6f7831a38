"""A job's spec, typed: parsed and defaulted once, read by attribute.

The API's schema (api/schemas.py) has judged a body before it gets here:
:meth:`JobSpec.parse` trusts its shape and fills the defaults of API.md, the
one place they are filled. :meth:`JobSpec.to_json` gives back what is stored
and shown, "as submitted, defaults filled": a field nobody gave and that has
no default (``None`` here; no field of the schema takes null) is left out.
Parsing that JSON again gives the same spec. Pure: no AWS here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Mapping

from .arrays import INDEX_ENV, SIZE_ENV, ArraySpec
from .dependencies import DEFAULT_CONDITION, Dependency
from .retry import DEFAULT_MAX_UNCOUNTED, RetryRule, RetrySpec

DEFAULT_WARN_SIGNAL = "SIGUSR1"


@dataclass(frozen=True)
class HeartbeatSpec:
    """How the job's ranks are heard and judged (domain/threshold.py, stall.py)."""
    interval_s: float = 10
    false_positive_budget_per_hour: float = 0.001
    miss_probability: float = 0.01
    startup_grace_s: float = 120
    #: what the job is judged by (stall.MODES)
    mode: str = "auto"
    #: how long silence with I/O at a real rate (a checkpoint) is excused
    #: past the threshold
    max_busy_s: float = 900
    #: how long process evidence may show no CPU and no I/O in mode "process"
    idle_s: float = 300
    #: a rank whose slow_score stays below this across a sustained window is
    #: called slow (domain/straggler.py)
    slow_score: float = 0.7


@dataclass(frozen=True)
class JobSpec:
    command: tuple[str, ...]
    ranks: int
    name: str | None = None
    working_dir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpus_per_rank: int = 1
    gpu_type: str | None = None
    priority: int = 0
    priority_class: str | None = None
    max_attempts: int = 1
    retry: RetrySpec = RetrySpec()
    max_runtime_s: int | None = None
    warn_before_s: int | None = None
    #: the warning's signal; filled (SIGUSR1) only when a warning is asked for
    warn_signal: str | None = None
    max_pending_s: int | None = None
    checkpoint_dir: str | None = None
    heartbeat: HeartbeatSpec = HeartbeatSpec()
    on_stall: str = "report"
    depends_on: tuple[Dependency, ...] | None = None
    array: ArraySpec | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> JobSpec:
        """The spec of a body the schema accepted (or of a stored spec),
        defaults filled; ``body`` is left as it was (its hash is the key's)."""
        values = {k: _frozen(v) for k, v in body.items() if k not in _NESTED}
        if "warn_before_s" in body:
            values.setdefault("warn_signal", DEFAULT_WARN_SIGNAL)
        retry = body.get("retry") or {}
        deps = body.get("depends_on")
        array = body.get("array")
        return cls(
            **values,
            heartbeat=HeartbeatSpec(**body.get("heartbeat", {})),
            retry=RetrySpec(rules=tuple(RetryRule(**_flat(r)) for r in retry.get("rules", ())),
                            max_uncounted_retries=retry.get("max_uncounted_retries",
                                                            DEFAULT_MAX_UNCOUNTED)),
            depends_on=None if deps is None else tuple(
                Dependency(d["job_id"], d.get("condition", DEFAULT_CONDITION)) for d in deps),
            array=None if array is None else ArraySpec(**_flat(array)),
        )

    def to_json(self) -> dict[str, Any]:
        """As stored and shown: as submitted, defaults filled."""
        return _json(self)

    @property
    def gpus(self) -> int:
        """The GPUs the job holds while it runs."""
        return self.ranks * self.gpus_per_rank

    def child(self, index: int) -> JobSpec:
        """An array's index ``index``: this spec without ``array`` and
        ``depends_on`` (the parent waited for those), its env with the index,
        the size and each ``array.env`` value chosen for this index."""
        assert self.array is not None, "an array's spec"
        env = dict(self.env)
        for name, values in (self.array.env or {}).items():
            env[name] = values[index]
        env[INDEX_ENV] = str(index)
        env[SIZE_ENV] = str(self.array.size)
        return replace(self, array=None, depends_on=None, env=env)


#: the members parsed into types of their own
_NESTED = ("heartbeat", "retry", "depends_on", "array")


def _frozen(value: Any) -> Any:
    """A parsed JSON value with its lists as tuples (objects stay dicts, copied)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _flat(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _frozen(v) for k, v in obj.items()}


def _json(value: Any) -> Any:
    if is_dataclass(value):
        return {f.name: _json(v) for f in fields(value)
                if (v := getattr(value, f.name)) is not None}
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value
