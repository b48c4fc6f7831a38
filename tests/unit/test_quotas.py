"""Per-tenant limits and fleet generations, as pure rules (issue 9)."""
import json
from datetime import timedelta

import pytest

from chalicelib.config import Config, ConfigError
from chalicelib.domain.clock import utcnow
from chalicelib.domain.fleet import Fleet, parked_partition
from chalicelib.domain.quotas import (
    DEFAULT_MAX_PENDING_JOBS,
    Limits,
    TenantLimits,
    gpu_limit_reason,
    pending_limit_detail,
)


def test_defaults_limit_pending_jobs_and_not_gpus():
    limits = TenantLimits.parse(None, None, None)
    assert limits.of("anyone") == Limits(DEFAULT_MAX_PENDING_JOBS, None)
    assert not limits.any_gpu_limit


def test_settings_and_per_tenant_overrides():
    limits = TenantLimits.parse("50", "16", json.dumps(
        {"big": {"max_pending_jobs": 500, "max_running_gpus": None},
         "small": {"max_running_gpus": 2}}))
    assert limits.of("someone") == Limits(50, 16)
    assert limits.of("big") == Limits(500, None), "null lifts the GPU limit"
    assert limits.of("small") == Limits(50, 2), "members not given fall back to the default"
    assert limits.any_gpu_limit


@pytest.mark.parametrize("pending,gpus,overrides,named", [
    ("-1", None, None, "GPUJOBS_TENANT_MAX_PENDING_JOBS"),
    ("ten", None, None, "GPUJOBS_TENANT_MAX_PENDING_JOBS"),
    (None, "1.5", None, "GPUJOBS_TENANT_MAX_RUNNING_GPUS"),
    (None, None, "{", "GPUJOBS_TENANT_LIMITS"),
    (None, None, "[]", "GPUJOBS_TENANT_LIMITS"),
    (None, None, '{"a": {"max_pending": 1}}', "GPUJOBS_TENANT_LIMITS['a']"),
    (None, None, '{"a": {"max_pending_jobs": null}}', "GPUJOBS_TENANT_LIMITS['a'].max_pending"),
    (None, None, '{"a": {"max_running_gpus": true}}', "GPUJOBS_TENANT_LIMITS['a'].max_running"),
    (None, None, '{"a": {"max_running_gpus": 2.5}}', "GPUJOBS_TENANT_LIMITS['a'].max_running"),
])
def test_a_bad_setting_is_refused_by_name(pending, gpus, overrides, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        TenantLimits.parse(pending, gpus, overrides)


def test_config_refuses_bad_limits_at_start(aws_env):
    with pytest.raises(ConfigError, match="GPUJOBS_TENANT_MAX_RUNNING_GPUS"):
        Config.from_env({**aws_env, "GPUJOBS_TENANT_MAX_RUNNING_GPUS": "-3"})
    assert Config.from_env({**aws_env, "GPUJOBS_TENANT_MAX_PENDING_JOBS": "7"}) \
        .tenant_limits.of("x").max_pending_jobs == 7


def test_the_gpu_limit_admits_up_to_the_limit_exactly():
    assert gpu_limit_reason(8, 8, 16) is None, "reaching the limit is allowed"
    assert gpu_limit_reason(0, 4, None) is None, "no limit"
    reason = gpu_limit_reason(9, 8, 16)
    assert reason is not None and "max_running_gpus" in reason and "16" in reason
    assert gpu_limit_reason(0, 17, 16) is not None, "a job bigger than the limit never starts"


def test_the_pending_limit_detail_names_the_limit():
    detail = pending_limit_detail("acme", 3)
    assert "max_pending_jobs" in detail and "3" in detail and "acme" in detail


def test_a_fleet_is_swept_when_its_generation_was_judged_and_the_change_settled():
    now = utcnow()
    assert not Fleet("h100").unswept, "a type never registered has nothing to sweep"
    changed = Fleet("h100", 8, 8, generation=3, swept_generation=2, changed_at=now)
    assert changed.unswept
    assert not changed.settled(now, 10.0)
    assert changed.settled(now + timedelta(seconds=10), 10.0)
    assert parked_partition(None) == "PARKED#*" and parked_partition("a100") == "PARKED#a100"
