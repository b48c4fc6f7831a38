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
#: the active meter (a ``write_units``, bench/endpoints.py's FleetReads), if
#: any: told of every DynamoDB request before it is sent and after it is
#: answered (``install_request_counter``)
WRITE_METER: list = [None]


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
        if service_name == "dynamodb":
            meter_client(client)
        return client

    create_client._bench_counting = True  # type: ignore[attr-defined]
    botocore.session.Session.create_client = create_client


def meter_client(client) -> None:
    """Tell the active ``write_units`` meter (``WRITE_METER``) of every request
    this DynamoDB client makes: its parameters before it is built, its status
    once it is answered (botocore's ``before-parameter-build`` and
    ``after-call`` events, once per call, retries included)."""
    def before(params=None, model=None, context=None, **_):
        meter = WRITE_METER[0]
        if meter is not None and context is not None:
            meter.before(model.name, params, context)

    def after(http_response=None, context=None, **_):
        meter = WRITE_METER[0]
        if meter is not None and context is not None:
            meter.after(getattr(http_response, "status_code", 500), context)

    client.meta.events.register("before-parameter-build.dynamodb", before)
    client.meta.events.register("after-call.dynamodb", after)


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


# -- write units: DynamoDB's pricing rules over the items moto holds ---------------------
#: DynamoDB operations that write, and whether each item they write is a
#: transaction's (twice the units)
_WRITES = {"PutItem": False, "UpdateItem": False, "DeleteItem": False,
           "BatchWriteItem": False, "TransactWriteItems": True}


def _number_size(text: str) -> int:
    """A number's size: about one byte per two significant digits, plus one."""
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def value_size(value: dict) -> int:
    """The size DynamoDB bills for one attribute value (wire format): strings
    and binaries by their bytes, numbers by their digits, 1 byte for a
    boolean or null, and 3 bytes plus 1 a member for a list or a map
    (CapacityUnitCalculations in the DynamoDB developer guide)."""
    (kind, v), = value.items()
    if kind == "S":
        return len(v.encode("utf-8"))
    if kind == "N":
        return _number_size(v)
    if kind == "B":
        return len(v) * 3 // 4 if isinstance(v, str) else len(v)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(x.encode("utf-8")) for x in v)
    if kind == "NS":
        return sum(_number_size(x) for x in v)
    if kind == "BS":
        return sum(len(x) * 3 // 4 if isinstance(x, str) else len(x) for x in v)
    if kind == "L":
        return 3 + sum(1 + value_size(x) for x in v)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + value_size(x) for k, x in v.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict | None) -> int:
    """An item's billed size: its attribute names and values (wire format)."""
    if not item:
        return 0
    return sum(len(k.encode("utf-8")) + value_size(v) for k, v in item.items())


