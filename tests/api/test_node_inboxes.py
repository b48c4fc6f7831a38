"""A node's inbox is made once per node, not per process every few minutes:
CreateQueue runs on the first registration, on a return from DOWN, when the
recorded URL is not this stage's inbox, and when the agent says its receive
found no queue (an inbox deleted by hand comes back). On moto's real SQS."""
from __future__ import annotations

import json
import uuid

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from agent.inbox import SqsInbox as AgentInbox
from chalicelib.adapters.models import NodeModel
from chalicelib.domain.principal import Principal

AGENT = Principal("agent", "*")


@pytest.fixture
def created(monkeypatch):
    """The QueueName of every CreateQueue sent from now on, by any client."""
    names: list[str] = []
    send = BaseClient._make_api_call

    def recorded(self, operation, params):
        if operation == "CreateQueue":
            names.append(params["QueueName"])
        return send(self, operation, params)
    monkeypatch.setattr(BaseClient, "_make_api_call", recorded)
    return names


def _node_id() -> str:
    return f"n-{uuid.uuid4().hex[:10]}"


def test_an_ordinary_call_in_creates_no_queue_even_from_a_new_process(make_services,
                                                                       created):
    node_id = _node_id()
    first = make_services().nodes
    url = first.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url
    assert len(created) == 1, "the first registration makes the inbox"
    assert first.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url == url
    fresh = make_services().nodes  # another process: a new NodesService, nothing remembered
    for _ in range(3):
        assert fresh.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url == url
    assert len(created) == 1, "no CreateQueue on an ordinary call-in"


def test_a_recorded_url_that_is_not_this_stages_inbox_is_made_again(make_services, created):
    node_id = _node_id()
    nodes = make_services().nodes
    url = nodes.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url
    NodeModel(node_id).update(actions=[NodeModel.inbox_queue_url.set(
        "https://sqs.us-east-1.amazonaws.com/000000000000/gpujobs-old-" + node_id)])
    created.clear()
    assert make_services().nodes.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url == url
    assert len(created) == 1
    assert NodeModel.get(node_id).inbox_queue_url == url


def test_a_recorded_url_at_another_endpoint_is_made_again(make_services, created):
    """The local stack restarted on the state it saved serves SQS on another
    port: a node's recorded inbox there is a dead URL, and its agents would
    poll it for ever (CI: every README job stayed SCHEDULED after a restart)."""
    node_id = _node_id()
    nodes = make_services().nodes
    url = nodes.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url
    scheme, rest = url.split("://", 1)
    host, path = rest.split("/", 1)
    moved = f"{scheme}://{host.split(':')[0]}:1/{path}"  # the same queue, another port
    NodeModel(node_id).update(actions=[NodeModel.inbox_queue_url.set(moved)])
    created.clear()
    assert make_services().nodes.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url == url
    assert len(created) == 1 and NodeModel.get(node_id).inbox_queue_url == url


def test_a_return_from_down_makes_sure_of_the_inbox(clock, make_services, created):
    node_id = _node_id()
    services = make_services()
    node = services.nodes.register(AGENT, node_id, {"gpus": 8})
    assert services.node_store.mark_down(node)
    created.clear()
    assert services.nodes.register(AGENT, node_id, {"gpus": 8}).state.value == "READY"
    assert len(created) == 1


def test_an_inbox_deleted_by_hand_comes_back_when_the_agent_says_so(make_services, sqs,
                                                                    created, tenants):
    from chalice.test import Client

    import app

    node_id = _node_id()
    nodes = make_services().nodes
    url = nodes.register(AGENT, node_id, {"gpus": 8}).inbox_queue_url
    sqs.delete_queue(QueueUrl=url)
    inbox = AgentInbox(url, wait_s=0, client=sqs)
    with pytest.raises(ClientError):
        inbox.receive()
    assert inbox.missing, "the agent's receive was told the queue does not exist"
    created.clear()
    nodes.register(AGENT, node_id, {"gpus": 8})
    assert created == [], "an ordinary call-in does not look"
    with Client(app.app) as client:  # the agent's next call-in says so, through the API
        r = client.http.put(f"/v1/nodes/{node_id}", headers=tenants.headers("agents"),
                            body=json.dumps({"gpus": 8, "inbox_missing": inbox.missing}))
    assert r.status_code == 200, r.body
    assert r.json_body["inbox_queue_url"] == url and len(created) == 1
    sqs.send_message(QueueUrl=url, MessageBody="{}")
    assert [m.body for m in inbox.receive()] == ["{}"], "the agent's inbox works again"
    assert not inbox.missing
