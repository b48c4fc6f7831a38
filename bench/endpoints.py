"""Endpoint latency against the bare AWS calls each endpoint needs, measured in one run.

``make bench`` runs ``.venv/bin/python bench/endpoints.py`` from the repository
root. Everything runs in-process on moto (``mock_aws``): the tables and queues
come from infra/template.yaml, deployed through CloudFormation exactly as
devstack/resources.py does; requests go through Chalice's test client.

For every endpoint the script times, in interleaved pairs, the endpoint and a
*baseline*: the minimum boto3 calls that endpoint needs, made with a plain
client against the same moto tables. It prints the medians (CPU time of the
calling thread, which other load on a shared machine does not move; wall-clock
ratios alongside), their ratio and the DynamoDB/SQS requests the endpoint made
(counted with a botocore ``request-created`` hook on every client, so retries
count too), flagging any endpoint that makes more than its documented minimum. It also measures, in
fresh interpreters, the import cost of ``import app`` over
``import boto3, chalice, pynamodb`` (cold start) and the cost of the first
request (bootstrap). See docs/benchmarks.md.

Options: --rounds N (default 60), --warmup N (6), --cold-runs N (8),
--first-runs N (2), --seed N, --profile ROW (cProfile that endpoint instead),
--moto server (moto over loopback HTTP on its own thread: the client side
with botocore's HTTP work, for information; see start_environment),
--per-handler (also bench/first_request.py's section), --quick (seconds: the
smoke test). Shared set-up: bench/harness.py; the baselines' items are checked
against the adapters' before every run (bench/parity.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Callable

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness, parity  # noqa: E402
from bench.harness import (  # noqa: E402 - shared by bench/placement.py and bench/scan.py
    CALLS,
    CLIENT_CREATION_S,
    REGION,
    Fail,
)

TENANT = "bench"
TOKEN = "bench"
STAGE = "dev"  # the stage Chalice's test client applies (.chalice/config.json)
#: jobs of TENANT before the run: more than one page of 50, few enough that
#: moto's whole-table copies per TransactWriteItems stay small
LISTED_JOBS = 60
BODY = {
    "name": "bench-train",
    "command": ["python", "train.py", "--epochs", "10", "--lr", "3e-4"],
    "ranks": 4,
    "gpus_per_rank": 8,
    "gpu_type": "H100",
    "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"},
    "labels": {"team": "ml", "project": "bench"},
}
BODY_BYTES = json.dumps(BODY).encode("utf-8")
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
NODE = "n1"
#: the node the placed jobs run on; its GPUs are given back after every round
NODE_GPUS = 1024
CANCEL_BYTES = json.dumps({"reason": "bench"}).encode("utf-8")
#: the cold-start target, as a ratio of CPU medians measured in the same run:
#: ``import app`` over ``import boto3, chalice, pynamodb``. An absolute figure
#: (it was 60 ms) does not carry across machines or load; 1.35 is that 60 ms
#: over the ~175 ms the bare imports took on the machine it was set on
COLD_TARGET_RATIO = 1.35
#: (option, default, --quick): the defaults keep `make bench` under 6 minutes
QUICK = (("rounds", 60, 1), ("warmup", 6, 1), ("cold_runs", 8, 2), ("first_runs", 2, 1))
RATIO_TARGET = 1.5

# -- moto's share ------------------------------------------------------------------
#: CPU nanoseconds this thread spent outside the Lambda function since the last
#: clear: inside moto (answering requests, DynamoDB's and SQS's side; timed by
#: harness.moto_cpu_timer) and in the local API Gateway building proxy events
#: (LambdaHTTP); see client_side_report
MOTO_CPU_NS = harness.MOTO_CPU_NS


# -- environment ----------------------------------------------------------------
def start_environment(moto: str = "in-process") -> dict[str, str]:
    """moto, the stack deployed from infra/template.yaml, the env set.

    ``in-process`` (the default, and the target's measure): requests are
    answered on the calling thread, no HTTP; moto's CPU is timed and taken
    out of the client side. ``server``: moto's embedded server on its own
    thread, reached over loopback HTTP by the app and the baselines alike
    (AWS_ENDPOINT_URL), so this thread's CPU is the client's alone, botocore's
    HTTP work included, as a Lambda pays it (for information: moto is not
    timed, and nothing is taken out)."""
    from devstack import resources

    endpoint_url = None
    if moto == "server":
        server = harness.moto_server()
        endpoint_url = os.environ["AWS_ENDPOINT_URL"] = server.endpoint_url
        harness.install_request_counter()
    else:
        harness.start_moto()  # before any client exists, with the request counter
        harness.moto_cpu_timer()
    env = {k: v for k, v in resources.deploy(endpoint_url, stage=STAGE, region=REGION).items()
           if v is not None}
    os.environ.update(env)
    return env


def build_services():
    from chalicelib import bootstrap
    from chalicelib.adapters.telemetry import LambdaTelemetry
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.config import Config

    # metrics on, as on Lambda: each invocation's EMF record is made and
    # written (to /dev/null here, to the runtime's stdout there), so its cost
    # is the endpoint's
    telemetry = LambdaTelemetry(metrics_to=open(os.devnull, "w"), metrics=True)
    services = bootstrap.build(Config.from_env(), telemetry=telemetry,
                               tokens=TokenStore.from_entries([{"token": TOKEN,
                                                                "tenant": TENANT}]))
    bootstrap.install(services)
    return services


class LambdaHTTP:
    """The routes invoked as Lambda invokes the API function, with the client
    surface of Chalice's test client (``get``/``post`` returning its
    HTTPResponse).

    Chalice's test client also swaps in a copy of ``os.environ`` carrying the
    stage's variables and re-reads the stage configuration on every request,
    about 75 us a call here (15 % of a bare GetItem's client side): work no
    Lambda does, where the environment is set once per container. This sets
    that environment once; per request, Chalice's LocalGateway builds the API
    Gateway proxy event and a LambdaContext (API Gateway's and the runtime's
    work outside the handler: its CPU is added to MOTO_CPU_NS, the share the
    client-side column takes out), then what the Lambda runtime does in the
    function's process is timed as the endpoint's: decoding the event JSON,
    ``app(event, context)``, encoding the result as JSON.
    """

    def __init__(self, app) -> None:
        from chalice.cli.factory import CLIFactory
        from chalice.local import LocalGateway

        config = CLIFactory(str(ROOT)).create_config_obj(chalice_stage_name=STAGE)
        os.environ.update(config.scope(STAGE, "api_handler").environment_variables)
        self._app = app
        self._gateway = LocalGateway(app, config)

    def request(self, method: str, path: str, headers: dict | None = None,
                body: bytes = b""):
        from chalice.test import HTTPResponse

        t0 = time.thread_time_ns()
        gateway = self._gateway
        context = gateway._generate_lambda_context()
        try:
            event = gateway._generate_lambda_event(method, path, dict(headers or {}), body)
        except ValueError:  # no such route: API Gateway answers, no function runs
            MOTO_CPU_NS[0] += time.thread_time_ns() - t0
            return HTTPResponse(headers={}, body=b'{"message": "Missing Authentication Token"}',
                                status_code=403)
        if isinstance(event["body"], bytes):  # API Gateway hands the body over as text
            event["body"] = event["body"].decode("utf-8")
        payload = json.dumps(event)
        MOTO_CPU_NS[0] += time.thread_time_ns() - t0
        response = self._app(json.loads(payload), context)
        json.dumps(response)  # the runtime serialises the handler's answer
        return HTTPResponse.create_from_dict(response)

    def get(self, path: str, **kwargs):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs):
        return self.request("POST", path, **kwargs)


def expect(response, status: int, what: str) -> Any:
    if response.status_code != status:
        raise Fail(f"{what}: HTTP {response.status_code}, expected {status}: "
                   f"{response.body[:300]!r}")
    return response.json_body


# -- the benchmark ----------------------------------------------------------------
@dataclasses.dataclass
class Row:
    name: str
    #: the documented minimum: {"dynamodb": n, "sqs": m}
    minimum: dict[str, int]
    #: untimed: makes what one endpoint call and one baseline call consume
    prepare: Callable[[], dict]
    endpoint: Callable[[dict], Any]
    baseline: Callable[[dict], Any]
    check: Callable[[dict, Any, Any], None]
    #: a create: its fleet read (FleetReads) is amortised, not counted; any
    #: other endpoint's is a request like the others
    reads_fleet: bool = False
    #: wall milliseconds per call
    endpoint_ms: list[float] = dataclasses.field(default_factory=list)
    baseline_ms: list[float] = dataclasses.field(default_factory=list)
    #: CPU milliseconds of this thread per call (everything, moto included,
    #: runs on it), which other processes on a busy machine barely move
    endpoint_cpu: list[float] = dataclasses.field(default_factory=list)
    baseline_cpu: list[float] = dataclasses.field(default_factory=list)
    #: the requests each call made (a create's less its fleet reads)
    endpoint_calls: list[tuple] = dataclasses.field(default_factory=list)
    baseline_calls: list[tuple] = dataclasses.field(default_factory=list)
    #: the fleet reads each endpoint call of a create made, not counted (FleetReads)
    endpoint_fleet_reads: list[int] = dataclasses.field(default_factory=list)
    #: of that CPU, what moto spent answering (client side = CPU - moto)
    endpoint_moto: list[float] = dataclasses.field(default_factory=list)
    baseline_moto: list[float] = dataclasses.field(default_factory=list)

    @property
    def min_total(self) -> int:
        return sum(self.minimum.values())


class FleetReads:
    """Which of a call's requests read the fleet table: the create path reads
    a GPU type's fleet item at most once every FLEET_TTL_S in a container
    (service/jobs.py:RecentFleets), so in wall-clock time one create in a
    while pays one GetItem more. That read is amortised over every create of
    those seconds, not a request of the endpoint, and is reported apart
    (``report``). Installed as harness.WRITE_METER, which hears every
    DynamoDB request before it is sent, in the order of harness.CALLS."""

    def __init__(self, table: str) -> None:
        self.table = table
        #: positions in harness.CALLS of the fleet reads since the last clear
        self.positions: list[int] = []

    def before(self, operation: str, params: dict, context: dict) -> None:
        if operation == "GetItem" and params.get("TableName") == self.table:
            self.positions.append(len(CALLS))

    def after(self, status: int, context: dict) -> None:
        pass


class Bench:
    #: moto's CPU ms in the last _timed call
    last_moto_ms = 0.0
    #: the create path's fleet reads (set up in __init__) and their
    #: positions in the last _timed call's requests
    fleet_reads = FleetReads("")
    last_fleet_reads: frozenset[int] = frozenset()

    def __init__(self, services, http: "LambdaHTTP") -> None:
        import boto3
        from botocore.config import Config as BotoConfig

        from chalicelib.config import Config
        from chalicelib.domain.principal import Principal

        self.services = services
        self.http = http
        self.cfg: Config = services.config
        Bench.fleet_reads = FleetReads(self.cfg.fleet_table)
        harness.WRITE_METER[0] = Bench.fleet_reads
        # the baseline: plain boto3 clients, no parameter validation (as PynamoDB)
        plain = BotoConfig(parameter_validation=False)
        session = boto3.session.Session()
        self.ddb = session.client("dynamodb", region_name=REGION, config=plain)
        self.sqs = session.client("sqs", region_name=REGION, config=plain)
        self.cleanup = boto3.session.Session().client("dynamodb", region_name=REGION)
        # registering creates the node's inbox queue (SqsInbox.ensure)
        node = services.nodes.register(Principal("agent", "*"), NODE,
                                       {"gpus": NODE_GPUS, "gpu_type": BODY["gpu_type"]})
        self.queue_url = node.inbox_queue_url
        self.queues = [u for u in (self.queue_url, self.cfg.pending_queue_url) if u]
        self.garbage: list[tuple[str, dict]] = []
        self.rows = self._rows()

    # -- fixtures (untimed) ----------------------------------------------------
    def _job_key(self, job_id: str) -> dict:
        return {"job_id": {"S": job_id}}

    def _new_job(self, *, key: str | None = None, placed: bool = False):
        """A PENDING job made through the service (or placed on NODE, as the
        placer would place it: a Plan, a LAUNCH intent, the store's place)."""
        from chalicelib.domain import idempotency
        from chalicelib.domain.clock import utcnow
        from chalicelib.domain.intents import launch_intent
        from chalicelib.domain.placement import Plan

        job = harness.new_job(self.services, TENANT, BODY, key)
        self.garbage.append((self.cfg.jobs_table, self._job_key(job.job_id)))
        if key is not None:
            self.garbage.append((self.cfg.idempotency_table,
                                 {"idem_id": {"S": idempotency.record_id(TENANT, key)}}))
        if placed:
            plan = Plan({NODE: list(range(job.spec.ranks))}, job.spec.gpus_per_rank)
            intent = launch_intent(job, job.attempt + 1, plan.ranks_by_node,
                                   {NODE: self.queue_url}, NODE, 29500)
            job = self.services.store.place(job, plan, intent, utcnow())
            self.garbage.append((self.cfg.attempts_table,
                                 {"job_id": {"S": job.job_id},
                                  "attempt": {"N": str(job.attempt)}}))
            for kind in ("LAUNCH", "CANCEL"):
                self.garbage.append((self.cfg.outbox_table,
                                     {"job_id": {"S": job.job_id},
                                      "intent_id": {"S": f"{kind}#{job.attempt}"}}))
        return job

    def _create_writes(self, key: str) -> list[dict]:
        """The transaction the store's create sends for a new job under ``key``
        (adapters/job_store.create_writes: the very requests, built by the same
        code): [0] the key's record, [1] the job, [2] the tenant's PENDING
        count under its max_pending_jobs (the bench tenant has the defaults)."""
        from chalicelib.adapters.job_store import create_writes
        from chalicelib.domain import idempotency
        from chalicelib.domain.clock import utcnow
        from chalicelib.domain.health import initial_health
        from chalicelib.domain.ids import new_job_id
        from chalicelib.domain.jobs import Job
        from chalicelib.domain.quotas import DEFAULT_MAX_PENDING_JOBS
        from chalicelib.domain.spec import JobSpec
        from chalicelib.domain.states import JobState
        from chalicelib.service.ports import IdemClaim

        now = utcnow()
        spec = JobSpec.parse(BODY)
        claim = IdemClaim(idempotency.record_id(TENANT, key), idempotency.body_hash(BODY))
        job = Job(job_id=new_job_id(), tenant=TENANT, state=JobState.PENDING, spec=spec,
                  created_at=now, updated_at=now, name=BODY["name"],
                  health=initial_health(spec, self.cfg.scans_per_hour), idem_id=claim.idem_id)
        return create_writes(job, claim, max_pending=DEFAULT_MAX_PENDING_JOBS)

    # -- rows --------------------------------------------------------------------
    def _rows(self) -> list[Row]:
        from chalicelib.adapters.fleet import FLEET
        from chalicelib.adapters.job_store import cancel_unplaced_writes, page_request
        from chalicelib.adapters.jobs_table import JOBS
        from chalicelib.adapters.transitions import request_cancel_writes
        from chalicelib.domain import idempotency
        from chalicelib.domain.clock import plus, utcnow
        from chalicelib.domain.fleet import LINE_KEY
        from chalicelib.domain.intents import cancel_intent

        cfg, ddb, sqs, http = self.cfg, self.ddb, self.sqs, self.http
        jobs_table = cfg.jobs_table

        def get_consistent(job_id: str) -> dict:
            return ddb.get_item(**JOBS.get(JOBS.key(job_id)))

        def get_pending(job_id: str) -> dict:
            """A PENDING job's get: the job, and the placer's line for its
            place in it (domain/queue.py; adapters/node_store.py line)."""
            ddb.get_item(**FLEET.get(FLEET.key(LINE_KEY), attributes=["line"], consistent=False))
            return get_consistent(job_id)

        # create ------------------------------------------------------------------
        def create_prepare() -> dict:
            key_e, key_b = f"e-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
            items = self._create_writes(key_b)
            record, job = items[0]["Put"]["Item"], items[1]["Put"]["Item"]
            self.garbage += [(cfg.idempotency_table, {"idem_id": record["idem_id"]}),
                             (jobs_table, self._job_key(job["job_id"]["S"])),
                             (cfg.idempotency_table,
                              {"idem_id": {"S": idempotency.record_id(TENANT, key_e)}})]
            return {"headers": {**HEADERS, "Idempotency-Key": key_e}, "items": items}

        def create_check(ctx, response, _baseline) -> None:
            body = expect(response, 201, "create")
            if "Idempotent-Replayed" in response.headers:
                raise Fail("create: fresh key reported as a replay")
            self.garbage.append((jobs_table, self._job_key(body["id"])))

        # replayed create ----------------------------------------------------------
        replay_key = f"replay-{uuid.uuid4()}"
        first = expect(http.post("/v1/jobs", headers={**HEADERS, "Idempotency-Key": replay_key},
                                 body=BODY_BYTES), 201, "replay set-up")
        replay_job_id = first["id"]

        def replay_prepare() -> dict:
            return {"headers": {**HEADERS, "Idempotency-Key": replay_key},
                    "items": self._create_writes(replay_key)}  # a new job id, the same key

        def replay_baseline(ctx) -> dict:
            try:
                ddb.transact_write_items(TransactItems=ctx["items"])
            except ddb.exceptions.TransactionCanceledException as e:
                held = e.response["CancellationReasons"][0]["Item"]
                return get_consistent(held["job_id"]["S"])
            raise Fail("replay baseline: the transaction did not fail")

        def replay_check(ctx, response, baseline) -> None:
            body = expect(response, 201, "replayed create")
            if response.headers.get("Idempotent-Replayed") != "true" or \
                    body["id"] != replay_job_id:
                raise Fail("replayed create did not replay")
            if baseline["Item"]["job_id"]["S"] != replay_job_id:
                raise Fail("replay baseline read the wrong job")

        # get and list -------------------------------------------------------------
        get_job_id = replay_job_id

        def list_baseline(ctx) -> dict:
            return ddb.query(**page_request(TENANT, None, 50, None))

        def list_check(ctx, response, baseline) -> None:
            body = expect(response, 200, "list")
            if len(body["jobs"]) != 50 or not body["next_page_token"]:
                raise Fail("list: expected a full page and a next_page_token")
            if len(baseline["Items"]) != 51:
                raise Fail("list baseline: expected 51 items")

        # cancel -------------------------------------------------------------------
        def cancel_prepare(*, key: bool = False, placed: bool = False) -> Callable[[], dict]:
            def prepare() -> dict:
                e = self._new_job(key=f"c-{uuid.uuid4()}" if key else None, placed=placed)
                b = self._new_job(key=f"c-{uuid.uuid4()}" if key else None, placed=placed)
                return {"path": f"/v1/jobs/{e.job_id}/cancel", "job": b}
            return prepare

        def cancel_endpoint(ctx):
            return http.post(ctx["path"], headers=HEADERS, body=CANCEL_BYTES)

        def cancel_check(state: str) -> Callable:
            def check(ctx, response, _baseline) -> None:
                body = expect(response, 202, "cancel")
                if body["state"] != state or body["cancel_requested_at"] is None:
                    raise Fail(f"cancel: state {body['state']}, expected {state}")
            return check

        def cancel_pending_prepare() -> dict:
            """GetItem, then the transaction of the store's cancel_unplaced
            (job_store.cancel_unplaced_writes): the conditional update of the job
            and the tenant's PENDING count."""
            ctx = cancel_prepare()()
            ctx["items"] = cancel_unplaced_writes(ctx["job"], utcnow(), "bench")
            return ctx

        def cancel_pending_baseline(ctx) -> None:
            get_consistent(ctx["job"].job_id)
            ddb.transact_write_items(TransactItems=ctx["items"])

        def cancel_keyed_prepare() -> dict:
            """GetItem, then one transaction: the same update of the job and the
            count, and the expiry of its idempotency record (the same
            cancel_unplaced_writes, of a job made under a key)."""
            ctx = cancel_prepare(key=True)()
            ctx["items"] = cancel_unplaced_writes(ctx["job"], utcnow(), "bench")
            return ctx

        def cancel_keyed_baseline(ctx) -> None:
            get_consistent(ctx["job"].job_id)
            ddb.transact_write_items(TransactItems=ctx["items"])

        def cancel_placed_prepare() -> dict:
            """The endpoint's job, and the baseline's requests for another placed
            job: GetItem, then one transaction that records the cancel request,
            puts the CANCEL intent in the outbox and stops the LAUNCH intent's
            resends (transitions.request_cancel_writes), then one SendMessage."""
            ctx = cancel_prepare(placed=True)()
            job = ctx["job"]
            now = utcnow()
            intent = cancel_intent(job, "bench")
            ctx["items"] = request_cancel_writes(job, now, "bench", intent,
                                                 plus(now, cfg.cancel_resend_after_s))
            ctx["message"] = json.dumps(intent.message_for(NODE), separators=(",", ":"))
            return ctx

        def cancel_placed_baseline(ctx) -> None:
            get_consistent(ctx["job"].job_id)
            ddb.transact_write_items(TransactItems=ctx["items"])
            sqs.send_message(QueueUrl=self.queue_url, MessageBody=ctx["message"])

        def create_baseline(ctx) -> None:
            ddb.transact_write_items(TransactItems=ctx["items"])
            sqs.send_message(QueueUrl=cfg.pending_queue_url, MessageBody='{"type":"PLACE"}')

        no_ctx: Callable[[], dict] = dict
        return [
            # the job and its key in one transaction, then the placement nudge
            # (placement runs right after a create: issue 3)
            Row("create", {"dynamodb": 1, "sqs": 1}, create_prepare,
                lambda c: http.post("/v1/jobs", headers=c["headers"], body=BODY_BYTES),
                create_baseline, create_check, reads_fleet=True),
            Row("replayed create", {"dynamodb": 2, "sqs": 0}, replay_prepare,
                lambda c: http.post("/v1/jobs", headers=c["headers"], body=BODY_BYTES),
                replay_baseline, replay_check, reads_fleet=True),
            Row("get", {"dynamodb": 2, "sqs": 0}, no_ctx,
                lambda c: http.get(f"/v1/jobs/{get_job_id}", headers=HEADERS),
                lambda c: get_pending(get_job_id),
                lambda c, r, b: expect(r, 200, "get")),
            Row("list page (50)", {"dynamodb": 1, "sqs": 0}, no_ctx,
                lambda c: http.get("/v1/jobs?page_size=50", headers=HEADERS),
                list_baseline, list_check),
            Row("cancel PENDING", {"dynamodb": 2, "sqs": 0}, cancel_pending_prepare,
                cancel_endpoint, cancel_pending_baseline, cancel_check("CANCELLED")),
            Row("cancel PENDING, keyed", {"dynamodb": 2, "sqs": 0}, cancel_keyed_prepare,
                cancel_endpoint, cancel_keyed_baseline, cancel_check("CANCELLED")),
            Row("cancel placed", {"dynamodb": 2, "sqs": 1}, cancel_placed_prepare,
                cancel_endpoint, cancel_placed_baseline, cancel_check("SCHEDULED")),
        ]

    # -- running -------------------------------------------------------------------
    def fill(self) -> None:
        for _ in range(LISTED_JOBS):
            self.services.jobs.submit(TENANT, BODY, None)

    def collect_garbage(self) -> None:
        """Delete what a round made, so tables keep their size (moto copies
        whole tables on every TransactWriteItems), and empty the queues."""
        by_table: dict[str, list] = {}
        for table, key in self.garbage:
            by_table.setdefault(table, []).append({"DeleteRequest": {"Key": key}})
        self.garbage.clear()
        for table, requests in by_table.items():
            for i in range(0, len(requests), 25):
                self.cleanup.batch_write_item(RequestItems={table: requests[i:i + 25]})
        # the placed jobs' reservations: the node gets its GPUs back
        self.cleanup.update_item(
            TableName=self.cfg.nodes_table, Key={"node_id": {"S": NODE}},
            UpdateExpression="SET #f = :g REMOVE #a",
            ExpressionAttributeNames={"#f": "gpus_free", "#a": "attempts"},
            ExpressionAttributeValues={":g": {"N": str(NODE_GPUS)}})
        # moto's leaks (its instance tracking, empty buckets): see harness
        harness.moto_housekeeping()
        for url in self.queues:  # moto's queues slow down as they fill
            while True:
                messages = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                    WaitTimeSeconds=0).get("Messages", [])
                if not messages:
                    break
                self.sqs.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)])

    @staticmethod
    def _timed(fn: Callable, ctx: dict) -> tuple[float, float, tuple, Any]:
        """Wall ms, CPU ms, the requests made (which of them read the fleet:
        ``Bench.last_fleet_reads``) and what ``fn`` returned."""
        CALLS.clear()
        Bench.fleet_reads.positions.clear()
        MOTO_CPU_NS[0] = 0
        # moto keeps every table in this process's heap, and a collection that
        # an allocation inside the call sets off would scan all of it (200 to
        # 550 us a call, landing on whichever side allocated last); on Lambda
        # the tables are DynamoDB's. Frozen here, untimed: what the call
        # allocates is still collected, and timed, as usual
        gc.freeze()
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        result = fn(ctx)
        wall = time.perf_counter_ns() - t0
        cpu = time.thread_time_ns() - c0
        Bench.last_moto_ms = MOTO_CPU_NS[0] / 1e6
        Bench.last_fleet_reads = frozenset(Bench.fleet_reads.positions)
        return wall / 1e6, cpu / 1e6, tuple(CALLS), result

    @staticmethod
    def _apart(row: Row, calls: tuple, fleet: frozenset[int]) -> tuple[tuple, int]:
        """A create's requests less its fleet reads, and how many those were;
        any other row's requests as made."""
        if not row.reads_fleet:
            return calls, 0
        return tuple(c for i, c in enumerate(calls) if i not in fleet), len(fleet)

    def round(self, index: int, rng: random.Random, record: bool) -> None:
        rows = list(self.rows)
        rng.shuffle(rows)
        for position, row in enumerate(rows):
            ctx = row.prepare()
            if (index + position) % 2 == 0:
                e_ms, e_cpu, e_calls, response = self._timed(row.endpoint, ctx)
                e_moto, e_fleet = Bench.last_moto_ms, Bench.last_fleet_reads
                b_ms, b_cpu, b_calls, base = self._timed(row.baseline, ctx)
                b_moto = Bench.last_moto_ms
            else:
                b_ms, b_cpu, b_calls, base = self._timed(row.baseline, ctx)
                b_moto = Bench.last_moto_ms
                e_ms, e_cpu, e_calls, response = self._timed(row.endpoint, ctx)
                e_moto, e_fleet = Bench.last_moto_ms, Bench.last_fleet_reads
            row.check(ctx, response, base)
            e_calls, fleet_reads = self._apart(row, e_calls, e_fleet)
            if record:
                row.endpoint_ms.append(e_ms)
                row.baseline_ms.append(b_ms)
                row.endpoint_cpu.append(e_cpu)
                row.baseline_cpu.append(b_cpu)
                row.endpoint_calls.append(e_calls)
                row.baseline_calls.append(b_calls)
                row.endpoint_fleet_reads.append(fleet_reads)
                row.endpoint_moto.append(e_moto)
                row.baseline_moto.append(b_moto)
        self.collect_garbage()


