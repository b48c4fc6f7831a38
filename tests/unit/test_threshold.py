"""threshold_s = k * interval_s, k the smallest integer within the budget."""
import math

import pytest
from hypothesis import given, strategies as st

from chalicelib.domain.threshold import threshold_k, threshold_s


@pytest.mark.parametrize("ranks, k", [(16, 3), (1024, 4)])
def test_worked_cases_from_the_issue(ranks, k):
    assert threshold_k(ranks, 60, 0.01, 0.001) == k


def test_threshold_is_k_intervals():
    assert threshold_s(16, 60, 10, 0.01, 0.001) == 30


def test_a_budget_met_exactly_is_within_it():
    # 4 * 1 * 0.5**2 == 1.0 exactly in floats -> k = 2, not 3
    assert threshold_k(4, 1, 0.5, 1.0) == 2


@given(ranks=st.integers(1, 100_000), sph=st.sampled_from([1, 12, 60, 720, 3600]),
       p=st.floats(1e-6, 0.999), budget=st.floats(1e-9, 1e3))
def test_k_is_the_smallest_integer_within_budget(ranks, sph, p, budget):
    k = threshold_k(ranks, sph, p, budget)
    assert k >= 1
    assert ranks * sph * p ** k <= budget
    if k > 1:
        assert ranks * sph * p ** (k - 1) > budget


@pytest.mark.parametrize("args", [(0, 60, 0.01, 1), (1, 60, 0, 1), (1, 60, 1, 1),
                                  (1, 60, 0.5, 0), (1, 0, 0.5, 1)])
def test_inputs_that_have_no_threshold_are_refused(args):
    with pytest.raises(ValueError):
        threshold_k(*args)


def test_a_huge_budget_still_gives_at_least_one_interval():
    assert threshold_k(1, 1, 0.5, 1e6) == 1  # 1e6: the largest budget accepted


def test_an_infinite_budget_is_refused():
    with pytest.raises(ValueError):
        threshold_k(1, 1, 0.5, math.inf)


# issue 9: input that turns arithmetic into a denial of service is refused
from chalicelib.domain import threshold as t  # noqa: E402


@given(ranks=st.integers(1, 65536), sph=st.sampled_from([1, 60, 720, 3600]),
       p=st.floats(t.MISS_PROBABILITY_MIN, t.MISS_PROBABILITY_MAX),
       budget=st.floats(t.BUDGET_MIN, t.BUDGET_MAX))
def test_inside_the_documented_ranges_k_is_exact_and_bounded(ranks, sph, p, budget):
    k = threshold_k(ranks, sph, p, budget)
    assert 1 <= k <= 41_000
    assert ranks * sph * p ** k <= budget
    if k > 1:
        assert ranks * sph * p ** (k - 1) > budget


def test_the_worst_corner_of_the_ranges_is_41_thousand_intervals_at_most():
    assert threshold_k(65536, 3600, t.MISS_PROBABILITY_MAX, t.BUDGET_MIN) < 41_000


@pytest.mark.parametrize("p, budget", [(0.9999999999999999, 1e-320), (0.5, 5e-324)])
def test_outside_them_it_refuses_at_once_instead_of_looping(p, budget):
    with pytest.raises(ValueError):
        threshold_k(1, 60, p, budget)
