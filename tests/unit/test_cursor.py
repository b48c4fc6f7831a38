"""Page tokens: opaque, round-trip, and bound to tenant and filter."""
import pytest
from hypothesis import given, settings, strategies as st

from chalicelib.domain import cursor
from chalicelib.domain.errors import InvalidPageToken

SECRET = b"k" * 32
keys = st.text(min_size=1, max_size=80)
names = st.text(min_size=1, max_size=20)


@given(keys, names, names)
def test_round_trip(key, tenant, flt):
    tok = cursor.encode(key, tenant=tenant, filter_key=flt, secret=SECRET)
    assert cursor.decode(tok, tenant=tenant, filter_key=flt, secret=SECRET) == key


@given(keys, st.data())
def test_any_single_character_change_is_rejected(key, data):
    tok = cursor.encode(key, tenant="acme", filter_key="state=", secret=SECRET)
    i = data.draw(st.integers(0, len(tok) - 1))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."
    c = data.draw(st.sampled_from(alphabet).filter(lambda c: c != tok[i]))
    tampered = tok[:i] + c + tok[i + 1:]
    with pytest.raises(InvalidPageToken):  # issue 9: any alteration is tampering
        cursor.decode(tampered, tenant="acme", filter_key="state=", secret=SECRET)


ANY_CHAR = st.characters(codec="utf-8")


@pytest.mark.slow
@settings(deadline=None)  # a decode per character of the token: ~200 a case, slow when busy
@given(keys, st.data())
def test_every_position_changed_to_any_character_is_rejected(key, data):
    """Issue 9: flips every character of the token in turn, to anything at all."""
    tok = cursor.encode(key, tenant="acme", filter_key="state=", secret=SECRET)
    for i in range(len(tok)):
        c = data.draw(ANY_CHAR.filter(lambda c, i=i: c != tok[i]), label=f"char {i}")
        with pytest.raises(InvalidPageToken):
            cursor.decode(tok[:i] + c + tok[i + 1:], tenant="acme", filter_key="state=",
                          secret=SECRET)


@given(keys, st.sampled_from(["=", "==", " ", "\n", "A", ".", "%3D"]))
def test_padding_or_trailing_characters_are_rejected(key, extra):
    tok = cursor.encode(key, tenant="acme", filter_key="state=", secret=SECRET)
    for bad in (tok + extra, extra + tok):
        with pytest.raises(InvalidPageToken):
            cursor.decode(bad, tenant="acme", filter_key="state=", secret=SECRET)


@given(keys)
def test_token_of_another_tenant_is_rejected(key):
    tok = cursor.encode(key, tenant="acme", filter_key="state=", secret=SECRET)
    with pytest.raises(InvalidPageToken):
        cursor.decode(tok, tenant="other", filter_key="state=", secret=SECRET)


@given(keys)
def test_token_used_with_another_filter_is_rejected(key):
    tok = cursor.encode(key, tenant="acme", filter_key="state=", secret=SECRET)
    with pytest.raises(InvalidPageToken):
        cursor.decode(tok, tenant="acme", filter_key="state=RUNNING", secret=SECRET)


def test_token_signed_with_another_key_is_rejected():
    tok = cursor.encode("job_x", tenant="acme", filter_key="", secret=b"other")
    with pytest.raises(InvalidPageToken):
        cursor.decode(tok, tenant="acme", filter_key="", secret=SECRET)


@given(st.text(max_size=200))
def test_arbitrary_text_is_rejected_not_crashed(text):
    with pytest.raises(InvalidPageToken):
        cursor.decode(text, tenant="acme", filter_key="", secret=SECRET)