def _count(calls: tuple, service: str) -> int:
    return sum(1 for s, _ in calls if s == service)


def _describe(calls: tuple) -> str:
    return " + ".join(op for _, op in calls)


def report(rows: list[Row]) -> tuple[float, str]:
    """The table; returns the worst ratio. Times are medians of the calling
    thread's CPU time: app, botocore and moto all run on it without I/O, so
    that is how long a call takes, and other processes on a busy machine do
    not move it. Wall-clock ratios are shown alongside; on an idle machine
    the two agree."""
    head = (f"{'endpoint':<22} {'endpoint ms':>11} {'baseline ms':>11} {'ratio':>6} "
            f"{'extra ms':>8} {'wall ratio':>10}  {'requests':>8} {'min':>4}  requests made")
    print(head)
    print("-" * len(head))
    worst = (0.0, "")
    flagged = []
    for row in rows:
        e, b = statistics.median(row.endpoint_cpu), statistics.median(row.baseline_cpu)
        ratio = e / b
        wall_ratio = statistics.median(row.endpoint_ms) / statistics.median(row.baseline_ms)
        worst = max(worst, (ratio, row.name))
        most = max(row.endpoint_calls, key=len)
        counts = {s: max(_count(c, s) for c in row.endpoint_calls) for s in ("dynamodb", "sqs")}
        total = max(len(c) for c in row.endpoint_calls)
        varied = len({len(c) for c in row.endpoint_calls}) > 1
        over = [s for s in counts if counts[s] > row.minimum[s]]
        flag = "  !! ABOVE MINIMUM" if over else ""
        if over:
            flagged.append(f"{row.name} (+" + ", +".join(
                f"{counts[s] - row.minimum[s]} {s}" for s in over) + ")")
        split = f"ddb {counts['dynamodb']}" + (f" sqs {counts['sqs']}" if counts["sqs"] or
                                                 row.minimum["sqs"] else "")
        print(f"{row.name:<22} {e:>11.2f} {b:>11.2f} {ratio:>6.2f} {e - b:>8.2f} "
              f"{wall_ratio:>10.2f}  {total:>8} {row.min_total:>4}  {split}: {_describe(most)}"
              f"{' (count varied)' if varied else ''}{flag}")
        for calls in row.baseline_calls:
            if len(calls) != row.min_total:
                print(f"   note: the {row.name} baseline made {len(calls)} requests: "
                      f"{_describe(calls)}")
                break
    fleet = [f"{row.name} in {sum(1 for n in row.endpoint_fleet_reads if n)} of "
             f"{len(row.endpoint_fleet_reads)} rounds"
             for row in rows if any(row.endpoint_fleet_reads)]
    if fleet:
        print("not counted above, the fleet read again once its FLEET_TTL_S had passed "
              "(one GetItem amortised over that many seconds of creates): " + ", ".join(fleet))
    if flagged:
        print(f"endpoints above their minimum request count: {', '.join(flagged)}")
    else:
        print("every endpoint made exactly its minimum number of requests")
    cpu = sum(sum(r.endpoint_cpu) + sum(r.baseline_cpu) for r in rows)
    wall = sum(sum(r.endpoint_ms) + sum(r.baseline_ms) for r in rows)
    share = round(100 * cpu / wall)
    busy = "" if share >= 85 else "; the machine was busy, so wall ratios are unreliable"
    print(f"the timed calls got {share}% of a CPU{busy}")
    return worst


