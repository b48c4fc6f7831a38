"""Stall threshold from a false-positive budget (API.md, "The scan").

A healthy rank looks stalled in one scan when ``k`` heartbeats in a row are
missed, probability ``p**k`` if misses are independent. With ``ranks`` ranks
scanned ``scans_per_hour`` times an hour the expected false alarms per hour are
``ranks * scans_per_hour * p**k``; ``k`` is the smallest integer keeping that
within the budget, and ``threshold_s = k * interval_s``.
"""
from __future__ import annotations

import functools
import math

#: the accepted ranges (the job schema and docs/openapi.yaml say the same). Inside
#: them k stays below about 41,000 (65,536 ranks scanned every second, p = 0.999,
#: budget 1e-9), and finding it takes a fixed number of steps.
MISS_PROBABILITY_MIN, MISS_PROBABILITY_MAX = 1e-9, 0.999
BUDGET_MIN, BUDGET_MAX = 1e-9, 1e6
INTERVAL_S_MIN, INTERVAL_S_MAX = 0.01, 3600
STARTUP_GRACE_S_MAX = 86400
#: float rounding in the logarithms moves the first guess by less than this
_SETTLE_STEPS = 3


def threshold_k(ranks: int, scans_per_hour: float, miss_probability: float,
                budget_per_hour: float) -> int:
    if ranks < 1 or not 0 < scans_per_hour < math.inf or not 0 < budget_per_hour < math.inf:
        raise ValueError("ranks, scans_per_hour and budget must be positive and finite")
    if not MISS_PROBABILITY_MIN <= miss_probability <= MISS_PROBABILITY_MAX:
        raise ValueError(f"miss_probability must lie in [{MISS_PROBABILITY_MIN}, "
                         f"{MISS_PROBABILITY_MAX}]")
    if not BUDGET_MIN <= budget_per_hour <= BUDGET_MAX:
        raise ValueError(f"the budget must lie in [{BUDGET_MIN}, {BUDGET_MAX}]")
    trials = ranks * scans_per_hour
    # first guess from logarithms (never a division that underflows to 0), then
    # settle float rounding with exact checks: a bounded number of steps, O(1)
    guess = (math.log(budget_per_hour) - math.log(trials)) / math.log(miss_probability)
    k = max(1, math.ceil(guess))
    for _ in range(_SETTLE_STEPS):
        if k > 1 and trials * miss_probability ** (k - 1) <= budget_per_hour:
            k -= 1
    for _ in range(_SETTLE_STEPS):
        if trials * miss_probability ** k > budget_per_hour:
            k += 1
    return k


@functools.lru_cache(maxsize=1024)  # once per job created; jobs repeat a few settings
def threshold_s(ranks: int, scans_per_hour: float, interval_s: float,
                miss_probability: float, budget_per_hour: float) -> float:
    return threshold_k(ranks, scans_per_hour, miss_probability, budget_per_hour) * interval_s
