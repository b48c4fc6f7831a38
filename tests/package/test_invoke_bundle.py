"""Every function of the bundle that would ship, invoked the way Lambda does.

The session's ``deployment.zip`` (``make package``) is unpacked into a clean
folder. Each function of the packaged ``sam.json`` runs in a fresh interpreter
whose path holds that folder and the standard library only (``python -I -S
-B``: no site-packages, bytecode writes off, the folder left untouched as on
Lambda's read-only file system), with the environment the packaged template
gives it, its ``Ref``/``Fn::GetAtt``/``Fn::Sub`` resolved against a stack of
``infra/template.yaml`` deployed into the session's moto server (the one
addition: ``GPUJOBS_AWS_ENDPOINT_URL`` points AWS at moto). It is called by
its ``Handler`` with the events AWS sends: API Gateway proxy events,
EventBridge scheduled events, SQS batches; first cold (init, then the first
event), then warm in the same interpreter.

Invariant checked: what ships runs. A handler that depends on state another
kind of invocation sets, a runtime dependency missing from requirements.txt,
a module that needs site-packages or writes next to itself, an environment
variable the template does not give: each fails here.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import stat
import subprocess
import sys
import uuid
import zipfile

import boto3
import pytest

RUNTIME = pathlib.Path(__file__).with_name("lambda_runtime.py")
REGION = "us-east-1"
TENANT_TOKEN, AGENT_TOKEN = "bundle-tenant-token", "bundle-agent-token"
OPERATOR_TOKEN = "bundle-operator-token"
NODE = "bundle-node-1"


# -- the unpacked bundle and its stack ----------------------------------------------
def _tree(root: pathlib.Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


@pytest.fixture(scope="module")
def task_root(bundle, tmp_path_factory):
    """deployment.zip unpacked as Lambda does into /var/task, read-only."""
    root = tmp_path_factory.mktemp("task")
    with zipfile.ZipFile(bundle.out / "deployment.zip") as z:
        z.extractall(root)
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = _tree(root)
    yield root
    assert _tree(root) == before, "a function wrote into its task root"


class Stack:
    """infra/template.yaml deployed into moto under its own stage; resolves the
    packaged template's intrinsic functions against it."""

    def __init__(self, endpoint_url: str, stage: str) -> None:
        from devstack import resources

        resources.deploy(endpoint_url, stage=stage)
        self.endpoint_url, self.stage = endpoint_url, stage
        self.cfn = boto3.client("cloudformation", endpoint_url=endpoint_url, region_name=REGION)
        self.sqs = boto3.client("sqs", endpoint_url=endpoint_url, region_name=REGION)
        # (moto gives the event bus no physical id; the bundle names it by output)
        self.physical = {r["LogicalResourceId"]: r.get("PhysicalResourceId") for r in
                         self.cfn.describe_stack_resources(
                             StackName=f"gpujobs-{stage}")["StackResources"]}

    def queue_url(self, logical_id: str) -> str:
        physical = self.physical[logical_id]
        if physical.startswith("http"):
            return physical
        return self.sqs.get_queue_url(QueueName=physical)["QueueUrl"]

    def _attribute(self, logical_id: str, attribute: str) -> str:
        if attribute == "Arn":
            return self.sqs.get_queue_attributes(
                QueueUrl=self.queue_url(logical_id),
                AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        if attribute == "QueueName":
            return self.queue_url(logical_id).rsplit("/", 1)[-1]
        if logical_id == "EventBus" and attribute == "Name":
            return f"gpujobs-{self.stage}"  # (as the template names it)
        raise AssertionError(f"no resolver for {logical_id}.{attribute}")

    def _ref(self, logical_id: str) -> str:
        if logical_id == "Stage":
            return self.stage
        if logical_id == "AWS::Region":
            return REGION
        kind = self.cfn.describe_stack_resource(
            StackName=f"gpujobs-{self.stage}",
            LogicalResourceId=logical_id)["StackResourceDetail"]["ResourceType"]
        return self.queue_url(logical_id) if kind == "AWS::SQS::Queue" \
            else self.physical[logical_id]

    def resolve(self, value):
        if isinstance(value, str):
            return value
        (fn, arg), = value.items()
        if fn == "Ref":
            return self._ref(arg)
        if fn == "Fn::GetAtt":
            return self._attribute(*arg)
        if fn == "Fn::Sub":
            return re.sub(r"\$\{([^}.]+)(?:\.([^}]+))?\}", lambda m: self._attribute(
                m[1], m[2]) if m[2] else self._ref(m[1]), arg)
        raise AssertionError(f"no resolver for {value!r}")


@pytest.fixture(scope="module")
def stack(moto_server, bundle):
    stage = "b" + uuid.uuid4().hex[:8]
    s = Stack(moto_server.endpoint_url, stage)
    # the secrets, where the packaged functions are told to find them
    ssm = boto3.client("ssm", endpoint_url=moto_server.endpoint_url, region_name=REGION)
    digest = lambda t: hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
    secrets = {"GPUJOBS_PAGE_TOKEN_KEY_PARAM": "bundle-page-token-key",
               "GPUJOBS_TOKEN_HASHES_PARAM": json.dumps({
                   digest(TENANT_TOKEN): {"tenant": "bundle-tenant"},
                   digest(AGENT_TOKEN): {"agent": "*"},
                   digest(OPERATOR_TOKEN): {"operator": "bundle-ops"}})}
    for var, value in secrets.items():
        name = s.resolve(bundle.environment[var])
        ssm.put_parameter(Name=name, Value=value, Type="SecureString", Overwrite=True)
    return s


class Function:
    """One function of the packaged template, as the Lambda service runs it."""

    def __init__(self, logical_id: str, props: dict, globals_: dict, stack: Stack,
                 task_root: pathlib.Path, tmp: pathlib.Path) -> None:
        self.logical_id, self.props, self.stack = logical_id, props, stack
        self.task_root, self.tmp = task_root, tmp
        self.handler = props["Handler"]
        self.memory_mb = props.get("MemorySize", globals_.get("MemorySize", 128))
        self.timeout_s = props.get("Timeout", globals_.get("Timeout", 3))
        self.name = f"gpujobs-{stack.stage}-{logical_id}"
        variables = props.get("Environment", {}).get("Variables", {})
        self.environment = {k: stack.resolve(v) for k, v in variables.items()}

    def env(self) -> dict[str, str]:
        """The stage's variables plus what the Lambda runtime sets."""
        return {**self.environment,
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_SESSION_TOKEN": "testing", "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, "AWS_LAMBDA_FUNCTION_NAME": self.name,
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_mb),
                "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
                "AWS_EXECUTION_ENV": f"AWS_Lambda_python{sys.version_info.major}."
                                     f"{sys.version_info.minor}",
                "LAMBDA_TASK_ROOT": str(self.task_root), "TZ": ":UTC",
                "LANG": "en_US.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin",
                "PYTHONDONTWRITEBYTECODE": "1",
                # the one addition: AWS, for this function, is the moto server
                "GPUJOBS_AWS_ENDPOINT_URL": self.stack.endpoint_url}

    def run(self, events: list[dict]) -> dict:
        """A cold container: init, the first event, then the rest warm."""
        results = self.tmp / f"{self.logical_id}-{uuid.uuid4().hex[:8]}.json"
        job = {"task_root": str(self.task_root), "handler": self.handler,
               "function_name": self.name, "memory_mb": self.memory_mb,
               "timeout_s": self.timeout_s, "results": str(results),
               "invocations": [{"event": e, "request_id": str(uuid.uuid4())} for e in events]}
        done = subprocess.run([sys.executable, "-I", "-S", "-B", str(RUNTIME)],
                              input=json.dumps(job), capture_output=True, text=True,
                              env=self.env(), cwd=self.task_root, timeout=120)
        assert done.returncode == 0, done.stderr
        out = json.loads(results.read_text())
        assert "init_error" not in out, out["init_error"]
        out["stdout"] = done.stdout
        _assert_lambda_like(out, self.task_root)
        errors = [r["error"] for r in out["results"] if "error" in r]
        assert not errors, f"{self.logical_id}: {errors[0]['stackTrace']}"
        assert len(out["results"]) == len(events)
        return out


