"""Build the deployable bundle of one stage: ``chalice package`` with the storage
and messaging of ``infra/template.yaml`` merged in.

    python infra/package.py --stage dev            # -> build/dev/{sam.json,deployment.zip}

Every table and queue is declared once, in ``infra/template.yaml``. This script
turns that template (plus the wiring below) into a merge template,
``build/merge-<stage>.json``, and runs

    chalice package --stage <stage> --merge-template build/merge-<stage>.json build/<stage>

Chalice deep-merges the file over its SAM output (dictionaries merge key by
key, anything else is replaced), so the merge template carries:

- the Parameters, Resources and Outputs of ``infra/template.yaml`` (a name
  clash with a resource Chalice generates is an error, never a silent merge);
  the Stage parameter defaults to the stage being packaged;
- for every Lambda function of the app: its environment, each table and queue
  named by ``Ref``/``Fn::GetAtt``/``Fn::Sub`` of the stack's own resources, the
  same expressions as the template's Outputs, mapped to variables by
  ``devstack.resources.OUTPUT_ENV`` (the mapping the local stack uses), plus the
  names of the SSM parameters that hold the secrets;
- for every ``@app.on_sqs_message``: the template's queue as
  ``{"Fn::Sub": "${<Queue>.Arn}"}`` and ``FunctionResponseTypes:
  [ReportBatchItemFailures]``;
- the agents' API (:data:`AGENT_ROUTES`, see docs/deploy.md, "Agent traffic
  on an HTTP API"): an API Gateway HTTP API, plain CloudFormation
  (``AWS::ApiGatewayV2::*``), whose only routes are the agent routes, each
  an ``AWS_PROXY`` integration of payload format 1.0 to the same
  ``APIHandler`` function the REST API calls (1.0 is the REST API's proxy
  event, which Chalice routes), its ``$default`` stage, the permission for
  it to invoke the function, and the output ``AgentApiUrl``. Tenants keep
  the REST API (Chalice's ``RestAPI``, ``EndpointURL``), which keeps every
  route.

After packaging it checks that each such queue's visibility timeout is at
least its function's timeout, drops the working tree's ``__pycache__`` that
Chalice copies with ``chalicelib/``, and adds unchecked-hash bytecode for every
module of ``deployment.zip`` (a faster cold start, see docs/deploy.md).

Packaging imports ``app.py`` (as ``chalice package`` does); it needs no AWS
credentials and no network except pip fetching the pinned Lambda wheels on
the first run (Chalice caches them under ``.chalice/deployments/``).
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import pathlib
import py_compile
import shutil
import subprocess
import sys
import tempfile
import zipfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "infra" / "template.yaml"
REGION = "us-east-1"

#: Secrets live in SSM Parameter Store (SecureString), never in the repository
#: or the template: the functions get the parameter names and read the values
#: at cold start (see docs/deploy.md).
SECRET_PARAMS = {
    "GPUJOBS_PAGE_TOKEN_KEY_PARAM": {"Fn::Sub": "/gpujobs/${Stage}/page-token-key"},
    "GPUJOBS_TOKEN_HASHES_PARAM": {"Fn::Sub": "/gpujobs/${Stage}/token-hashes"},
}

#: extra stack outputs -> environment variables, beyond devstack's mapping
EXTRA_OUTPUT_ENV = {"PendingQueueName": "GPUJOBS_PENDING_QUEUE_NAME",
                    "ScanQueueName": "GPUJOBS_SCAN_QUEUE_NAME",
                    "FollowUpQueueName": "GPUJOBS_FOLLOW_UP_QUEUE_NAME",
                    "WebhookQueueName": "GPUJOBS_WEBHOOK_QUEUE_NAME"}

SQS_RESPONSE_TYPES = ["ReportBatchItemFailures"]

#: The routes agents call (agent/api.py), and nothing else: served by the
#: agents' HTTP API as well as by the REST API. Each must be a route of the
#: app; the HTTP API is generated from this list alone (:func:`agent_api`).
AGENT_ROUTES = (
    ("PUT", "/v1/nodes/{node_id}"),                             # register, call in
    ("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events"),    # STARTED, EXITED, ...
    ("POST", "/v1/jobs/{job_id}/heartbeats"),                   # the ranks' beats
)
AGENT_API = "AgentApi"
AGENT_API_OUTPUT = "AgentApiUrl"


# -- CloudFormation YAML ------------------------------------------------------
class _CfnLoader(yaml.SafeLoader):
    """CloudFormation YAML with its short tags turned into the long JSON forms."""


def _construct(loader, node):
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


def _short_tag(loader, suffix, node):
    value = _construct(loader, node)
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        resource, _, attribute = value.partition(".")
        return {"Fn::GetAtt": [resource, attribute]}
    if suffix == "Condition":
        return {"Condition": value}
    return {f"Fn::{suffix}": value}


_CfnLoader.add_multi_constructor("!", _short_tag)


def load_template(path: pathlib.Path = TEMPLATE) -> dict:
    return yaml.load(path.read_text(), Loader=_CfnLoader)


def render(value, template: dict, stage: str):
    """The plain value an expression of the template has in ``stage`` (only the
    forms the names use: literals, ``Fn::Sub`` of ``${Stage}``, ``Ref`` of a
    table or queue, ``Fn::GetAtt`` of a name). Used to import the app with the
    stage's names; never written into the packaged template."""
    if isinstance(value, str):
        return value
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        return value["Fn::Sub"].replace("${Stage}", stage)
    if "Ref" in value:
        if value["Ref"] == "Stage":
            return stage
        props = template["Resources"][value["Ref"]]["Properties"]
        name = render(props.get("TableName") or props.get("QueueName")
                      or props["LogGroupName"], template, stage)
        if template["Resources"][value["Ref"]]["Type"] == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/000000000000/{name}"
        return name
    if "Fn::GetAtt" in value:
        resource, attribute = value["Fn::GetAtt"]
        props = template["Resources"][resource]["Properties"]
        name = render(props.get("TableName") or props.get("QueueName") or props.get("Name"),
                      template, stage)
        if attribute == "Arn":
            return f"arn:aws:sqs:{REGION}:000000000000:{name}"
        return name
    raise ValueError(f"cannot render {value!r}")