def client_side_report(rows: list[Row], share: str = "moto") -> tuple[float, str]:
    """The same calls without moto's share: moto answers in-process, on the
    calling thread, and is most of every baseline's CPU, which dilutes the
    ratios above. Here each call's CPU minus the CPU spent inside moto's stub
    (harness.moto_cpu_timer): what the app, PynamoDB and botocore add over bare
    boto3 calls, as a Lambda pays it. Returns the worst client-side ratio."""
    head = (f"{'endpoint (client side)':<22} {'endpoint ms':>11} {'baseline ms':>11} "
            f"{'ratio':>6} {'extra ms':>8} {share + ' share':>13}")
    print(head)
    print("-" * len(head))
    worst = (0.0, "")
    for row in rows:
        e = statistics.median(c - m for c, m in zip(row.endpoint_cpu, row.endpoint_moto))
        b = statistics.median(c - m for c, m in zip(row.baseline_cpu, row.baseline_moto))
        taken = sum(row.baseline_moto) / sum(row.baseline_cpu)
        ratio = e / b
        worst = max(worst, (ratio, row.name))
        flag = "  !! ABOVE TARGET" if ratio > RATIO_TARGET else ""
        print(f"{row.name:<22} {e:>11.3f} {b:>11.3f} {ratio:>6.2f} {e - b:>8.3f} "
              f"{100 * taken:>12.0f}%{flag}")
    return worst


