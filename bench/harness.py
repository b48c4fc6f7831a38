"""What every benchmark in bench/ shares: the argument parser (with ``--quick``),
the environment, moto (in-process or the embedded server) with the stack
deployed from infra/template.yaml, request counting, timing, and the
machine-readable last line.

A benchmark prints ratios against a baseline measured in the same run, and ends
with one line ``<name>-bench: key=value ...`` (``machine_line``) that
tests/test_bench_smoke.py looks for when it runs every benchmark with
``--quick``. ``--quick`` means seconds and small sizes: it checks that the
benchmark still runs against the current code, not what it measures.

Every use of moto's *internals* (not its public API) is in the last section of
this module, each behind one documented function; see docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import gc
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable, Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REGION = "us-east-1"
#: DynamoDB operations that read; every other DynamoDB operation writes
READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"})


class Fail(RuntimeError):
    """A benchmark's own check failed: its numbers would mean nothing."""


# -- arguments and output -------------------------------------------------------------
def parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmark's parser, with ``--quick`` (seconds, small sizes: the smoke
    test's mode) and ``--seed``."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="seconds and small sizes: does it still run? (the smoke test)")
    p.add_argument("--seed", type=int, default=1)
    return p


def pick(value, default, quick_value, quick: bool):
    """An option's value: as given, else its quick or its default size."""
    if value is not None:
        return value
    return quick_value if quick else default


def banner(what: str, moto_mode: str | None = "in-process") -> None:
    line = (f"gpujobs {what} benchmark, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; "
            f"Python {platform.python_version()}")
    if moto_mode:
        import moto

        line += f", moto {moto.__version__} {moto_mode}"
    print(f"{line}, {os.cpu_count()} CPUs", flush=True)


def machine_line(name: str, **values: Any) -> str:
    """Print (and return) ``<name>-bench: k=v ...``, the line scripts and the
    smoke test read. Floats get two decimals unless already rounded."""
    text = f"{name}-bench: " + " ".join(f"{k}={v}" for k, v in values.items())
    print(text, flush=True)
    return text


# -- environment ------------------------------------------------------------------------
def aws_environment(**extra: str) -> None:
    """Fake credentials, the region, a page-token key; no profile or endpoint
    from the caller's shell leaks in."""
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION,
                       "GPUJOBS_PAGE_TOKEN_KEY": "bench-page-token-key", **extra})
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "GPUJOBS_AWS_ENDPOINT_URL",
                 "GPUJOBS_TOKENS_FILE"):
        os.environ.pop(name, None)


def start_moto(**extra_env: str) -> None:
    """moto in-process (``mock_aws``: requests answered on the calling thread,
    no I/O) and the request counter, before any client exists."""
    aws_environment(**extra_env)
    from moto import mock_aws

    mock_aws().start()
    install_request_counter()


def deploy(stage: str, endpoint_url: str | None = None, *, tokens: list[dict] | None = None,
           install: bool = True, clock=None):
    """The stack from infra/template.yaml, deployed through CloudFormation by
    ``devstack.resources.deploy`` (as the tests and ``make up`` do), its
    ``GPUJOBS_*`` variables in the environment; returns services built on it
    by ``bootstrap.build`` (and installed for the handlers), on ``clock`` if
    given."""
    from chalicelib import bootstrap
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.config import Config
    from devstack import resources

    env = {k: v for k, v in resources.deploy(endpoint_url, stage=stage, region=REGION).items()
           if v is not None}
    os.environ.update(env)
    services = bootstrap.build(Config.from_env(), tokens=TokenStore.from_entries(tokens or []),
                               **({"clock": clock} if clock is not None else {}))
    if install:
        bootstrap.install(services)
    return services


def moto_server():
    """The embedded moto server (devstack.motoserver), started: the app talks to
    it over loopback, so this process's CPU time for a call is the client's.
    Stop it with ``.stop()``."""
    aws_environment()
    from devstack.motoserver import MotoServer

    return MotoServer().start()


# -- counting requests ------------------------------------------------------------------
#: (service, operation) of every HTTP request any botocore client made; clear
#: before a timed call
CALLS: list[tuple[str, str]] = []
#: CPU seconds spent creating clients, by service
CLIENT_CREATION_S: dict[str, float] = {}


