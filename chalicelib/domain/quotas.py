"""Per-tenant limits (issue 9): how many jobs a tenant may have PENDING, and how
many GPUs its placed jobs may hold at once. Pure: no AWS here.

The pending limit is enforced at create, in the same DynamoDB transaction that
writes the job (a per-tenant counter conditioned on ``pending < limit``); the GPU
limit by the placer, which skips a tenant's job that would take it past its limit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

#: a tenant may have this many jobs PENDING unless configured otherwise; well
#: under the 5,000 PENDING jobs one placement run reads, so no single tenant can
#: fill a run's window on its own
DEFAULT_MAX_PENDING_JOBS = 1000
_KEYS = ("max_pending_jobs", "max_running_gpus", "guaranteed_gpus", "weight")
#: the key of guaranteed_gpus for jobs that name no GPU type
ANY_TYPE = "*"


def type_key(gpu_type: str | None) -> str:
    return gpu_type or ANY_TYPE


@dataclass(frozen=True)
class Limits:
    max_pending_jobs: int = DEFAULT_MAX_PENDING_JOBS
    #: None: no limit on GPUs held
    max_running_gpus: int | None = None
    #: GPU type ("*": jobs naming none) -> GPUs the tenant is guaranteed: it may
    #: borrow idle ones beyond, and reclaims its own by preemption
    guaranteed_gpus: Mapping[str, int] = field(default_factory=dict)
    #: its share in fair sharing between tenants (2: twice another's)
    weight: float = 1.0


@dataclass(frozen=True)
class TenantLimits:
    default: Limits = Limits()
    #: tenant -> its own limits (members not given fall back to ``default``)
    overrides: Mapping[str, Limits] = field(default_factory=dict)

    def of(self, tenant: str) -> Limits:
        return self.overrides.get(tenant, self.default)

    @property
    def any_gpu_limit(self) -> bool:
        return self.default.max_running_gpus is not None or any(
            o.max_running_gpus is not None for o in self.overrides.values())

    @classmethod
    def parse(cls, max_pending_jobs: str | None, max_running_gpus: str | None,
              overrides_json: str | None) -> "TenantLimits":
        """From the settings GPUJOBS_TENANT_MAX_PENDING_JOBS,
        GPUJOBS_TENANT_MAX_RUNNING_GPUS (empty: no limit) and GPUJOBS_TENANT_LIMITS
        (``{"acme": {"max_pending_jobs": 50, "max_running_gpus": 64}}``; ``null``
        for no GPU limit). Raises ValueError naming the bad setting."""
        default = Limits(
            _count("GPUJOBS_TENANT_MAX_PENDING_JOBS", max_pending_jobs,
                   DEFAULT_MAX_PENDING_JOBS),
            _count("GPUJOBS_TENANT_MAX_RUNNING_GPUS", max_running_gpus, None))
        overrides: dict[str, Limits] = {}
        if overrides_json:
            try:
                raw = json.loads(overrides_json)
            except ValueError as e:
                raise ValueError(f"GPUJOBS_TENANT_LIMITS is not JSON: {e}") from None
            if not isinstance(raw, dict):
                raise ValueError("GPUJOBS_TENANT_LIMITS maps tenant names to objects")
            for tenant, entry in raw.items():
                where = f"GPUJOBS_TENANT_LIMITS[{tenant!r}]"
                if not isinstance(entry, dict) or set(entry) - set(_KEYS):
                    raise ValueError(f"{where} is an object with members {', '.join(_KEYS)}")
                pending = entry.get("max_pending_jobs", default.max_pending_jobs)
                gpus = entry.get("max_running_gpus", default.max_running_gpus)
                overrides[tenant] = Limits(
                    _count(f"{where}.max_pending_jobs", pending, None, allow_none=False),
                    _count(f"{where}.max_running_gpus", gpus, None),
                    _guarantees(f"{where}.guaranteed_gpus", entry.get("guaranteed_gpus")),
                    _weight(f"{where}.weight", entry.get("weight", 1)))
        return cls(default, overrides)


def _guarantees(name: str, value) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ValueError(f"{name} maps GPU types (\"*\": any) to GPUs")
    return {k: _count(f"{name}[{k!r}]", v, None, allow_none=False) for k, v in value.items()}


def _weight(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1000:
        raise ValueError(f"{name} must be a number above 0, at most 1000")
    return float(value)


def _count(name: str, value, default, *, allow_none: bool = True):
    if value is None or value == "":
        if default is None and not allow_none:
            raise ValueError(f"{name} must be a whole number >= 0")
        return default
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{name} must be a whole number >= 0")
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number >= 0") from None
    if n < 0:
        raise ValueError(f"{name} must be a whole number >= 0")
    return n


def gpu_limit_reason(held: int, demand: int, limit: int | None) -> str | None:
    """Why placing a job of ``demand`` GPUs would take its tenant, holding ``held``,
    past its limit; None when it would not (or there is no limit)."""
    if limit is None or held + demand <= limit:
        return None
    return (f"tenant at its GPU limit: holds {held} of {limit} GPUs "
            f"(max_running_gpus); this job needs {demand} more")


def pending_limit_detail(tenant: str, limit: int, weight: int = 1) -> str:
    if weight > 1:  # an array counts as its size
        return (f"an array of {weight} indexes counts as {weight} PENDING jobs, which would "
                f"take tenant {tenant} over its limit (max_pending_jobs = {limit}); cancel "
                "some jobs, wait for them to start, or submit a smaller array")
    return (f"tenant {tenant} already has {limit} jobs PENDING, its limit "
            f"(max_pending_jobs = {limit}); cancel some or wait for them to start")


#: no per-tenant limit beyond the defaults
NO_LIMITS = TenantLimits()