# -- the app's functions --------------------------------------------------------
def environment(template: dict) -> dict:
    """Every function's environment: the template's Outputs, by variable."""
    sys.path.insert(0, str(ROOT))
    try:
        from devstack.resources import OUTPUT_ENV
    finally:
        sys.path.remove(str(ROOT))
    outputs = template["Outputs"]
    env = {}
    for output, var in {**OUTPUT_ENV, **EXTRA_OUTPUT_ENV}.items():
        if output not in outputs:
            raise SystemExit(f"infra/template.yaml has no output {output} (for {var})")
        env[var] = outputs[output]["Value"]
    return {**env, **SECRET_PARAMS}


def load_app(env: dict, template: dict, stage: str):
    """Import app.py with the stage's names in the environment, as chalice does."""
    for var, value in env.items():  # this process only: packaging runs on its own
        os.environ[var] = render(value, template, stage)
    sys.path.insert(0, str(ROOT))
    try:
        import app as app_module
    finally:
        sys.path.remove(str(ROOT))
    return app_module.app


def functions(app) -> dict[str, dict]:
    """Logical id of each Lambda function Chalice generates -> what feeds it."""
    from chalice.app import ScheduledEventConfig, SQSEventConfig
    from chalice.utils import to_cfn_resource_name

    out: dict[str, dict] = {}
    if app.routes:
        out["APIHandler"] = {"kind": "api"}
    for source in app.event_sources:
        name = to_cfn_resource_name(source.name)
        if isinstance(source, SQSEventConfig):
            out[name] = {"kind": "sqs", "queue": source.queue, "queue_arn": source.queue_arn,
                         "event": to_cfn_resource_name(source.name + "-sqs-event-source")}
        elif isinstance(source, ScheduledEventConfig):
            out[name] = {"kind": "schedule"}
        else:  # nothing else is used today; fail rather than package it unwired
            raise SystemExit(f"infra/package.py does not know event source {source!r}")
    for fn in app.pure_lambda_functions:
        out[to_cfn_resource_name(fn.name)] = {"kind": "pure"}
    return out


def queue_resource(template: dict, stage: str, queue: str | None, queue_arn: str | None) -> str:
    """The template's queue an ``@app.on_sqs_message`` names."""
    name = queue if queue else (queue_arn or "").rsplit(":", 1)[-1]
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::SQS::Queue" and render(
                resource["Properties"]["QueueName"], template, stage) == name:
            return logical_id
    raise SystemExit(f"the app consumes queue {name!r}, which infra/template.yaml "
                     "does not declare")


