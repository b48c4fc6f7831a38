"""PUT/GET /v1/nodes: registration creates the inbox; repeats are harmless."""
import json

import pytest

from chalicelib.adapters.models import FleetModel


def put(client, tenants, node_id, body, who="agents"):
    return client.http.put(f"/v1/nodes/{node_id}", headers=tenants.headers(who),
                           body=json.dumps(body))


def test_registering_creates_an_inbox_with_a_dead_letter_queue(iso_client, tenants, sqs):
    r = put(iso_client, tenants, "node-1", {"gpus": 8, "gpu_type": "h100"}, who="agent")
    assert r.status_code == 200
    node = r.json_body
    assert node["node_id"] == "node-1" and node["gpus"] == node["gpus_free"] == 8
    assert node["gpu_type"] == "h100" and node["state"] == "READY"
    assert node["last_seen_at"].endswith("Z")
    attrs = sqs.get_queue_attributes(QueueUrl=node["inbox_queue_url"],
                                     AttributeNames=["RedrivePolicy"])["Attributes"]
    assert "inbox-dlq" in json.loads(attrs["RedrivePolicy"])["deadLetterTargetArn"]


def test_repeating_a_registration_is_harmless(iso_client, tenants):
    first = put(iso_client, tenants, "n1", {"gpus": 8}).json_body
    again = put(iso_client, tenants, "n1", {"gpus": 8}).json_body
    assert again["inbox_queue_url"] == first["inbox_queue_url"]
    assert again["gpus_free"] == 8 and again["last_seen_at"] >= first["last_seen_at"]
    assert FleetModel.get("*").gpus == 8, "the fleet counts the node once"


def test_a_capacity_change_moves_free_gpus_and_the_fleet_by_the_delta(iso_client, tenants):
    put(iso_client, tenants, "n1", {"gpus": 8, "gpu_type": "a100"})
    r = put(iso_client, tenants, "n1", {"gpus": 4, "gpu_type": "a100"})
    assert r.json_body["gpus"] == r.json_body["gpus_free"] == 4
    assert FleetModel.get("a100").gpus == 4 and FleetModel.get("*").gpus == 4


def test_an_agent_acts_only_for_its_own_node(iso_client, tenants):
    r = put(iso_client, tenants, "node-2", {"gpus": 8}, who="agent")
    assert r.status_code == 403 and r.json_body["code"] == "forbidden"


def test_a_tenant_cannot_register_nodes_but_can_read_them(iso_client, tenants):
    assert put(iso_client, tenants, "n1", {"gpus": 8}, who="a").status_code == 403
    put(iso_client, tenants, "n1", {"gpus": 8})
    listed = iso_client.http.get("/v1/nodes", headers=tenants.headers("a")).json_body
    assert [n["node_id"] for n in listed["nodes"]] == ["n1"]
    one = iso_client.http.get("/v1/nodes/n1", headers=tenants.headers("a"))
    assert one.status_code == 200 and one.json_body["gpus"] == 8
    assert iso_client.http.get("/v1/nodes/nope", headers=tenants.headers()).status_code == 404


@pytest.mark.parametrize("body, field", [({}, "gpus"), ({"gpus": 0}, "gpus"),
                                         ({"gpus": "8"}, "gpus"),
                                         ({"gpus": 8, "gpu_type": ""}, "gpu_type"),
                                         ({"gpus": 8, "x": 1}, "x"),
                                         ({"gpus": 8, "running": {}}, "running"),
                                         ({"gpus": 8, "running": [{"job_id": "j"}]},
                                          "running.0.attempt"),
                                         ({"gpus": 8, "running": [{"job_id": "j",
                                                                   "attempt": 0}]},
                                          "running.0.attempt")])
def test_a_bad_registration_is_400_naming_the_field(iso_client, tenants, body, field):
    r = put(iso_client, tenants, "n1", body)
    assert r.status_code == 400 and r.json_body["field"] == field


@pytest.mark.parametrize("node_id", ["-bad", "a" * 64, "has space"])
def test_a_bad_node_id_is_400(iso_client, tenants, node_id):
    r = put(iso_client, tenants, node_id, {"gpus": 8})
    assert r.status_code in (400, 404)


