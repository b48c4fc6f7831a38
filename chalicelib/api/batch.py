"""SQS batches: the partial batch response (the event sources report
ReportBatchItemFailures), so only the messages that failed are received again
and, past the queue's redrive policy, dead-lettered for a human."""
from __future__ import annotations

import json
import logging
from typing import Any, Callable, Iterable

log = logging.getLogger("gpujobs")
#: a nudge's body, "run placement" (chalicelib/adapters/inbox.py sends it)
NUDGE = {"type": "PLACE"}


def is_nudge(body: str) -> bool:
    try:
        return json.loads(body) == NUDGE
    except ValueError:
        return False


def failures(records: Iterable[Any]) -> dict:
    """The partial batch response naming ``records`` as failed."""
    return {"batchItemFailures": [{"itemIdentifier": r.to_dict()["messageId"]}
                                  for r in records]}


def nudged(event: Iterable[Any], run: Callable[[], object]) -> dict:
    """One ``run`` serves the whole batch of nudges; a message that is no
    nudge is reported failed."""
    run()
    return failures([r for r in event if not is_nudge(r.body)])


def each(event: Iterable[Any], handle: Callable[[str], object], what: str) -> dict:
    """``handle`` every message's body on its own: one that fails is reported
    failed (and logged as the ``what`` that failed), the others stand."""
    failed = []
    for record in event:
        try:
            handle(record.body)
        except Exception:  # noqa: BLE001 - this message only; the others stand
            log.exception("%s %s failed", what, record.to_dict().get("messageId"))
            failed.append(record)
    return failures(failed)
