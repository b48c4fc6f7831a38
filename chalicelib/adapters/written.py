"""The one written-out Query heartbeat_store.py still sends (its owner moves
it to adapters/dynamo.py's Table; then this module goes). Every job-side
request is built by adapters/dynamo.py.

In an expression a ``#name`` placeholder stands for the attribute of that
very name (``#state`` is ``state``); ``:value`` placeholders come with their
values.
"""
from __future__ import annotations

import functools
import re
from typing import Any

from pynamodb.models import Model

_NAME = re.compile(r"#(\w+)")


def _names(*expressions: str | None) -> dict[str, str]:
    """The ``#name`` placeholders of ``expressions``: a copy of the ones worked
    out the first time (a request's expressions are a handful of fixed texts)."""
    return dict(_placeholders(expressions))


@functools.lru_cache(maxsize=512)
def _placeholders(expressions: tuple[str | None, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((f"#{n}", n) for e in expressions if e for n in _NAME.findall(e))


def _table(model: type[Model]) -> str:
    return model.Meta.table_name  # bound at start-up (models.bind)


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
