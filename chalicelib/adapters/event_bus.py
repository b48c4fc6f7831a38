"""The EventSink port on EventBridge: every event of the tenants' feeds goes
on the stack's bus (infra/ EventBus), source ``gpujobs``, detail-type the
event's type, detail the event as the feed serves it, so a rule on the bus
routes job events to SQS, SNS, Lambda or Step Functions (API.md)."""
from __future__ import annotations

import json
from typing import Sequence

from ..domain.clock import parse_iso
from . import aws

SOURCE = "gpujobs"
#: PutEvents takes at most 10 entries a call
_PER_CALL = 10


class EventsNotPut(RuntimeError):
    """Some entries were refused: the push is retried (at least once)."""


class EventBridgeSink:
    def __init__(self, bus: str, region: str, endpoint_url: str | None) -> None:
        self._bus = bus
        self._aws = aws.session_for(region, endpoint_url)

    def put(self, events: Sequence[dict]) -> None:
        client = self._aws.client("events")
        for i in range(0, len(events), _PER_CALL):
            entries = [{"Source": SOURCE, "DetailType": e["type"], "Detail": json.dumps(e),
                        "EventBusName": self._bus, "Time": parse_iso(e["time"]),
                        "Resources": []} for e in events[i:i + _PER_CALL]]
            answer = client.put_events(Entries=entries)
            if answer.get("FailedEntryCount"):
                codes = {r.get("ErrorCode") for r in answer.get("Entries", []) if r.get("ErrorCode")}
                raise EventsNotPut(f"{answer['FailedEntryCount']} events not put on "
                                   f"{self._bus}: {', '.join(sorted(map(str, codes)))}")
