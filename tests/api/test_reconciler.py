"""The reconciler: lost sends are resent, silent nodes go DOWN, and the
attempts they held are failed or re-queued; the lost node's GPUs come back only
once its agent confirms the ranks gone (a report, or a registration)."""
import json

import pytest
from botocore.exceptions import ClientError

from chalicelib.adapters.dynamo_errors import dependency_failure
from chalicelib.adapters.models import NodeModel
from chalicelib.domain.principal import Principal
from tests.fakes import FailingInbox
from tests.faults import inject

from .helpers import drain
from .test_events import event, free, placed

AGENT = Principal("agent", "*")
#: a node's loss counted like any failure: with one attempt, the job fails
COUNTED = {"rules": [{"reasons": ["node_lost"], "action": "retry"}]}


def test_a_placer_that_dies_before_launch_is_covered_by_a_resend(clock, make_services, fresh_env,
                                                                 tenants, sqs):
    healthy = make_services(fresh_env)
    urls = {n: healthy.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url
            for n in ("n1", "n2")}
    dying = make_services(fresh_env, inbox=FailingInbox(healthy.nodes.inbox))
    from chalice.test import Client

    import app
    with Client(app.app) as client:
        job_id, by_node = placed(dying, client, tenants)
    assert all(drain(sqs, u, job_id) == [] for u in urls.values()), "LAUNCH was lost"
    healthy = make_services(fresh_env)
    healthy.reconciler.resend_due_intents()
    assert all(drain(sqs, u, job_id) == [] for u in urls.values()), "not before it is due"
    clock.advance(healthy.config.cancel_resend_after_s + 1)
    healthy.reconciler.resend_due_intents()
    for n, url in urls.items():
        [launch] = drain(sqs, url, job_id)
        assert launch["type"] == "LAUNCH" and launch["ranks"] == by_node[n]


def test_a_silent_node_goes_down_and_its_job_is_requeued(clock, iso, iso_client, tenants, sqs):
    urls = {n: iso.nodes.register(AGENT, n, {"gpus": 2}).inbox_queue_url for n in ("n1", "n2")}
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
        drain(sqs, urls[n], job_id)
    iso.nodes.register(AGENT, "n2", {"gpus": 2})  # n2 keeps calling in
    clock.advance(iso.config.node_down_after_s + 1)
    # only n1 went silent: move n2's last call into the future
    NodeModel("n2").update(actions=[NodeModel.last_seen_at.set("2999-01-01T00:00:00.000Z")])
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"]
    node = NodeModel.get("n1")
    assert node.state == "DOWN" and node.ready_any is None
    assert int(node.gpus_free) == 0, "held until n1's agent confirms its ranks gone"
    assert node.lost == {f"{job_id}#1"}
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "PENDING", "re-queued while attempts remain"
    [attempt] = iso.store.attempts(job_id)
    assert attempt["exit"]["reason"] == "node_lost"
    assert [m["type"] for m in drain(sqs, urls["n2"], job_id)] == ["CANCEL"]
    assert iso.reconciler.mark_silent_nodes_down() == [], "once"


def test_a_silent_node_fails_a_job_with_no_attempts_left(clock, iso, iso_client, tenants):
    iso.nodes.register(AGENT, "n1", {"gpus": 4})
    job_id, _ = placed(iso, iso_client, tenants, ranks=2, retry=COUNTED)
    clock.advance(iso.config.node_down_after_s + 1)
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"]
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "FAILED" and job["exit"]["reason"] == "node_lost"
    assert free("n1") == 2, "the lost ranks may still run there: their GPUs stay held"


def test_a_node_that_comes_back_is_ready_again(clock, iso):
    iso.nodes.register(AGENT, "n1", {"gpus": 4})
    clock.advance(iso.config.node_down_after_s + 1)
    iso.reconciler.mark_silent_nodes_down()
    node = iso.nodes.register(AGENT, "n1", {"gpus": 4})
    assert node.state.value == "READY" and node.gpus_free == 4
    assert NodeModel.get("n1").ready_any == "1", "placeable again"


def test_a_node_that_keeps_calling_in_is_not_marked_down(clock, iso):
    iso.nodes.register(AGENT, "n1", {"gpus": 4})
    clock.advance(iso.config.node_down_after_s / 2)
    assert iso.reconciler.mark_silent_nodes_down() == []


