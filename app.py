"""gpujobs HTTP API (see ../shared/API.md and docs/openapi.yaml).

Routes only: each reads its request through the HTTP edge (chalicelib/api/edge.py:
the one error boundary, the request helpers), calls one service and shapes the
response; each scheduled or queued function is one call into a service. Storage
and queues live behind chalicelib/service/ports.py.
"""
from __future__ import annotations

import os

from chalice import Chalice, Rate

from chalicelib.api import batch
from chalicelib.api.edge import Edge, handler, no_content, ok, whole_number
from chalicelib.api.representation import (
    attempt_json,
    delivery_json,
    job_json,
    job_view_json,
    node_json,
    node_registration_json,
    webhook_json,
)
from chalicelib.api.validation import MAX_HEARTBEATS_BYTES
from chalicelib.bootstrap import services
from chalicelib.domain import idempotency
from chalicelib.domain.clock import iso
from chalicelib.domain.principal import Principal

app = Chalice(app_name="gpujobs")
http = Edge(app)  # the error boundary and the request helpers (chalicelib/api/edge.py)
endpoint = http.endpoint


# -- health -------------------------------------------------------------------
@endpoint("/v1/health", "GET")
def get_health():
    return ok(services().ready())


# -- jobs ---------------------------------------------------------------------
@endpoint("/v1/jobs", "POST")
def create_job():
    tenant = http.tenant()
    key = idempotency.check_key(http.header("idempotency-key"))
    body = http.body("JOB_CREATE", required=True)
    job, replayed = services().jobs.submit(tenant, body, key)
    headers = {"Location": f"/v1/jobs/{job['job_id']}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return ok(job_view_json(job), 201, headers)


@endpoint("/v1/jobs", "GET")
def list_jobs():
    tenant = http.tenant()
    params = http.query()
    jobs, token = services().jobs.list(
        tenant, state=params.get("state"), page_size=http.query_int("page_size", 50),
        page_token=params.get("page_token"), parent=params.get("parent"))
    return ok({"jobs": [job_view_json(j) for j in jobs], "next_page_token": token})


@endpoint("/v1/jobs/{job_id}", "GET")
def get_job(job_id: str):
    return ok(job_view_json(services().jobs.look(http.tenant(), job_id)))


@endpoint("/v1/jobs/{job_id}/cancel", "POST")
def cancel_job(job_id: str):
    tenant = http.tenant()
    body = http.body("CANCEL", required=False) or {}
    return ok(job_json(services().jobs.cancel(tenant, job_id, body.get("reason"))), 202)


@endpoint("/v1/jobs/{job_id}/attempts", "GET")
def list_attempts(job_id: str):
    attempts = services().jobs.attempts(http.tenant(), job_id)
    return ok({"attempts": [attempt_json(a) for a in attempts]})


@endpoint("/v1/jobs/{job_id}/events", "GET")
def list_job_events(job_id: str):
    return ok({"events": services().jobs.events(http.tenant(), job_id)})


@endpoint("/v1/events", "GET")
def list_events():
    params = http.query()
    return ok(services().feed.read(
        http.tenant(), after=params.get("after"), type_=params.get("type"),
        job_id=params.get("job_id"), page_size=http.query_int("page_size", 100),
        wait_s=http.query_int("wait_s", 0)))


@endpoint("/v1/jobs/{job_id}/logs", "GET")
def get_job_logs(job_id: str):
    tenant = http.tenant()
    params = http.query()
    return ok(services().logs.read(
        tenant, job_id, attempt=http.optional_query_int("attempt"),
        rank=http.optional_query_int("rank"), since=params.get("since"),
        page_token=params.get("page_token"), page_size=http.query_int("page_size", 1000),
        tail=http.optional_query_int("tail")))


@endpoint("/v1/jobs/{job_id}/attempts/{attempt}/events", "POST")
def report_attempt_event(job_id: str, attempt: str):
    principal = services().auth.agent(http.authorization())
    body = http.body("ATTEMPT_EVENT", required=True)
    number = whole_number(attempt, "attempt", "attempt must be a positive integer")
    return ok(job_json(services().attempts.report(principal, job_id, number, body)))


@endpoint("/v1/jobs/{job_id}/heartbeats", "POST")
def post_heartbeats(job_id: str):
    principal = services().auth.agent(http.authorization())
    body = http.body("HEARTBEATS", required=True, max_bytes=MAX_HEARTBEATS_BYTES)
    call_in = body.get("call_in")
    if call_in is not None:  # the node's call-in, carried: one request, not two
        services().nodes.authorize(principal, call_in["node_id"], field="call_in.node_id")
    received_at = services().heartbeats.ingest(principal, job_id, body)
    out: dict[str, object] = {"received_at": iso(received_at)}
    if call_in is not None:
        out["node"] = _called_in(principal, call_in["node_id"], call_in)
    return ok(out, 202)


@endpoint("/v1/jobs/{job_id}/ranks", "GET")
def get_ranks(job_id: str):
    job = services().jobs.get(http.tenant(), job_id)
    return ok(services().heartbeats.ranks_page(job, page_size=http.optional_query_int("page_size"),
                                               page_token=http.query().get("page_token")))


# -- nodes ----------------------------------------------------------------------
@endpoint("/v1/nodes/{node_id}", "PUT")
def put_node(node_id: str):
    principal = services().auth.authenticate(http.authorization())
    services().nodes.authorize(principal, node_id)
    return ok(_called_in(principal, node_id, http.body("NODE_PUT", required=True)))


def _called_in(principal: Principal, node_id: str, body: dict) -> dict:
    """A node's call-in (a PUT, or carried by a heartbeat POST) and its answer."""
    node = node_registration_json(services().nodes.register(principal, node_id, body))
    # where the node's agent ships its ranks' output (agent/logship.py)
    return {**node, "log_group": services().config.log_group}


@endpoint("/v1/nodes/{node_id}", "GET")
def get_node(node_id: str):
    services().auth.authenticate(http.authorization())
    return ok(node_json(services().nodes.get(node_id)))


@endpoint("/v1/nodes", "GET")
def list_nodes():
    services().auth.authenticate(http.authorization())
    return ok({"nodes": [node_json(n) for n in services().nodes.list()]})


@endpoint("/v1/nodes/{node_id}/cordon", "POST")
def cordon_node(node_id: str):
    operator = services().auth.operator(http.authorization())
    body = http.body("CORDON", required=False) or {}
    return ok(node_json(services().cordons.cordon(operator, node_id, body.get("reason"))))


@endpoint("/v1/nodes/{node_id}/drain", "POST")
def drain_node(node_id: str):
    operator = services().auth.operator(http.authorization())
    body = http.body("DRAIN", required=False) or {}
    node = services().cordons.drain(operator, node_id, body.get("reason"),
                                    wait=body.get("wait", False))
    # the preemptions are intents (CANCELs), as a cancel's are
    return ok(node_json(node), 202)


@endpoint("/v1/nodes/{node_id}/uncordon", "POST")
def uncordon_node(node_id: str):
    operator = services().auth.operator(http.authorization())
    return ok(node_json(services().cordons.uncordon(operator, node_id)))


# -- webhooks (issue 45): the tenant's, and their deliveries -------------------------
@endpoint("/v1/webhooks", "POST")
def create_webhook():
    tenant = http.tenant()
    body = http.body("WEBHOOK_CREATE", required=True)
    return ok(webhook_json(services().webhooks.create(tenant, body), with_secret=True), 201)


@endpoint("/v1/webhooks", "GET")
def list_webhooks():
    return ok({"webhooks": [webhook_json(w)
                            for w in services().webhooks.webhooks_of(http.tenant())]})


@endpoint("/v1/webhooks/{webhook_id}", "GET")
def get_webhook(webhook_id: str):
    return ok(webhook_json(services().webhooks.get(http.tenant(), webhook_id)))


@endpoint("/v1/webhooks/{webhook_id}", "DELETE")
def delete_webhook(webhook_id: str):
    services().webhooks.delete(http.tenant(), webhook_id)
    return no_content()


@endpoint("/v1/webhooks/{webhook_id}/deliveries", "GET")
def list_webhook_deliveries(webhook_id: str):
    tenant = http.tenant()
    found, token = services().webhooks.deliveries(
        tenant, webhook_id, page_size=http.query_int("page_size", 50),
        page_token=http.query().get("page_token"))
    return ok({"deliveries": [delivery_json(d) for d in found], "next_page_token": token})


@endpoint("/v1/webhooks/{webhook_id}/test", "POST")
def test_webhook(webhook_id: str):
    event = services().webhooks.test(http.tenant(), webhook_id)
    return ok({"event": event}, 202)


@endpoint("/v1/usage", "GET")
def get_usage():
    usage = services().usage
    principal = services().auth.authenticate(http.authorization())
    return ok(usage.read(usage.query(principal, http.query())))


# -- the dashboard: static files (chalicelib/web) that call the JSON API above ------
@endpoint("/", ("GET", "HEAD"), content_types=["*/*"])
def dashboard():
    return http.dashboard()


@endpoint("/static/{name}", ("GET", "HEAD"), content_types=["*/*"])
def static_file(name: str):
    return http.asset(name)


# -- scheduled and queued ------------------------------------------------------------
@app.schedule(Rate(1, unit=Rate.MINUTES), name="place")
@handler
def place(event):
    """Place PENDING jobs (also run right after a create, through the pending queue)."""
    return services().placer.run().counts()


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_PENDING_QUEUE_NAME", "gpujobs-dev-pending"),
                    batch_size=10, name="place_on_nudge")
