"""What a request's metrics cost: gpujobs' EMF records against Powertools' Metrics.

A create or a cancel counts one metric, then the invocation's end writes its
EMF record. Timed per request (``begin``, one ``count``, ``flush``, the
record written to /dev/null as Lambda's runtime would read it from stdout),
interleaved in the same run: chalicelib/adapters/telemetry.py's
LambdaTelemetry, and the same calls through Powertools' ``Metrics``
(``add_metric``, ``flush_metrics``), which it replaced. First checks that both
write the same record, Timestamp aside. Ends with ``telemetry-bench:
us_gpujobs=.. us_powertools=.. ratio=..``; ``--quick`` times fewer calls.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import statistics
import sys
import timeit

import _quiet  # noqa: F401 - first: no INFO logs unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402


def powertools_request(metrics, logger, unit) -> None:
    """One request's telemetry as the app did it through Powertools."""
    logger.append_keys(request_id="req-1")
    metrics.add_metric(name="JobsCreated", unit=unit, value=1)
    metrics.flush_metrics(raise_on_empty_metrics=False)


def main() -> None:
    args = harness.parser(__doc__).parse_args()
    n, rounds = (500, 3) if args.quick else (5000, 15)
    os.environ["POWERTOOLS_METRICS_DISABLED"] = "false"  # both write, as on Lambda
    from aws_lambda_powertools import Logger, Metrics
    from aws_lambda_powertools.metrics import MetricUnit

    from chalicelib.adapters.telemetry import LambdaTelemetry

    sink = open(os.devnull, "w")
    ours = LambdaTelemetry(stream=sink, metrics_to=sink)
    metrics, logger = Metrics(namespace="gpujobs", service="gpujobs"), Logger(service="gpujobs")

    def gpujobs_request() -> None:
        ours.begin("req-1")
        ours.count("JobsCreated")
        ours.flush()

    # the same record from both, or the comparison means nothing
    mine, theirs = io.StringIO(), io.StringIO()
    ours._metrics_to = mine
    gpujobs_request()
    ours._metrics_to = sink
    with contextlib.redirect_stdout(theirs):
        powertools_request(metrics, logger, MetricUnit.Count)
    a, b = json.loads(mine.getvalue()), json.loads(theirs.getvalue())
    for record in (a, b):
        record["_aws"].pop("Timestamp")
    if a != b:
        raise harness.Fail(f"the records differ:\n  gpujobs    {a}\n  powertools {b}")

    real_stdout = sys.stdout
    mine_us, theirs_us = [], []
    try:
        sys.stdout = sink  # where Powertools prints
        for _ in range(rounds):
            mine_us.append(timeit.timeit(gpujobs_request, number=n) / n * 1e6)
            theirs_us.append(timeit.timeit(
                lambda: powertools_request(metrics, logger, MetricUnit.Count), number=n) / n * 1e6)
    finally:
        sys.stdout = real_stdout
    m, t = statistics.median(mine_us), statistics.median(theirs_us)
    print(f"one request's metrics (begin, count, flush; medians of {rounds} x {n} calls): "
          f"gpujobs {m:.1f} us, Powertools Metrics {t:.1f} us, ratio {m / t:.2f}")
    harness.machine_line("telemetry", us_gpujobs=f"{m:.1f}", us_powertools=f"{t:.1f}",
                         ratio=f"{m / t:.2f}")


if __name__ == "__main__":
    main()