def _assert_lambda_like(out: dict, task_root: pathlib.Path) -> None:
    """Only the task root and the standard library were importable, and every
    module came from one of them."""
    assert not out["site_imported"]
    assert out["dont_write_bytecode"]
    root = os.path.realpath(task_root)
    assert out["sys_path"][0] == root
    assert not [p for p in out["sys_path"] if "site-packages" in p or "dist-packages" in p]
    allowed = (root + os.sep, *(p + os.sep for p in out["stdlib"]))
    strays = {name: origin for name, origin in out["modules"].items()
              if origin and not origin.startswith(allowed)}
    assert not strays, f"imported from outside the bundle and the standard library: {strays}"


@pytest.fixture(scope="module")
def functions(bundle, stack, task_root, tmp_path_factory) -> dict[str, Function]:
    globals_ = bundle.sam.get("Globals", {}).get("Function", {})
    tmp = tmp_path_factory.mktemp("invocations")
    return {k: Function(k, v["Properties"], globals_, stack, task_root, tmp)
            for k, v in bundle.functions().items()}


# -- the events AWS sends -----------------------------------------------------------
def api_event(method: str, resource: str, path: str, *, token: str | None = TENANT_TOKEN,
              body=None, headers: dict | None = None, query: dict | None = None,
              path_params: dict | None = None) -> dict:
    """An API Gateway REST API (v1) proxy integration event."""
    hdrs = {"Host": "abc123.execute-api.us-east-1.amazonaws.com", "User-Agent": "curl/8",
            "X-Forwarded-For": "192.0.2.10", "X-Forwarded-Proto": "https",
            "X-Forwarded-Port": "443", **({"Authorization": f"Bearer {token}"} if token else {}),
            **({"Content-Type": "application/json"} if body is not None else {}),
            **(headers or {})}
    request_id = str(uuid.uuid4())
    return {
        "resource": resource, "path": path, "httpMethod": method,
        "headers": hdrs, "multiValueHeaders": {k: [v] for k, v in hdrs.items()},
        "queryStringParameters": query, "multiValueQueryStringParameters":
            {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": path_params, "stageVariables": None,
        "requestContext": {
            "resourceId": "abc123", "resourcePath": resource, "httpMethod": method,
            "extendedRequestId": request_id, "requestTime": "01/May/2024:12:00:00 +0000",
            "path": f"/api{path}", "accountId": "123456789012", "protocol": "HTTP/1.1",
            "stage": "api", "domainPrefix": "abc123", "requestTimeEpoch": 1714564800000,
            "requestId": request_id, "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
            "apiId": "abc123", "identity": {"sourceIp": "192.0.2.10", "userAgent": "curl/8",
                                            "accessKey": None, "user": None}},
        "body": body if body is None or isinstance(body, str) else json.dumps(body),
        "isBase64Encoded": False}


def scheduled_event(rule: str) -> dict:
    """EventBridge's event for a schedule rule."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event",
            "source": "aws.events", "account": "123456789012",
            "time": "2024-05-01T12:00:00Z", "region": REGION,
            "resources": [f"arn:aws:events:{REGION}:123456789012:rule/{rule}"], "detail": {}}


def sqs_event(queue_arn: str, messages: list[dict]) -> dict:
    """The Lambda event source mapping's batch of received messages."""
    return {"Records": [{
        "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"], "body": m["Body"],
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1714564800000",
                       "SenderId": "AROAEXAMPLE:gpujobs",
                       "ApproximateFirstReceiveTimestamp": "1714564800001"},
        "messageAttributes": {}, "md5OfBody": hashlib.md5(m["Body"].encode()).hexdigest(),
        "eventSource": "aws:sqs", "eventSourceARN": queue_arn, "awsRegion": REGION}
        for m in messages]}