@handler
def place_on_nudge(event):
    """A create or freed GPUs asked for a run: one run serves the whole batch;
    a message that is no nudge goes, through the redrive policy, to a human."""
    return batch.nudged(event, services().placer.run)


@app.schedule(Rate(1, unit=Rate.MINUTES), name="scan")
@handler
def scan(event):
    """Judge every RUNNING job's ranks; record each stall once."""
    return services().scanner.run()


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_SCAN_QUEUE_NAME", "gpujobs-dev-scan"),
                    batch_size=1, name="scan_shard")
def scan_shard(event):
    """One shard of a fanned-out stall scan (chalicelib/service/scan_fanout.py);
    a shard that fails is received again, then dead-lettered."""
    return batch.each(event, lambda body: services().judge_shard(body), "scan shard")


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_FOLLOW_UP_QUEUE_NAME",
                                         "gpujobs-dev-follow-up"),
                    batch_size=10, name="follow_up")
def follow_up(event):
    """What follows jobs' ends (their arrays, their dependents), off the
    requests that ended them; a message that fails is received again, then
    dead-lettered (the pipelines' sweep makes up for it meanwhile)."""
    return batch.each(event, lambda body: services().pipelines.follow_up(body), "follow-up")


@app.schedule(Rate(1, unit=Rate.MINUTES), name="feed")
@handler
def feed(event):
    """Number the tenants' new events (a read of the feed also does), and put
    every numbered event on the bus and to the webhooks, at least once."""
    return services().feed.sweep()


@app.on_sqs_message(queue=os.environ.get("GPUJOBS_WEBHOOK_QUEUE_NAME", "gpujobs-dev-webhook"),
                    batch_size=1, name="deliver_webhook")
def deliver_webhook(event):
    """One webhook delivery attempt a message, one message an invocation (so a
    slow endpoint delays no other); a failed attempt is re-sent by the service
    with its delay; a message that fails here is received again, then
    dead-lettered."""
    return batch.each(event, lambda body: services().webhooks.deliver(body), "webhook delivery")


@app.schedule(Rate(1, unit=Rate.MINUTES), name="reconcile")
@handler
def reconcile(event):
    """Resend unacknowledged intents; mark silent nodes DOWN and fail their
    attempts; roll up the usage of attempts whose roll was missed."""
    done = services().reconciler.run()
    services().usage.sweep()
    return done
