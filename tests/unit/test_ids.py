"""Job ids sort by creation time."""
from chalicelib.domain.ids import UlidGenerator, is_job_id, new_job_id


def test_ids_made_one_after_another_sort_in_creation_order():
    ids = [new_job_id() for _ in range(2000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_later_millisecond_sorts_after_an_earlier_one():
    gen = UlidGenerator()
    a = gen(now_ms=10**12)
    b = gen(now_ms=10**12 + 1)
    assert a < b and a[:10] < b[:10]


def test_a_clock_stepping_back_does_not_break_the_order():
    gen = UlidGenerator()
    a = gen(now_ms=10**12 + 5)
    b = gen(now_ms=10**12)
    assert a < b


def test_ids_have_the_documented_shape():
    assert is_job_id(new_job_id())
    assert not is_job_id("job_" + "I" * 26)  # not Crockford base32
    assert not is_job_id("job_123")
