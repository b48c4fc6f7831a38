"""moto's TransactWriteItems without a copy of every table it touches.

moto (5.x) keeps a rollback copy of a transaction's tables by deep-copying
each table once per item of the transaction, whatever the transaction
touches: a create on the local stack (the job, the tenant's count, a
fleet's check) copied the jobs table two or three times, so each create
cost O(jobs), a flood of 520 jobs O(jobs²), all of it inside the one write
lock the embedded server admits (devstack/motoserver.py), with every read
of every other tenant waiting behind it (issue 24, item 6: 0.2-0.5 s a
create, reads of 5-15 s).

Here the rollback copy is of the items the transaction names alone (each
deep-copied before the transaction, put back, or removed, if it is
cancelled), and moto's copy of a table is the table itself. DynamoDB's
answer is unchanged: the same cancellation reasons, the same items after
a cancelled transaction. The embedded server runs one write at a time, so
nothing else changes a table meanwhile. ``install()`` is called by
MotoServer; tests/unit/test_mototx.py holds the answers to moto's own.
"""
from __future__ import annotations

import copy
import threading
import types
from typing import Any

_lock = threading.Lock()
_installed = False
#: set while one of this module's transactions runs on this thread
_here = threading.local()


def _copy_module(table_type: type) -> types.ModuleType:
    """``copy`` as moto's backend module sees it: a table deep-copied inside
    a transaction of ours is the table itself; anything else is copied."""
    shim = types.ModuleType("copy")
    shim.__dict__.update(copy.__dict__)

    def deepcopy(value: Any, memo: Any = None) -> Any:
        if isinstance(value, table_type) and getattr(_here, "active", False):
            return value
        return copy.deepcopy(value, memo)
    shim.deepcopy = deepcopy  # type: ignore[attr-defined]
    return shim


def _key_of(table: Any, op_type: str, op: dict) -> tuple[Any, Any] | None:
    from moto.dynamodb.models.dynamo_type import DynamoType

    key = op.get("Item") if op_type == "Put" else op.get("Key")
    if not isinstance(key, dict) or table.hash_key_attr not in key:
        return None
    range_value = None
    if table.range_key_attr is not None:
        if table.range_key_attr not in key:
            return None
        range_value = DynamoType(key[table.range_key_attr])
    return DynamoType(key[table.hash_key_attr]), range_value


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        from moto.dynamodb import models
        from moto.dynamodb.models.table import Table

        models.copy = _copy_module(Table)
        original = models.DynamoDBBackend.transact_write_items

        def transact_write_items(self, transact_items: list[dict[str, Any]]) -> None:
            saved = []
            for item in transact_items if isinstance(transact_items, list) else ():
                if not isinstance(item, dict) or len(item) != 1:
                    continue
                (op_type, op), = item.items()
                table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
                key = None if table is None else _key_of(table, op_type, op)
                if table is None or key is None:
                    continue  # moto answers it as it does (a validation error, or no table)
                try:
                    current = table.get_item(*key)
                except Exception:  # noqa: BLE001 - moto's own call will say what is wrong
                    continue
                saved.append((table, key, copy.deepcopy(current)))
            _here.active = True
            try:
                return original(self, transact_items)
            except BaseException:
                for table, (hash_value, range_value), before in reversed(saved):
                    if range_value is None:
                        if before is None:
                            table.items.pop(hash_value, None)
                        else:
                            table.items[hash_value] = before
                    elif before is None:
                        table.items.get(hash_value, {}).pop(range_value, None)
                    else:
                        table.items[hash_value][range_value] = before
                raise
            finally:
                _here.active = False

        models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
        _installed = True
