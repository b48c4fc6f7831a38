"""The one way every DynamoDB request is built and sent.

The PynamoDB models (models.py) are the schema: table names, attributes,
their types, stored names, defaults and serialisers, and the indexes. Every
operation on every table is built here from a model as a request dict:
items and values through the model's own attributes (:class:`.items.Codec`),
keys, conditions and updates as DynamoDB expression text, in which a
``#name`` placeholder stands for the attribute ``name`` of the model, under
the name the model stores it as (``attr_name``), so the text reads as what
it does. A ``#name`` that is no attribute of the model is a key inside a
map (an event's key in ``events``) and stands for itself.

Requests go out through PynamoDB's connection, by its public calls only:
``dispatch`` for one request, ``transact_write_items`` for a transaction
(so its errors, TransactWriteError with cancellation reasons in the order
condition checks, deletes, puts, updates, stay PynamoDB's). No request asks
for the consumed capacity: nothing reads it.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable, Sequence

from botocore.exceptions import ClientError
from pynamodb.connection import Connection
from pynamodb.exceptions import GetError
from pynamodb.models import Model

from .items import Codec

_NAME = re.compile(r"#(\w+)")
#: sends of one batch at most, the unprocessed part resent (as PynamoDB's
#: batch_write, models.py's max_retry_attempts)
BATCH_SENDS = 3
_NO_CAPACITY = "NONE"
_CONDITION_FAILED = "ConditionalCheckFailedException"
#: expression sets whose placeholders a table keeps worked out
_NAMES_KEPT = 512


class ConditionFailed(Exception):
    """A single write's condition was false; ``item`` is the item that is
    there when the request asked for it (``return_old``), else None."""

    def __init__(self, item: dict | None = None) -> None:
        super().__init__("the condition of the write was false")
        self.item = item


class ItemTooLarge(Exception):
    """The write would make an item bigger than DynamoDB's 400 KB; nothing
    was written (a ValidationException, whose message says so)."""

    def __init__(self, operation: str, message: str) -> None:
        super().__init__(f"{operation}: {message}")


class EmptyAnswer(Exception):
    """DynamoDB (or what stands between) answered a request with nothing,
    not even ``{}``: the answer is lost, so the request's outcome is unknown.
    A dependency failure (dynamo_errors: 503 upstream), never read as "no item"."""

    def __init__(self, operation: str) -> None:
        super().__init__(f"{operation} got an empty answer")
        self.operation = operation


class Table:
    """The requests of one table, built from its model."""

    def __init__(self, model: type[Model], *, tells: Callable[[str], bool] | None = None) -> None:
        self.model = model
        #: which story events (domain/events.py keys) of its items a tenant's
        #: feed tells: each is marked unfed with it (Changes.event)
        self.tells = tells
        self.codec = Codec(model)
        attributes = model.get_attributes()
        #: (python name, stored name) of every attribute, for the placeholders
        self._stored = tuple((name, a.attr_name) for name, a in attributes.items())
        self._stored_name = dict(self._stored)
        self._names: dict[tuple[str | None, ...], tuple[tuple[str, str], ...]] = {}
        self.hash_key = next(n for n, a in attributes.items() if a.is_hash_key)
        ranges = [n for n, a in attributes.items() if a.is_range_key]
        self.range_key = ranges[0] if ranges else None

    @property
    def name(self) -> str:
        return self.model.Meta.table_name  # bound at start-up (models.bind)

    # -- pieces --------------------------------------------------------------
    def key(self, hash_value: Any, range_value: Any = None) -> dict:
        """The raw key of an item."""
        stored = self._stored_name
        key = {stored[self.hash_key]: self.codec.value(self.hash_key, hash_value)}
        if self.range_key is not None:
            key[stored[self.range_key]] = self.codec.value(self.range_key, range_value)
        return key

    def item(self, values: dict[str, Any]) -> dict:
        """A new item of these attribute values (defaults for the rest)."""
        return self.codec.item(values)

    def value(self, name: str, value: Any) -> dict:
        """One attribute's value as an expression takes it."""
        return self.codec.value(name, value)

    def values(self, item: dict) -> dict[str, Any]:
        """Every attribute of a raw item (items.Codec.values)."""
        return self.codec.values(item)

    def names(self, *expressions: str | None) -> dict[str, str]:
        """The ``#name`` placeholders of ``expressions`` and the stored
        names they stand for (worked out once per set of expressions: a
        table's requests are a handful of fixed texts)."""
        found = self._names.get(expressions)
        if found is None:
            if len(self._names) >= _NAMES_KEPT:
                self._names.clear()
            found = self._names[expressions] = _placeholders(self._stored, expressions)
        return dict(found)

    # -- requests ---------------------------------------------------------------
    def get(self, key: dict, *, attributes: Iterable[str] | None = None,
            consistent: bool = True) -> dict:
        """A GetItem (of only ``attributes`` if given), strongly consistent
        unless ``consistent`` is False (half the read units)."""
        request: dict[str, Any] = {"TableName": self.name, "Key": key,
                                   "ConsistentRead": consistent}
        if attributes is not None:
            projection = ", ".join(f"#{a}" for a in attributes)
            request["ProjectionExpression"] = projection
            request["ExpressionAttributeNames"] = self.names(projection)
        return request

    def put(self, item: dict, *, condition: str | None = None, values: dict | None = None,
            return_old: bool = False) -> dict:
        """Put ``item``, on ``condition`` when given; with ``return_old`` a
        failed condition carries the item that is there."""
        request: dict[str, Any] = {"TableName": self.name, "Item": item}
        self._condition(request, condition, values)
        if return_old:
            request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        return request

    def put_new(self, item: dict, **kwargs: Any) -> dict:
        """Put ``item`` on condition that no item has its key."""
        return self.put(item, condition=f"attribute_not_exists(#{self.hash_key})", **kwargs)

    def update(self, key: dict, expression: str, *, condition: str | None = None,
               values: dict | None = None, keys: dict[str, str] | None = None,
               return_new: bool = False) -> dict:
        """Update the item of ``key`` by ``expression``, on ``condition``.
        ``keys`` names map keys that are no word (``{"#e": "placed#1"}``:
        ``#events.#e`` is that event); with ``return_new`` the answer's
        ``Attributes`` are the item as the update left it."""
        names = self.names(expression, condition)
        if keys:
            names.update(keys)
        request: dict[str, Any] = {"TableName": self.name, "Key": key,
                                   "UpdateExpression": expression,
                                   "ExpressionAttributeNames": names}
        if condition:
            request["ConditionExpression"] = condition
        if values:
            request["ExpressionAttributeValues"] = values
        if return_new:
            request["ReturnValues"] = "ALL_NEW"
        return request

    def check(self, key: dict, condition: str, values: dict | None = None) -> dict:
        """A transaction's condition on the item of ``key``."""
        request: dict[str, Any] = {"TableName": self.name, "Key": key}
        self._condition(request, condition, values)
        return request

    def query(self, index: str | None, condition: str, values: dict, *,
              limit: int | None = None, forward: bool = True, start: dict | None = None,
              consistent: bool = False, attributes: Iterable[str] | None = None,
              filter: str | None = None) -> dict:
        """A Query of ``index`` (None: the table) for the items meeting the
        key ``condition`` (and the ``filter``, applied after ``limit`` items
        are read); strongly consistent if asked (not on a global index)."""
        request: dict[str, Any] = {"TableName": self.name, "KeyConditionExpression": condition,
                                   "ExpressionAttributeValues": values,
                                   "ScanIndexForward": forward}
        expressions = [condition]
        if filter is not None:
            request["FilterExpression"] = filter
            expressions.append(filter)
        if attributes is not None:
            request["ProjectionExpression"] = ", ".join(f"#{a}" for a in attributes)
            expressions.append(request["ProjectionExpression"])
        request["ExpressionAttributeNames"] = self.names(*expressions)
        if index is not None:
            request["IndexName"] = index
        if limit is not None:
            request["Limit"] = limit
        if consistent:
            request["ConsistentRead"] = True
        if start:
            request["ExclusiveStartKey"] = start
        return request

    def scan(self, condition: str | None = None, values: dict | None = None, *,
             consistent: bool = False) -> dict:
        """A Scan of the whole table for the items meeting the filter
        ``condition`` (only the small tables are read whole: nodes, fleets)."""
        request: dict[str, Any] = {"TableName": self.name}
        if condition:
            request.update(FilterExpression=condition,
                           ExpressionAttributeNames=self.names(condition),
                           ExpressionAttributeValues=values or {})
        if consistent:
            request["ConsistentRead"] = True
        return request

    def _condition(self, request: dict, condition: str | None, values: dict | None) -> None:
        if condition:
            request["ConditionExpression"] = condition
            names = self.names(condition)
            if names:
                request["ExpressionAttributeNames"] = names
        if values:
            request["ExpressionAttributeValues"] = values