def status(result: dict) -> int:
    return result["response"]["statusCode"]


def body(result: dict) -> dict:
    return json.loads(result["response"]["body"])


# -- the functions, each cold then warm -------------------------------------------------
#: every function the package defines gets a test below
INVOKED = {"APIHandler", "Place", "PlaceOnNudge", "Scan", "ScanShard", "Reconcile",
           "FollowUp", "Feed", "DeliverWebhook"}


def test_every_function_of_the_package_is_invoked_here(functions):
    assert set(functions) == INVOKED


@pytest.fixture(scope="module")
def api(functions):
    """The API function: a cold container serving the routes' requests."""
    fn = functions["APIHandler"]
    job_body = {"command": ["python", "train.py"], "ranks": 1, "gpus_per_rank": 1}
    steps = [
        ("health", api_event("GET", "/v1/health", "/v1/health", token=None)),
        ("put_node", api_event("PUT", "/v1/nodes/{node_id}", f"/v1/nodes/{NODE}",
                               token=AGENT_TOKEN, body={"gpus": 8},
                               path_params={"node_id": NODE})),
        ("create", api_event("POST", "/v1/jobs", "/v1/jobs", body=job_body,
                             headers={"Idempotency-Key": "bundle-create-1"})),
        ("create_other", api_event("POST", "/v1/jobs", "/v1/jobs", body=job_body,
                                   headers={"Idempotency-Key": "bundle-create-2"})),
        ("bad_body", api_event("POST", "/v1/jobs", "/v1/jobs", body={"command": ["x"],
                               "ranks": "many"}, headers={"Idempotency-Key": "bundle-bad"})),
        ("not_json", api_event("POST", "/v1/jobs", "/v1/jobs", body="{not json",
                               headers={"Idempotency-Key": "bundle-bad-2"})),
        ("unknown_job", api_event("GET", "/v1/jobs/{job_id}", "/v1/jobs/j-nope",
                                  path_params={"job_id": "j-nope"})),
        ("list", api_event("GET", "/v1/jobs", "/v1/jobs", query={"page_size": "10"})),
        ("get_node", api_event("GET", "/v1/nodes/{node_id}", f"/v1/nodes/{NODE}",
                               token=AGENT_TOKEN, path_params={"node_id": NODE})),
        ("list_nodes", api_event("GET", "/v1/nodes", "/v1/nodes", token=AGENT_TOKEN)),
        ("dashboard", api_event("GET", "/", "/", token=None)),
        ("asset", api_event("GET", "/static/{name}", "/static/app.js", token=None,
                            path_params={"name": "app.js"})),
        ("dashboard_head", api_event("HEAD", "/", "/", token=None)),
        ("asset_head", api_event("HEAD", "/static/{name}", "/static/app.js", token=None,
                                 path_params={"name": "app.js"})),
        ("webhook_create", api_event("POST", "/v1/webhooks", "/v1/webhooks",
                                     body={"url": "https://93.184.216.34/bundle"})),
        ("webhooks", api_event("GET", "/v1/webhooks", "/v1/webhooks")),
    ]
    out = fn.run([e for _, e in steps])
    results = dict(zip([n for n, _ in steps], out["results"]))
    job_id = body(results["create"])["id"]
    other = body(results["create_other"])["id"]
    pp = {"job_id": job_id}
    hook = body(results["webhook_create"])["id"]
    wp = {"webhook_id": hook}
    # the same container, warm, on the routes that need the job's id
    more = [
        ("get", api_event("GET", "/v1/jobs/{job_id}", f"/v1/jobs/{job_id}", path_params=pp)),
        ("attempts", api_event("GET", "/v1/jobs/{job_id}/attempts",
                               f"/v1/jobs/{job_id}/attempts", path_params=pp)),
        ("ranks", api_event("GET", "/v1/jobs/{job_id}/ranks", f"/v1/jobs/{job_id}/ranks",
                            path_params=pp)),
        ("cancel", api_event("POST", "/v1/jobs/{job_id}/cancel", f"/v1/jobs/{other}/cancel",
                             body={"reason": "bundle test"}, path_params={"job_id": other})),
        ("heartbeats", api_event("POST", "/v1/jobs/{job_id}/heartbeats",
                                 f"/v1/jobs/{job_id}/heartbeats", token=AGENT_TOKEN,
                                 body={"attempt": 1, "ranks": [{"rank": 0}]},
                                 path_params=pp)),
        ("event", api_event("POST", "/v1/jobs/{job_id}/attempts/{attempt}/events",
                            f"/v1/jobs/{job_id}/attempts/1/events", token=AGENT_TOKEN,
                            body={"type": "STARTED", "node_id": NODE},
                            path_params={"job_id": job_id, "attempt": "1"})),
        ("events", api_event("GET", "/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/events",
                             path_params=pp)),
        ("logs", api_event("GET", "/v1/jobs/{job_id}/logs", f"/v1/jobs/{job_id}/logs",
                           path_params=pp)),
        ("feed", api_event("GET", "/v1/events", "/v1/events")),
        ("usage", api_event("GET", "/v1/usage", "/v1/usage",
                            query={"start": "2020-01-01T00:00:00Z", "end": "2020-01-02T00:00:00Z"})),
        # an operator's (issue 28): cordon, drain (preempting the job), uncordon
        ("cordon", api_event("POST", "/v1/nodes/{node_id}/cordon", f"/v1/nodes/{NODE}/cordon",
                             token=OPERATOR_TOKEN, body={"reason": "bundle test"},
                             path_params={"node_id": NODE})),
        ("drain", api_event("POST", "/v1/nodes/{node_id}/drain", f"/v1/nodes/{NODE}/drain",
                            token=OPERATOR_TOKEN, body={"reason": "bundle test"},
                            path_params={"node_id": NODE})),
        ("uncordon", api_event("POST", "/v1/nodes/{node_id}/uncordon",
                               f"/v1/nodes/{NODE}/uncordon", token=OPERATOR_TOKEN,
                               path_params={"node_id": NODE})),
        # a webhook's (issue 45): read, its log, a test event (queued), deleted
        ("webhook", api_event("GET", "/v1/webhooks/{webhook_id}", f"/v1/webhooks/{hook}",
                              path_params=wp)),
        ("deliveries", api_event("GET", "/v1/webhooks/{webhook_id}/deliveries",
                                 f"/v1/webhooks/{hook}/deliveries", path_params=wp)),
        ("webhook_test", api_event("POST", "/v1/webhooks/{webhook_id}/test",
                                   f"/v1/webhooks/{hook}/test", path_params=wp)),
        ("webhook_delete", api_event("DELETE", "/v1/webhooks/{webhook_id}",
                                     f"/v1/webhooks/{hook}", path_params=wp)),
    ]
    warm = fn.run([steps[0][1]] + [e for _, e in more])
    results.update(dict(zip(["health_again"] + [n for n, _ in more], warm["results"])))
    return {"results": results, "job_id": job_id, "other": other,
            "events": [e for _, e in steps + more], "runs": [out, warm]}


