"""chalicelib/fastjson.py gives json's values (orjson where it agrees), and
what is stored through it reads back exactly."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from chalicelib import fastjson
from chalicelib.service import limits

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(), inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(values)
def test_dumps_then_loads_is_the_value_json_round_trips(value):
    expected = json.loads(json.dumps(value))
    assert fastjson.loads(fastjson.dumps(value)) == expected
    assert json.loads(fastjson.dumps(value)) == expected  # valid JSON for any client


@pytest.mark.parametrize("text, expected", [
    ('{"a": NaN}', "nan"), ('[Infinity, -Infinity]', [math.inf, -math.inf]),
    ('"tab\there"', "tab\there"), ('{"k": "\\u00e9"}', {"k": "é"}),
])
def test_loads_reads_what_only_json_reads(text, expected):
    got = fastjson.loads(text)
    if expected == "nan":
        assert math.isnan(got["a"])
    else:
        assert got == expected == json.loads(text, strict=False)


def test_integers_beyond_64_bits_are_answered_by_json_and_never_stored():
    big = {"n": 2**64 + 1}
    assert json.loads(fastjson.dumps(big)) == big
    with pytest.raises(TypeError):
        fastjson.dumps_strict(big)
    assert fastjson.loads(fastjson.dumps_strict({"n": 2**64 - 1})) == {"n": 2**64 - 1}


def test_lone_surrogates_fall_back_and_non_string_keys_become_strings():
    assert json.loads(fastjson.dumps("\ud800")) == "\ud800"
    assert fastjson.dumps({1: "a"}) == '{"1":"a"}'
    with pytest.raises(TypeError):
        fastjson.dumps_strict("\ud800")


@settings(max_examples=200, deadline=None)
@given(values)
def test_proxy_bytes_bounds_the_payload_the_runtime_sends(value):
    """The body as the app encodes it, inside the proxy payload as the Lambda
    runtime encodes that (a JSON string, ASCII): never more than proxy_bytes."""
    body = fastjson.dumps(value)
    assert len(json.dumps({"body": body})) - len('{"body": }') <= limits.proxy_bytes(value)


@pytest.mark.parametrize("char", ["é", "✓", "😀", "\n", '"', "\\", "\x01"])
def test_proxy_bytes_counts_every_kind_of_character_at_least_as_sent(char):
    value = [char * 100]
    sent = len(json.dumps(fastjson.dumps(value)))
    assert sent <= limits.proxy_bytes(value) <= 3 * sent


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100), max_size=20), st.integers(1, 500))
def test_fit_answers_the_same_with_the_whole_page_bound(sizes, budget):
    """The one-encoding shortcut of a list page (``whole``) never changes
    where a page is cut: it only answers when everything fits."""
    alone = limits.fit(sizes, lambda n: n, budget)
    assert limits.fit(sizes, lambda n: n, budget, whole=sum) == alone
    assert alone == len(sizes) or sum(sizes[:alone + 1]) > budget


@settings(max_examples=100, deadline=None)
@given(values)
def test_raw_json_is_written_as_the_value_it_holds(value):
    """A view's spec, health and exit stay the text the store holds
    (RawJSON): encoded, they read back as the value that text was made from."""
    raw = fastjson.RawJSON(fastjson.dumps_strict({"v": value}))
    assert json.loads(fastjson.dumps({"spec": raw, "list": [raw]})) == \
        {"spec": {"v": value}, "list": [{"v": value}]}


def test_raw_json_survives_the_fallback_to_json():
    """A lone surrogate elsewhere sends the value to ``json``, which has no
    raw text: it decodes the RawJSON instead, and still shows the value."""
    raw = fastjson.RawJSON('{"a":[1,"\\u00e9"]}')
    assert json.loads(fastjson.dumps({"name": "\ud800", "spec": raw})) == \
        {"name": "\ud800", "spec": {"a": [1, "é"]}}
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object()})