def install_request_counter() -> None:
    """Hook every botocore client created from now on: PynamoDB makes its own
    botocore clients, boto3 (the SQS inbox, the baselines) others; all of them
    go through botocore.session.Session.create_client. ``request-created``
    fires once per HTTP attempt, so retries count too."""
    import botocore.session

    original = botocore.session.Session.create_client
    if getattr(original, "_bench_counting", False):
        return

    def create_client(self, service_name, *args, **kwargs):
        t0 = time.thread_time()
        client = original(self, service_name, *args, **kwargs)
        CLIENT_CREATION_S[service_name] = (CLIENT_CREATION_S.get(service_name, 0.0)
                                           + time.thread_time() - t0)

        def count(operation_name=None, **_):
            CALLS.append((service_name, operation_name))

        client.meta.events.register("request-created", count)
        return client

    create_client._bench_counting = True  # type: ignore[attr-defined]
    botocore.session.Session.create_client = create_client


def split(calls: Iterable[tuple[str, str]]) -> collections.Counter:
    """{"reads": n, "writes": n, "sqs": n} and the count of every operation."""
    out: collections.Counter = collections.Counter()
    for service, op in calls:
        if service == "dynamodb":
            out["reads" if op in READS else "writes"] += 1
            out[op] += 1
        elif service == "sqs":
            out["sqs"] += 1
            out["sqs:" + op] += 1
        else:
            out[f"{service}:{op}"] += 1
    return out


def plain_clients():
    """The baselines' clients: plain boto3, no parameter validation (as
    PynamoDB configures its own); returns (dynamodb, sqs)."""
    import boto3
    from botocore.config import Config as BotoConfig

    session = boto3.session.Session()
    plain = BotoConfig(parameter_validation=False)
    return (session.client("dynamodb", region_name=REGION, config=plain),
            session.client("sqs", region_name=REGION, config=plain))


# -- fixtures -----------------------------------------------------------------------------
def new_job(services, tenant: str, body: dict, key: str | None = None):
    """A job submitted as the route submits it (``services.jobs.submit``),
    read back as the Job the store holds (untimed set-up: one more read)."""
    view, _ = services.jobs.submit(tenant, body, key)
    return services.store.get(view["job_id"])


# -- timing -----------------------------------------------------------------------------
class Sample:
    """One timed call: wall and CPU milliseconds, the requests it made, its result."""

    __slots__ = ("wall_ms", "cpu_ms", "calls", "result")

    def __init__(self, wall_ms: float, cpu_ms: float, calls: tuple, result: Any) -> None:
        self.wall_ms, self.cpu_ms, self.calls, self.result = wall_ms, cpu_ms, calls, result


def timed(fn: Callable[[], Any], *, cpu: str = "thread", no_gc: bool = False) -> Sample:
    """Time ``fn()``: CPU time of the calling thread (``cpu="thread"``: moto
    in-process answers on it, so this is the work done and other processes
    barely move it) or of the process (``"process"``: when the code under test
    uses a thread pool), and wall time. With ``no_gc``, as timeit does, the
    cyclic GC is off inside the call (moto's whole-table copies would set off
    full collections of its heap, a cost of neither side)."""
    clock = time.thread_time_ns if cpu == "thread" else time.process_time_ns
    if no_gc:
        gc.collect()
    CALLS.clear()
    if no_gc:
        gc.disable()
    try:
        c0, t0 = clock(), time.perf_counter_ns()
        result = fn()
        wall, used = time.perf_counter_ns() - t0, clock() - c0
    finally:
        if no_gc:
            gc.enable()
    return Sample(wall / 1e6, used / 1e6, tuple(CALLS), result)


