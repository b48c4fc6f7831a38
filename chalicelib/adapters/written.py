"""DynamoDB operations written out, for the hot paths.

PynamoDB builds every key, condition and update as a tree of expression
objects and a model instance per item, then serialises them: on create,
cancel, get and a list page that cost more than the rest of the app's client
side (docs/benchmarks.md). The hot paths write the same operations as text
instead, items through the models' own attributes (items.py), sent by
PynamoDB's connection (``dispatch``) or in its transaction (so the
ClientRequestToken, the error wrapping and the order of cancellation
reasons stay PynamoDB's: condition checks, deletes, puts, then updates).

In an expression a ``#name`` placeholder stands for the attribute of that
very name (``#state`` is ``state``), so the text reads as what it does;
``:value`` placeholders come with their values.
"""
from __future__ import annotations

import functools
import re
from typing import Any

from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

_NAME = re.compile(r"#(\w+)")


class Transaction(TransactWrite):
    """PynamoDB's TransactWrite, which also takes written-out operations."""

    def put_item(self, operation: dict[str, Any]) -> None:
        self._put_items.append(operation)

    def update_item(self, operation: dict[str, Any]) -> None:
        self._update_items.append(operation)


def _names(*expressions: str | None) -> dict[str, str]:
    """The ``#name`` placeholders of ``expressions``: a copy of the ones worked
    out the first time (a request's expressions are a handful of fixed texts)."""
    return dict(_placeholders(expressions))


@functools.lru_cache(maxsize=512)
def _placeholders(expressions: tuple[str | None, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((f"#{n}", n) for e in expressions if e for n in _NAME.findall(e))


def _table(model: type[Model]) -> str:
    return model.Meta.table_name  # bound at start-up (models.bind)


def put_new(model: type[Model], item: dict, *, return_old: bool = False,
            condition: str | None = None, values: dict | None = None) -> dict:
    """Put ``item`` on condition that no item has its key (or on
    ``condition``); with ``return_old``, a failed condition returns the item
    that is there (ReturnValuesOnConditionCheckFailure ALL_OLD)."""
    condition = condition or f"attribute_not_exists(#{model._hash_keyname})"
    op: dict[str, Any] = {"TableName": _table(model), "Item": item,
                          "ConditionExpression": condition,
                          "ExpressionAttributeNames": _names(condition)}
    if values:
        op["ExpressionAttributeValues"] = values
    if return_old:
        op["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    return op


def update(model: type[Model], key: dict, expression: str, *, condition: str | None = None,
           values: dict | None = None) -> dict:
    """Update the item of ``key`` (raw key attributes) by ``expression``, on
    ``condition`` when given."""
    op: dict[str, Any] = {"TableName": _table(model), "Key": key,
                          "UpdateExpression": expression,
                          "ExpressionAttributeNames": _names(expression, condition)}
    if condition:
        op["ConditionExpression"] = condition
    if values:
        op["ExpressionAttributeValues"] = values
    return op


def get(model: type[Model], key: dict) -> dict:
    """A strongly consistent GetItem of the item of ``key``."""
    return {"TableName": _table(model), "Key": key, "ConsistentRead": True}


def query(model: type[Model], index: str | None, condition: str, values: dict, *,
          limit: int | None = None, forward: bool = True, start: dict | None = None,
          consistent: bool = False) -> dict:
    """A Query of ``index`` (None: the table) for the items meeting the key
    ``condition``; strongly consistent if asked (not on a global index)."""
    op: dict[str, Any] = {"TableName": _table(model),
                          "KeyConditionExpression": condition,
                          "ExpressionAttributeNames": _names(condition),
                          "ExpressionAttributeValues": values, "ScanIndexForward": forward}
    if index is not None:
        op["IndexName"] = index
    if limit is not None:
        op["Limit"] = limit
    if consistent:
        op["ConsistentRead"] = True
    if start:
        op["ExclusiveStartKey"] = start
    return op
