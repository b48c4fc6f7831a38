"""Job ids sort by creation time."""
from hypothesis import given, strategies as st

from chalicelib.domain.ids import UlidGenerator, _ulid_text, is_job_id, new_job_id

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford's


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


@given(ms=st.integers(0, 2**48 - 1), rand=st.integers(0, 2**80 - 1))
def test_an_id_spells_its_time_then_its_randomness_in_crockford_base32(ms, rand):
    """The one-call encoding spells the same 26 characters as reading the
    number five bits at a time, most significant first."""
    n = (ms << 80) | rand
    by_hand = "".join(ALPHABET[(n >> shift) & 31] for shift in range(125, -5, -5))
    assert _ulid_text(ms, rand) == by_hand
    assert by_hand[:10] == "".join(ALPHABET[(ms >> s) & 31] for s in range(45, -5, -5))
