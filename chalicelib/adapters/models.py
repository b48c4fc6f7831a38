"""The schema of the tables declared in infra/template.yaml, as PynamoDB models:
attributes, their types, stored names, defaults and serialisers, and the
indexes. Every request is built from them by adapters/dynamo.py; nothing
reads or writes through a model instance.

Table names, region and endpoint are bound at start-up by :func:`bind`, never
from the environment at import.
"""
from __future__ import annotations

from typing import Any

from pynamodb.attributes import (
    JSONAttribute,
    MapAttribute,
    NumberAttribute,
    NumberSetAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
)
from pynamodb.connection import Connection
from pynamodb.indexes import (
    AllProjection,
    GlobalSecondaryIndex,
    IncludeProjection,
    KeysOnlyProjection,
)
from pynamodb.models import Model

from .. import fastjson
from ..config import Config
from . import aws


class FastJSONAttribute(JSONAttribute):
    """PynamoDB's JSONAttribute (JSON text in a string attribute), through
    orjson (chalicelib/fastjson.py): a list page decodes about 150 of them.
    Written by ``dumps_strict``, so what is stored reads back exactly."""

    def serialize(self, value: Any) -> str | None:
        return None if value is None else fastjson.dumps_strict(value)

    def deserialize(self, value: str) -> Any:
        return fastjson.loads(value)


class _Meta:
    region = "us-east-1"
    host = None
    connect_timeout_seconds = 2
    read_timeout_seconds = 5
    max_retry_attempts = 3


class JobsByTenant(GlobalSecondaryIndex["JobModel"]):
    class Meta:
        index_name = "by_tenant"
        projection = AllProjection()
    tenant = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute(range_key=True)


class JobsByTenantState(GlobalSecondaryIndex["JobModel"]):
    class Meta:
        index_name = "by_tenant_state"
        projection = AllProjection()
    tenant_state = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute(range_key=True)


class JobsByActiveState(GlobalSecondaryIndex["JobModel"]):
    class Meta:
        index_name = "by_active_state"
        projection = AllProjection()
    active_state = UnicodeAttribute(hash_key=True)
    queue_key = UnicodeAttribute(range_key=True)


class JobsByParent(GlobalSecondaryIndex["JobModel"]):
    class Meta:
        index_name = "by_parent"
        projection = AllProjection()
    parent_id = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute(range_key=True)


class JobsByUnfed(GlobalSecondaryIndex["JobModel"]):
    """Sparse: jobs whose story has events the tenant's feed has not
    numbered yet (domain/feed.py), under their tenant."""
    class Meta:
        index_name = "by_unfed"
        projection = KeysOnlyProjection()
    unfed = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute(range_key=True)


class JobModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-jobs"

    job_id = UnicodeAttribute(hash_key=True)
    tenant = UnicodeAttribute()
    state = UnicodeAttribute()
    #: "<tenant>#<state>", written with every state: a state-filtered list is
    #: one Query of its own partition, whatever the tenant's history
    tenant_state = UnicodeAttribute(null=True)
    #: set only while the job is not terminal (sparse index)
    active_state = UnicodeAttribute(null=True)
    #: priority then age, the order in which PENDING jobs are placed
    queue_key = UnicodeAttribute()
    pending_reason = UnicodeAttribute(null=True)
    #: when the job last became PENDING (created, or retried); None once placed
    pending_since = UnicodeAttribute(null=True)
    #: how many of its retries did not count against max_attempts (domain/retry.py)
    uncounted_retries = NumberAttribute(null=True)
    #: the preemption it made room with and waits on: {"jobs", "at", "class"}
    #: (domain/priority.py); removed when it is placed
    preempting = FastJSONAttribute(null=True)
    name = UnicodeAttribute(null=True)
    spec = FastJSONAttribute()
    attempt = NumberAttribute(default=0)
    created_at = UnicodeAttribute()
    updated_at = UnicodeAttribute()
    started_at = UnicodeAttribute(null=True)
    finished_at = UnicodeAttribute(null=True)
    cancel_requested_at = UnicodeAttribute(null=True)
    cancel_reason = UnicodeAttribute(null=True)
    health = FastJSONAttribute()
    exit = FastJSONAttribute(null=True)
    idem_id = UnicodeAttribute(null=True)
    inboxes = FastJSONAttribute(null=True)
    #: "<attempt>#<n>" of the last stall incident recorded (each recorded once)
    incident_key = UnicodeAttribute(null=True)
    #: the job's story: event key -> event, each written with its transition
    #: (chalicelib/domain/events.py)
    events: MapAttribute[str, Any] = MapAttribute(default=dict)
    #: "<fleet room version>@<time>" at which the placer found no room for it
    waiting_on = UnicodeAttribute(null=True)
    #: a parked never-fitting job: the fleet generation it was judged against
    #: (its active_state is then "PARKED#<gpu_type or *>", out of the PENDING partition)
    parked_generation = NumberAttribute(null=True)
    #: an array's child: its parent and index (sparse index by_parent, in
    #: index order: domain/ids.py child_job_id)
    parent_id = UnicodeAttribute(null=True)
    array_index = NumberAttribute(null=True)
    #: an array's counters (domain/arrays.py COUNTERS), each moved by ADD in
    #: the transaction of the child's transition
    array_materialized = NumberAttribute(null=True)
    array_placed = NumberAttribute(null=True)
    array_succeeded = NumberAttribute(null=True)
    array_failed = NumberAttribute(null=True)
    array_cancelled = NumberAttribute(null=True)
    #: the dependencies not ended yet (domain/dependencies.py); its
    #: active_state is "WAITING" meanwhile, out of the placement queue
    waiting_for = FastJSONAttribute(null=True)
    #: the jobs that wait on this one
    dependents = UnicodeSetAttribute(null=True)
    #: the keys of story events the tenant's feed has not numbered yet, and
    #: the tenant while there are any (by_unfed; domain/feed.py)
    unfed_keys = UnicodeSetAttribute(null=True)
    unfed = UnicodeAttribute(null=True)

    by_tenant = JobsByTenant()
    by_tenant_state = JobsByTenantState()
    by_active_state = JobsByActiveState()
    by_parent = JobsByParent()
    by_unfed = JobsByUnfed()


class IdempotencyModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-idempotency"

    idem_id = UnicodeAttribute(hash_key=True)
    job_id = UnicodeAttribute()
    body_hash = UnicodeAttribute()
    created_at = UnicodeAttribute()
    #: the stored timestamp that decides expiry; absent while the job lives
    expires_at = UnicodeAttribute(null=True)
    #: DynamoDB TTL clean-up only, well after expires_at
    ttl_epoch = NumberAttribute(null=True)


class AttemptModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-attempts"

    job_id = UnicodeAttribute(hash_key=True)
    attempt = NumberAttribute(range_key=True)
    state = UnicodeAttribute()
    #: node id -> its ranks as runs (domain/attempts.rank_runs: [[first, last], ...]),
    #: where each rank runs (the API's per-rank placement is worked out from
    #: them) / its reserved GPUs / its inbox
    node_ranks = FastJSONAttribute()
    node_gpus = FastJSONAttribute()
    world_size = NumberAttribute()
    created_at = UnicodeAttribute()
    finished_at = UnicodeAttribute(null=True)
    exit = FastJSONAttribute(null=True)
    #: nodes whose reserved GPUs were given back (exactly once each)
    released = UnicodeSetAttribute(null=True)
    #: ranks started, exited, stopped: one event per report (domain/events.py),
    #: their ranks as runs; the attempt's progress (domain/attempts.reported)
    events: MapAttribute[str, Any] = MapAttribute(default=dict)
    #: per-rank progress as attempts wrote it before their events held it
    #: (read with the events, never written: four sets of every rank went past
    #: 400 KB at 65,536 ranks)
    started = NumberSetAttribute(null=True)
    exited = NumberSetAttribute(null=True)
    stopped = NumberSetAttribute(null=True)
    exit_codes: MapAttribute[str, Any] = MapAttribute(null=True)
    #: node id -> its GPU type, so a release tells that type's waiting jobs
    node_types = FastJSONAttribute(null=True)