# -- the agents' HTTP API ---------------------------------------------------------
def agent_api(app, routes=AGENT_ROUTES) -> tuple[dict, dict]:
    """The agents' HTTP API: (resources, outputs) for the merge template.

    Payload format 1.0 is the REST API's Lambda proxy event (``resource``,
    ``path``, ``httpMethod``, ``headers``, ``multiValueHeaders``,
    ``queryStringParameters``, ``pathParameters``, ``requestContext`` with
    ``resourcePath``, ``httpMethod`` and ``stage`` ``$default``, ``body``,
    ``isBase64Encoded``), so the one handler, ``app.app``, routes it as it
    routes the REST API's (tests/api/test_agent_http_api.py). Only the
    routes named here exist on it: any other request is API Gateway's own
    404, and never reaches the function."""
    resources: dict = {
        AGENT_API: {"Type": "AWS::ApiGatewayV2::Api", "Properties": {
            "Name": {"Fn::Sub": "gpujobs-${Stage}-agents"},
            "ProtocolType": "HTTP",
            "Description": "gpujobs agents: node call-ins, attempt events, heartbeats "
                           "(tenants use the REST API)"}},
        f"{AGENT_API}Integration": {"Type": "AWS::ApiGatewayV2::Integration", "Properties": {
            "ApiId": {"Ref": AGENT_API},
            "IntegrationType": "AWS_PROXY",
            "IntegrationUri": {"Fn::GetAtt": ["APIHandler", "Arn"]},
            "PayloadFormatVersion": "1.0"}},
        f"{AGENT_API}Stage": {"Type": "AWS::ApiGatewayV2::Stage", "Properties": {
            "ApiId": {"Ref": AGENT_API}, "StageName": "$default", "AutoDeploy": True}},
        f"{AGENT_API}InvokePermission": {"Type": "AWS::Lambda::Permission", "Properties": {
            "FunctionName": {"Ref": "APIHandler"},
            "Action": "lambda:InvokeFunction",
            "Principal": "apigateway.amazonaws.com",
            "SourceArn": {"Fn::Sub": "arn:${AWS::Partition}:execute-api:${AWS::Region}:"
                                     "${AWS::AccountId}:${%s}/*" % AGENT_API}}},
    }
    from chalice.utils import to_cfn_resource_name

    for method, path in routes:
        entry = app.routes.get(path, {}).get(method)
        if entry is None:
            raise SystemExit(f"agent route {method} {path} is no route of app.py")
        resources[f"{AGENT_API}Route" + to_cfn_resource_name(entry.view_name)] = {
            "Type": "AWS::ApiGatewayV2::Route", "Properties": {
                "ApiId": {"Ref": AGENT_API},
                "RouteKey": f"{method} {path}",
                "AuthorizationType": "NONE",  # the handler checks the agent token
                "Target": {"Fn::Sub": "integrations/${%sIntegration}" % AGENT_API}}}
    outputs = {AGENT_API_OUTPUT: {
        "Description": "the agents' API (agent --api); tenants use EndpointURL",
        "Value": {"Fn::GetAtt": [AGENT_API, "ApiEndpoint"]}}}
    return resources, outputs


# -- the merge template -----------------------------------------------------------
def merge_template(stage: str) -> dict:
    template = load_template()
    env = environment(template)
    app = load_app(env, template, stage)
    merge: dict = {
        "Description": template.get("Description", ""),
        "Parameters": json.loads(json.dumps(template["Parameters"])),
        "Resources": dict(template["Resources"]),
        "Outputs": dict(template["Outputs"]),
    }
    merge["Parameters"]["Stage"]["Default"] = stage
    for logical_id, fn in functions(app).items():
        if logical_id in template["Resources"]:
            raise SystemExit(f"{logical_id}: both a Chalice function and a template resource")
        props: dict = {"Environment": {"Variables": dict(env)}}
        if fn["kind"] == "sqs":
            queue = queue_resource(template, stage, fn["queue"], fn["queue_arn"])
            # Chalice writes the queue as {"Fn::Sub": "arn:...:<name>"}, and a
            # deep merge keeps every key of a dictionary: replacing the Sub's
            # string is the one way to point it at the template's queue (and
            # "${Queue.Arn}" also orders the mapping after the queue)
            props["Events"] = {fn["event"]: {"Properties": {
                "Queue": {"Fn::Sub": "${%s.Arn}" % queue},
                "FunctionResponseTypes": SQS_RESPONSE_TYPES,
            }}}
        merge["Resources"][logical_id] = {"Properties": props}
    resources, outputs = agent_api(app)
    for logical_id in [*resources, *outputs]:
        if logical_id in merge["Resources"] or logical_id in merge["Outputs"]:
            raise SystemExit(f"{logical_id}: both the agents' API and a template name")
    merge["Resources"].update(resources)
    merge["Outputs"].update(outputs)
    return merge


def sqs_event_queue(event: dict) -> str:
    """The logical id of the template queue an SQS event reads (after the merge)."""
    queue = event["Properties"]["Queue"]
    sub = queue.get("Fn::Sub") if isinstance(queue, dict) else None
    if len(queue) != 1 or not isinstance(sub, str) or not (
            sub.startswith("${") and sub.endswith(".Arn}")):
        raise SystemExit(f"SQS event source not wired to a template queue: {queue!r}")
    return sub[2:-len(".Arn}")]


