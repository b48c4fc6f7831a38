"""A write applied by the store whose answer was lost: botocore retries it,
the retry fails the condition the first try made false, and the writer must
recognise its own write (answer as if the first answer had arrived), never
report a conflict, a 500, or write twice."""
import json
import uuid

from chalicelib.adapters.models import JobModel
from chalicelib.domain.principal import Principal
from tests.faults import inject

from .helpers import drain, place

AGENT = Principal("agent", "*")


def submit(client, tenants, key=None, **spec):
    headers = tenants.headers(**({"Idempotency-Key": key} if key else {}))
    return client.http.post("/v1/jobs", body=json.dumps({"command": ["x"], "ranks": 1, **spec}),
                            headers=headers)


def tenant_jobs(tenant):
    return [m.job_id for m in JobModel.by_tenant.query(tenant)]


def node_id():
    return "n-" + uuid.uuid4().hex[:8]


def test_lost_response_to_create_without_key_answers_201_with_its_job(client, tenants):
    # one transaction: the job and the tenant's pending count
    with inject("TransactWriteItems", "lost_response", times=1, when=tenants.a) as lost:
        r = submit(client, tenants)
    assert lost.hits == 1
    assert r.status_code == 201, r.body
    assert tenant_jobs(tenants.a) == [r.json_body["id"]], "one job, the one answered"


def test_lost_response_to_create_with_key_answers_201_not_a_replay(client, tenants):
    with inject("TransactWriteItems", "lost_response", times=1, when=tenants.a) as lost:
        r = submit(client, tenants, key="k-1")
    assert lost.hits == 1
    assert r.status_code == 201, r.body
    assert "Idempotent-Replayed" not in r.headers
    assert tenant_jobs(tenants.a) == [r.json_body["id"]]


def test_lost_response_to_cancel_of_a_pending_job_answers_202(client, tenants):
    job_id = submit(client, tenants).json_body["id"]
    # one transaction: the job and the tenant's pending count
    with inject("TransactWriteItems", "lost_response", times=1,
                when="cancel_requested_at") as lost:
        r = client.http.post(f"/v1/jobs/{job_id}/cancel", body="{}", headers=tenants.headers())
    assert lost.hits == 1
    assert r.status_code == 202 and r.json_body["state"] == "CANCELLED", r.body


def test_lost_response_to_cancel_intent_still_sends_the_cancel_now(client, tenants, services,
                                                                   sqs):
    job_id = submit(client, tenants).json_body["id"]
    [url] = place(services, job_id, [node_id()]).values()
    drain(sqs, url)
    with inject("TransactWriteItems", "lost_response", times=1, when=job_id) as lost:
        r = client.http.post(f"/v1/jobs/{job_id}/cancel", body="{}", headers=tenants.headers())
    assert lost.hits == 1
    assert r.status_code == 202, r.body
    assert [m["type"] for m in drain(sqs, url, job_id)] == ["CANCEL"], \
        "the intent is sent at once, not left to the reconciler"


def test_lost_response_to_start_transition_answers_running(client, tenants, services):
    job_id = submit(client, tenants).json_body["id"]
    [node] = place(services, job_id, [node_id()])
    with inject("UpdateItem", "lost_response", times=1, when="started_at") as lost:
        r = client.http.post(f"/v1/jobs/{job_id}/attempts/1/events", headers=tenants.headers(
            "agents"), body=json.dumps({"type": "STARTED", "ranks": [0], "node_id": node}))
    assert lost.hits == 1
    assert r.status_code == 200 and r.json_body["state"] == "RUNNING", r.body


def test_lost_response_to_ending_an_attempt_still_stops_the_other_ranks(client, tenants,
                                                                      services, sqs):
    job_id = submit(client, tenants, ranks=2).json_body["id"]
    [(node, url)] = place(services, job_id, [node_id()]).items()
    drain(sqs, url)
    with inject("TransactWriteItems", "lost_response", times=1, when="CANCEL") as lost:
        r = client.http.post(f"/v1/jobs/{job_id}/attempts/1/events", headers=tenants.headers(
            "agents"), body=json.dumps({"type": "EXITED", "ranks": [0], "exit_code": 3,
                                        "node_id": node}))
    assert lost.hits == 1
    assert r.status_code == 200 and r.json_body["state"] == "FAILED", r.body
    assert [m["type"] for m in drain(sqs, url, job_id)] == ["CANCEL"]


def test_lost_response_to_placement_sends_the_launch_now(iso, iso_client, tenants, sqs):
    node = node_id()
    url = iso.nodes.register(AGENT, node, {"gpus": 8}).inbox_queue_url
    job_id = submit(iso_client, tenants).json_body["id"]
    with inject("TransactWriteItems", "lost_response", times=1, when=job_id) as lost:
        report = iso.placer.run()
    assert lost.hits == 1
    assert job_id in report.placed
    assert [m["type"] for m in drain(sqs, url, job_id)] == ["LAUNCH"]
    assert iso.node_store.get(node).gpus_free == 7, "GPUs reserved once"


def test_lost_response_to_node_registration_counts_its_gpus_once(iso, iso_client, tenants):
    node, gpu_type = node_id(), "t" + uuid.uuid4().hex[:6]
    with inject("TransactWriteItems", "lost_response", times=1, when=node) as lost:
        r = iso_client.http.put(f"/v1/nodes/{node}", headers=tenants.headers("agents"),
                                body=json.dumps({"gpus": 8, "gpu_type": gpu_type}))
    assert lost.hits == 1
    assert r.status_code == 200, r.body
    assert iso.node_store.fleet_of(gpu_type).gpus == 8
    assert iso.node_store.get(node).gpus_free == 8