#: what the placer reads of a READY node besides the keys (adapters/node_store
#: candidate_from_item): not ``last_seen_at``, so a call-in that only proves
#: liveness writes neither placement index (infra/template.yaml says the same)
READY_PROJECTED = ["gpus", "gpu_type", "address", "inbox_queue_url"]


class NodesReadyByType(GlobalSecondaryIndex["NodeModel"]):
    class Meta:
        index_name = "ready_by_type"
        projection = IncludeProjection(READY_PROJECTED)
    ready_type = UnicodeAttribute(hash_key=True)
    gpus_free = NumberAttribute(range_key=True)


class NodesReadyAny(GlobalSecondaryIndex["NodeModel"]):
    class Meta:
        index_name = "ready_any"
        projection = IncludeProjection(READY_PROJECTED)
    ready_any = UnicodeAttribute(hash_key=True)
    gpus_free = NumberAttribute(range_key=True)


class NodeModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-nodes"

    node_id = UnicodeAttribute(hash_key=True)
    gpus = NumberAttribute()
    gpus_free = NumberAttribute()
    gpu_type = UnicodeAttribute()
    state = UnicodeAttribute()
    #: gpu_type / "1" while READY (sparse placement indexes)
    ready_type = UnicodeAttribute(null=True)
    ready_any = UnicodeAttribute(null=True)
    address = UnicodeAttribute()
    labels = FastJSONAttribute(default=dict)
    inbox_queue_url = UnicodeAttribute()
    last_seen_at = UnicodeAttribute()
    registered_at = UnicodeAttribute()
    #: "job_id#attempt" of every attempt holding GPUs here
    attempts = UnicodeSetAttribute(null=True)
    #: how the agent isolates ranks, as it last registered ("user" or "none")
    isolation = UnicodeAttribute(null=True)
    #: those of them lost with the node (DOWN), until its agent confirms their ranks gone
    lost = UnicodeSetAttribute(null=True)
    #: the operator's (or auto-) cordon, domain/nodes.cordon_of; absent: none
    cordon = FastJSONAttribute(null=True)
    #: "<iso time>|<job_id#attempt>" of recent rank_failed ends here (auto-cordon)
    failures = UnicodeSetAttribute(null=True)

    ready_by_type = NodesReadyByType()
    ready_any_index = NodesReadyAny()


class FleetModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-fleet"

    gpu_type = UnicodeAttribute(hash_key=True)
    gpus = NumberAttribute(default=0)
    largest_node = NumberAttribute(default=0)
    #: the capacity summary: counts every event that may have made room for
    #: this type (GPUs released, a node registered, grown or back from DOWN),
    #: bumped by the same transactions; and when it last moved
    room_version = NumberAttribute(null=True)
    room_at = UnicodeAttribute(null=True)
    #: bumped by every change of gpus or largest_node (parked jobs, issue 9)
    generation = NumberAttribute(null=True)
    changed_at = UnicodeAttribute(null=True)
    #: the generation whose parked jobs the placer has judged again
    swept_generation = NumberAttribute(null=True)
    #: only on the item of key fleet.LINE_KEY, no GPU type's: the placer's
    #: line, the waiting jobs in the order it tries them (domain/queue.py)
    line = FastJSONAttribute(null=True)


class FeedPushDue(GlobalSecondaryIndex["FeedModel"]):
    """Sparse: the heads of feeds with numbered events not yet put on the
    bus and handed to the webhooks."""
    class Meta:
        index_name = "by_push_due"
        projection = KeysOnlyProjection()
    push_due = UnicodeAttribute(hash_key=True)
    pk = UnicodeAttribute(range_key=True)