def test_api_routes_answer_as_the_contract_says(api):
    r = api["results"]
    assert (status(r["cordon"]), status(r["drain"]), status(r["uncordon"])) == (200, 202, 200)
    assert body(r["drain"])["cordon"]["by"] == "bundle-ops"
    assert body(r["uncordon"])["state"] == "READY"
    assert status(r["health"]) == 200 and status(r["health_again"]) == 200
    assert status(r["put_node"]) == 200
    assert status(r["create"]) == 201
    assert r["create"]["response"]["headers"]["Location"] == f"/v1/jobs/{api['job_id']}"
    assert status(r["list"]) == 200
    assert status(r["dashboard"]) == 200 and status(r["asset"]) == 200
    assert r["asset"]["response"]["headers"]["Content-Type"].startswith("text/javascript")
    # HEAD answers GET's headers, its length, and no body
    for head, get in (("dashboard_head", "dashboard"), ("asset_head", "asset")):
        assert status(r[head]) == 200, r[head]
        assert not r[head]["response"].get("body"), r[head]["response"]
        assert r[head]["response"]["headers"]["Content-Type"] == \
            r[get]["response"]["headers"]["Content-Type"]
    assert status(r["events"]) == 200 and "events" in body(r["events"])
    assert status(r["logs"]) == 200 and "lines" in body(r["logs"])
    # the tenant's feed tells the job's creation (numbered by the read itself)
    assert status(r["feed"]) == 200
    assert status(r["usage"]) == 200 and body(r["usage"]) == {"rows": []}
    assert api["job_id"] in [e["job_id"] for e in body(r["feed"])["events"]]
    assert api["job_id"] in [j["id"] for j in body(r["list"])["jobs"]]
    assert status(r["get"]) == 200 and body(r["get"])["id"] == api["job_id"]
    assert status(r["get_node"]) == 200 and status(r["list_nodes"]) == 200
    assert status(r["attempts"]) == 200
    assert status(r["cancel"]) == 202
    assert [status(r[n]) for n in ("webhook_create", "webhooks", "webhook", "deliveries",
                                   "webhook_test", "webhook_delete")] == \
        [201, 200, 200, 200, 202, 204]
    assert "secret" in body(r["webhook_create"]) and "secret" not in body(r["webhook"])
    for name in ("ranks", "heartbeats", "event"):
        assert status(r[name]) < 500, (name, r[name]["response"])


