"""pytest plugin: every AWS call the application code makes, for the IAM check.

Loaded from tests/conftest.py with ``pytest_plugins = ["tests.iam_recorder"]``.
It wraps ``botocore.client.BaseClient._make_api_call``, the one method every
boto3 client call and every PynamoDB request goes through, and records the IAM
actions and resources of each DynamoDB, SQS and SSM call **made by the
application**; ``tests/test_iam_policy.py`` then fails, as the last test of the
session, if ``.chalice/policy-dev.json`` does not grant one of them.

Which calls are the application's: the innermost frame of this repository's
own code on the calling stack decides (frames of libraries such as PynamoDB,
boto3 and the standard library are skipped). A call whose nearest project
frame is in ``chalicelib/`` or ``app.py`` is the Lambda's, and is recorded;
one whose nearest project frame is in ``tests/``, ``devstack/``, ``agent/``,
``client/`` or ``bench/`` is not: the tests deploying the stack into moto
(CloudFormation, CreateTable, UpdateTimeToLive), reading inboxes as an agent
does (ReceiveMessage, DeleteMessage), the local stack driving the queue
consumer, and the agents themselves run under other roles on AWS. A fake
adapter that a test passes into the services is test code by this rule even
when chalicelib calls it. CloudFormation is never recorded.

Subprocesses (the local stack of the end-to-end tests) are covered too: the
plugin puts ``tests/iam_site`` on ``PYTHONPATH``; its ``sitecustomize`` installs
the same wrapper in any Python process that imports botocore, and appends each
new record to a file of its own under ``IAM_RECORD_DIR``, read back here.

IAM names differ from API names in places, and this module maps them: a
``TransactWriteItems`` is authorised item by item as ``PutItem``,
``UpdateItem``, ``DeleteItem`` and ``ConditionCheckItem`` on each item's table
(AWS: "Using IAM with DynamoDB transactions"); ``Query``/``Scan`` on an index
are authorised on ``table/<t>/index/<i>``; SQS batch calls are authorised as
their single forms. Resource names are rewritten to one stage (``dev``), since
the tests deploy stages named ``test``, ``t<hex>`` and ``local``.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlparse

ROOT = pathlib.Path(__file__).resolve().parents[1]
_ROOT = str(ROOT) + os.sep
_APP_DIRS = (str(ROOT / "chalicelib") + os.sep,)
_APP_FILES = (str(ROOT / "app.py"),)
#: services whose calls are recorded and checked
SERVICES = ("dynamodb", "sqs", "ssm", "logs")
#: the host agent's code: recorded as function "agent", checked against the
#: agent's own role (infra/agent-policy-<stage>.json), never the Lambda's
_AGENT_DIR = str(ROOT / "agent") + os.sep
AGENT = "agent"
ENV_DIR = "IAM_RECORD_DIR"
SITE_DIR = ROOT / "tests" / "iam_site"
#: scheduled and queued entry points of app.py; everything else there is the API
_ENTRIES = {"place", "place_on_nudge", "scan", "reconcile", "follow_up", "feed",
            "deliver_webhook"}
#: chalicelib/service module -> the Lambda function that runs it
_SERVICE_FUNCTION = {"placement": "place", "scan": "scan", "reconciler": "reconcile"}


@dataclass(frozen=True, order=True)
class Record:
    action: str        # "dynamodb:PutItem"
    resource: str      # "arn:aws:dynamodb:us-east-1:123456789012:table/gpujobs-dev-jobs"
    function: str      # the Lambda function that would make it (best effort, informational)
    operation: str     # the API operation as called ("TransactWriteItems")

    def as_dict(self) -> dict:
        return {"action": self.action, "resource": self.resource,
                "function": self.function, "operation": self.operation}


# -- which code made the call ---------------------------------------------------
def _is_project(filename: str) -> bool:
    return filename.startswith(_ROOT) and "site-packages" not in filename \
        and os.sep + ".venv" + os.sep not in filename


def caller(frame) -> tuple[bool, str]:
    """(made by the application?, the function it belongs to)."""
    f = frame
    nearest = None
    while f is not None:
        name = f.f_code.co_filename
        if _is_project(name) and not name.startswith(str(ROOT / "tests" / "iam_")):
            nearest = f
            break
        f = f.f_back
    if nearest is None:
        return False, ""
    name = nearest.f_code.co_filename
    if name.startswith(_AGENT_DIR):
        return True, AGENT
    if not (name.startswith(_APP_DIRS) or name in _APP_FILES):
        return False, ""
    return True, _function_of(nearest)


def _function_of(frame) -> str:
    service = None
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if name in _APP_FILES:
            code = f.f_code.co_name
            if code in _ENTRIES:
                return code
        elif name.startswith(str(ROOT / "chalicelib" / "service") + os.sep):
            service = pathlib.Path(name).stem  # the outermost one wins
        f = f.f_back
    if service is not None:
        return _SERVICE_FUNCTION.get(service, "api_handler")
    return "direct"  # a test called an adapter itself: no function to name


# -- API call -> IAM actions and resources ------------------------------------------
_STAGE = re.compile(r"^gpujobs-[a-z][a-z0-9]*-")
_PARAM_STAGE = re.compile(r"^/gpujobs/[^/]+/")
_TX_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
               "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}
_SQS_SINGLE = {"SendMessageBatch": "SendMessage", "DeleteMessageBatch": "DeleteMessage",
               "ChangeMessageVisibilityBatch": "ChangeMessageVisibility"}


def generalised(resource: str) -> str:
    """Per-node inboxes as one pattern, for reading (never for checking)."""
    return re.sub(r"(:gpujobs-[a-z0-9]+-inbox-)(?!dlq$).+$", r"\1*", resource)


def staged(name: str, stage: str = "dev") -> str:
    """A resource name of any stage as the same resource of ``stage``."""
    if name.startswith("/"):
        return _PARAM_STAGE.sub(f"/gpujobs/{stage}/", name)
    return _STAGE.sub(f"gpujobs-{stage}-", name)


def _table_arn(region: str, account: str, table: str, index: str | None = None) -> str:
    if table.startswith("arn:"):
        table = table.split(":table/", 1)[1]
    arn = f"arn:aws:dynamodb:{region}:{account}:table/{staged(table)}"
    return f"{arn}/index/{index}" if index else arn


def _queue_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:sqs:{region}:{account}:{staged(name)}"


def _queue_name(url: str) -> str:
    return urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]


def iam_requests(service: str, operation: str, params: dict, *, region: str = "us-east-1",
                 account: str = "123456789012") -> list[tuple[str, str]]:
    """The (IAM action, resource ARN) pairs one API call is authorised by."""
    if service == "dynamodb":
        if operation in ("TransactWriteItems", "TransactGetItems"):
            out = []
            for item in params.get("TransactItems", []):
                (kind, body), = item.items()
                out.append((f"dynamodb:{_TX_ACTIONS[kind]}",
                            _table_arn(region, account, body["TableName"])))
            return out
        if operation in ("BatchGetItem", "BatchWriteItem"):
            return [(f"dynamodb:{operation}", _table_arn(region, account, t))
                    for t in params.get("RequestItems", {})]
        if "TableName" in params:
            return [(f"dynamodb:{operation}",
                     _table_arn(region, account, params["TableName"], params.get("IndexName")))]
        return [(f"dynamodb:{operation}", "*")]
    if service == "sqs":
        action = f"sqs:{_SQS_SINGLE.get(operation, operation)}"
        if "QueueUrl" in params:
            return [(action, _queue_arn(region, account, _queue_name(params["QueueUrl"])))]
        if "QueueName" in params:
            return [(action, _queue_arn(region, account, params["QueueName"]))]
        return [(action, "*")]
    if service == "logs":
        group = staged(params.get("logGroupName", "*"))
        base = f"arn:aws:logs:{region}:{account}:log-group:{group}"
        if "logStreamName" in params:
            return [(f"logs:{operation}", f"{base}:log-stream:{params['logStreamName']}")]
        return [(f"logs:{operation}", f"{base}:*")]
    if service == "ssm":
        names = params.get("Names") or [params.get("Name") or params.get("Path") or "*"]
        return [(f"ssm:{operation}",
                 f"arn:aws:ssm:{region}:{account}:parameter/{staged(n).lstrip('/')}")
                for n in names]
    if service == "events":
        buses = {e.get("EventBusName", "default") for e in params.get("Entries", [])} \
            or {params.get("EventBusName", "default")}
        return [(f"events:{operation}", f"arn:aws:events:{region}:{account}:event-bus/"
                 f"{'gpujobs-dev' if b.startswith('gpujobs-') else b}") for b in sorted(buses)]
    return [(f"{service}:{operation}", "*")]


# -- IAM policy evaluation (identity policy, no conditions) ---------------------------
def _pattern(glob: str, *, ignore_case: bool) -> re.Pattern:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
    return re.compile(f"^{regex}$", re.IGNORECASE if ignore_case else 0)


def _listed(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def _statement_matches(st: dict, action: str, resource: str) -> bool:
    if "Action" in st:
        hit = any(_pattern(a, ignore_case=True).match(action) for a in _listed(st["Action"]))
    else:
        hit = not any(_pattern(a, ignore_case=True).match(action)
                      for a in _listed(st["NotAction"]))
    if not hit:
        return False
    if "Resource" in st:
        return any(_pattern(r, ignore_case=False).match(resource)
                   for r in _listed(st["Resource"]))
    return not any(_pattern(r, ignore_case=False).match(resource)
                   for r in _listed(st["NotResource"]))


def allowed(policy: dict, action: str, resource: str) -> bool:
    """Whether an identity policy allows ``action`` on ``resource``: an explicit
    Deny wins; an Allow with a Condition is not counted (this check cannot
    know the request context), so conditional grants must be tested elsewhere."""
    grant = False
    statements = policy.get("Statement", [])
    for st in [statements] if isinstance(statements, dict) else statements:
        if not _statement_matches(st, action, resource):
            continue
        if st["Effect"] == "Deny":
            return False
        if st["Effect"] == "Allow" and not st.get("Condition"):
            grant = True
    return grant


# -- the recorder -----------------------------------------------------------------------
class Recorder:
    def __init__(self, sink: pathlib.Path | None = None) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[Record] = Counter()
        self._sink = sink

    def add(self, records: list[Record]) -> None:
        new = []
        with self._lock:
            for r in records:
                if r not in self.counts:
                    new.append(r)
                self.counts[r] += 1
            if new and self._sink is not None:
                with self._sink.open("a", encoding="utf-8") as f:
                    for r in new:
                        f.write(json.dumps(r.as_dict()) + "\n")

    def records(self) -> set[Record]:
        with self._lock:
            records = set(self.counts)
        directory = os.environ.get(ENV_DIR)
        if directory and os.path.isdir(directory):
            for path in pathlib.Path(directory).glob("*.jsonl"):
                for line in path.read_text(encoding="utf-8").splitlines():
                    try:
                        records.add(Record(**json.loads(line)))
                    except (ValueError, TypeError):
                        continue  # a line a killed process left half-written
        return records


RECORDER: Recorder | None = None


def install(sink: pathlib.Path | None = None) -> Recorder:
    """Wrap botocore once per process; later calls return the same recorder."""
    global RECORDER
    if RECORDER is not None:
        return RECORDER
    import importlib

    # from sys.modules: sitecustomize calls this while botocore.client is
    # still being imported, before it is an attribute of botocore
    client = sys.modules.get("botocore.client") or importlib.import_module("botocore.client")
    recorder = RECORDER = Recorder(sink)
    original = client.BaseClient._make_api_call

    def _make_api_call(self, operation_name, api_params):
        try:
            service = self.meta.service_model.service_name
            if service in SERVICES:
                mine, function = caller(sys._getframe(1))
                if mine:
                    region = self.meta.region_name or "us-east-1"
                    recorder.add([Record(action, resource, function, operation_name)
                                  for action, resource in iam_requests(
                                      service, operation_name, api_params or {},
                                      region=region)])
        except Exception:  # noqa: BLE001 - recording must never change behaviour
            pass
        return original(self, operation_name, api_params)

    client.BaseClient._make_api_call = _make_api_call
    return recorder


# -- pytest hooks -----------------------------------------------------------------------
_OWN_DIR: str | None = None


def pytest_configure(config):
    import tempfile

    global _OWN_DIR
    directory = os.environ.get(ENV_DIR)
    if not directory:
        directory = _OWN_DIR = tempfile.mkdtemp(prefix="iam-record-")
        os.environ[ENV_DIR] = directory
    paths = [str(SITE_DIR)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p and p != str(SITE_DIR)]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    # every pytest process (an xdist worker too) leaves its records in the
    # directory, so a check run after the workers (`make test`) reads them all
    install(pathlib.Path(directory) / f"pytest-{os.getpid()}.jsonl")


def pytest_collection_modifyitems(session, config, items):
    """The policy checks (marked ``iam_last``) run after every other test of the
    session; with workers (xdist), `make test` runs them in a session of their
    own after the others, over the records every worker left."""
    last = [i for i in items if i.get_closest_marker("iam_last")]
    if last:
        items[:] = [i for i in items if i not in last] + last


def pytest_sessionfinish(session, exitstatus):
    """Leave what was recorded in build/iam-recorded.json, for reading and for
    tightening the policy (the check itself is tests/test_iam_policy.py)."""
    if RECORDER is None:
        return
    records = sorted(RECORDER.records())
    if not records:
        return
    out = ROOT / "build" / "iam-recorded.json"
    try:
        out.parent.mkdir(exist_ok=True)
        by_function: dict[str, set[str]] = {}
        for r in records:
            by_function.setdefault(r.function, set()).add(
                f"{r.action} {generalised(r.resource)}")
        out.write_text(json.dumps({
            "records": [r.as_dict() | {"calls": RECORDER.counts.get(r, 0)} for r in records],
            "by_function": {k: sorted(v) for k, v in sorted(by_function.items())},
        }, indent=1) + "\n")
    except OSError:
        pass


def unexercised(policy: dict, records) -> list[str]:
    """DynamoDB and SQS grants of an Allow statement that no recorded call used
    (the event source mapping's own actions aside): candidates for removal."""
    out = []
    for st in policy.get("Statement", []):
        if st.get("Effect") != "Allow" or "Action" not in st or "Resource" not in st:
            continue
        for action in _listed(st["Action"]):
            if action.split(":")[0] not in ("dynamodb", "sqs") or action in (
                    "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"):
                continue
            for resource in _listed(st["Resource"]):
                a, r = _pattern(action, ignore_case=True), _pattern(resource, ignore_case=False)
                if not any(a.match(x.action) and r.match(x.resource) for x in records):
                    out.append(f"{action} on {resource}")
    return out


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if RECORDER is None:
        return
    records = {r for r in RECORDER.records() if r.function != AGENT}
    if not any(r.action.startswith(("dynamodb:", "sqs:")) for r in records):
        return
    directory = pathlib.Path(os.environ.get("IAM_POLICY_DIR") or ROOT / ".chalice")
    try:
        policy = json.loads((directory / "policy-dev.json").read_text())
    except (OSError, ValueError):
        return
    unused = unexercised(policy, records)
    if unused:
        terminalreporter.write_sep("-", "IAM: granted in policy-dev.json, not called this session")
        for line in unused:
            terminalreporter.write_line(f"  {line}")


def pytest_unconfigure(config):
    """Remove the subprocesses' record files (after the summary has read them)."""
    global _OWN_DIR
    if _OWN_DIR is not None:
        import shutil

        shutil.rmtree(_OWN_DIR, ignore_errors=True)
        if os.environ.get(ENV_DIR) == _OWN_DIR:
            del os.environ[ENV_DIR]
        _OWN_DIR = None
