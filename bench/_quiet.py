"""Benchmarks print their own results: the services' INFO logs and EMF
metric records (meant for CloudWatch) stay off unless asked for with
``GPUJOBS_VERBOSE=1`` (``make bench V=1``). Imported first by every benchmark;
the settings are environment variables, so child interpreters inherit them."""
import os

if os.environ.get("GPUJOBS_VERBOSE", "").lower() not in ("1", "true", "yes"):
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("GPUJOBS_LOG_LEVEL", "WARNING")