def test_a_bad_body_is_a_problem_naming_the_field(api):
    r = api["results"]
    for name in ("bad_body", "not_json"):
        assert status(r[name]) == 400, r[name]
        assert r[name]["response"]["headers"]["Content-Type"] == "application/problem+json"
    assert "ranks" in json.dumps(body(r["bad_body"]))


def test_an_unknown_job_is_404(api):
    r = api["results"]["unknown_job"]
    assert status(r) == 404
    assert r["response"]["headers"]["Content-Type"] == "application/problem+json"


def test_every_route_of_the_packaged_api_is_called(bundle, api):
    swagger = bundle.resources["RestAPI"]["Properties"]["DefinitionBody"]
    declared = {(path, method.upper()) for path, methods in swagger["paths"].items()
                for method in methods if method.lower() != "options"}
    called = {(e["resource"], e["httpMethod"]) for e in api["events"]}
    assert declared - called == set()


def test_every_log_line_is_json_naming_its_request(api):
    for run in api["runs"]:
        lines = [json.loads(line) for line in run["stdout"].splitlines() if line.strip()]
        ids = {r["request_id"] for r in run["results"]}
        for line in lines:
            if "_aws" in line:  # an EMF metrics record
                continue
            assert line.get("request_id") in ids, line


@pytest.mark.parametrize("logical_id", ["Place", "Scan", "Reconcile", "Feed"])
def test_a_scheduled_function_runs_cold_then_warm(functions, api, logical_id):
    fn = functions[logical_id]
    [rule] = [e for e in fn.props["Events"].values() if e["Type"] == "Schedule"]
    assert rule["Properties"]["Schedule"].startswith("rate(")
    out = fn.run([scheduled_event(f"{fn.name}-event")] * 2)
    cold, warm = out["results"]
    assert isinstance(cold["response"], dict) and isinstance(warm["response"], dict)
    if logical_id == "Scan":
        assert {"jobs", "incidents"} <= set(cold["response"])
    if logical_id == "Reconcile":
        assert cold["response"] is not None
    if logical_id == "Feed":  # the events it numbered and put on the stack's bus
        assert set(cold["response"]) == {"numbered", "pushed", "failed"}
        assert cold["response"]["failed"] == 0


