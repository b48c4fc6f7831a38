"""The deployable bundle: `infra/package.py` (what `make package` runs) builds it
once per session for the dev stage, then every check reads that one bundle.
Nothing is skipped: if packaging fails, the fixture fails every test here.

Size, measured on the pinned requirements.txt (boto3/botocore 1.44.8, pynamodb
6.1.0, fastjsonschema 2.22.3) with Chalice 1.34.0 for python3.11: 19.5 MB
zipped (19,455,363 bytes), 28.7 MB unzipped, of which the precompiled bytecode
is 1.8 MB zipped and botocore ~85 %. The budget below (24 MiB zipped, 40 MiB
unzipped) leaves room for botocore's growth and fails long before Lambda's own
limits (50 MB zipped for a direct upload, 250 MB unzipped).
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGE = "dev"
MAX_ZIPPED_BYTES = 24 * 2**20
MAX_UNZIPPED_BYTES = 40 * 2**20
#: top-level names in the zip that only the dev tooling brings
DEV_ONLY = {"moto", "pytest", "_pytest", "hypothesis", "cfnlint", "samtranslator", "yaml",
            "_yaml", "openapi_spec_validator", "requests", "werkzeug", "flask", "docker",
            "click", "tests", "devstack", "agent", "client", "bench", "gpujobs_client",
            "gpujobs", "infra"}
#: the only files of the chalice distribution a function needs (its runtime)
CHALICE_RUNTIME = {"chalice/__init__.py", "chalice/app.py", "chalice/app.pyi"}
SCHEDULED = {"Place": "rate(1 minute)", "Scan": "rate(1 minute)",
             "Reconcile": "rate(1 minute)", "Feed": "rate(1 minute)"}


def test_cfn_lint_is_clean(bundle):
    cfn_lint = pathlib.Path(sys.executable).parent / "cfn-lint"
    done = subprocess.run([str(cfn_lint), str(bundle.out / "sam.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_table_and_queue_of_the_template_is_in_the_bundle(bundle):
    declared = bundle.template["Resources"]
    assert {k for k, v in declared.items() if v["Type"] == "AWS::DynamoDB::Table"} >= {
        "JobsTable", "IdempotencyTable", "AttemptsTable", "OutboxTable", "NodesTable",
        "HeartbeatsTable", "CollectorTable", "FleetTable", "TenantsTable"}
    for logical_id, resource in declared.items():
        assert bundle.resources.get(logical_id) == resource, logical_id
    assert bundle.sam["Parameters"]["Stage"]["Default"] == STAGE
    for name, output in bundle.template["Outputs"].items():
        assert bundle.sam["Outputs"][name] == output


def test_every_dead_letter_queue_is_there_and_used(bundle):
    queues = {k: v for k, v in bundle.resources.items() if v["Type"] == "AWS::SQS::Queue"}
    targets = {q["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
               for q in queues.values() if "RedrivePolicy" in q["Properties"]}
    assert targets == {"PendingDeadLetterQueue", "ScanDeadLetterQueue",
                       "FollowUpDeadLetterQueue", "WebhookDeadLetterQueue"}
    assert targets <= set(queues)
    # the inbox queues are made at run time with this one as their redrive target
    for fn in bundle.functions().values():
        assert fn["Properties"]["Environment"]["Variables"]["GPUJOBS_INBOX_DLQ_ARN"] == {
            "Fn::GetAtt": ["InboxDeadLetterQueue", "Arn"]}


def test_the_three_schedules(bundle):
    schedules = {}
    for name, fn in bundle.functions().items():
        for event in fn["Properties"].get("Events", {}).values():
            if event["Type"] == "Schedule":
                schedules[name] = event["Properties"]["Schedule"]
    assert schedules == SCHEDULED


def test_the_pending_queue_feeds_place_on_nudge_with_partial_batch_failures(bundle):
    sqs_events = {(name, event_id): event
                  for name, fn in bundle.functions().items()
                  for event_id, event in fn["Properties"].get("Events", {}).items()
                  if event["Type"] == "SQS"}
    assert set(sqs_events) == {("PlaceOnNudge", "PlaceOnNudgeSqsEventSource"),
                               ("ScanShard", "ScanShardSqsEventSource"),
                               ("FollowUp", "FollowUpSqsEventSource"),
                               ("DeliverWebhook", "DeliverWebhookSqsEventSource")}
    queues = {"PlaceOnNudge": ("PendingQueue", 10), "ScanShard": ("ScanQueue", 1),
              "FollowUp": ("FollowUpQueue", 10), "DeliverWebhook": ("WebhookQueue", 1)}
    for (name, _), event in sqs_events.items():
        props = event["Properties"]
        queue, batch = queues[name]
        assert props["Queue"] == {"Fn::Sub": "${%s.Arn}" % queue}
        assert "ReportBatchItemFailures" in props["FunctionResponseTypes"]
        assert props["BatchSize"] == batch


def test_queue_visibility_covers_the_function_timeout(bundle):
    default = bundle.sam.get("Globals", {}).get("Function", {}).get("Timeout", 3)
    checked = 0
    for name, fn in bundle.functions().items():
        timeout = fn["Properties"].get("Timeout", default)
        for event in fn["Properties"].get("Events", {}).values():
            if event["Type"] != "SQS":
                continue
            queue = event["Properties"]["Queue"]["Fn::Sub"][2:-len(".Arn}")]
            visibility = bundle.resources[queue]["Properties"].get("VisibilityTimeout", 30)
            assert visibility >= timeout, (queue, visibility, name, timeout)
            checked += 1
    assert checked == 4


_LITERAL = re.compile(r"gpujobs-|arn:|amazonaws\.com|\b\d{12}\b")


def test_every_function_names_the_real_resources(bundle):
    kinds = {"_TABLE": "AWS::DynamoDB::Table", "_QUEUE_URL": "AWS::SQS::Queue",
             "_QUEUE_NAME": "AWS::SQS::Queue", "_DLQ_ARN": "AWS::SQS::Queue"}
    assert set(bundle.functions()) == {"APIHandler", "Place", "PlaceOnNudge", "Scan",
                                       "ScanShard", "Reconcile", "FollowUp", "Feed",
                                       "DeliverWebhook"}
    for name, fn in bundle.functions().items():
        env = fn["Properties"]["Environment"]["Variables"]
        for var, expected in bundle.environment.items():
            assert env.get(var) == expected, (name, var)
        for var, value in env.items():
            if isinstance(value, str):
                assert not _LITERAL.search(value), f"{name}: {var}={value!r} is hard-coded"
                continue
            (fn_name, arg), = value.items()
            target = arg if fn_name == "Ref" else arg[0] if fn_name == "Fn::GetAtt" else None
            if target is not None:
                for suffix, kind in kinds.items():
                    if var.endswith(suffix):
                        assert bundle.resources[target]["Type"] == kind, (name, var)


def test_every_variable_the_config_needs_is_set(bundle):
    source = (ROOT / "chalicelib" / "config.py").read_text()
    needed = set(re.findall(r'need\("([A-Z0-9_]+)"\)', source))
    assert needed
    for name, fn in bundle.functions().items():
        env = fn["Properties"]["Environment"]["Variables"]
        # a secret comes as the name of its SSM parameter instead of its value
        missing = {v for v in needed if v not in env and f"{v}_PARAM" not in env}
        assert not missing, (name, missing)


def test_the_code_reads_the_secret_parameters_it_is_given(bundle):
    """The bundle hands the functions SSM parameter names, never the secrets:
    chalicelib must read them (config.py / adapters/tokens.py)."""
    code = "\n".join(p.read_text() for p in (ROOT / "chalicelib").rglob("*.py"))
    params = [v for v in bundle.environment if v.endswith("_PARAM")]
    assert params == ["GPUJOBS_PAGE_TOKEN_KEY_PARAM", "GPUJOBS_TOKEN_HASHES_PARAM"]
    unread = [v for v in params if v not in code]
    assert not unread, f"chalicelib never reads {unread}: on AWS the secrets would be missing"


def test_every_role_carries_the_stage_policy(bundle):
    policy = json.loads((ROOT / ".chalice" / f"policy-{STAGE}.json").read_text())
    for name, fn in bundle.functions().items():
        role_id = fn["Properties"]["Role"]["Fn::GetAtt"][0]
        role = bundle.resources[role_id]
        assert [p["PolicyDocument"] for p in role["Properties"]["Policies"]] == [policy], name


def test_the_zip_holds_the_app_and_no_dev_tooling(bundle):
    names = set(bundle.names)
    assert "app.py" in names
    ours = {str(p.relative_to(ROOT)) for p in (ROOT / "chalicelib").rglob("*.py")
            if "__pycache__" not in p.parts}
    assert ours and ours <= names, sorted(ours - names)
    top = {n.split("/", 1)[0] for n in names}
    dists = {t.split("-", 1)[0].lower() for t in top if t.endswith(".dist-info")}
    assert not top & DEV_ONLY, sorted(top & DEV_ONLY)
    assert not dists & {"moto", "pytest", "hypothesis", "chalice", "cfn_lint", "pyyaml"}
    assert {n for n in names if n.startswith("chalice/") and not n.endswith(".pyc")} \
        <= CHALICE_RUNTIME, "the chalice CLI is in the bundle"
    # bytecode: only what infra/package.py compiled (unchecked-hash, this
    # interpreter = the runtime), none of the working tree's __pycache__
    runtime = {fn["Properties"]["Runtime"] for fn in bundle.functions().values()}
    assert runtime == {f"python{sys.version_info.major}.{sys.version_info.minor}"}
    tag = sys.implementation.cache_tag
    pycs = {n for n in names if n.endswith(".pyc")}
    expected = {f"{n.rsplit('/', 1)[0]}/__pycache__/{n.rsplit('/', 1)[1][:-3]}.{tag}.pyc"
                if "/" in n else f"__pycache__/{n[:-3]}.{tag}.pyc"
                for n in names if n.endswith(".py")}
    assert pycs == expected
    # what Lambda needs at import time is there
    assert {"boto3", "botocore", "pynamodb", "fastjsonschema"} <= top


def test_the_bytecode_is_unchecked_hash_based(bundle):
    with zipfile.ZipFile(bundle.out / "deployment.zip") as z:
        for name in ("__pycache__/app.%s.pyc" % sys.implementation.cache_tag,
                     "botocore/__pycache__/client.%s.pyc" % sys.implementation.cache_tag):
            header = z.read(name)[:8]
            assert header[:4] == importlib.util.MAGIC_NUMBER, name
            assert int.from_bytes(header[4:8], "little") == 0b01, name  # hash, unchecked


def test_the_zip_stays_under_its_budget(bundle):
    assert bundle.zipped <= MAX_ZIPPED_BYTES, \
        f"deployment.zip is {bundle.zipped / 2**20:.1f} MiB, over {MAX_ZIPPED_BYTES / 2**20} MiB"
    assert bundle.unzipped <= MAX_UNZIPPED_BYTES, \
        f"unzipped {bundle.unzipped / 2**20:.1f} MiB, over {MAX_UNZIPPED_BYTES / 2**20} MiB"