class FeedModel(Model):
    """The tenants' event feeds (domain/feed.py), one partition a tenant
    (``t#<tenant>``): its head at ``sk`` 0 (the last number given, the ms
    its id carried, the last number pushed), then its events by number; and
    one marker per story event fed (``fed#<job>#<key>``), so none is fed twice."""
    class Meta(_Meta):
        table_name = "gpujobs-unbound-events"

    pk = UnicodeAttribute(hash_key=True)
    sk = NumberAttribute(range_key=True)
    head_seq = NumberAttribute(null=True)
    head_ms = NumberAttribute(null=True)
    pushed_seq = NumberAttribute(null=True)
    push_due = UnicodeAttribute(null=True)
    #: the event as served, and its type and job for a reader's filter
    event = FastJSONAttribute(null=True)
    type = UnicodeAttribute(null=True)
    job_id = UnicodeAttribute(null=True)
    #: the table's TTL
    expires_epoch = NumberAttribute(null=True)

    by_push_due = FeedPushDue()


class TenantModel(Model):
    """Per-tenant counters: ``pending`` is the number of its jobs in PENDING."""
    class Meta(_Meta):
        table_name = "gpujobs-unbound-tenants"

    tenant = UnicodeAttribute(hash_key=True)
    pending = NumberAttribute(null=True)


class UsageModel(Model):
    """Usage rolled up by hour and day (domain/rollup.py; GET /v1/usage).
    A tenant's cells of one UTC day share a partition ``u#<tenant>#<day>``:
    ``h#<dimension>#<HH>#<value>`` (an hour) and ``d#<dimension>#<value>``
    (the day), each with GPU-seconds by part (``s_<part>``, ADDed, signed)
    and ``jobs``. ``tenants#<day>``: one item per tenant with usage that
    day (sk: the tenant). ``rolled#<job>``: one marker per attempt's chunk
    added (sk ``<attempt>#<chunk>``), so none is added twice. ``due#<n>``
    (16 shards): an attempt ended and not rolled up yet (sk
    ``<job>#<attempt>``), put in the transaction that ends it and deleted
    once it is rolled up: the sweep rolls what a lost follow-up left."""
    class Meta(_Meta):
        table_name = "gpujobs-unbound-usage"

    pk = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)
    jobs = NumberAttribute(null=True)
    #: a due item's: when its attempt ended
    due_at = UnicodeAttribute(null=True)


class HeartbeatModel(Model):
    """One item per host of an attempt: the ranks it runs, each rank's record
    a map in ``ranks`` under its rank (adapters/heartbeat_store.FIELDS)."""
    class Meta(_Meta):
        table_name = "gpujobs-unbound-heartbeats"

    #: ``<job>#<attempt>#<rank // 512>`` of the host's lowest rank
    shard_key = UnicodeAttribute(hash_key=True)
    #: the host's lowest rank in the attempt (fixed: placement never changes)
    rank = NumberAttribute(range_key=True)
    node_id = UnicodeAttribute()
    ttl_epoch = NumberAttribute(null=True)
    #: the collector's receive time of the host's last post: its node is alive
    #: (the reconciler takes a node silent by its call-ins for DOWN only
    #: when its beats stopped too)
    posted_at = UnicodeAttribute(null=True)
    #: raw map, ``12`` -> rank 12's record, ``{"h": heard_at, "s": step, ...}``: the
    #: collector's receive time (the only time that decides liveness), the
    #: beat's time on it, the step, a declared pause, the host's latest
    #: process sample and its times, the rank's last collective
    ranks: MapAttribute[str, Any] = MapAttribute(null=True)


class CollectorModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-collector"

    name = UnicodeAttribute(hash_key=True)
    at = UnicodeAttribute(null=True)
    #: convictions stay suppressed until then, and why (after a collector pause)
    hold_until = UnicodeAttribute(null=True)
    hold_reason = UnicodeAttribute(null=True)