# -- cold start and first request ----------------------------------------------------
IMPORT_BASE = "import boto3, chalice, pynamodb"
IMPORT_APP = "import app"


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def _import_ms(statement: str) -> tuple[float, float]:
    """CPU and wall milliseconds of ``statement`` in a fresh interpreter."""
    code = ("import time; c, t = time.process_time(), time.perf_counter(); " + statement +
            "; print((time.process_time() - c) * 1e3, (time.perf_counter() - t) * 1e3)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_subprocess_env(),
                         capture_output=True, text=True, check=True)
    cpu, wall = out.stdout.split()[-2:]
    return float(cpu), float(wall)


def cold_start(runs: int) -> float:
    """Import cost of the app over its libraries. Imports are CPU-bound, so the
    difference is taken on the processes' CPU time, which other load on a noisy
    machine barely moves; wall time is shown for information."""
    for statement in (IMPORT_BASE, IMPORT_APP):
        _import_ms(statement)  # write bytecode caches; not counted
    base, full = [], []
    for i in range(runs):
        if i % 2:
            full.append(_import_ms(IMPORT_APP))
            base.append(_import_ms(IMPORT_BASE))
        else:
            base.append(_import_ms(IMPORT_BASE))
            full.append(_import_ms(IMPORT_APP))
    b_cpu, f_cpu = (statistics.median(c for c, _ in x) for x in (base, full))
    b_wall, f_wall = (statistics.median(w for _, w in x) for x in (base, full))
    print(f"imports (median of {runs} fresh interpreters each, interleaved; CPU ms, wall ms "
          f"in brackets): `{IMPORT_BASE}` {b_cpu:.1f} ({b_wall:.1f}), `{IMPORT_APP}` "
          f"{f_cpu:.1f} ({f_wall:.1f})")
    delta, ratio = f_cpu - b_cpu, f_cpu / b_cpu
    print(f"cold-start: ratio {ratio:.2f} to the bare imports, +{delta:.1f} ms (target: ratio "
          f"under {COLD_TARGET_RATIO}; wall ratio {f_wall / b_wall:.2f}, "
          f"+{f_wall - b_wall:.1f} ms){'' if ratio < COLD_TARGET_RATIO else '  !! ABOVE TARGET'}")
    return delta