def _placeholders(stored: tuple[tuple[str, str], ...],
                  expressions: tuple[str | None, ...]) -> tuple[tuple[str, str], ...]:
    names = dict(stored)
    return tuple((f"#{n}", names.get(n, n)) for e in expressions if e for n in _NAME.findall(e))


class Dynamo:
    """Sends the requests of :class:`Table` through PynamoDB's connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def call(self, operation: str, request: dict) -> dict:
        """One request (GetItem, Query, PutItem, UpdateItem, ...); a write
        whose condition fails raises :class:`ConditionFailed`."""
        try:
            answer = self.connection.dispatch(
                operation, {**request, "ReturnConsumedCapacity": _NO_CAPACITY})
        except ClientError as e:
            response = e.response if isinstance(e.response, dict) else {}
            error = response.get("Error") or {}
            if error.get("Code") == _CONDITION_FAILED:
                raise ConditionFailed(response.get("Item")) from None
            if error.get("Code") == "ValidationException" and \
                    "exceeded the maximum allowed size" in str(error.get("Message")):
                raise ItemTooLarge(operation, str(error.get("Message"))) from None
            raise
        if not isinstance(answer, dict):
            raise EmptyAnswer(operation)
        return answer

    def get(self, request: dict) -> dict | None:
        return self.call("GetItem", request).get("Item")

    def put(self, request: dict) -> None:
        self.call("PutItem", request)

    def update(self, request: dict) -> dict:
        return self.call("UpdateItem", request)

    def query(self, request: dict) -> dict:
        return self.call("Query", request)

    def pages(self, request: dict, operation: str = "Query") -> Iterable[list[dict]]:
        """Every page of a Query (or a Scan), lazily."""
        start = request.get("ExclusiveStartKey")
        while True:
            page = self.call(operation, {**request, "ExclusiveStartKey": start}
                             if start else request)
            yield page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                return

    def get_all(self, table: Table, keys: Sequence[dict], *, consistent: bool = False,
                attributes: Iterable[str] | None = None) -> list[dict]:
        """The items of ``keys`` (at most 100) by BatchGetItem, eventually
        consistent unless asked (and only ``attributes`` if given), the
        unprocessed keys asked again; raises GetError (503 upstream) when
        some are still unread after BATCH_SENDS."""
        items: list[dict] = []
        pending: dict[str, Any] = {"Keys": list(keys)}
        if consistent:
            pending["ConsistentRead"] = True
        if attributes is not None:
            pending["ProjectionExpression"] = ", ".join(f"#{a}" for a in attributes)
            pending["ExpressionAttributeNames"] = table.names(pending["ProjectionExpression"])
        for _ in range(BATCH_SENDS):
            answer = self.call("BatchGetItem", {"RequestItems": {table.name: pending}})
            items += answer.get("Responses", {}).get(table.name, [])
            pending = answer.get("UnprocessedKeys", {}).get(table.name) or {}
            if not pending.get("Keys"):
                return items
        raise GetError(f"{len(pending['Keys'])} keys of {table.name} unread after "
                       f"{BATCH_SENDS} sends")

    def transaction(self) -> "Transaction":
        return Transaction(self.connection)


class Transaction:
    """A TransactWriteItems, sent when the ``with`` block ends without an
    error, under its own ClientRequestToken: when botocore retries it after
    a lost answer, DynamoDB applies it once (moto ignores the token, so each
    writer also recognises its own write when a retry fails its condition).
    Raises PynamoDB's TransactWriteError when it is cancelled."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._checks: list[dict] = []
        self._deletes: list[dict] = []
        self._puts: list[dict] = []
        self._updates: list[dict] = []

    def check(self, request: dict) -> None:
        self._checks.append(request)

    def delete(self, request: dict) -> None:
        self._deletes.append(request)

    def put(self, request: dict) -> None:
        self._puts.append(request)

    def update(self, request: dict) -> None:
        self._updates.append(request)

    def add(self, items: Iterable[dict]) -> None:
        """Items as TransactWriteItems lists them (``{"Put": request}``,
        ``{"Update": ...}``, ``{"ConditionCheck": ...}``, ``{"Delete": ...}``):
        a transaction's requests built once, for the store to send and for a
        benchmark to send bare."""
        sorts = {"ConditionCheck": self.check, "Delete": self.delete, "Put": self.put,
                 "Update": self.update}
        for item in items:
            (kind, request), = item.items()
            sorts[kind](request)

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            answer = self._connection.transact_write_items(
                condition_check_items=self._checks, delete_items=self._deletes,
                put_items=self._puts, update_items=self._updates,
                client_request_token=os.urandom(16).hex(),
                return_consumed_capacity=_NO_CAPACITY)
            if not isinstance(answer, dict):  # applied or not: unknown
                raise EmptyAnswer("TransactWriteItems")


