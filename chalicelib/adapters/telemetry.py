"""Structured logs and CloudWatch metrics through AWS Powertools for Python.

Every log line of the ``gpujobs`` and ``chalicelib`` loggers is one JSON
object carrying the invocation's request id; metrics are Embedded Metric
Format records that CloudWatch turns into metrics without an API call.
Imported on first use (bootstrap), not by ``import app``: measured in
docs/deploy.md, Powertools adds 5-15 ms to a cold start with bytecode.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import IO

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

NAMESPACE = "gpujobs"
#: counted on every heartbeat request (thousands a second at scale): summed in
#: the container and emitted once a minute, not one EMF record a request
BATCHED = frozenset({"HeartbeatsIngested"})
BATCH_EVERY_S = 60.0


class PowertoolsTelemetry:
    def __init__(self, service: str = "gpujobs", stream: IO[str] | None = None) -> None:
        self.logger = Logger(service=service)
        # our modules log through the standard library, under these two
        # parents: give them Powertools' JSON formatter, so every line is the
        # same JSON with the same request id
        handler = logging.StreamHandler(stream or sys.stdout)
        handler.setFormatter(self.logger.registered_formatter)
        for name in ("gpujobs", "chalicelib"):
            parent = logging.getLogger(name)
            parent.handlers = [handler]
            parent.propagate = False
            if parent.level == logging.NOTSET:
                # INFO on Lambda; the local stack and the benchmarks ask for
                # WARNING (GPUJOBS_LOG_LEVEL) unless run with -v
                parent.setLevel(os.environ.get("GPUJOBS_LOG_LEVEL", "INFO").upper())
        self.metrics = Metrics(namespace=NAMESPACE, service=service)
        self._batched: dict[str, float] = {}
        self._batched_since = time.monotonic()

    def count(self, name: str, value: float = 1) -> None:
        if name in BATCHED:
            self._batched[name] = self._batched.get(name, 0) + value
            return
        self.metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)

    def seconds(self, name: str, value: float) -> None:
        self.metrics.add_metric(name=name, unit=MetricUnit.Seconds, value=value)

    def begin(self, request_id: str | None) -> None:
        """Every line logged until the next ``begin`` names this request."""
        self.logger.append_keys(request_id=request_id)

    def flush(self) -> None:
        """Emit the invocation's metrics (an EMF line on stdout), if any; the
        per-request counts of the hot paths once a minute per container."""
        if self._batched and time.monotonic() - self._batched_since >= BATCH_EVERY_S:
            for name, value in self._batched.items():
                self.metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
            self._batched, self._batched_since = {}, time.monotonic()
        if self.metrics.metric_set:  # nothing to say: no record, no warning
            self.metrics.flush_metrics(raise_on_empty_metrics=False)