def first_request_child() -> None:
    """In a fresh interpreter: what the first request costs over a warm one."""
    start_environment()
    import fastjsonschema
    from chalice.test import Client

    import app as gpujobs  # noqa: F401 - imported as Lambda would, before any request
    from chalicelib import bootstrap
    from chalicelib.adapters.tokens import TokenStore
    from chalicelib.api import validation
    from chalicelib.config import Config

    compile_s = [0.0]
    original_compile = fastjsonschema.compile

    def timed_compile(*args, **kwargs):
        t = time.thread_time()
        try:
            return original_compile(*args, **kwargs)
        finally:
            compile_s[0] += time.thread_time() - t

    validation.fastjsonschema.compile = timed_compile
    http = Client(gpujobs.app, stage_name=STAGE, project_dir=str(ROOT)).http
    tokens = TokenStore.from_entries([{"token": TOKEN, "tenant": TENANT}])
    CLIENT_CREATION_S.clear()
    t0 = time.thread_time()
    config = Config.from_env()
    t1 = time.thread_time()
    services = bootstrap.build(config, tokens=tokens)
    t2 = time.thread_time()
    bootstrap.install(services)
    sqs_client_s = CLIENT_CREATION_S.pop("sqs", 0.0)

    created: list[str] = []

    def create() -> float:
        headers = {**HEADERS, "Idempotency-Key": str(uuid.uuid4())}
        t = time.thread_time()
        response = http.post("/v1/jobs", headers=headers, body=BODY_BYTES)
        elapsed = time.thread_time() - t
        created.append(expect(response, 201, "first-request create")["id"])
        return elapsed

    first = create()
    ddb_client_s = CLIENT_CREATION_S.pop("dynamodb", 0.0)
    warm = statistics.median(create() for _ in range(15))

    def get(job_id: str) -> float:
        t = time.thread_time()
        response = http.get(f"/v1/jobs/{job_id}", headers=HEADERS)
        elapsed = time.thread_time() - t
        expect(response, 200, "first-request get")
        return elapsed

    # the first GET reads through JobModel's own PynamoDB connection, not the
    # transaction connection the create used
    job_id = created[0]
    CLIENT_CREATION_S.clear()
    first_get = get(job_id)
    get_client_s = CLIENT_CREATION_S.pop("dynamodb", 0.0)
    warm_get = statistics.median(get(job_id) for _ in range(15))
    print(json.dumps({"config": t1 - t0, "build": t2 - t1, "sqs_client": sqs_client_s,
                      "first": first, "ddb_client": ddb_client_s, "compile": compile_s[0],
                      "warm": warm, "first_get": first_get, "get_client": get_client_s,
                      "warm_get": warm_get}))


