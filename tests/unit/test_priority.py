"""Priority classes and the choice of victims (domain/priority.py), without AWS."""
from datetime import datetime, timedelta, timezone

import pytest

from chalicelib.domain import placement, priority
from chalicelib.domain.priority import PriorityClasses, Victim

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def fits_gang(ranks: int, gpus_per_rank: int = 1):
    def fits(room):
        nodes = sorted(room.items(), key=lambda kv: -kv[1])
        return placement.plan(ranks, gpus_per_rank,
                              (placement.Candidate(n, f) for n, f in nodes)) is not None
    return fits


def test_classes_parse_with_a_default_of_value_zero():
    classes = PriorityClasses.parse('{"urgent": {"value": 10, "preempts": true}}')
    assert classes.of(None).value == 0 and not classes.of(None).preempts
    assert classes.of("urgent").preempts and classes.value_of("urgent") == 10
    assert classes.value_of("removed-since") == 0, "nothing stranded"
    assert classes.names() == ["urgent", "default"]


@pytest.mark.parametrize("raw, says", [
    ("[1]", "maps class names"), ("{", "not JSON"), ('{"a b": {}}', "not a class name"),
    ('{"x": {"value": "9"}}', "x.value"), ('{"x": {"value": true}}', "x.value"),
    ('{"x": {"preempts": 1}}', "x.preempts"), ('{"x": {"weight": 1}}', "value, preempts and"),
    ('{"x": {"tenants": "acme"}}', "x.tenants"),
])
def test_a_bad_class_setting_is_named(raw, says):
    with pytest.raises(ValueError) as caught:
        PriorityClasses.parse(raw)
    assert says in str(caught.value) and "GPUJOBS_PRIORITY_CLASSES" in str(caught.value)


def test_eligible_victims_are_lower_classes_that_ran_long_enough_lowest_then_newest():
    vs = [Victim("old-batch", -100, at(0), {"n1": 2}), Victim("new-batch", -100, at(10), {"n2": 2}),
          Victim("default", 0, at(20), {"n3": 2}), Victim("same", 1000, at(0), {"n4": 2}),
          Victim("fresh", -100, at(29), {"n5": 2})]
    chosen = priority.eligible(vs, 1000, at(30), min_runtime_s=300)
    assert [v.job_id for v in chosen] == ["new-batch", "old-batch", "default"]


def test_the_victims_are_a_minimal_set_and_none_when_nothing_would_make_room():
    vs = [Victim("a", -1, at(3), {"n1": 1}), Victim("b", -1, at(2), {"n2": 4}),
          Victim("c", 0, at(1), {"n3": 4})]
    # 4 GPUs on one node: a alone cannot, a and b can, and a is then not needed
    assert [v.job_id for v in priority.choose_victims(vs, {}, fits_gang(1, 4))] == ["b"]
    assert priority.choose_victims(vs, {}, fits_gang(3, 4)) is None
    assert priority.choose_victims(vs, {"n1": 3}, fits_gang(1, 4)) == [vs[0]], \
        "what is free counts: one GPU more on n1 is enough"


def test_among_equals_the_victim_freeing_the_fewest_gpus_beyond_the_need_goes():
    """Kueue's rule: lowest class, then the fewest GPUs freed beyond what is
    needed, then the most recently started."""
    big_new = Victim("big-new", -1, at(9), {"n1": 8})
    small_old = Victim("small-old", -1, at(1), {"n2": 2})
    small_new = Victim("small-new", -1, at(5), {"n3": 2})
    lower = Victim("lower-class", -5, at(0), {"n4": 8})
    ordered = priority.eligible([big_new, small_old, small_new], 10, at(60), 0)
    assert [v.job_id for v in priority.choose_victims(ordered, {}, fits_gang(2))] == [
        "small-new"], "2 GPUs needed: not the 8 of the newest"
    ordered = priority.eligible([big_new, small_old, lower], 10, at(60), 0)
    assert [v.job_id for v in priority.choose_victims(ordered, {}, fits_gang(2))] == [
        "lower-class"], "a lower class goes first, whatever it frees"