def check_packaged(sam: dict) -> None:
    """What the merge cannot express by itself: each queue feeding a function
    stays invisible at least as long as the function may run."""
    resources = sam["Resources"]
    default_timeout = sam.get("Globals", {}).get("Function", {}).get("Timeout", 3)
    for logical_id, resource in resources.items():
        if resource["Type"] != "AWS::Serverless::Function":
            continue
        timeout = resource["Properties"].get("Timeout", default_timeout)
        for event in resource["Properties"].get("Events", {}).values():
            if event.get("Type") != "SQS":
                continue
            queue = sqs_event_queue(event)
            visibility = resources[queue]["Properties"].get("VisibilityTimeout", 30)
            if visibility < timeout:
                raise SystemExit(f"{queue}: VisibilityTimeout {visibility} s is below "
                                 f"{logical_id}'s Timeout {timeout} s")


def strip_bytecode(path: pathlib.Path) -> int:
    """Drop the ``__pycache__`` folders Chalice copies from the working tree
    with ``chalicelib/``: compiled for whatever the developer last ran, and
    never valid on Lambda (their recorded source times are not the zip's)."""
    tmp = path.with_suffix(".tmp")
    dropped = 0
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if "__pycache__/" in info.filename or info.filename.endswith(".pyc"):
                dropped += 1
                continue
            dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(path)
    return dropped


def precompile(path: pathlib.Path) -> int:
    """Add bytecode for every module, as *unchecked-hash* ``.pyc`` files (PEP
    552): valid whatever the files' times, so a cold start loads them instead
    of compiling botocore & co. each time (measured: 425 -> 176 ms of CPU for
    ``import boto3, chalice, pynamodb``; see docs/deploy.md). Compiled by this
    interpreter, whose version Chalice also chose as the runtime."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(path) as src:
            infos = src.infolist()
            src.extractall(tmp)
        compileall.compile_dir(tmp, quiet=2, workers=0, legacy=False,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        known = {i.filename for i in infos}
        added = sorted(str(p.relative_to(tmp)) for p in pathlib.Path(tmp).rglob("*.pyc")
                       if str(p.relative_to(tmp)) not in known)
        out = path.with_suffix(".tmp")
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in infos:
                dst.writestr(info, (pathlib.Path(tmp) / info.filename).read_bytes()
                             if not info.is_dir() else b"", compress_type=zipfile.ZIP_DEFLATED)
            for name in added:
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o644 << 16
                dst.writestr(info, (pathlib.Path(tmp) / name).read_bytes(),
                             compress_type=zipfile.ZIP_DEFLATED)
        out.replace(path)
    return len(added)


def package(stage: str, out: pathlib.Path, *, merge_path: pathlib.Path | None = None) -> dict:
    """Write ``out/sam.json`` and ``out/deployment.zip``; returns a summary."""
    out = out.resolve()
    merge_path = (merge_path or out.parent / f"merge-{stage}.json").resolve()
    merge_path.parent.mkdir(parents=True, exist_ok=True)
    merge_path.write_text(json.dumps(merge_template(stage), indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    chalice = pathlib.Path(sys.executable).parent / "chalice"
    env = {**os.environ}
    env.setdefault("AWS_DEFAULT_REGION", REGION)  # chalice wants one; the template uses AWS::Region
    cmd = [str(chalice), "package", "--stage", stage, "--merge-template", str(merge_path),
           str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                         f"{done.stdout}{done.stderr}")
    sam = json.loads((out / "sam.json").read_text())
    check_packaged(sam)
    strip_bytecode(out / "deployment.zip")
    precompile(out / "deployment.zip")
    with zipfile.ZipFile(out / "deployment.zip") as z:
        unpacked = sum(i.file_size for i in z.infolist())
    return {"stage": stage, "sam": str(out / "sam.json"), "merge": str(merge_path),
            "zip": str(out / "deployment.zip"),
            "zip_bytes": (out / "deployment.zip").stat().st_size, "unzipped_bytes": unpacked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="dev")
    parser.add_argument("--out", type=pathlib.Path,
                        help="output folder (default: build/<stage>)")
    args = parser.parse_args(argv)
    summary = package(args.stage, args.out or ROOT / "build" / args.stage)
    print(f"packaged stage {summary['stage']}: {summary['sam']}, {summary['zip']} "
          f"({summary['zip_bytes'] / 1e6:.1f} MB zipped, "
          f"{summary['unzipped_bytes'] / 1e6:.1f} MB unzipped); merged {summary['merge']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