def first_request(runs: int) -> None:
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()),
                              "--first-request-child"], cwd=ROOT, env=_subprocess_env(),
                             capture_output=True, text=True)
        if out.returncode:
            raise Fail(f"first-request run failed:\n{out.stderr[-2000:]}")
        samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    m = {k: statistics.median(s[k] for s in samples) * 1e3 for k in samples[0]}
    extra = m["config"] + m["build"] + m["first"] - m["warm"]
    print(f"first request (median of {runs}, CPU ms, for information): +{extra:.1f} ms = "
          f"bootstrap {m['config'] + m['build']:.1f} ms (config {m['config']:.2f}, "
          f"bind + SQS client {m['build']:.1f}, of it the SQS client {m['sqs_client']:.1f})"
          f" + first create {m['first']:.1f} ms vs {m['warm']:.1f} ms warm (of it the "
          f"PynamoDB DynamoDB client {m['ddb_client']:.1f}, JOB_CREATE schema compile "
          f"{m['compile']:.1f}); then the first get {m['first_get']:.1f} ms vs "
          f"{m['warm_get']:.1f} ms warm (another DynamoDB client {m['get_client']:.1f})")


# -- first request per handler (issue 15) ----------------------------------------------
def first_request_per_handler(runs: int, quick: bool = False) -> float:
    """Every handler's first request in a fresh interpreter over its warm calls,
    with the AWS clients it made (bench/first_request.py; its own moto server,
    before this script starts moto in-process)."""
    from bench import first_request as per_handler

    handlers = per_handler.QUICK_HANDLERS if quick else per_handler.HANDLERS
    return per_handler.report(per_handler.measure(runs, handlers), runs)