def test_the_queue_consumer_reports_only_the_bad_message_as_failed(functions, stack, api):
    """A batch of the real nudges the creates queued, plus one message that is
    no nudge: the partial batch response names only that one."""
    fn = functions["PlaceOnNudge"]
    [source] = [e for e in fn.props["Events"].values() if e["Type"] == "SQS"]
    assert "ReportBatchItemFailures" in source["Properties"]["FunctionResponseTypes"]
    queue = source["Properties"]["Queue"]["Fn::Sub"][2:-len(".Arn}")]
    url, arn = stack.queue_url(queue), stack.resolve(source["Properties"]["Queue"])
    stack.sqs.send_message(QueueUrl=url, MessageBody="not a nudge")
    messages: list[dict] = []
    for _ in range(10):
        got = stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                        WaitTimeSeconds=0).get("Messages", [])
        messages += got
        if any(m["Body"] == "not a nudge" for m in messages) and len(messages) >= 2:
            break
    nudges = [m for m in messages if m["Body"] != "not a nudge"]
    [bad] = [m for m in messages if m["Body"] == "not a nudge"]
    assert nudges, "the creates queued their nudges"
    batch = sqs_event(arn, messages)
    out = fn.run([batch, sqs_event(arn, nudges)])
    cold, warm = out["results"]
    assert cold["response"] == {"batchItemFailures": [{"itemIdentifier": bad["MessageId"]}]}
    assert warm["response"] == {"batchItemFailures": []}


