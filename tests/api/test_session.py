"""One botocore session per container: every table's requests (adapters/
dynamo.py, through the one shared connection), transactions and the queue
client come from it, each client made once, on first use."""
import json

import botocore.session
import pytest

from chalicelib.adapters import aws
from chalicelib.domain.principal import Principal

BODY = json.dumps({"command": ["x"], "ranks": 1})


@pytest.fixture
def made(monkeypatch):
    """(sessions, clients by service) made from here on."""
    sessions, clients = [], []
    original = botocore.session.Session.create_client

    def create_client(self, service_name, *args, **kwargs):
        clients.append(service_name)
        if self not in sessions:
            sessions.append(self)
        return original(self, service_name, *args, **kwargs)

    monkeypatch.setattr(botocore.session.Session, "create_client", create_client)
    aws.reset()  # a fresh container
    yield sessions, clients
    aws.reset()


def test_building_services_makes_no_client(made, make_services):
    make_services()
    assert made == ([], [])


def test_every_table_and_the_inbox_share_one_session_and_one_client_each(made, make_services,
                                                                         tenants):
    from chalice.test import Client

    import app

    s = make_services()
    with Client(app.app) as c:
        job_id = c.http.post("/v1/jobs", body=BODY, headers=tenants.headers(
            **{"Idempotency-Key": "k-session"})).json_body["id"]  # a transaction + SQS
        c.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers())  # JobModel
        c.http.get("/v1/jobs?state=PENDING", headers=tenants.headers())  # an index
        c.http.post(f"/v1/jobs/{job_id}/cancel", headers=tenants.headers())
        s.nodes.register(Principal("agent", "*"), "n-session", {"gpus": 1})  # nodes, fleet
    sessions, clients = made
    assert sorted(clients) == ["dynamodb", "sqs"], "one client per service"
    assert len(sessions) == 1, "one botocore session"
    assert sorted(aws.session_for(s.config.region, s.config.endpoint_url).made()) == [
        "dynamodb (pynamodb)", "sqs"], "the shared connection made the DynamoDB client"
