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

from typing import Any, Iterable

from pynamodb.attributes import Attribute
from pynamodb.constants import NULL
from pynamodb.models import Model


def _reader(attribute: Attribute):
    """The attribute's deserialiser, or None where it returns its input."""
    read = type(attribute).deserialize
    return None if read is Attribute.deserialize else attribute.deserialize


class Codec:
    """The attributes ``names`` of ``model`` (all of them by default)."""

    def __init__(self, model: type[Model], names: Iterable[str] | None = None) -> None:
        attributes = model.get_attributes()
        chosen = list(attributes) if names is None else list(names)
        self.model = model
        self._attributes = {name: attributes[name] for name in chosen}
        #: (python name, item name, DynamoDB type, attribute, default)
        self._fields = [(name, a.attr_name, a.attr_type, a, a.default)
                        for name in chosen for a in (attributes[name],)]
        #: (python name, item name, DynamoDB type, deserialiser or None, default)
        self._readers = [(name, item_name, kind, _reader(a), default)
                         for name, item_name, kind, a, default in self._fields]

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
        for name, item_name, kind, attribute, default in self._fields:
            value = values.get(name)
            if value is None:
                value = attribute.default_for_new or default
                value = value() if callable(value) else value
            serialised = None if value is None else attribute.serialize(value)
            if serialised is None:
                if not attribute.null:
                    raise ValueError(f"{self.model.__name__}.{name} needs a value")
                continue
            out[item_name] = {kind: serialised}
        return out

    def value(self, name: str, value: Any) -> dict[str, Any]:
        """One attribute's value as DynamoDB takes it in an expression."""
        attribute = self._attributes[name]
        return {attribute.attr_type: attribute.serialize(value)}