def test_node_ids_that_differ_only_in_unsafe_characters_get_different_inboxes(iso):
    a = iso.nodes.inbox.queue_name("node.1")
    b = iso.nodes.inbox.queue_name("node_1")
    c = iso.nodes.inbox.queue_name("x" * 63)
    assert a != b and len(c) <= 80


def test_a_node_calling_in_is_read_once(iso_client, tenants):
    from .helpers import aws_calls

    put(iso_client, tenants, "n1", {"gpus": 8})
    with aws_calls() as calls:
        assert put(iso_client, tenants, "n1", {"gpus": 8}).status_code == 200
    reads = [op for svc, op in calls if op in ("GetItem", "Query", "Scan")]
    assert reads == ["GetItem"], calls


def act(client, tenants, node_id, verb, body=None, who="ops"):
    return client.http.post(f"/v1/nodes/{node_id}/{verb}", headers=tenants.headers(who),
                            body=json.dumps(body) if body is not None else None)


@pytest.mark.parametrize("verb", ["cordon", "drain", "uncordon"])
@pytest.mark.parametrize("who", ["a", "agent", "agents"])
def test_only_an_operator_may_cordon_drain_or_uncordon(iso_client, tenants, verb, who):
    put(iso_client, tenants, "node-1", {"gpus": 8})
    r = act(iso_client, tenants, "node-1", verb, who=who)
    assert r.status_code == 403 and r.json_body["code"] == "forbidden", r.json_body
    assert r.json_body["field"] == "Authorization"
    node = iso_client.http.get("/v1/nodes/node-1", headers=tenants.headers()).json_body
    assert (node["state"], node["cordon"]) == ("READY", None), "nothing written"
    r = iso_client.http.post("/v1/nodes/node-1/cordon")
    assert r.status_code == 401


def test_an_operator_cordons_and_uncordons_and_everyone_sees_why(iso_client, tenants):
    put(iso_client, tenants, "n1", {"gpus": 8})
    r = act(iso_client, tenants, "n1", "cordon", {"reason": "bad ECC on GPU 3"})
    assert r.status_code == 200
    cordon = r.json_body["cordon"]
    assert r.json_body["state"] == "DRAINING"
    assert (cordon["reason"], cordon["by"], cordon["drain"], cordon["auto"]) == (
        "bad ECC on GPU 3", tenants.entries[4]["operator"], "keep", False)
    seen = iso_client.http.get("/v1/nodes/n1", headers=tenants.headers("a")).json_body
    assert seen["cordon"] == cordon
    assert put(iso_client, tenants, "n1", {"gpus": 8}).json_body["state"] == "DRAINING"
    r = act(iso_client, tenants, "n1", "uncordon")
    assert (r.status_code, r.json_body["state"], r.json_body["cordon"]) == (200, "READY", None)


def test_a_drain_is_accepted_as_an_intent(iso_client, tenants):
    put(iso_client, tenants, "n1", {"gpus": 8})
    r = act(iso_client, tenants, "n1", "drain", {"reason": "retire", "wait": True})
    assert r.status_code == 202 and r.json_body["cordon"]["drain"] == "wait"
    r = act(iso_client, tenants, "n1", "drain", {})
    assert r.status_code == 202 and r.json_body["cordon"]["drain"] == "stop"


@pytest.mark.parametrize("verb, body, field", [
    ("cordon", {"reason": ""}, "reason"),
    ("cordon", {"reason": "x" * 1025}, "reason"),
    ("cordon", {"why": "x"}, "why"),
    ("drain", {"wait": "yes"}, "wait"),
    ("drain", [], "body"),
])
def test_a_bad_cordon_or_drain_body_is_400_naming_the_field(iso_client, tenants, verb, body,
                                                            field):
    put(iso_client, tenants, "n1", {"gpus": 8})
    r = act(iso_client, tenants, "n1", verb, body)
    assert r.status_code == 400 and r.json_body["field"] == field, r.json_body
    node = iso_client.http.get("/v1/nodes/n1", headers=tenants.headers()).json_body
    assert node["cordon"] is None, "nothing half-written"


@pytest.mark.parametrize("verb", ["cordon", "drain", "uncordon"])
def test_cordoning_a_node_that_does_not_exist_is_404(iso_client, tenants, verb):
    r = act(iso_client, tenants, "ghost", verb)
    assert r.status_code == 404 and r.json_body["code"] == "not_found"