class OutboxDue(GlobalSecondaryIndex["OutboxModel"]):
    class Meta:
        index_name = "by_due"
        projection = AllProjection()
    pending = UnicodeAttribute(hash_key=True)
    due_at = UnicodeAttribute(range_key=True)


class OutboxModel(Model):
    class Meta(_Meta):
        table_name = "gpujobs-unbound-outbox"

    job_id = UnicodeAttribute(hash_key=True)
    intent_id = UnicodeAttribute(range_key=True)
    attempt = NumberAttribute()
    kind = UnicodeAttribute()
    message = FastJSONAttribute()
    #: node id -> inbox queue URL
    targets = FastJSONAttribute()
    #: node id -> its ranks, for messages that name them
    node_ranks = FastJSONAttribute(null=True)
    #: nodes that have not acknowledged yet (removed one by one, atomically)
    unacked = UnicodeSetAttribute(null=True)
    created_at = UnicodeAttribute()
    #: "1" while not acknowledged by an agent (sparse index)
    pending = UnicodeAttribute(null=True)
    due_at = UnicodeAttribute()
    sends = NumberAttribute(default=0)
    ttl_epoch = NumberAttribute(null=True)

    by_due = OutboxDue()


class WebhookModel(Model):
    """Webhooks (issue 45), generic keys: ``T#<tenant>`` holds the tenant's
    webhooks (``W#<id>``) and their count (``COUNT``); ``D#<id>`` a
    webhook's deliveries log (``<at>#<event id>#<attempt>``, newest last)."""
    class Meta(_Meta):
        table_name = "gpujobs-unbound-webhooks"

    pk = UnicodeAttribute(hash_key=True)
    sk = UnicodeAttribute(range_key=True)
    #: on the COUNT item: how many webhooks the tenant has
    held = NumberAttribute(null=True)
    webhook_id = UnicodeAttribute(null=True)
    tenant = UnicodeAttribute(null=True)
    url = UnicodeAttribute(null=True)
    types = FastJSONAttribute(null=True)
    description = UnicodeAttribute(null=True)
    state = UnicodeAttribute(null=True)
    created_at = UnicodeAttribute(null=True)
    secret = UnicodeAttribute(null=True)
    #: the first failure since the last success (domain/webhooks.should_disable)
    failing_since = UnicodeAttribute(null=True)
    disabled_at = UnicodeAttribute(null=True)
    #: a delivery's record
    event_id = UnicodeAttribute(null=True)
    attempt = NumberAttribute(null=True)
    at = UnicodeAttribute(null=True)
    status_code = NumberAttribute(null=True)
    error = UnicodeAttribute(null=True)
    next_retry_at = UnicodeAttribute(null=True)
    note = UnicodeAttribute(null=True)
    ttl_epoch = NumberAttribute(null=True)


MODELS = {
    JobModel: "jobs_table",
    IdempotencyModel: "idempotency_table",
    AttemptModel: "attempts_table",
    OutboxModel: "outbox_table",
    NodeModel: "nodes_table",
    HeartbeatModel: "heartbeats_table",
    CollectorModel: "collector_table",
    FleetModel: "fleet_table",
    TenantModel: "tenants_table",
    FeedModel: "events_table",
    WebhookModel: "webhooks_table",
    UsageModel: "usage_table",
}


def bind(config: Config) -> Connection:
    """Point every model at the configured tables, and return the container's
    one DynamoDB connection, through which adapters/dynamo.py sends every
    request (no client is made until a handler first reads or writes). The
    models are the schema only: nothing here reads or writes through them."""
    for model, attr in MODELS.items():
        model.Meta.table_name = getattr(config, attr)
        model.Meta.region = config.region
        model.Meta.host = config.endpoint_url
    return aws.session_for(config.region, config.endpoint_url).dynamodb
