"""Stall threshold from a false-positive budget (API.md, "The scan").

A healthy rank looks stalled in one scan when ``k`` heartbeats in a row are
missed, probability ``p**k`` if misses are independent. With ``ranks`` ranks
scanned ``scans_per_hour`` times an hour the expected false alarms per hour are
``ranks * scans_per_hour * p**k``; ``k`` is the smallest integer keeping that
within the budget, and ``threshold_s = k * interval_s``.
"""
from __future__ import annotations

import math


def threshold_k(ranks: int, scans_per_hour: float, miss_probability: float,
                budget_per_hour: float) -> int:
    if ranks < 1 or not 0 < scans_per_hour < math.inf or not 0 < budget_per_hour < math.inf:
        raise ValueError("ranks, scans_per_hour and budget must be positive and finite")
    if not 0 < miss_probability < 1:
        raise ValueError("miss_probability must lie strictly between 0 and 1")
    trials = ranks * scans_per_hour
    # first guess from logarithms, then settle float rounding with exact checks
    k = max(1, math.ceil(math.log(budget_per_hour / trials) / math.log(miss_probability)))
    while k > 1 and trials * miss_probability ** (k - 1) <= budget_per_hour:
        k -= 1
    while trials * miss_probability ** k > budget_per_hour:
        k += 1
    return k


def threshold_s(ranks: int, scans_per_hour: float, interval_s: float,
                miss_probability: float, budget_per_hour: float) -> float:
    return threshold_k(ranks, scans_per_hour, miss_probability, budget_per_hour) * interval_s
