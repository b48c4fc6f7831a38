"""One SDK method per endpoint of API.md, against the fake server (which also
serves the node, event, heartbeat and rank endpoints the real server is
still growing)."""
from __future__ import annotations

import base64
import json

import pytest

from gpujobs_client import (
    AlreadyFinished,
    Client,
    Forbidden,
    InvalidPageToken,
    Job,
    Node,
    NodeWaitTimeout,
    NotFound,
    StaleAttempt,
    Unauthenticated,
)
from gpujobs_client.client import InvalidResponse


def test_pagination_follows_every_token_to_the_end(fake, sdk):
    ids = [fake.add_job(name=f"j{i}")["id"] for i in range(7)]
    fake.add_job(tenant="other")
    got = [j.id for j in sdk.iter_jobs(page_size=3)]
    assert got == sorted(ids, reverse=True)  # newest first, each once, all of them
    calls = fake.sent("GET", "/v1/jobs")
    assert len(calls) == 3
    assert "page_token" not in calls[0].query
    assert all(c.query["page_size"] == ["3"] for c in calls)
    # each request passes back the token of the answer before it
    page1 = sdk.list_jobs(page_size=3)
    assert calls[1].query["page_token"] == [page1.next_page_token]


def test_pagination_keeps_the_filter_and_stops_at_a_limit(fake, sdk):
    for _ in range(5):
        fake.update_job(fake.add_job()["id"], state="RUNNING")
    fake.add_job()  # PENDING
    running = list(sdk.iter_jobs(state="RUNNING", page_size=2))
    assert len(running) == 5 and {j.state for j in running} == {"RUNNING"}
    assert all(c.query["state"] == ["RUNNING"] for c in fake.sent("GET", "/v1/jobs"))
    before = len(fake.sent("GET", "/v1/jobs"))
    assert len(list(sdk.iter_jobs(page_size=2, limit=3))) == 3
    assert len(fake.sent("GET", "/v1/jobs")) - before == 2


def test_an_empty_page_with_a_token_is_not_the_end(fake, sdk):
    job = fake.add_job()
    # a token that resumes from the start, as the fake server makes them
    token = base64.urlsafe_b64encode(json.dumps({"t": "acme", "s": None, "a": "job_~"})
                                     .encode()).decode()
    fake.fail("GET", "/v1/jobs", status=200, ctype="application/json",
              body=json.dumps({"jobs": [], "next_page_token": token}).encode())
    assert [j.id for j in sdk.iter_jobs()] == [job["id"]]
    assert fake.sent("GET", "/v1/jobs")[1].query["page_token"] == [token]


def test_a_token_that_comes_back_twice_is_an_error_not_a_loop(fake, sdk):
    body = json.dumps({"jobs": [], "next_page_token": "same"}).encode()
    fake.fail("GET", "/v1/jobs", status=200, ctype="application/json", body=body, times=5)
    with pytest.raises(InvalidResponse):
        list(sdk.iter_jobs())
    assert len(fake.sent("GET", "/v1/jobs")) == 2


def test_a_ranks_page_token_that_comes_back_twice_is_an_error_not_a_loop(fake, sdk):
    job = fake.add_job(ranks=2)
    body = json.dumps({"attempt": 1, "ranks": [], "next_page_token": "same"}).encode()
    fake.fail("GET", r"/v1/jobs/.*/ranks", status=200, ctype="application/json", body=body,
              times=5)
    with pytest.raises(InvalidResponse):
        sdk.get_ranks(job["id"])
    assert len(fake.sent("GET", r"/v1/jobs/.*/ranks")) == 2


def test_a_tampered_token_is_invalid_page_token(fake, sdk):
    with pytest.raises(InvalidPageToken) as err:
        sdk.list_jobs(page_token="garbage")
    assert err.value.field == "page_token"


