"""JSON on the hot paths through orjson, with the standard library's answer
wherever orjson would refuse.

A 50-job list page decodes about 150 stored JSON attributes and encodes some
50 KB of response; with ``json`` that was a large part of what the app adds
to the bare DynamoDB Query. orjson does both faster (measured in
docs/benchmarks.md, "Client side"); what it imports beyond its own extension
the app imports anyway.

Where the two disagree:

- ``dumps``: orjson encodes no integer beyond 64 bits and no lone
  surrogate: those raise, and ``json`` answers instead (``dumps_strict``
  raises, for what is stored: see below). NaN and Infinity become ``null``
  (``json`` would write text no JSON parser accepts); nothing the API stores
  or computes is one.
  Its text is compact and UTF-8, as ``json.dumps(value, ensure_ascii=False,
  separators=(",", ":"))``; floats in shortest round-trip form. Non-string
  dict keys become strings, as ``json`` makes them.
- ``loads``: orjson refuses NaN and Infinity and raw control characters in
  strings, which ``json.loads(strict=False)`` (PynamoDB's JSONAttribute)
  reads: those go to ``json``. orjson reads an integer beyond 64 bits as a
  float; no stored text holds one, as every JSON attribute is written by
  ``dumps_strict``, which refuses them (the request schemas bound every
  number a client sends).
"""
from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS


class RawJSON:
    """JSON text kept as it was stored, shown as is: ``dumps`` writes the text
    itself where the value stands, so a job read to be shown is never decoded
    and encoded again (its spec, health and exit on get and list pages).
    Only for text this module wrote (``dumps_strict``): nothing checks it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    @classmethod
    def of(cls, value: Any) -> "RawJSON":
        """The stored text of ``value`` (``dumps_strict``), as the store holds it."""
        return cls(dumps_strict(value))

    def value(self) -> Any:
        """The JSON value of the text, decoded (for a service that must read
        it; a view only shows it)."""
        return loads(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJSON) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RawJSON({self.text!r})"


def _fragment(value: Any) -> orjson.Fragment:
    if type(value) is RawJSON:
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _decoded(value: Any) -> Any:
    if type(value) is RawJSON:
        return loads(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON")


def loads(text: str | bytes) -> Any:
    """``json.loads(text, strict=False)``, faster."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text, strict=False)


def dumpb(value: Any) -> bytes:
    """The JSON text of ``value`` in UTF-8 (compact, characters unescaped;
    a RawJSON as its text)."""
    try:
        return orjson.dumps(value, default=_fragment, option=_OPTIONS)
    except orjson.JSONEncodeError:  # big integers, lone surrogates: json's answer
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          default=_decoded).encode("utf-8", "surrogatepass")


def dumps(value: Any) -> str:
    """The JSON text of ``value`` (compact, UTF-8 characters unescaped; a lone
    surrogate stays one, for the caller to refuse)."""
    return dumpb(value).decode("utf-8", "surrogatepass")


def dumps_strict(value: Any) -> str:
    """``dumps`` for text that ``loads`` must read back exactly: what orjson
    cannot encode (integers beyond 64 bits, lone surrogates, types JSON has
    no form for) raises TypeError instead of taking ``json``'s form."""
    try:
        return orjson.dumps(value, option=_OPTIONS).decode("utf-8")
    except orjson.JSONEncodeError as e:
        raise TypeError(f"not storable as JSON: {e}") from None
