"""Raw DynamoDB items to attribute values and back, without model instances.

PynamoDB builds a model instance per item read or written: every attribute
set through a descriptor, defaults first, then serialised one by one. On the
hot paths that cost more than the request itself (a list page decodes 50
jobs; docs/benchmarks.md), so they read and write raw items through a
:class:`Codec` instead. A codec is made from the model class: the names,
types, defaults and (de)serialisers are the model's own attribute objects,
so a field added to a model is read and written here too, and
tests/unit/test_items.py holds both directions equal to PynamoDB's.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from pynamodb.attributes import Attribute, JSONAttribute, MapAttribute, NumberAttribute
from pynamodb.constants import NULL
from pynamodb.models import Model

from ..fastjson import RawJSON


def _reader(attribute: Attribute, raw_json: bool = False):
    """The attribute's deserialiser, or None where it returns its input;
    with ``raw_json`` a JSON attribute's text is kept as it is (RawJSON)."""
    if raw_json and isinstance(attribute, JSONAttribute):
        return RawJSON
    read = type(attribute).deserialize
    return None if read is Attribute.deserialize else attribute.deserialize


class _NotJSON(Exception):
    """A value of a type JSON has no form for: PynamoDB's to serialise."""


def _json_value(value: Any) -> dict[str, Any]:
    """A JSON value (dicts, lists, strings, numbers, booleans, None) as
    PynamoDB stores it inside a raw map: what ``MapAttribute`` and
    ``ListAttribute`` make of undeclared values, without looking up an
    attribute class for each (docs/benchmarks.md, "Second pass")."""
    kind = type(value)
    if kind is str:
        return {"S": value}
    if kind is dict:
        return {"M": {k: _json_value(v) for k, v in value.items()}}
    if value is None:
        return {"NULL": True}
    if kind is bool:
        return {"BOOL": value}
    if kind is int:
        return {"N": str(value)}  # json.dumps of an int, as NumberAttribute
    if kind is float:
        return {"N": json.dumps(value)}
    if kind is list:
        return {"L": [_json_value(v) for v in value]}
    raise _NotJSON


def _writer(attribute: Attribute) -> Callable[[Any], Any]:
    """The attribute's serialiser: PynamoDB's, or the same text made faster
    for a raw map of JSON values and for an integer number."""
    if type(attribute) is MapAttribute:  # raw: every key undeclared
        def write_map(value: Any) -> Any:
            if type(value) is dict:
                try:
                    return {k: _json_value(v) for k, v in value.items()}
                except _NotJSON:
                    pass
            return attribute.serialize(value)
        return write_map
    if type(attribute) is NumberAttribute:
        def write_number(value: Any) -> Any:
            return str(value) if type(value) is int else attribute.serialize(value)
        return write_number
    return attribute.serialize


class Codec:
    """The attributes ``names`` of ``model`` (all of them by default). With
    ``raw_json``, ``values`` keeps each JSON attribute's stored text as it is
    (fastjson.RawJSON), for values that are shown, not used: written out by
    fastjson.dumps, it is never decoded and encoded again."""

    def __init__(self, model: type[Model], names: Iterable[str] | None = None, *,
                 raw_json: bool = False) -> None:
        attributes = model.get_attributes()
        chosen = list(attributes) if names is None else list(names)
        self.model = model
        #: (python name, item name, DynamoDB type, attribute, default)
        fields = [(name, a.attr_name, a.attr_type, a, a.default)
                  for name in chosen for a in (attributes[name],)]
        #: (python name, item name, DynamoDB type, deserialiser or None, default)
        self._readers = [(name, item_name, kind, _reader(a, raw_json), default)
                         for name, item_name, kind, a, default in fields]
        #: (python name, item name, DynamoDB type, serialiser, a new item's
        #: value when none is given, whether it may be absent)
        self._writers = [(name, item_name, kind, _writer(a), a.default_for_new or default,
                          a.null) for name, item_name, kind, a, default in fields]
        self._serialisers = {name: (kind, write)
                             for name, _, kind, write, _, _ in self._writers}

    def values(self, item: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The attributes of a raw item, as ``model.from_raw_data(item)`` has
        them (a map as a plain dict): an absent or NULL attribute is its
        default, else None."""
        out = {}
        for name, item_name, kind, read, default in self._readers:
            raw = item.get(item_name)
            if raw and NULL not in raw:
                out[name] = raw[kind] if read is None else read(raw[kind])
            else:
                out[name] = default() if callable(default) else default
        return out

    def item(self, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """``model(**values).serialize()`` for a new item: the default of an
        attribute not given; one without a value and without ``null=True``
        raises ValueError, as PynamoDB's does."""
        out = {}
        for name, item_name, kind, write, default, nullable in self._writers:
            value = values.get(name)
            if value is None:
                value = default() if callable(default) else default
            serialised = None if value is None else write(value)
            if serialised is None:
                if not nullable:
                    raise ValueError(f"{self.model.__name__}.{name} needs a value")
                continue
            out[item_name] = {kind: serialised}
        return out

    def value(self, name: str, value: Any) -> dict[str, Any]:
        """One attribute's value as DynamoDB takes it in an expression."""
        kind, write = self._serialisers[name]
        return {kind: write(value)}
