"""The LogReader port on CloudWatch Logs: one FilterLogEvents call a page.

More than ``MAX_STREAM_NAMES`` streams are asked for by name prefix, which the
embedded moto ignores: it answers with every stream of the log group. What it
returns is passed on as it is; chalicelib/service/logs.py checks every stream
(``LogScope``)."""
from __future__ import annotations

from typing import Any, Callable

from ..config import Config
from ..service.ports import LogPage
from . import aws

#: FilterLogEvents takes at most this many stream names
MAX_STREAM_NAMES = 100


def logs_client(config: Config):
    """The container's CloudWatch Logs client, from its one botocore session."""
    return aws.session_for(config.region, config.endpoint_url).client("logs")


class CloudWatchLogReader:
    def __init__(self, config: Config, factory: Callable[[Config], object] = logs_client) -> None:
        self._config, self._factory = config, factory
        self._client: Any = None

    @property
    def client(self):
        if self._client is None:  # made on first use: cold starts that never read logs skip it
            self._client = self._factory(self._config)
        return self._client

    def read(self, streams: list[str], prefix: str, *, start_ms: int | None,
             token: str | None, limit: int) -> LogPage:
        if self._config.log_group is None:
            return LogPage([], None)
        # interleaved: what CloudWatch always does (it ignores the flag), and moto
        # only when asked; without it moto answers stream after stream
        args: dict = {"logGroupName": self._config.log_group, "limit": limit,
                      "interleaved": True}
        if len(streams) <= MAX_STREAM_NAMES:
            args["logStreamNames"] = streams
        else:
            args["logStreamNamePrefix"] = prefix
        if start_ms is not None:
            args["startTime"] = start_ms
        if token:
            args["nextToken"] = token
        try:
            out = self.client.filter_log_events(**args)
        except self.client.exceptions.ResourceNotFoundException:
            return LogPage([], None)  # no stream yet: nothing was written
        events = [(e["logStreamName"], int(e["timestamp"]), e["message"], e.get("eventId"))
                  for e in out.get("events", [])]
        return LogPage(events, out.get("nextToken") or None)