class Changes:
    """The clauses of one UpdateExpression on an item of ``table``, gathered
    as a transition adds them: each attribute's value goes through the
    model's codec under the placeholder ``:<name>``, and each event of the
    ``events`` map under a key placeholder of its own (an event's key holds
    ``#``, which no placeholder may)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._set: list[str] = []
        self._remove: list[str] = []
        self._add: list[str] = []
        self._delete: list[str] = []
        self.values: dict[str, dict] = {}
        self.keys: dict[str, str] = {}
        self._unfed: set[str] = set()

    def set(self, name: str, value: Any) -> "Changes":
        """SET the attribute to ``value`` (its python value); None removes it."""
        if value is None:
            return self.remove(name)
        self._set.append(f"#{name} = :{name}")
        self.values[f":{name}"] = self.table.value(name, value)
        return self

    def remove(self, *names: str) -> "Changes":
        self._remove.extend(f"#{name}" for name in names)
        return self

    def add(self, name: str, value: Any) -> "Changes":
        """ADD ``value`` to a number or to a set (of the attribute's type)."""
        self._add.append(f"#{name} :{name}")
        self.values[f":{name}"] = self.table.value(name, value)
        return self

    def delete(self, name: str, value: Any) -> "Changes":
        """DELETE the members ``value`` from a set."""
        self._delete.append(f"#{name} :{name}")
        self.values[f":{name}"] = self.table.value(name, value)
        return self

    def entry(self, name: str, key: str, value: Any, *, first: bool = False) -> "Changes":
        """SET one entry of the map attribute ``name``; with ``first``, a
        repeat keeps the entry already there (``if_not_exists``)."""
        n = len(self.keys)
        placeholder, ref = f"#k{n}", f":k{n}"
        self.keys[placeholder] = key
        path = f"#{name}.{placeholder}"
        self._set.append(f"{path} = if_not_exists({path}, {ref})" if first else f"{path} = {ref}")
        self.values[ref] = self.table.value(name, {key: value})["M"][key]
        return self

    def entry_field(self, name: str, key: str, field: str, value: Any) -> "Changes":
        """SET one field of the map held under ``key`` in the map attribute
        ``name`` (that map must exist: DynamoDB makes no parent of a path)."""
        n = len(self.keys)
        outer, inner, ref = f"#k{n}", f"#k{n + 1}", f":k{n}"
        self.keys[outer], self.keys[inner] = key, field
        self._set.append(f"#{name}.{outer}.{inner} = {ref}")
        self.values[ref] = self.table.value(name, {key: {field: value}})["M"][key]["M"][field]
        return self

    def event(self, key: str, value: dict) -> "Changes":
        """Record one event of the item's story (domain/events.py): the first
        of a repeat stays. One the tenant's feed tells is marked unfed in
        the same write (domain/feed.py): its key joins ``unfed_keys``, and
        the item joins its tenant's ``unfed`` index partition."""
        self.entry("events", key, value, first=True)
        if self.table.tells is not None and self.table.tells(key):
            if not self._unfed:
                self._set.append("#unfed = #tenant")
                self._add.append("#unfed_keys :unfed_keys")
            self._unfed.add(key)
            self.values[":unfed_keys"] = self.table.value("unfed_keys", self._unfed)
        return self

    @property
    def expression(self) -> str:
        parts = []
        for word, clauses in (("SET", self._set), ("REMOVE", self._remove),
                              ("ADD", self._add), ("DELETE", self._delete)):
            if clauses:
                parts.append(f"{word} {', '.join(clauses)}")
        return " ".join(parts)

    def update(self, key: dict, *, condition: str | None = None,
               values: dict | None = None, return_new: bool = False) -> dict:
        """The UpdateItem of these changes on the item of ``key``, on
        ``condition`` (whose ``values`` join the changes')."""
        return self.table.update(key, self.expression, condition=condition,
                                 values={**self.values, **(values or {})},
                                 keys=self.keys, return_new=return_new)
