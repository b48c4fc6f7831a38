"""How DynamoDB failures read to the services.

A lost condition is a fact the service acts on (someone else got there first);
throttling and unreachable storage become 503 with Retry-After, so clients
retry; anything else is a bug and surfaces as such.
"""
from __future__ import annotations

import functools

from pynamodb.exceptions import DoesNotExist, PynamoDBException, TransactWriteError

from ..domain.errors import ServiceUnavailable

_CONFLICT = "ConditionalCheckFailedException"


def lost_condition(e: Exception) -> bool:
    return getattr(e, "cause_response_code", None) == _CONFLICT


def tx_lost(e: TransactWriteError) -> bool:
    """A transaction lost to a condition or to a concurrent transaction."""
    codes = {r.code for r in (e.cancellation_reasons or []) if r is not None}
    return bool(codes & {"ConditionalCheckFailed", "TransactionConflict"})


_TRANSIENT = {"ProvisionedThroughputExceededException", "ThrottlingException",
              "RequestLimitExceeded", "InternalServerError", "ServiceUnavailable"}


def _transient_as_unavailable(fn):
    """Throttling and unreachable storage become 503 + Retry-After: retry, not a bug."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PynamoDBException as e:
            code = e.cause_response_code
            if code in _TRANSIENT or (code is None and not isinstance(e, DoesNotExist)):
                raise ServiceUnavailable("storage is busy or unreachable; retry",
                                         headers={"Retry-After": "1"}) from e
            raise
    return wrapper


class Translating(type):
    def __new__(mcs, name, bases, ns):
        for k, v in list(ns.items()):
            if callable(v) and not k.startswith("_"):
                ns[k] = _transient_as_unavailable(v)
        return super().__new__(mcs, name, bases, ns)