def only_the_bad_message_fails(fn, stack, good_body: str, bad_body: str) -> None:
    """``fn`` (a queue's consumer) on a batch of ``good_body`` and ``bad_body``
    sent to its queue: only the bad one is reported failed, cold; the good
    one alone, warm, fails nothing."""
    [source] = [e for e in fn.props["Events"].values() if e["Type"] == "SQS"]
    assert "ReportBatchItemFailures" in source["Properties"]["FunctionResponseTypes"]
    queue = source["Properties"]["Queue"]["Fn::Sub"][2:-len(".Arn}")]
    url, arn = stack.queue_url(queue), stack.resolve(source["Properties"]["Queue"])
    for text in (good_body, bad_body):
        stack.sqs.send_message(QueueUrl=url, MessageBody=text)
    messages: list[dict] = []
    for _ in range(10):
        messages += stack.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                              WaitTimeSeconds=0).get("Messages", [])
        if len(messages) >= 2:
            break
    [bad] = [m for m in messages if m["Body"] == bad_body]
    good = [m for m in messages if m["Body"] == good_body]
    out = fn.run([sqs_event(arn, messages), sqs_event(arn, good)])
    cold, warm = out["results"]
    assert cold["response"] == {"batchItemFailures": [{"itemIdentifier": bad["MessageId"]}]}
    assert warm["response"] == {"batchItemFailures": []}


def test_the_scan_shard_consumer_reports_only_the_bad_shard_as_failed(functions, stack, api):
    """A shard of the fanned-out scan naming the API's job (judged, or skipped
    if not RUNNING), and a message that is no shard: only that one fails."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    shard = json.dumps({"type": "SCAN", "scan_at": now, "suppressed": None,
                        "jobs": [[api["job_id"], 1]]})
    only_the_bad_message_fails(functions["ScanShard"], stack, shard, "not a shard")


def test_the_follow_up_consumer_reports_only_the_bad_message_as_failed(functions, stack, api):
    """A follow-up naming the API's job (nothing follows it: done) and a
    message that is no follow-up: only that one fails, to be received again
    and then dead-lettered."""
    only_the_bad_message_fails(functions["FollowUp"], stack,
                               json.dumps({"job_id": api["job_id"]}), "not a follow-up")


def test_the_webhook_consumer_reports_only_the_bad_message_as_failed(functions, stack, api):
    """A delivery for a webhook that is gone (dropped: done, after reading
    the webhooks table) and a message that is no delivery: only that one
    fails, to be received again and then dead-lettered."""
    good = json.dumps({"tenant": "bundle-tenant", "webhook_id": "wh_gone", "attempt": 1,
                       "not_before": None, "event": {"id": "evt_bundle", "type": "job.created",
                                                     "time": "2026-12-01T00:00:00.000Z",
                                                     "job_id": api["job_id"], "data": {}}})
    only_the_bad_message_fails(functions["DeliverWebhook"], stack, good, "not a delivery")
