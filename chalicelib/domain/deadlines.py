"""A job's time limits: ``max_runtime_s`` per attempt, ``max_pending_s`` per wait.

Who enforces each, so that either holds when one side fails:

- **The attempt's runtime** is enforced by the agents holding its ranks, on
  their own clock from the launch: ``warn_before_s`` ahead of the limit every
  rank gets ``warn_signal`` (checkpoint now), at the limit SIGTERM, the grace
  period, SIGKILL; the agent reports TIMED_OUT at once, so the control plane
  ends the attempt (reason ``timeout``) and stops its ranks on every node.
  A scheduled scan that runs late changes nothing. If the agent is cut off or
  does not enforce it (an older agent), the stall scan ends the attempt
  itself :data:`BACKSTOP_S` after the limit, counted on the collector's clock
  from the attempt's start, and its CANCEL stops the ranks when the agent
  hears again.
- **The wait** is enforced by the control plane alone (nothing runs yet): the
  placer never places a job past its deadline, however late it runs, and
  ends it (reason ``pending_timeout``, its last ``pending_reason`` kept) the
  next time it looks.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import JobSpec

#: how long after an attempt's limit the control plane ends it itself: past
#: the agent's grace period (10 s by default) and its report's way in
BACKSTOP_S = 60.0
PENDING_TIMEOUT = "pending_timeout"


def _past(limit_s: float | None, since: datetime | None, now: datetime,
          slack_s: float = 0.0) -> bool:
    """Is ``now`` strictly past ``since`` + ``limit_s`` (+ ``slack_s``)? No
    limit, or no start: never."""
    return limit_s is not None and since is not None \
        and now > since + timedelta(seconds=limit_s + slack_s)


def past_runtime_backstop(spec: JobSpec, started_at: datetime | None, now: datetime) -> bool:
    """Is the attempt so far past its limit that its agents cannot be enforcing it?"""
    return _past(spec.max_runtime_s, started_at, now, BACKSTOP_S)


def pending_expired(spec: JobSpec, pending_since: datetime | None, now: datetime) -> bool:
    """Has the job waited longer than its ``max_pending_s`` (strictly)?"""
    return _past(spec.max_pending_s, pending_since, now)


def pending_exit(spec: JobSpec, pending_reason: str | None) -> dict:
    """The exit of a job that waited too long: its limit, and why it waited."""
    waited = spec.max_pending_s
    why = pending_reason or "not placed yet"
    return {"reason": PENDING_TIMEOUT, "exit_code": None,
            "decision": f"waited longer than max_pending_s ({waited} s): {why}"}


#: how an attempt over its max_runtime_s ends (its retry decision is added)
TIMEOUT_EXIT = {"reason": "timeout", "exit_code": None}
