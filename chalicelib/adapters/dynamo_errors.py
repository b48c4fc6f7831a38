"""How DynamoDB and SQS failures read to the services and the entry points.

A lost condition is a fact the service acts on (someone else got there first):
the adapters turn it into a domain answer where it happens. Every other failure
of a dependency (timeouts, dropped connections, throttling, 5xx, whatever
botocore raises, directly or wrapped by PynamoDB) is told apart here, by
:func:`dependency_failure`, and answered once, at the boundary where requests
and events enter (chalicelib/api/edge.py, through bootstrap): 503 with
Retry-After, so clients retry. Anything else is a bug and surfaces as such.
One boundary covers every adapter method, generators included, since a
generator is only ever drained inside a request or event.
"""
from __future__ import annotations

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError
from pynamodb.exceptions import DoesNotExist, PynamoDBException, TransactWriteError

from ..domain.errors import ServiceUnavailable
from .dynamo import ConditionFailed, EmptyAnswer

_CONFLICT = "ConditionalCheckFailedException"


def response_code(e: BaseException) -> str | None:
    """The DynamoDB error code PynamoDB's error wraps, or None. Not PynamoDB's
    ``cause_response_code``: that reads ``cause.response``, which botocore's
    timeouts and dropped connections have and set to None, so it raises
    AttributeError exactly when the call timed out."""
    response = getattr(getattr(e, "cause", None), "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def lost_condition(e: Exception) -> bool:
    """A single write lost its condition: dynamo.ConditionFailed (the one
    sender), botocore's ClientError, or PynamoDB's error wrapping it."""
    if isinstance(e, ConditionFailed):
        return True
    if isinstance(e, ClientError):
        return e.response.get("Error", {}).get("Code") == _CONFLICT
    return response_code(e) == _CONFLICT


def tx_lost(e: TransactWriteError) -> bool:
    """A transaction lost to a condition or to a concurrent transaction."""
    codes = {r.code for r in (e.cancellation_reasons or []) if r is not None}
    return bool(codes & {"ConditionalCheckFailed", "TransactionConflict"})


#: error codes that say "busy or unwell, try again", DynamoDB's and SQS's
TRANSIENT_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "Throttling",
    "RequestLimitExceeded", "InternalServerError", "InternalFailure", "InternalError",
    "ServiceUnavailable", "ServiceUnavailableException", "TransactionInProgressException",
    "RequestThrottled", "AWS.SimpleQueueService.RequestThrottled", "SlowDown",
    "LimitExceededException", "TooManyRequestsException", "RequestTimeout",
    "RequestTimeoutException", "PriorRequestNotComplete",
    # a transaction's per-item reasons
    "ThrottlingError", "ProvisionedThroughputExceeded",
})


def _client_error_transient(e: ClientError) -> bool:
    err = e.response.get("Error", {}) if isinstance(e.response, dict) else {}
    status = (e.response.get("ResponseMetadata", {}) if isinstance(e.response, dict)
              else {}).get("HTTPStatusCode") or 0
    return err.get("Code") in TRANSIENT_CODES or int(status) >= 500


def dependency_failure(e: BaseException) -> bool:
    """True when ``e`` says a dependency failed (retry later), not that the
    request or the code is wrong."""
    if isinstance(e, (ServiceUnavailable, EmptyAnswer)):
        return True
    if isinstance(e, TransactWriteError):
        reasons = {r.code for r in (e.cancellation_reasons or []) if r is not None}
        if reasons & TRANSIENT_CODES:
            return True
        if not reasons and response_code(e) == "TransactionCanceledException":
            return True  # cancelled, and no item says why: an empty answer
    if isinstance(e, PynamoDBException):
        if isinstance(e, DoesNotExist):
            return False
        cause = e.cause
        if cause is None:  # e.g. unprocessed batch items after every retry
            code = response_code(e)
            return code is None or code in TRANSIENT_CODES
        return dependency_failure(cause)
    if isinstance(e, ParamValidationError):
        return False  # a request botocore refused to send: a bug
    if isinstance(e, BotoCoreError):
        return True  # timeouts, dropped or refused connections, credentials, ...
    if isinstance(e, ClientError):
        return _client_error_transient(e)
    return False