def test_a_node_lost_finds_a_cancel_in_its_inbox_when_it_comes_back(clock, iso, iso_client, tenants,
                                                                   sqs):
    url = iso.nodes.register(AGENT, "n1", {"gpus": 4}).inbox_queue_url
    job_id, _ = placed(iso, iso_client, tenants, ranks=2)
    drain(sqs, url, job_id)
    clock.advance(iso.config.node_down_after_s + 1)
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"]
    [cancel] = drain(sqs, url, job_id)
    assert cancel == {"type": "CANCEL", "job_id": job_id, "attempt": 1, "reason": "node_lost"}


def put_node(client, tenants, node_id, **body):
    r = client.http.put(f"/v1/nodes/{node_id}", headers=tenants.headers("agents"),
                        body=json.dumps({"gpus": 4, **body}))
    assert r.status_code == 200, r.json_body
    return r.json_body


def lost_job(clock, iso, client, tenants, sqs):
    """A two-rank job running on n1 (4 GPUs), which then goes DOWN (and
    fails: its loss counts)."""
    url = iso.nodes.register(AGENT, "n1", {"gpus": 4}).inbox_queue_url
    job_id, _ = placed(iso, client, tenants, ranks=2, retry=COUNTED)
    event(client, tenants, job_id, 1, {"type": "STARTED", "ranks": [0, 1], "node_id": "n1"})
    drain(sqs, url, job_id)
    clock.advance(iso.config.node_down_after_s + 1)
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"]
    assert free("n1") == 2
    return job_id


def test_the_registration_answer_lists_the_attempts_the_server_waits_for(iso, iso_client,
                                                                         tenants):
    put_node(iso_client, tenants, "n1")
    job_id, _ = placed(iso, iso_client, tenants, ranks=2)
    node = put_node(iso_client, tenants, "n1", running=[])
    assert node["attempts"] == [{"job_id": job_id, "attempt": 1}]
    assert node["gpus_free"] == 2, "a placement not yet launched keeps its GPUs"
    listed = iso_client.http.get("/v1/nodes/n1", headers=tenants.headers("a")).json_body
    assert "attempts" not in listed, "tenants reading nodes see no job ids"


@pytest.mark.parametrize("report", [{"type": "STOPPED", "ranks": [0, 1]},
                                    {"type": "STOPPED"},
                                    {"type": "EXITED", "ranks": [0, 1], "exit_code": -15}])
def test_a_lost_nodes_gpus_come_back_when_its_agent_confirms_the_ranks_gone(clock, 
        iso, iso_client, tenants, sqs, report):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    event(iso_client, tenants, job_id, 1, {**report, "node_id": "n1"})
    assert free("n1") == 4
    assert NodeModel.get("n1").lost is None


def test_a_lost_node_reporting_started_or_one_rank_gone_keeps_its_gpus(clock, iso, iso_client,
                                                                        tenants, sqs):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": [0, 1], "node_id": "n1"})
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": [0], "exit_code": 0, "node_id": "n1"})
    assert free("n1") == 2, "rank 1 may still run"
    event(iso_client, tenants, job_id, 1,
          {"type": "EXITED", "ranks": [1], "exit_code": 0, "node_id": "n1"})
    assert free("n1") == 4


def test_a_lost_node_registering_without_the_attempt_gets_its_gpus_back(clock, iso, iso_client,
                                                                         tenants, sqs):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    node = put_node(iso_client, tenants, "n1", running=[])
    assert node["state"] == "READY" and node["gpus_free"] == 4 and node["attempts"] == []
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "FAILED" and job["exit"]["reason"] == "node_lost", "unchanged"


def test_a_lost_node_still_running_the_attempt_keeps_its_gpus_and_is_told_to_stop_it(clock, 
        iso, iso_client, tenants, sqs):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    node = put_node(iso_client, tenants, "n1", running=[{"job_id": job_id, "attempt": 1}])
    assert node["state"] == "READY" and node["gpus_free"] == 2
    assert node["attempts"] == [], "the failed attempt is not live: the agent stops it"
    node = put_node(iso_client, tenants, "n1", running=[])  # stopped now
    assert node["gpus_free"] == 4