# -- main ----------------------------------------------------------------------------
def profile(bench: Bench, name: str, rounds: int) -> None:
    import cProfile
    import pstats

    row = next(r for r in bench.rows if r.name.startswith(name))
    profiler = cProfile.Profile()
    for _ in range(rounds):
        ctx = row.prepare()
        profiler.enable()
        result = row.endpoint(ctx)
        profiler.disable()
        if not 200 <= result.status_code < 300:
            raise Fail(f"{row.name}: HTTP {result.status_code}: {result.body[:300]!r}")
        if row.name.startswith("create"):
            bench.garbage.append((bench.cfg.jobs_table, bench._job_key(result.json_body["id"])))
        bench.collect_garbage()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(60)


def main() -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--cold-runs", type=int, default=None)
    parser.add_argument("--first-runs", type=int, default=None)
    parser.add_argument("--profile", metavar="ROW", help="cProfile one endpoint and exit")
    parser.add_argument("--moto", choices=("in-process", "server"), default="in-process",
                        help="server: moto over loopback HTTP on its own thread, so the "
                             "client side is this thread's CPU, HTTP included (start_environment)")
    parser.add_argument("--per-handler", action="store_true",
                        help="also the first request of every handler (bench/first_request.py, "
                             "which bench/scale.py runs in `make bench`)")
    parser.add_argument("--first-request-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_request_child:
        first_request_child()
        return 0
    for name, default, quick in QUICK:
        setattr(args, name, harness.pick(getattr(args, name), default, quick, args.quick))

    started = time.monotonic()
    import moto

    print(f"gpujobs endpoint benchmark, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"Python {platform.python_version()}, moto {moto.__version__} {args.moto}, "
          f"{os.cpu_count()} CPUs")
    if not args.profile and args.moto == "in-process":
        cold_start(args.cold_runs)
        first_request(args.first_runs)
        if args.per_handler:  # `make bench` has it from bench/scale.py
            first_request_per_handler(args.first_runs, args.quick)

    start_environment(args.moto)
    services = build_services()
    import app as gpujobs

    bench = Bench(services, LambdaHTTP(gpujobs.app))
    bench.fill()
    parity.check_endpoints(bench, TENANT)
    if args.profile:
        profile(bench, args.profile, args.rounds)
        return 0
    rng = random.Random(args.seed)
    for i in range(args.warmup):
        bench.round(i, rng, record=False)
    gc.collect()
    gc.freeze()
    for i in range(args.rounds):
        bench.round(i, rng, record=True)
    print(f"\nmedians of {args.rounds} interleaved rounds after {args.warmup} warm-up rounds, "
          f"in CPU ms of the calling thread; jobs table held {LISTED_JOBS}-{LISTED_JOBS + 20} "
          f"items (target ratio: under {RATIO_TARGET})")
    ratio, name = report(bench.rows)
    if args.moto == "server":
        print("\nclient side over HTTP: moto answered on its own thread, so this is the "
              "client's CPU alone, botocore's HTTP included, less the local API Gateway's "
              "event building (for information; the target is the in-process run's)")
        client_ratio, client_name = client_side_report(bench.rows, share="gateway")
        print(f"total run time {time.monotonic() - started:.0f} s")
        print(f"worst client-side ratio over HTTP: {client_ratio:.2f} ({client_name})")
        return 0
    print(f"\nclient side: medians of CPU ms minus moto's share of each call "
          f"(target ratio: under {RATIO_TARGET})")
    client_ratio, client_name = client_side_report(bench.rows)
    print(f"total run time {time.monotonic() - started:.0f} s")
    print(f"worst ratio: {ratio:.2f} ({name})")
    print(f"worst client-side ratio: {client_ratio:.2f} ({client_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
