"""The reconciler: lost sends are resent, silent nodes go DOWN and give back
their GPUs, and the attempts they held are failed or re-queued."""

from chalicelib.adapters.models import NodeModel
from chalicelib.domain.principal import Principal

from .helpers import drain
from .test_cancel import FailingInbox
from .test_events import event, free, placed

AGENT = Principal("agent", "*")


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
    assert int(node.gpus_free) == 2, "the lost ranks' GPUs came back"
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "PENDING", "re-queued while attempts remain"
    [attempt] = iso.store.attempts(job_id)
    assert attempt["exit"]["reason"] == "node_lost"
    assert [m["type"] for m in drain(sqs, urls["n2"], job_id)] == ["CANCEL"]
    assert iso.reconciler.mark_silent_nodes_down() == [], "once"


def test_a_silent_node_fails_a_job_with_no_attempts_left(clock, iso, iso_client, tenants):
    iso.nodes.register(AGENT, "n1", {"gpus": 4})
    job_id, _ = placed(iso, iso_client, tenants, ranks=2)
    clock.advance(iso.config.node_down_after_s + 1)
    assert iso.reconciler.mark_silent_nodes_down() == ["n1"]
    job = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert job["state"] == "FAILED" and job["exit"]["reason"] == "node_lost"
    assert free("n1") == 4


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