def _units(size: int) -> int:
    """Write units of one item of ``size`` bytes: 1 per started KB, at least 1."""
    return max(1, -(-size // 1024))


class write_units:
    """Meter the DynamoDB write units of the requests made inside the block,
    by DynamoDB's rules, from the items moto holds before and after each
    write (moto's own ``ConsumedCapacity`` is a constant, not a size):

    - the table: 1 unit per started KB of the larger of the item's old and
      new image, twice that for an item of a ``TransactWriteItems``;
    - each global secondary index: an entry put or deleted costs the units of
      its projected item, one whose index key changed costs both (a delete
      and a put), one whose projected attributes changed costs one put, and
      an item outside the index (a sparse index) costs nothing. Index writes
      are propagated after the write and are counted once, transactions
      included.

    A write that fails its condition is counted at its table's units (no
    index). ``ConditionCheck`` items are counted as transaction writes of
    the item checked; ``checks`` says how many there were. The meter's own
    work (the lookups and sizes) is timed into ``cpu_ns`` (thread CPU) and
    ``wall_ns``, for the caller to take out of its timings. Needs
    ``install_request_counter`` (the hooks on every DynamoDB client)."""

    def __init__(self) -> None:
        self.table = 0
        self.index = 0
        self.by_table: collections.Counter = collections.Counter()
        self.items = 0
        self.failed = 0
        self.checks = 0
        #: hook calls that raised (a table moto does not hold, ...): not counted
        self.errors = 0
        self.cpu_ns = 0
        self.wall_ns = 0

    @property
    def total(self) -> int:
        return self.table + self.index

    def __enter__(self) -> "write_units":
        WRITE_METER[0] = self
        return self

    def __exit__(self, *exc) -> None:
        WRITE_METER[0] = None

    # -- the hooks ---------------------------------------------------------------
    def before(self, operation: str, params: dict, context: dict) -> None:
        if operation not in _WRITES:
            return
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            self._before(operation, params, context)
        except Exception:  # noqa: BLE001 - a meter never changes the request
            self.errors += 1
        self.cpu_ns += time.thread_time_ns() - c0
        self.wall_ns += time.perf_counter_ns() - t0

    def _before(self, operation: str, params: dict, context: dict) -> None:
        targets = []  # (table, key, transactional, check)
        tx = _WRITES[operation]
        if operation == "TransactWriteItems":
            for entry in params.get("TransactItems", []):
                (kind, body), = entry.items()
                targets.append((body["TableName"], _key_of(body), tx, kind == "ConditionCheck"))
        elif operation == "BatchWriteItem":
            for table, requests in params.get("RequestItems", {}).items():
                for request in requests:
                    (kind, body), = request.items()
                    targets.append((table, _key_of(body, table), False, False))
        else:
            targets.append((params["TableName"], _key_of(params), False, False))
        context["_bench_write_units"] = [(t, k, x, c, moto_item(t, k)) for t, k, x, c in targets]

    def after(self, status: int, context: dict) -> None:
        targets = context.pop("_bench_write_units", None)
        if targets is None:
            return
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            self._after(status, targets)
        except Exception:  # noqa: BLE001 - a meter never changes the request
            self.errors += 1
        self.cpu_ns += time.thread_time_ns() - c0
        self.wall_ns += time.perf_counter_ns() - t0

    def _after(self, status: int, targets: list) -> None:
        for table, key, tx, check, old in targets:
            new = old if check or status >= 300 else moto_item(table, key)
            units = _units(max(item_size(old), item_size(new))) * (2 if tx else 1)
            self.table += units
            self.by_table[table] += units
            self.items += 1
            if check:
                self.checks += 1
                continue
            if status >= 300:
                self.failed += 1
                continue
            for index, projected in moto_index_entries(table, old, new):
                self.index += projected
                self.by_table[f"{table}/{index}"] += projected


def _key_of(body: dict, table: str | None = None) -> dict:
    """The primary key a write names: its ``Key``, or its ``Item``'s key."""
    if "Key" in body:
        return body["Key"]
    return moto_key(table or body["TableName"], body["Item"])


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


def _moto_table(name: str):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends

    return dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table(name)


def moto_key(table: str, item: dict) -> dict:
    """The primary key of ``item`` (wire format) in moto's ``table``."""
    t = _moto_table(table)
    names = [t.hash_key_attr] + ([t.range_key_attr] if t.range_key_attr else [])
    return {n: item[n] for n in names}


def moto_item(table: str, key: dict) -> dict | None:
    """The item of ``key`` that moto's ``table`` holds now (wire format), or
    None: what ``write_units`` sizes before and after each write."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    t = _moto_table(table)
    range_key = DynamoType(key[t.range_key_attr]) if t.range_key_attr else None
    found = t.get_item(DynamoType(key[t.hash_key_attr]), range_key)
    return None if found is None else found.to_json()["Attributes"]


def moto_index_entries(table: str, old: dict | None, new: dict | None):
    """(index name, write units) of the entries a write moves in each global
    secondary index of moto's ``table`` (see ``write_units``)."""
    t = _moto_table(table)
    for index in t.global_indexes:
        keys = index.schema_key_attrs
        projection = (index.projection or {}).get("ProjectionType", "ALL")

        kept = set(keys) | set(index.table_key_attrs)
        if projection == "INCLUDE":
            kept |= set((index.projection or {}).get("NonKeyAttributes", []))

        def projected(item: dict, kept=kept, everything=projection == "ALL") -> dict:
            return item if everything else {k: v for k, v in item.items() if k in kept}

        was = old is not None and all(k in old for k in keys)
        now = new is not None and all(k in new for k in keys)
        units = 0
        if was and now:
            if any(old[k] != new[k] for k in keys):
                units = _units(item_size(projected(old))) + _units(item_size(projected(new)))
            elif projected(old) != projected(new):
                units = _units(item_size(projected(new)))
        elif now:
            units = _units(item_size(projected(new)))
        elif was:
            units = _units(item_size(projected(old)))
        if units:
            yield index.name, units