def median_ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of a/b within each round (pairs measured together)."""
    return statistics.median(x / y for x, y in zip(a, b))


# -- item parity ----------------------------------------------------------------------------
def same_items(name: str, ours: dict, theirs: dict, *, ids: Iterable[str] = (),
               ignore: Iterable[str] = ()) -> None:
    """Fail unless two DynamoDB items (wire format) are the same but for the
    named ``ids`` (replaced by ``<id>`` wherever they occur) and the attributes
    in ``ignore`` (whose presence must still agree): how a benchmark proves
    that the items its bare-boto3 baseline writes are the items the adapter
    writes. ISO timestamps are not compared: the two sides run moments apart.
    Ids are replaced inside every string, JSON held in a string included."""
    import re

    ignore, ids = set(ignore), list(ids)
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")

    def norm(value):
        if isinstance(value, dict):
            return {norm(k): norm(v) for k, v in value.items()}
        if isinstance(value, list):
            return [norm(v) for v in value]
        if isinstance(value, str):
            for i in ids:
                value = value.replace(i, "<id>")
            return stamp.sub("<time>", value)
        return value

    def top(item: dict) -> dict:
        return {k: ("<ignored>" if k in ignore else v) for k, v in norm(item).items()}

    a, b = top(ours), top(theirs)
    if a != b:
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        raise Fail(f"parity {name}: the baseline's item differs from the adapter's in "
                   f"{diff}: baseline {[a.get(k) for k in diff]!r}, adapter "
                   f"{[b.get(k) for k in diff]!r}")


# -- moto's internals: the only place the benchmarks touch them ------------------------------
def moto_housekeeping() -> None:
    """Undo two moto behaviours that make every call slower as a long run goes
    on (untimed, between rounds). (1) ``BaseModel.__new__`` appends every model
    instance to ``instances_tracked`` (for moto's dashboard), the whole-table
    copies of every TransactWriteItems included: ``reset_model_data()``, which
    moto's own reset calls, drops them. (2) Deleting from a table with a range
    key leaves the hash key's empty bucket behind, and every later whole-table
    copy copies it: the empty buckets are dropped."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.core.model_instances import reset_model_data
    from moto.dynamodb.models import dynamodb_backends

    reset_model_data()
    for table in dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].tables.values():
        if table.has_range_key:
            for key in [k for k, v in table.items.items() if not v]:
                del table.items[key]


class partition_queries:
    """A base-table Query on a table with a range key reads only the hash key's
    bucket (``Table.items[hash_key]``), as DynamoDB reads one partition, instead
    of moto's walk over every item of the table. The items and their order are
    the same: moto filters the walk by hash key and sorts by range key, which is
    what it still does here, over the bucket (bench/scan.py checks this against
    moto's own answer with ``moto_query``). Index Queries are unchanged."""

    def __enter__(self):
        from moto.dynamodb.models.table import Table

        self._table, self._query = Table, Table.query
        original = self._query

        def query(table, hash_key, *args, **kwargs):
            index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
            if index_name or not table.has_range_key:
                return original(table, hash_key, *args, **kwargs)
            bucket = table.items.get(hash_key) or {}
            table.all_items = lambda: list(bucket.values())  # shadows the method
            try:
                return original(table, hash_key, *args, **kwargs)
            finally:
                del table.all_items

        Table.query = query
        return self

    def __exit__(self, *exc) -> None:
        self._table.query = self._query

    def moto_query(self):
        """A block in which moto's own Query answers (inside this one)."""
        patch = self

        class _own:
            def __enter__(self):
                self._patched = patch._table.query
                patch._table.query = patch._query

            def __exit__(self, *exc):
                patch._table.query = self._patched

        return _own()


#: CPU nanoseconds this thread spent inside moto's in-process stub since the
#: last clear (``moto_cpu_timer``)
MOTO_CPU_NS = [0]


def moto_cpu_timer() -> None:
    """Time moto's in-process stub (``BotocoreStubber.process_request``), where
    every mocked request is answered, into ``MOTO_CPU_NS``: a call's CPU time
    minus that share is the client side (app, PynamoDB, botocore), what a
    Lambda pays on AWS, where DynamoDB and SQS answer elsewhere (the
    client-side ratios of bench/endpoints.py and bench/scan_rank_cost.py);
    patching the class times every client, made before or after."""
    from moto.core.botocore_stubber import BotocoreStubber

    original = BotocoreStubber.process_request
    if getattr(original, "_bench_moto_timed", False):
        return

    def process_request(self, request):
        t0 = time.thread_time_ns()
        try:
            return original(self, request)
        finally:
            MOTO_CPU_NS[0] += time.thread_time_ns() - t0

    process_request._bench_moto_timed = True  # type: ignore[attr-defined]
    BotocoreStubber.process_request = process_request
