"""The straggler rule (domain/straggler.py), time injected scan by scan."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import given, settings, strategies as st

from chalicelib.domain import straggler
from chalicelib.domain.straggler import Sample, judge, scores, sentence

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)
PERIOD = 30.0


def _samples(times: dict[int, float | None], paused: set[int] = frozenset()) -> list[Sample]:
    return [Sample(r, f"node-{r // 2}", t, counts=r not in paused) for r, t in times.items()]


def _run(scans: list[dict[int, float | None]], *, paused_at: dict[int, set[int]] | None = None,
         state=None, attempt=1, start=0):
    """Each scan's judgement, PERIOD apart."""
    out = []
    for i, times in enumerate(scans):
        j = judge(state, _samples(times, (paused_at or {}).get(i, set())),
                  now=T0 + timedelta(seconds=(start + i) * PERIOD), attempt=attempt)
        state = j.state
        out.append(j)
    return out


def test_scores_are_the_fastest_over_each_and_none_when_unknown():
    assert scores({0: 0.5, 1: 1.2, 2: None, 3: 0.5}) == {0: 1.0, 1: 0.417, 2: None, 3: 1.0}
    assert scores({0: None}) == {0: None}
    assert scores({0: 0.0, 1: 0.0}) == {0: 1.0, 1: 1.0}


def test_the_sentence():
    assert sentence(1, "local-2", round(1 / 2.4, 3)) == \
        "rank 1 on local-2 is slow: its steps take 2.4× the fastest rank's"


def test_a_sustained_slowdown_opens_one_episode_after_the_window():
    slow = {0: 0.5, 1: 1.2, 2: 0.5, 3: 0.52}
    judged = _run([slow] * 6)
    opened_at = [i for i, j in enumerate(judged) if j.opened]
    # the third scan is 60 s after the first: both the count and the span hold
    assert opened_at == [2]
    ep = judged[2].opened[0]
    assert (ep.rank, ep.episode, ep.key, ep.node_id) == (1, 1, "rank_slow#1#1", "node-0")
    assert ep.text == "rank 1 on node-0 is slow: its steps take 2.4× the fastest rank's"
    assert all(j.slow_ranks == [1] for j in judged[2:])
    assert judged[1].slow_ranks == []


def test_scans_too_close_together_do_not_make_the_window():
    slow = {0: 0.5, 1: 1.2}
    state = None
    for i in range(5):  # five scans within 40 s
        j = judge(state, _samples(slow), now=T0 + timedelta(seconds=10 * i), attempt=1)
        state = j.state
        assert not j.opened
    j = judge(state, _samples(slow), now=T0 + timedelta(seconds=60), attempt=1)
    assert [e.rank for e in j.opened] == [1]


def test_a_pause_restarts_the_window_and_never_makes_a_rank_slow():
    slow = {0: 0.5, 1: 1.2}
    judged = _run([slow] * 7, paused_at={1: {1}, 3: {1}, 5: {1}})
    assert not any(j.opened for j in judged)
    assert all(j.slow_ranks == [] for j in judged)


def test_a_small_absolute_difference_is_noise():
    judged = _run([{0: 0.001, 1: 0.005}] * 6)
    assert not any(j.opened for j in judged)


def test_recovery_ends_the_episode_and_a_new_slowdown_is_a_second_one():
    slow, ok = {0: 0.5, 1: 1.2}, {0: 0.5, 1: 0.52}
    judged = _run([slow] * 3 + [ok] * 2 + [slow] * 3)
    assert [e.key for j in judged for e in j.opened] == ["rank_slow#1#1", "rank_slow#1#2"]
    assert judged[3].slow_ranks == [1]   # one scan at the threshold is not recovery
    assert judged[4].closed == [1] and judged[4].slow_ranks == []


def test_a_new_attempt_starts_afresh_but_keeps_counting_episodes():
    slow = {0: 0.5, 1: 1.2}
    first = _run([slow] * 3)
    second = _run([slow] * 3, state=first[-1].state, attempt=2, start=3)
    assert second[0].slow_ranks == []
    assert [e.key for e in second[2].opened] == ["rank_slow#1#2"]


def test_suppressed_scans_change_nothing():
    slow = {0: 0.5, 1: 1.2}
    j = _run([slow] * 2)[-1]
    again = judge(j.state, _samples(slow), now=T0 + timedelta(hours=1), attempt=1,
                  suppressed=True)
    assert again.state == j.state and not again.opened


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 5),
                                st.one_of(st.none(), st.floats(0, 5, allow_nan=False)),
                                min_size=1, max_size=6), min_size=1, max_size=12),
       st.floats(0.1, 0.99))
def test_episodes_open_once_each_and_only_after_the_window(scans, threshold):
    state = None
    opened: dict[int, list[int]] = {}
    below: dict[int, int] = {}
    for i, times in enumerate(scans):
        j = judge(state, _samples(times), now=T0 + timedelta(seconds=i * PERIOD),
                  attempt=1, threshold=threshold)
        state = j.state
        sc = scores(times)
        known = [t for t in times.values() if t is not None]
        for r in range(6):
            t = times.get(r)
            is_below = r in times and t is not None and sc[r] is not None and \
                sc[r] < threshold and t - min(known) >= straggler.MIN_EXCESS_S
            below[r] = below.get(r, 0) + 1 if is_below else 0
        for e in j.opened:
            # never before MIN_SCANS consecutive scans below, never twice open
            assert below[e.rank] >= straggler.MIN_SCANS
            assert e.score < threshold
            opened.setdefault(e.rank, []).append(e.episode)
        assert set(j.slow_ranks) <= set(times) | set(opened)
    for eps in opened.values():
        assert eps == list(range(1, len(eps) + 1))


def test_when_most_ranks_are_below_the_fastest_is_the_outlier_and_nobody_is_slow():
    # rank 0 has less work than the rest: three of four "below" is no straggler
    judged = _run([{0: 0.2, 1: 1.0, 2: 1.0, 3: 1.1}] * 6)
    assert not any(j.opened for j in judged) and judged[-1].state["ranks"] == {}
    # two of four is still a pair of stragglers
    judged = _run([{0: 0.5, 1: 1.2, 2: 0.5, 3: 1.3}] * 3)
    assert sorted(e.rank for e in judged[-1].opened) == [1, 3]


def test_the_state_stays_bounded_however_many_ranks_are_slow():
    n = 4 * straggler.MAX_BELOW
    times = {r: (2.0 + r / n if r % 2 else 0.5) for r in range(n)}  # half of them slow
    j = _run([times] * 3)[-1]
    assert len(j.state["ranks"]) == straggler.MAX_BELOW
    assert len(j.opened) == straggler.MAX_BELOW
    sc = scores(times)
    kept = {e.rank for e in j.opened}
    assert max(sc[r] for r in kept) <= min(sc[r] for r in range(1, n, 2) if r not in kept), \
        "the slowest are the ones kept"