def test_create_get_cancel_and_attempts(fake, sdk):
    job = sdk.create_job(command=["python", "train.py"], ranks=4, gpu_type="h100",
                         labels={"team": "nlp"})
    assert isinstance(job, Job) and job.state == "PENDING" and job.ranks == 4
    assert job.spec["gpus_per_rank"] == 1 and job.health.status == "UNKNOWN"
    assert job.raw["spec"]["labels"] == {"team": "nlp"}
    sent = fake.sent("POST", "/v1/jobs")[0]
    assert sent.headers["content-type"] == "application/json"
    assert sent.headers["authorization"] == "Bearer t1"
    assert sent.json() == {"command": ["python", "train.py"], "ranks": 4, "gpu_type": "h100",
                           "labels": {"team": "nlp"}}
    assert sdk.get_job(job.id) == job
    assert sdk.list_attempts(job.id) == []
    cancelled = sdk.cancel_job(job.id, reason="wrong data")
    assert cancelled.state == "CANCELLED" and cancelled.is_terminal
    assert cancelled.cancel_reason == "wrong data" and cancelled.exit.reason == "cancelled"
    assert fake.sent("POST", r"/v1/jobs/.*/cancel")[0].json() == {"reason": "wrong data"}
    assert sdk.cancel_job(job.id).state == "CANCELLED"  # a repeat is harmless


def test_cancel_of_a_finished_job_is_already_finished(fake, sdk):
    job = fake.add_job()
    fake.update_job(job["id"], state="SUCCEEDED")
    with pytest.raises(AlreadyFinished):
        sdk.cancel_job(job["id"])


def test_wait_for_job_polls_until_terminal(fake, sdk):
    job = fake.add_job()
    fake.place(job["id"], ["node-1"])
    polls = []
    fake.on_get_job.append(lambda j: polls.append(j["state"]) or (
        len(polls) == 3 and j.update(state="SUCCEEDED")))
    done = sdk.wait_for_job(job["id"], interval_s=0, sleep=lambda s: None)
    assert done.state == "SUCCEEDED" and len(polls) == 3


def test_agent_endpoints_nodes_events_heartbeats_and_ranks(fake, sdk, agent_sdk):
    node = agent_sdk.put_node("node-1", gpus=8, gpu_type="h100", labels={"zone": "a"})
    assert (node.node_id, node.gpus, node.gpu_type, node.labels) == ("node-1", 8, "h100",
                                                                     {"zone": "a"})
    assert fake.sent("PUT", "/v1/nodes/node-1")[0].json() == {"gpus": 8, "gpu_type": "h100",
                                                              "labels": {"zone": "a"}}
    agent_sdk.put_node("node-2", gpus=4, gpu_type="a100")
    assert [n.node_id for n in sdk.list_nodes()] == ["node-1", "node-2"]
    assert sdk.get_node("node-2").gpus_free == 4
    with pytest.raises(NotFound):
        sdk.get_node("node-9")

    job = sdk.create_job(command=["x"], ranks=3)
    fake.place(job.id, ["node-1", "node-2"], state="SCHEDULED")
    started = agent_sdk.post_event(job.id, 1, "STARTED", [0, 1, 2])
    assert started.state == "RUNNING"
    assert fake.sent("POST", r"/v1/jobs/.*/attempts/1/events")[0].json() == {
        "type": "STARTED", "ranks": [0, 1, 2]}

    fake.clock = 10.0
    ack = agent_sdk.post_heartbeats(job.id, 1, [{"rank": 0, "step": 100}, (2, 90)])
    assert ack.received_at == fake.now()
    beats = fake.sent("POST", r"/v1/jobs/.*/heartbeats")[0].json()
    assert beats["attempt"] == 1 and [b["rank"] for b in beats["ranks"]] == [0, 2]
    assert all(b["sent_at"].endswith("Z") for b in beats["ranks"])

    fake.clock = 50.0
    ranks = sdk.get_ranks(job.id)
    # never heard rank 1 is silent since the start; the others since t=10
    assert [r.rank for r in ranks.ranks] == [1, 0, 2]
    assert ranks.ranks[0].last_heard_at is None and ranks.ranks[0].silence_s == 50.0
    assert ranks.ranks[1].step == 100 and ranks.ranks[1].node_id == "node-1"
    assert [r.rank for r in ranks.stalled] == [1, 0, 2]
    assert ranks.threshold_s == 30.0 and ranks.attempt == 1

    with pytest.raises(StaleAttempt):
        agent_sdk.post_event(job.id, 7, "EXITED", [0], exit_code=0)
    done = agent_sdk.post_event(job.id, 1, "EXITED", [0, 1, 2], exit_code=1)
    assert done.state == "FAILED" and done.exit.exit_code == 1
    assert fake.sent("POST", r"/v1/jobs/.*/attempts/1/events")[-1].json()["exit_code"] == 1
    with pytest.raises(AlreadyFinished):
        agent_sdk.post_heartbeats(job.id, 1, [(0, 1)])