def test_a_lost_node_whose_agent_does_not_say_what_runs_keeps_its_gpus(clock, iso, iso_client,
                                                                        tenants, sqs):
    lost_job(clock, iso, iso_client, tenants, sqs)
    node = put_node(iso_client, tenants, "n1")  # an agent that does not send `running`
    assert node["gpus_free"] == 2 and node["attempts"] == []


def test_a_throttled_store_in_the_middle_of_down_handling_is_finished_by_the_next_run(
        clock, iso, iso_client, tenants, sqs):
    url = iso.nodes.register(AGENT, "n1", {"gpus": 4}).inbox_queue_url
    job_id, _ = placed(iso, iso_client, tenants, ranks=2, retry=COUNTED)
    drain(sqs, url, job_id)
    clock.advance(iso.config.node_down_after_s + 1)
    # the last step for the attempt (marking it lost on the node) is throttled
    with inject("UpdateItem", "throttling", when=f"{job_id}#1") as throttled, \
            pytest.raises(ClientError) as caught:
        iso.reconciler.mark_silent_nodes_down()
    assert throttled.hits
    assert dependency_failure(caught.value), "the scheduled handler's wrapper makes it a 503"
    assert NodeModel.get("n1").state == "DOWN" and NodeModel.get("n1").lost is None
    assert iso.reconciler.mark_silent_nodes_down() == [], "already DOWN"
    assert NodeModel.get("n1").lost == {f"{job_id}#1"}, "the next run finished the handling"
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "FAILED" and job["exit"]["reason"] == "node_lost"
    assert free("n1") == 2
    assert {m["reason"] for m in drain(sqs, url, job_id)} == {"node_lost"}
    iso.reconciler.mark_silent_nodes_down()
    assert drain(sqs, url, job_id) == [], "nothing more once finished"


@pytest.mark.parametrize("fault", ["read_timeout", "throttling"])
def test_a_store_fault_while_a_lost_node_registers_is_503_and_a_retry_gives_its_gpus_back(clock, iso, iso_client, tenants, sqs, fault):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    with inject("TransactWriteItems", fault, when=job_id) as injected:
        r = iso_client.http.put("/v1/nodes/n1", headers=tenants.headers("agents"),
                                body=json.dumps({"gpus": 4, "running": []}))
    assert injected.hits and r.status_code == 503 and r.headers["Retry-After"]
    assert free("n1") == 2
    assert put_node(iso_client, tenants, "n1", running=[])["gpus_free"] == 4


def test_a_lost_response_to_the_release_of_a_lost_node_gives_its_gpus_back_once(clock, iso, iso_client, tenants, sqs):
    job_id = lost_job(clock, iso, iso_client, tenants, sqs)
    with inject("TransactWriteItems", "lost_response", times=1, when=job_id) as lost:
        node = put_node(iso_client, tenants, "n1", running=[])
    assert lost.hits == 1
    assert node["gpus_free"] == 4 and free("n1") == 4
    assert put_node(iso_client, tenants, "n1", running=[])["gpus_free"] == 4


def test_a_busy_node_silent_by_call_ins_stays_up_while_its_beats_arrive(clock, iso, iso_client,
                                                                         tenants, sqs):
    """A busy agent calls in only every few minutes: its beats are its lease.
    It goes DOWN once both are older than GPUJOBS_NODE_DOWN_AFTER_S (a beat
    from its neighbour, for the same attempt, does not keep it up)."""
    from .test_heartbeats import beat

    for n in ("n1", "n2"):
        iso.nodes.register(AGENT, n, {"gpus": 2})
    job_id, by_node = placed(iso, iso_client, tenants, max_attempts=2)
    for n, ranks in by_node.items():
        event(iso_client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    down_after = iso.config.node_down_after_s
    for _ in range(3):   # three DOWN periods without a call-in, beating
        clock.advance(down_after / 2)
        for ranks in by_node.values():
            assert beat(iso_client, tenants, job_id, ranks).status_code == 202
        clock.advance(down_after / 2)
        assert iso.reconciler.mark_silent_nodes_down() == []
    assert {iso.nodes.get(n).state.value for n in by_node} == {"READY"}
    clock.advance(1)
    assert beat(iso_client, tenants, job_id, by_node["n2"]).status_code == 202
    clock.advance(down_after / 2)
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"], "n1's beats stopped"
    assert iso.nodes.get("n2").state.value == "READY"
