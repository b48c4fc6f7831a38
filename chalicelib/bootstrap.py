"""Wires adapters into services, once per process, on first use.

Nothing here runs at import time: a Lambda cold start pays for it on the first
request, and tests can bind their own configuration (or fakes) first.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from .adapters import dynamo_errors, models
from .adapters.dynamo import Dynamo
from .adapters.event_bus import EventBridgeSink
from .adapters.feed_store import DynamoFeeds, tenant_tag
from .adapters.heartbeat_store import DynamoCollectorStore, DynamoHeartbeatStore
from .adapters.inbox import SqsFollowUps, SqsInbox, SqsNudge, SqsScanQueue
from .adapters.log_reader import CloudWatchLogReader
from .adapters.node_store import DynamoNodeStore
from .adapters.parameters import SsmParameters
from .adapters.store import DynamoStore
from .adapters.tokens import TokenStore
from .adapters.usage_store import DynamoUsage
from .adapters.webhook_delivery import SqsWebhookQueue, Urllib3Poster
from .adapters.webhook_store import DynamoWebhookStore
from .config import Config, ConfigError
from .domain.clock import Clock, utcnow
from .domain.happened import (
    AttemptEnded,
    ChildPlaced,
    JobEnded,
    PreemptionChosen,
    RankFailed,
    RanksGone,
)
from .service import health
from .service.attempts import AttemptsService
from .service.auth import Authenticator
from .service.bus import Bus
from .service.cancels import Canceller
from .service.cordons import Cordons, FailureWatch
from .service.dispatch import Dispatcher
from .service.feed import FeedService
from .service.heartbeats import HeartbeatsService
from .service.jobs import JobsService
from .service.logs import LogsService
from .service.nodes import NodesService
from .service.pipelines import PipelinesService
from .service.placement import Placer
from .service.ports import FeedLog, FollowUps, JobTables, NodeStore, Telemetry
from .service.reconciler import Reconciler
from .service.scan import Scanner
from .service.scan_fanout import ScanFanout
from .service.usage_rollup import UsageService
from .service.webhooks import WebhooksService


@dataclass
class Services:
    config: Config
    store: JobTables
    node_store: NodeStore
    jobs: JobsService
    nodes: NodesService
    attempts: AttemptsService
    placer: Placer
    reconciler: Reconciler
    heartbeats: HeartbeatsService
    scanner: Scanner
    scan_fanout: ScanFanout | None
    auth: Authenticator
    telemetry: Telemetry
    logs: LogsService
    cordons: Cordons
    #: dependencies and arrays: what follows a job's end (follow_ups), the sweep
    pipelines: PipelinesService
    #: the tenants' event feeds, and their push to the bus (and webhooks)
    feed: FeedService
    #: webhooks, and their deliveries (fan_out: the event feed's side)
    webhooks: WebhooksService
    #: usage rolled up as attempts end, and GET /v1/usage
    usage: UsageService
    #: the one time source every service reads
    clock: Clock = utcnow

    def ready(self) -> dict:
        """Readiness: the API can reach its tables (503 otherwise)."""
        return health.check(self.store)

    def judge_shard(self, body: str) -> None:
        """Judge one shard of a fanned-out stall scan (service/scan_fanout.py)."""
        if self.scan_fanout is None:  # only deployed with its queue (GPUJOBS_SCAN_QUEUE_URL)
            raise RuntimeError("a scan shard arrived but no scan queue is configured")
        self.scan_fanout.judge(body, self.scanner.scan_job)


def dependency_failure(e: BaseException) -> bool:
    """True when ``e`` says a dependency of the wired adapters failed (retry
    later), not that the request or the code is wrong: how the HTTP edge
    tells a 503 from a bug without importing an adapter."""
    return dynamo_errors.dependency_failure(e)


_lock = threading.Lock()
_services: Services | None = None


def build(config: Config, *, inbox=None, store: JobTables | None = None,
          node_store: NodeStore | None = None, nudge=None,
          tokens: TokenStore | None = None, telemetry: Telemetry | None = None,
          log_reader=None, feeds: FeedLog | None = None, clock: Clock = utcnow) -> Services:
    """Every service of the app over the configured adapters; ``clock`` is the
    one time source they all read (tests pass a clock they control)."""
    parameters = SsmParameters(config.region, config.endpoint_url)
    config = with_page_token_key(config, parameters)
    connection = models.bind(config)
    store = store or DynamoStore(Dynamo(connection), clock)
    node_store = node_store or DynamoNodeStore(connection)
    sqs_inbox = SqsInbox(config)
    inbox = inbox or sqs_inbox
    nudge = nudge or SqsNudge(config, sqs_inbox)  # no client until a nudge
    if tokens is None:
        if config.tokens_file:
            tokens = TokenStore.from_file(config.tokens_file)
        elif config.token_hashes_param:
            tokens = TokenStore.from_hashes_json(parameters.get(config.token_hashes_param))
        else:
            tokens = TokenStore({})
    if telemetry is None:
        from .adapters.telemetry import LambdaTelemetry  # first use, not import
        telemetry = LambdaTelemetry()
    dispatcher, bus = Dispatcher(inbox), Bus()
    canceller = Canceller(store, dispatcher, resend_after_s=config.cancel_resend_after_s,
                          telemetry=telemetry, clock=clock)
    pipelines = PipelinesService(store, canceller, nudge,
                                 scans_per_hour=config.scans_per_hour, clock=clock)
    jobs = JobsService(store, dispatcher, nudge, page_token_key=config.page_token_key,
                       scans_per_hour=config.scans_per_hour,
                       cancel_resend_after_s=config.cancel_resend_after_s,
                       telemetry=telemetry, clock=clock, limits=config.tenant_limits,
                       classes=config.priority_classes, pipelines=pipelines,
                       canceller=canceller, fleet_of=node_store.fleet_of, line_of=node_store.line,
                       publish=bus.publish)
    watch = FailureWatch(node_store, failures=config.auto_cordon_failures,
                         window_s=config.auto_cordon_window_s,
                         tenants=config.auto_cordon_tenants,
                         max_fraction=config.auto_cordon_max_fraction, clock=clock)
    attempts = AttemptsService(store, dispatcher, nudge, clock=clock, publish=bus.publish)
    follow_ups(bus, pipelines=pipelines, attempts=attempts, watch=watch,
               queue=SqsFollowUps(config.follow_up_queue_url, sqs_inbox)
               if config.follow_up_queue_url else None)
    collector = DynamoCollectorStore(connection)
    heartbeats = HeartbeatsService(store, DynamoHeartbeatStore(connection), collector,
                                   scans_per_hour=config.scans_per_hour, telemetry=telemetry,
                                   page_token_key=config.page_token_key, clock=clock)
    fanout = ScanFanout(SqsScanQueue(config.scan_queue_url, sqs_inbox), store,
                        period_s=config.scan_period_s) if config.scan_queue_url else None
    scanner = Scanner(store, heartbeats, collector, attempts, period_s=config.scan_period_s,
                      fanout=fanout, telemetry=telemetry, clock=clock)
    webhooks = WebhooksService(
        DynamoWebhookStore(Dynamo(connection)),
        SqsWebhookQueue(config.webhook_queue_url, sqs_inbox) if config.webhook_queue_url
        else None, Urllib3Poster(), page_token_key=config.page_token_key,
        allow_local=config.webhook_allow_local, schedule=config.webhook_retry_schedule_s,
        clock=clock)
    feed = FeedService(
        feeds or DynamoFeeds(Dynamo(connection), clock), page_token_key=config.page_token_key,
        tenant_tag=tenant_tag, clock=clock, webhooks=webhooks.fan_out,
        sinks=[EventBridgeSink(config.event_bus, config.region, config.endpoint_url)]
        if config.event_bus else [])
    webhooks.on_disabled = feed.webhook_disabled
    usage = UsageService(DynamoUsage(Dynamo(connection), clock), store, prices=config.prices,
                         clock=clock)
    # an attempt's end is rolled up (second: a later roll of the job makes it up)
    bus.subscribe(AttemptEnded, lambda e: usage.roll(e.job_id, e.attempt), second=True)
    return Services(usage=usage,
        config=config, feed=feed, webhooks=webhooks, store=store, node_store=node_store, jobs=jobs,
        nodes=NodesService(node_store, inbox, collector, clock=clock, publish=bus.publish,
                           down_after_s=config.node_down_after_s),
        attempts=attempts,
        placer=Placer(store, node_store, dispatcher,
                      resend_after_s=config.cancel_resend_after_s, clock=clock,
                      limits=config.tenant_limits, classes=config.priority_classes,
                      preempt_min_runtime_s=config.preempt_min_runtime_s,
                      publish=bus.publish),
        reconciler=Reconciler(store, node_store, dispatcher, attempts,
                              resend_after_s=config.cancel_resend_after_s,
                              down_after_s=config.node_down_after_s, pipelines=pipelines,
                              beats=heartbeats.beats, placed=heartbeats.node_of, clock=clock),
        heartbeats=heartbeats, scanner=scanner, scan_fanout=fanout, auth=Authenticator(tokens),
        telemetry=telemetry, clock=clock,
        logs=LogsService(jobs, log_reader or CloudWatchLogReader(config),
                         page_token_key=config.page_token_key, clock=clock),
        cordons=Cordons(node_store, store, attempts, clock=clock), pipelines=pipelines)


def follow_ups(bus: Bus, *, pipelines: PipelinesService, attempts: AttemptsService,
               watch: FailureWatch, queue: FollowUps | None = None) -> Bus:
    """What follows each domain event (domain/happened.py), in one place: a
    job's end reaches its array and its dependents (second: the pipelines'
    sweep makes it up), through ``queue`` when there is one, so that the
    request that ended it does no work in proportion to its dependents or
    its array (issue 41: an end releasing 999 dependents took 10 s), else in
    the call; an array's child placed starts its array; a rank's failure
    counts against its node (second: auto-cordon never fails an attempt's
    end); a lost node's ranks confirmed gone give their GPUs back; a
    preemption's victim has its attempt ended."""
    def ended(e: JobEnded) -> None:
        if not pipelines.follows(e.job):
            return
        if queue is None:
            pipelines.ended(e.job)
        else:
            queue.send(e.job.job_id)

    bus.subscribe(JobEnded, ended, second=True)
    bus.subscribe(ChildPlaced, lambda e: pipelines.index_placed(e.job))
    bus.subscribe(RankFailed, lambda e: watch.attempt_failed(e.node_id, e.job_id, e.attempt,
                                                             e.tenant), second=True)
    bus.subscribe(RanksGone, lambda e: attempts.confirm_gone(e.job_id, e.attempt, e.node_id))
    bus.subscribe(PreemptionChosen, lambda e: attempts.abandon(e.victim, e.exit))
    return bus


def with_page_token_key(config: Config, parameters: SsmParameters) -> Config:
    """``config`` holding its page-token key, read from SSM when it names a
    parameter instead (once per process: the services are built once)."""
    if config.page_token_key_param:
        key = parameters.get(config.page_token_key_param).encode("utf-8")
        config = replace(config, page_token_key=key)
    if not config.page_token_key:
        raise ConfigError("no page-token key: page tokens would be forgeable")
    return config


def services() -> Services:
    global _services
    if _services is None:
        with _lock:
            if _services is None:
                _services = build(Config.from_env())
    return _services


def install(s: Services | None) -> None:
    """Use these services from now on (tests, the local stack); None rebuilds lazily."""
    global _services
    with _lock:
        _services = s