def test_tokens_and_tenants(fake, sdk, agent_sdk):
    job = sdk.create_job(command=["x"], ranks=1)
    with Client(fake.url, "t2") as other, pytest.raises(NotFound):
        other.get_job(job.id)
    with pytest.raises(Forbidden):
        agent_sdk.get_job(job.id)
    with Client(fake.url, "nope") as bad, pytest.raises(Unauthenticated) as err:
        bad.list_jobs()
    assert err.value.field == "Authorization"
    with Client(fake.url, None) as anonymous:
        assert anonymous.health() == {"status": "ok"}
    assert "authorization" not in fake.sent("GET", "/v1/health")[0].headers


def test_a_job_id_cannot_reach_another_path(fake, sdk):
    with pytest.raises(NotFound):
        sdk.get_job("../nodes")
    assert fake.sent("GET", r"/v1/jobs/.*")[0].path == "/v1/jobs/..%2Fnodes"


def test_defaults_come_from_the_environment(fake, monkeypatch):
    monkeypatch.setenv("GPUJOBS_API_URL", fake.url + "/")
    monkeypatch.setenv("GPUJOBS_TOKEN", "t1")
    with Client() as c:
        assert c.api_url == fake.url
        assert c.list_jobs().jobs == []


def test_from_config_reads_the_config_file(fake, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUJOBS_API_URL", raising=False)
    monkeypatch.delenv("GPUJOBS_TOKEN", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "gpujobs").mkdir()
    (tmp_path / "gpujobs" / "config.toml").write_text(f'api_url = "{fake.url}"\ntoken = "t1"\n')
    with Client.from_config() as c:
        assert (c.api_url, c.token) == (fake.url, "t1")


def test_importing_the_package_does_not_import_requests_or_rich():
    import subprocess
    import sys

    from tests.support.cli import CLIENT_DIR
    code = ("import sys, gpujobs_client, gpujobs_client.cli; "
            "print(sorted(m for m in ('requests', 'rich', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(CLIENT_DIR), "PATH": ""}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the lifecycle: retry rules, time limits, how an attempt ended -------------------
LIFECYCLE = {"retry": {"rules": [{"exit_codes": [42], "action": "fail"},
                                 {"reasons": ["node_lost"], "action": "retry_uncounted"}],
                       "max_uncounted_retries": 5},
             "max_runtime_s": 14400, "warn_before_s": 300, "warn_signal": "SIGUSR2",
             "max_pending_s": 1800, "checkpoint_dir": "/shared/ckpt"}


def test_create_job_passes_the_lifecycle_members_through(fake, sdk):
    job = sdk.create_job(command=["python", "train.py"], ranks=2, **LIFECYCLE)
    assert fake.sent("POST", "/v1/jobs")[0].json() == {
        "command": ["python", "train.py"], "ranks": 2, **LIFECYCLE}
    assert {k: job.spec[k] for k in LIFECYCLE} == LIFECYCLE
    assert job.pending_since == fake.now() and job.uncounted_retries == 0
    assert job.counted_attempts == 0


def test_the_spec_shown_back_has_the_retry_defaults(fake, sdk):
    job = sdk.create_job({"command": ["x"], "ranks": 1, "max_runtime_s": 60,
                          "warn_before_s": 10})
    assert job.spec["retry"] == {"rules": [], "max_uncounted_retries": 10}
    assert job.spec["warn_signal"] == "SIGUSR1"


def test_job_exit_and_events_expose_the_decision_and_the_node(fake, sdk):
    raw = fake.add_job(max_attempts=3)
    decision = "node_lost (rank 3): retried, not counted (uncounted retry 2 of 10)"
    fake.update_job(raw["id"], state="FAILED", attempt=4, uncounted_retries=2,
                    exit={"reason": "rank_failed", "exit_code": 137, "rank": 3,
                          "node_id": "node-2", "decision": "rank_failed (rank 3, exit code "
                          "137, SIGKILL): not retried (counted attempt 2 of 3, none left)"})
    fake.events[raw["id"]] = [{"type": "retried", "time": fake.now(), "attempt": 2,
                               "reason": "node_lost", "rank": 3, "node_id": "node-2",
                               "next_attempt": 3, "decision": decision}]
    job = sdk.get_job(raw["id"])
    assert (job.uncounted_retries, job.counted_attempts) == (2, 2)
    assert job.exit is not None and job.exit.rank == 3 and job.exit.node_id == "node-2"
    assert job.exit.decision.endswith("none left)")
    (event,) = sdk.list_events(raw["id"])
    assert event.decision == decision and event.node_id == "node-2"


# -- operator actions on nodes: cordon, drain, uncordon -------------------------------------
@pytest.fixture
def operator_sdk(fake, policy):
    c = Client(fake.url, "o1", timeout=5, retry=policy())
    try:
        yield c
    finally:
        c.close()


def test_cordon_drain_and_uncordon_send_their_bodies_and_read_the_cordon(fake, operator_sdk):
    fake.add_node("n1")
    node = operator_sdk.cordon_node("n1", "bad ECC")
    assert fake.sent("POST", "/v1/nodes/n1/cordon")[0].json() == {"reason": "bad ECC"}
    assert node.state == "DRAINING" and node.cordon is not None
    assert (node.cordon.reason, node.cordon.by, node.cordon.at, node.cordon.drain,
            node.cordon.auto) == ("bad ECC", "ops-oncall", fake.now(), "keep", False)
    assert node.cordon.raw == node.raw["cordon"]

    drained = operator_sdk.drain_node("n1", "retire", wait=True)
    assert fake.sent("POST", "/v1/nodes/n1/drain")[0].json() == {"reason": "retire",
                                                                 "wait": True}
    assert drained.cordon is not None and drained.cordon.drain == "wait"
    assert operator_sdk.drain_node("n1").cordon.drain == "stop"
    assert fake.sent("POST", "/v1/nodes/n1/drain")[1].json() == {}

    back = operator_sdk.uncordon_node("n1")
    assert fake.sent("POST", "/v1/nodes/n1/uncordon")[0].body == b""
    assert (back.state, back.cordon) == ("READY", None)
    assert operator_sdk.get_node("n1").cordon is None


def test_a_node_from_a_server_without_cordons_has_none():
    node = Node.from_json({"node_id": "old", "gpus": 8, "gpus_free": 2, "gpu_type": "h100",
                           "state": "READY"})
    assert node.cordon is None and node.gpus_used == 6 and not node.is_drained


def test_only_an_operator_token_may_cordon(fake, sdk, agent_sdk, operator_sdk):
    fake.add_node("n1")
    for c in (sdk, agent_sdk):
        for verb in ("cordon_node", "drain_node", "uncordon_node"):
            with pytest.raises(Forbidden) as err:
                getattr(c, verb)("n1")
            assert err.value.field == "Authorization"
    assert fake.nodes["n1"]["cordon"] is None
    with pytest.raises(NotFound) as missing:
        operator_sdk.drain_node("ghost", "x")
    assert missing.value.field == "node_id"


@pytest.mark.parametrize("call, path", [
    (lambda c: c.cordon_node("n1", "x"), "/v1/nodes/n1/cordon"),
    (lambda c: c.drain_node("n1", "x"), "/v1/nodes/n1/drain"),
    (lambda c: c.uncordon_node("n1"), "/v1/nodes/n1/uncordon"),
])
def test_node_actions_are_retried_after_a_dropped_answer(fake, operator_sdk, call, path):
    """Not keyed, but the same effect twice: retried as a cancel is."""
    fake.add_node("n1")
    fake.fail("POST", path, "drop_after")
    call(operator_sdk)
    assert len(fake.sent("POST", path)) == 2


def test_a_drain_preempts_the_running_attempts_and_wait_for_drain_polls(fake, operator_sdk,
                                                                        sdk):
    fake.add_node("n1", gpus_free=6)
    job = sdk.create_job(command=["x"], ranks=2)
    fake.place(job.id, ["n1"])
    operator_sdk.drain_node("n1", "bad ECC")
    (attempt,) = sdk.list_attempts(job.id)
    assert attempt.exit is not None and attempt.exit.reason == "preempted"
    assert attempt.exit.detail == "node n1 drained: bad ECC"
    assert attempt.exit.decision == ("preempted (node n1 drained: bad ECC): retried, not "
                                     "counted (uncounted retry 1 of 10)")
    after = sdk.get_job(job.id)
    assert (after.state, after.uncounted_retries) == ("PENDING", 1)

    fake.on_get_node.append(lambda n: n.update(gpus_free=min(8, n["gpus_free"] + 1)))
    seen = []
    done = operator_sdk.wait_for_drain("n1", interval_s=0, sleep=lambda s: None,
                                       on_poll=lambda n: seen.append(n.gpus_free))
    assert seen == [7, 8] and done.is_drained


def test_wait_for_drain_gives_up_with_the_last_node_seen(fake, operator_sdk):
    fake.add_node("n1", gpus_free=5)
    operator_sdk.drain_node("n1", wait=True)
    with pytest.raises(NodeWaitTimeout) as err:
        operator_sdk.wait_for_drain("n1", interval_s=0, timeout_s=0)
    assert err.value.node.gpus_used == 3


# -- the fake's cordons are the server's ------------------------------------------------------
def test_the_fakes_node_and_cordon_are_the_servers(fake):
    nodes = pytest.importorskip("chalicelib.domain.nodes")
    representation = pytest.importorskip("chalicelib.api.representation")
    from datetime import datetime, timezone
    now = datetime(2025, 1, 31, 12, tzinfo=timezone.utc)
    node = nodes.Node("n1", 8, 8, "h100", nodes.NodeState.READY, "q", now, now,
                      cordon=nodes.cordon_of("r", "ops", "t", nodes.STOP))
    served = representation.node_json(node)
    fake.add_node("n1")
    with Client(fake.url, "o1") as c:
        mine = c.drain_node("n1", "r").raw
    assert set(mine) == set(served)
    assert set(mine["cordon"]) == set(served["cordon"])
    assert mine["cordon"]["drain"] == served["cordon"]["drain"] == "stop"


@pytest.mark.parametrize("spec, attempt, uncounted", [
    ({}, 1, 0), ({"max_attempts": 3}, 2, 10), ({"max_attempts": 1}, 11, 10),
    ({"retry": {"rules": [{"reasons": ["preempted"], "action": "fail"}]}}, 1, 0),
    ({"retry": {"rules": [{"reasons": ["preempted"], "action": "retry"}]},
      "max_attempts": 2}, 1, 0),
])
def test_the_fakes_preemption_decision_is_the_servers(spec, attempt, uncounted):
    retry = pytest.importorskip("chalicelib.domain.retry")
    JobSpec = pytest.importorskip("chalicelib.domain.spec").JobSpec
    from .fakeserver import _decide
    exit_ = {"reason": "preempted", "exit_code": None, "node_id": "n1",
             "detail": "node n1 drained: bad ECC"}
    full = {"max_attempts": 1, **spec,
            "retry": {"rules": [], "max_uncounted_retries": 10, **spec.get("retry", {})}}
    want = retry.decide(JobSpec.parse({"command": ["x"], "ranks": 1, **spec}), exit_, attempt=attempt, uncounted=uncounted)
    got = _decide({"spec": full, "attempt": attempt, "uncounted_retries": uncounted}, exit_)
    assert got == (want.action, want.text)


# -- priority classes and preemption (issue 28) ---------------------------------------------
CLASSES = {"default": {"value": 0}, "urgent": {"value": 1000, "preempts": True,
                                               "tenants": ["acme"]},
           "batch": {"value": -100}}


def test_create_job_sends_the_priority_class_and_the_job_says_its_preemption(fake, sdk):
    fake.priority_classes = CLASSES
    plain = sdk.create_job(command=["x"], ranks=1)
    assert "priority_class" not in fake.sent("POST", "/v1/jobs")[0].json()
    assert (plain.priority_class, plain.priority, plain.preempting) == ("default", 0, None)
    victim = sdk.create_job(command=["x"], ranks=2, priority_class="batch")
    assert fake.sent("POST", "/v1/jobs")[1].json()["priority_class"] == "batch"
    assert victim.priority_class == "batch"
    fake.place(victim.id, ["n1"])
    urgent = sdk.create_job({"command": ["x"], "ranks": 2, "priority": 7},
                            priority_class="urgent")
    assert (urgent.priority_class, urgent.priority) == ("urgent", 7)
    fake.preempt(urgent.id, [victim.id])
    job = sdk.get_job(urgent.id)
    assert job.preempting is not None
    assert (job.preempting.jobs, job.preempting.priority_class, job.preempting.at) == (
        [victim.id], "urgent", fake.now())
    assert job.pending_reason == (f"preempting {victim.id} (2 GPUs of lower priority classes) "
                                  "to make room (urgent)")
    (event,) = sdk.list_events(urgent.id)
    assert (event.type, event.jobs, event.attempt) == ("preempting", [victim.id], None)
    (ended,) = sdk.list_attempts(victim.id)
    assert ended.exit is not None and ended.exit.reason == "preempted"
    assert ended.exit.detail == f"by {urgent.id}, priority class urgent"
    assert ended.exit.decision == (f"preempted (by {urgent.id}, priority class urgent): "
                                   "retried, not counted (uncounted retry 1 of 10)")
    assert sdk.get_job(victim.id).state == "PENDING"
    assert [e.jobs for e in sdk.list_events(victim.id)] == [[]]


def test_an_unknown_class_is_400_and_another_tenants_class_403(fake, sdk, policy):
    from gpujobs_client import InvalidArgument
    fake.priority_classes = CLASSES
    with pytest.raises(InvalidArgument) as bad:
        sdk.create_job(command=["x"], ranks=1, priority_class="vip")
    assert bad.value.field == "priority_class"
    assert bad.value.detail == ("priority_class 'vip' is not one of this deployment's classes: "
                                "urgent, default, batch")
    with Client(fake.url, "t2", timeout=5, retry=policy()) as other:
        with pytest.raises(Forbidden) as refused:
            other.create_job(command=["x"], ranks=1, priority_class="urgent")
    assert refused.value.field == "priority_class"
    assert refused.value.detail == "tenant other may not submit to priority class urgent"
    assert len(fake.jobs) == 0


@pytest.mark.parametrize("name, tenant", [("vip", "acme"), ("urgent", "globex"),
                                          ("no spaces", "acme"), (7, "acme"),
                                          ("urgent", "acme"), ("default", "globex")])
def test_the_fakes_priority_class_refusals_are_the_servers(name, tenant):
    """The fake answers a priority_class as chalicelib does: the schema's
    pattern (api/validation.py), then service/jobs.py submit (unknown: 400,
    kept for other tenants: 403), the same problem document."""
    pytest.importorskip("fastjsonschema")
    from chalicelib.api import problems, validation
    from chalicelib.domain.errors import ApiError as ServerError
    from chalicelib.domain.priority import PriorityClasses
    from chalicelib.service.jobs import JobsService

    from .fakeserver import FakeApi, Problem
    body = {"command": ["x"], "ranks": 1, "priority_class": name}
    # no store (nor pipelines): the class is judged before the service reads
    # or writes anything
    service = JobsService(None, None, None, page_token_key=b"k", scans_per_hour=1.0,
                          cancel_resend_after_s=1.0, telemetry=None, pipelines=None,
                          canceller=None,
                          classes=PriorityClasses.parse(json.dumps(
                              {k: v for k, v in CLASSES.items() if k != "default"})))
    served = None
    try:
        validation.validate("JOB_CREATE", body)
        service.submit(tenant, body, None)
    except ServerError as e:
        served = problems.body(e)
    except AttributeError:  # past every check: it reached the (absent) store
        pass
    fake = FakeApi()
    fake.priority_classes = CLASSES
    try:
        fake._check_priority_class(tenant, body)
        mine = None
    except Problem as p:
        mine = p.body
    finally:
        fake.server.server_close()
    assert mine == served
