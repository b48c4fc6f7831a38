"""What follows an attempt's failure: the spec's retry rules, decided once.

An attempt that fails ends with a *reason* (:data:`REASONS`) and, when a rank
exited, an exit code (a rank killed by signal N exits ``128 + N``, as the shim
records it). The spec's ``retry.rules`` are tried in order; the first rule
that matches names the action:

- ``retry``: a new attempt, counted against ``max_attempts``;
- ``retry_uncounted``: a new attempt that does not count, under the separate
  cap ``retry.max_uncounted_retries`` (past it, the retry counts, so nothing
  loops forever);
- ``fail``: no new attempt, whatever is left.

No rule matching, the defaults a platform team wants apply: an
infrastructure cause (:data:`INFRA`: the node lost, a preemption, the agent
lost) is ``retry_uncounted``; anything else (a rank that failed, a stall
restart, a time-out) is ``retry``. Either way a counted retry is made only
while counted attempts remain.

A rule matches when every criterion it gives matches: ``reasons`` (any of),
``exit_codes`` (any of), ``signals`` (any of, by name: ``SIGKILL`` is exit
code 137). Exit codes and signals match only an attempt a rank's own exit
ended (``rank_failed``, ``timeout`` when a rank exited before the stop).

Pure Python: the attempts service decides with :func:`decide` and records the
decision's :attr:`Decision.text` in the attempt's end event and its exit.
"""
from __future__ import annotations

import signal as _signal
from dataclasses import dataclass
from typing import Protocol

#: every reason an attempt ends with a failure: a rank's exit, its node's loss,
#: a stall restart (``on_stall: restart``), the attempt's time limit, the
#: causes the scheduler itself makes (a preemption; an agent that lost its
#: ranks), which rules may name before anything ends an attempt with them,
#: and a rendezvous port found held (no rank started)
REASONS = ("rank_failed", "node_lost", "stalled", "timeout", "preempted", "agent_lost",
           "port_in_use")
#: causes outside the job: retried without counting by default (``port_in_use``:
#: the attempt's rendezvous port was held on the node of rank 0, maybe by
#: another tenant's process; the next attempt draws another port)
INFRA = frozenset({"node_lost", "preempted", "agent_lost", "port_in_use"})
ACTIONS = ("retry", "retry_uncounted", "fail")
DEFAULT_MAX_UNCOUNTED = 10
MAX_RULES = 16
#: the signals a rule may name (Linux numbering): what a rank can die of
SIGNALS = tuple(s.name for s in sorted(_signal.Signals, key=lambda s: s.value)
                if s.name.startswith("SIG") and not s.name.startswith("SIG_")
                and 1 <= s.value <= 31)
#: the exit code of a rank killed by a signal (the shim's ``128 + N``)
SIGNAL_EXIT_BASE = 128


@dataclass(frozen=True)
class RetryRule:
    """One of a spec's ``retry.rules``: matches a failure when every
    criterion it gives matches (:func:`decide`)."""
    action: str
    reasons: tuple[str, ...] | None = None
    exit_codes: tuple[int, ...] | None = None
    signals: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RetrySpec:
    """A spec's ``retry`` (domain/spec.py)."""
    #: no rules of its own: the defaults above decide
    rules: tuple[RetryRule, ...] = ()
    max_uncounted_retries: int = DEFAULT_MAX_UNCOUNTED


class Policy(Protocol):
    """What :func:`decide` reads of a spec (domain/spec.py JobSpec)."""
    @property
    def retry(self) -> RetrySpec: ...
    @property
    def max_attempts(self) -> int: ...


def signal_exit_code(name: str) -> int:
    return SIGNAL_EXIT_BASE + _signal.Signals[name].value


def signal_of(exit_code: int | None) -> str | None:
    """The signal an exit code says the rank died of, or None."""
    if exit_code is None or not SIGNAL_EXIT_BASE < exit_code <= SIGNAL_EXIT_BASE + 31:
        return None
    try:
        return _signal.Signals(exit_code - SIGNAL_EXIT_BASE).name
    except ValueError:
        return None


@dataclass(frozen=True)
class Decision:
    #: "retry", "retry_uncounted" or "fail"; a retry refused (no counted
    #: attempt left) is "fail"
    action: str
    #: what a person reads: "node_lost: retried, not counted (uncounted retry 2 of 10)"
    text: str

    @property
    def retry(self) -> bool:
        return self.action != "fail"

    @property
    def counted(self) -> bool:
        return self.action == "retry"


def _matches(rule: RetryRule, reason: str, exit_code: int | None) -> bool:
    return (rule.reasons is None or reason in rule.reasons) \
        and (rule.exit_codes is None or exit_code in rule.exit_codes) \
        and (rule.signals is None or signal_of(exit_code) in rule.signals)


def _cause(exit_: dict) -> str:
    """'rank_failed (rank 3, exit code 137, SIGKILL)', 'preempted (node n1
    drained: bad ECC)': the end in a few words."""
    reason, rank, code = exit_.get("reason") or "rank_failed", exit_.get("rank"), \
        exit_.get("exit_code")
    bits = [f"rank {rank}"] if rank is not None else []
    if code is not None:
        sig = signal_of(code)
        bits.append(f"exit code {code}" + (f", {sig}" if sig else ""))
    if exit_.get("detail"):
        bits.append(exit_["detail"])
    return f"{reason} ({', '.join(bits)})" if bits else reason


def decide(spec: Policy, exit_: dict, *, attempt: int, uncounted: int) -> Decision:
    """What follows attempt number ``attempt`` of a job with spec ``spec``
    (defaults filled), ended as ``exit_`` says (``reason``, ``exit_code``,
    ``rank``), when ``uncounted`` of its earlier retries did not count."""
    cap, max_attempts = spec.retry.max_uncounted_retries, spec.max_attempts
    reason, code = exit_.get("reason") or "rank_failed", exit_.get("exit_code")
    cause = _cause(exit_)
    action, by = ("retry_uncounted" if reason in INFRA else "retry"), "default"
    for i, rule in enumerate(spec.retry.rules, 1):
        if _matches(rule, reason, code):
            action, by = rule.action, f"rule {i}"
            break
    if action == "fail":
        return Decision("fail", f"{cause}: not retried ({by} says fail)")
    if action == "retry_uncounted":
        if uncounted < cap:
            return Decision("retry_uncounted", f"{cause}: retried, not counted "
                                               f"(uncounted retry {uncounted + 1} of {cap})")
        note = f"all {cap} uncounted retries used, so it counts; "
    else:
        note = "" if by == "default" else f"{by}; "
    counted = attempt - uncounted  # this attempt included
    if counted < max_attempts:
        return Decision("retry", f"{cause}: retried ({note}counted attempt {counted} "
                                 f"of {max_attempts})")
    return Decision("fail", f"{cause}: not retried ({note}counted attempt {counted} of "
                            f"{max_attempts}, none left)")


def check_rules(rules: list[dict]) -> tuple[str, str] | None:
    """(field, message) of the first rule JSON Schema cannot judge: one with
    nothing to match on (it would match every failure: say so with
    ``reasons``)."""
    for i, rule in enumerate(rules):
        if not any(k in rule for k in ("reasons", "exit_codes", "signals")):
            return (f"retry.rules.{i}",
                    f"retry.rules.{i} must match on at least one of reasons, exit_codes, "
                    "signals")
    return None
