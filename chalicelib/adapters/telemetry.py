"""Structured logs through AWS Powertools for Python; CloudWatch metrics as
Embedded Metric Format records.

Every log line of the ``gpujobs`` and ``chalicelib`` loggers is one JSON
object carrying the invocation's request id (Powertools' Logger). Metrics
are EMF records on stdout, which CloudWatch turns into metrics without an API
call: one record per invocation that counted anything.

The records are written here, not by Powertools' Metrics: a request counts
one or two metrics of a fixed vocabulary, and Powertools validates, logs and
serialises each through some twenty calls, on every create and cancel: work
this module skips (bench/telemetry_cost.py compares the two; figures in
docs/benchmarks.md, "Second pass"). The record is the one Powertools writes,
and ``POWERTOOLS_METRICS_DISABLED`` still turns metrics off (the benchmarks'
and the quiet local stack's setting).

Imported on first use (bootstrap), not by ``import app``: Powertools adds to
a cold start (measured in docs/deploy.md).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import IO

from aws_lambda_powertools import Logger

from .. import fastjson

NAMESPACE = "gpujobs"
#: counted on every heartbeat request (thousands a second at scale): summed in
#: the container and emitted once a minute, not one EMF record a request
BATCHED = frozenset({"HeartbeatsIngested"})
BATCH_EVERY_S = 60.0
#: EMF's limit of values per metric in one record
MAX_VALUES = 100
_DISABLED = frozenset({"1", "true", "yes", "on"})


class LambdaTelemetry:
    """``stream`` takes the log lines and ``metrics_to`` the EMF records
    (stdout, as Lambda's runtime reads them, by default); ``metrics`` turns
    metrics on or off (by default on unless POWERTOOLS_METRICS_DISABLED)."""

    def __init__(self, service: str = "gpujobs", stream: IO[str] | None = None, *,
                 metrics_to: IO[str] | None = None, metrics: bool | None = None) -> None:
        self.logger = Logger(service=service)
        # our modules log through the standard library, under these two
        # parents: give them Powertools' JSON formatter, so every line is the
        # same JSON with the same request id
        handler = logging.StreamHandler(stream or sys.stdout)
        #: Powertools' formatter, looked up once: ``Logger.append_keys`` finds
        #: it through the logger's handlers on every call
        self._formatter = self.logger.registered_formatter
        handler.setFormatter(self._formatter)
        for name in ("gpujobs", "chalicelib"):
            parent = logging.getLogger(name)
            parent.handlers = [handler]
            parent.propagate = False
            if parent.level == logging.NOTSET:
                # INFO on Lambda; the local stack and the benchmarks ask for
                # WARNING (GPUJOBS_LOG_LEVEL) unless run with -v
                parent.setLevel(os.environ.get("GPUJOBS_LOG_LEVEL", "INFO").upper())
        self.service = service
        self.enabled = metrics if metrics is not None else \
            os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() not in _DISABLED
        self._metrics_to = metrics_to
        #: name -> (unit, values) of the invocation so far
        self._metrics: dict[str, tuple[str, list[float]]] = {}
        self._batched: dict[str, float] = {}
        self._batched_since = time.monotonic()

    def count(self, name: str, value: float = 1) -> None:
        if name in BATCHED:
            self._batched[name] = self._batched.get(name, 0) + value
            return
        self._add(name, "Count", value)

    def seconds(self, name: str, value: float) -> None:
        self._add(name, "Seconds", value)

    def _add(self, name: str, unit: str, value: float) -> None:
        if not self.enabled:
            return
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = (unit, [])
        metric[1].append(float(value))
        if len(metric[1]) == MAX_VALUES:
            self._emit()

    def begin(self, request_id: str | None) -> None:
        """Every line logged until the next ``begin`` names this request."""
        self._formatter.append_keys(request_id=request_id)

    def flush(self) -> None:
        """Emit the invocation's metrics (an EMF line on stdout), if any; the
        per-request counts of the hot paths once a minute per container."""
        if self._batched and time.monotonic() - self._batched_since >= BATCH_EVERY_S:
            batched, self._batched, self._batched_since = self._batched, {}, time.monotonic()
            for name, value in batched.items():
                self._add(name, "Count", value)
        if self._metrics:
            self._emit()

    def _emit(self) -> None:
        """One EMF record of what was counted since the last, as Powertools'
        Metrics writes it (dimension ``service``, each metric's values)."""
        metrics, self._metrics = self._metrics, {}
        record: dict = {
            "_aws": {
                "Timestamp": int(time.time() * 1000),
                "CloudWatchMetrics": [{
                    "Namespace": NAMESPACE, "Dimensions": [["service"]],
                    "Metrics": [{"Name": name, "Unit": unit}
                                for name, (unit, _) in metrics.items()]}],
            },
            "service": self.service,
        }
        for name, (_, values) in metrics.items():
            record[name] = values
        (self._metrics_to or sys.stdout).write(fastjson.dumps(record) + "\n")
