"""Only live ranks judged, heartbeat modes, host evidence and the culprit, through
the API on moto (issue 11, items 1, 2, 3 and 5)."""
import json

import pytest

from ..clock import FakeClock
from .test_events import event, placed
from .test_heartbeats import AGENT, beat, health, ranks_view


@pytest.fixture
def clock():
    return FakeClock()


def post(client, tenants, job_id, entries, attempt=1):
    r = client.http.post(f"/v1/jobs/{job_id}/heartbeats",
                         body=json.dumps({"attempt": attempt, "ranks": entries}),
                         headers=tenants.headers("agents"))
    assert r.status_code == 202, r.json_body
    return r


def start(iso, client, tenants, **spec):
    for n in ("n1", "n2"):
        iso.nodes.register(AGENT, n, {"gpus": 2})
    clock = iso.clock
    hb = {"interval_s": 5, "startup_grace_s": 30, **spec.pop("heartbeat", {})}
    job_id, by_node = placed(iso, client, tenants, heartbeat=hb, **spec)
    for n, ranks in by_node.items():
        event(client, tenants, job_id, 1, {"type": "STARTED", "ranks": ranks, "node_id": n})
    return job_id, by_node, clock


def scan(iso, clock, s):
    clock.advance(s)
    iso.nodes.register(AGENT, "n1", {"gpus": 2})  # the ingest path is alive
    iso.scanner.run()


def statuses(client, tenants, job_id):
    return {r["rank"]: r["status"] for r in ranks_view(client, tenants, job_id)["ranks"]}


def test_a_rank_that_exited_0_while_the_others_run_is_not_stalled(iso, iso_client, tenants):
    """Item 1: with on_stall restart, a job that would succeed is not failed as stalled."""
    job_id, by_node, clock = start(iso, iso_client, tenants, on_stall="restart", max_attempts=2)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    node0 = next(n for n, rs in by_node.items() if 0 in rs)
    event(iso_client, tenants, job_id, 1, {"type": "EXITED", "ranks": [0], "exit_code": 0,
                                           "node_id": node0})
    for _ in range(12):  # a minute: far past the threshold for rank 0
        clock.advance(5)
        beat(iso_client, tenants, job_id, [1, 2, 3])
        iso.scanner.run()
    j = iso_client.http.get(f"/v1/jobs/{job_id}", headers=tenants.headers()).json_body
    assert j["state"] == "RUNNING" and j["health"]["status"] == "OK"
    assert j["health"]["ranks_by_status"] == {"exited": [0]}
    assert statuses(iso_client, tenants, job_id) == {0: "exited", 1: "live", 2: "live",
                                                     3: "live"}


def test_health_is_frozen_when_the_job_finishes_not_left_stale(iso, iso_client, tenants):
    job_id, by_node, clock = start(iso, iso_client, tenants)
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    scan(iso, clock, 100)
    assert health(iso_client, tenants, job_id)["status"] == "STALLED"
    for n, ranks in by_node.items():  # then every rank exits 0 after all
        event(iso_client, tenants, job_id, 1, {"type": "EXITED", "ranks": ranks,
                                               "exit_code": 0, "node_id": n})
    h = health(iso_client, tenants, job_id)
    # every rank went on to exit 0: not hung after all, and frozen
    assert h["status"] == "OK" and h["frozen_at"]
    assert h["first_stalled_rank"] is not None, "the incident stays as history"
    scan(iso, clock, 100)
    assert health(iso_client, tenants, job_id) == h
    v = ranks_view(iso_client, tenants, job_id)
    assert not v["judged"] and {r["status"] for r in v["ranks"]} == {"exited"}


def test_an_uninstrumented_job_is_watched_not_convicted(iso, iso_client, tenants):
    """Item 2, mode auto: no rank ever beat, so no stall however long."""
    job_id, _, clock = start(iso, iso_client, tenants)
    post(iso_client, tenants, job_id, [{"rank": r, "proc": {"cpu": 0.0, "io_bps": 0,
                                                             "state": "S"}}
                                       for r in range(4)])
    for _ in range(3):
        scan(iso, clock, 60)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "UNKNOWN" and h["instrumented"] is False and h["stalled_ranks"] == []
    v = ranks_view(iso_client, tenants, job_id)
    assert {r["status"] for r in v["ranks"]} == {"not_instrumented"}
    assert all(r["proc"]["state"] == "S" and r["last_heard_at"] is None for r in v["ranks"])


def test_a_job_not_heard_from_within_its_grace_waits_for_its_first_beat(iso, iso_client,
                                                                       tenants):
    """Invariant (issue 47): under mode auto, no beat yet does not make a job
    "not instrumented" until its startup grace (30 s) is over: before, its
    ranks are awaiting_first_beat and health.instrumented is null (not known
    yet); after, with no beat ever, not_instrumented and false; the first
    beat makes it true."""
    job_id, _, clock = start(iso, iso_client, tenants)
    scan(iso, clock, 10)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "UNKNOWN" and h["instrumented"] is None, h
    assert h["ranks_by_status"] == {"awaiting_first_beat": [0, 1, 2, 3]}
    v = ranks_view(iso_client, tenants, job_id)
    assert v["instrumented"] is None
    assert set(statuses(iso_client, tenants, job_id).values()) == {"awaiting_first_beat"}
    scan(iso, clock, 21)  # 31 s: the grace is over, and no rank ever beat
    h = health(iso_client, tenants, job_id)
    assert h["instrumented"] is False and h["status"] == "UNKNOWN", h
    assert set(statuses(iso_client, tenants, job_id).values()) == {"not_instrumented"}
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    scan(iso, clock, 1)
    assert health(iso_client, tenants, job_id)["instrumented"] is True


def test_once_any_rank_beat_a_rank_that_never_did_is_stalled_after_the_grace(iso, iso_client,
                                                                            tenants):
    job_id, _, clock = start(iso, iso_client, tenants)
    for _ in range(8):  # 40 s: past the 30 s grace; rank 2 never beats
        beat(iso_client, tenants, job_id, [0, 1, 3])
        scan(iso, clock, 5)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 2
    assert h["verdict"]["rank"] == 2 and h["instrumented"] is True


def test_mode_beats_convicts_an_uninstrumented_job(iso, iso_client, tenants):
    job_id, _, clock = start(iso, iso_client, tenants, heartbeat={"mode": "beats"})
    scan(iso, clock, 100)
    assert health(iso_client, tenants, job_id)["status"] == "STALLED"


def test_mode_off_never_convicts(iso, iso_client, tenants):
    job_id, _, clock = start(iso, iso_client, tenants, heartbeat={"mode": "off"})
    beat(iso_client, tenants, job_id, [0, 1, 2, 3])
    scan(iso, clock, 1000)
    assert health(iso_client, tenants, job_id)["stalled_ranks"] == []


def test_mode_process_convicts_after_idle_s_without_cpu_or_io(iso, iso_client, tenants):
    job_id, _, clock = start(iso, iso_client, tenants,
                             heartbeat={"mode": "process", "idle_s": 20})
    working = {"cpu": 1.0, "io_bps": 0, "state": "R"}
    idle = {"cpu": 0.0, "io_bps": 0, "state": "S"}
    for i in range(8):
        post(iso_client, tenants, job_id,
             [{"rank": r, "proc": working if r != 1 or i < 2 else idle} for r in range(4)])
        scan(iso, clock, 5)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 1
    assert statuses(iso_client, tenants, job_id)[0] == "live"


def test_a_silent_rank_writing_is_busy_not_stalled_until_max_busy_s(iso, iso_client, tenants):
    """Item 3: an undeclared checkpoint shows as I/O, and the excuse is bounded."""
    job_id, _, clock = start(iso, iso_client, tenants, heartbeat={"max_busy_s": 60})
    beat(iso_client, tenants, job_id, [0, 1, 2, 3], proc={"cpu": 1.0, "io_bps": 0})
    writing = {"cpu": 0.9, "io_bps": 300e6, "state": "D"}
    waiting = {"cpu": 0.0, "io_bps": 0, "state": "S"}
    for _ in range(10):  # 50 s silent: past the threshold, writing
        post(iso_client, tenants, job_id, [{"rank": r, "proc": writing if r == 0 else waiting}
                                           for r in range(4)])
        scan(iso, clock, 5)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "OK" and h["ranks_by_status"] == {"busy": [0],
                                                            "silent": [1, 2, 3]}
    v = ranks_view(iso_client, tenants, job_id)
    [r0] = [r for r in v["ranks"] if r["rank"] == 0]
    assert r0["proc"]["io_bps"] == 300e6 and r0["proc"]["io_at"] and r0["last_heard_at"]
    assert all(r["silence_s"] >= 50 for r in v["ranks"]), "a sample is not a beat"
    for _ in range(10):  # past threshold + max_busy_s: a hang that still writes
        post(iso_client, tenants, job_id, [{"rank": r, "proc": writing if r == 0 else waiting}
                                           for r in range(4)])
        scan(iso, clock, 5)
    assert health(iso_client, tenants, job_id)["status"] == "STALLED"


def test_the_culprit_is_named_by_the_collective_it_never_arrived_at(iso, iso_client, tenants):
    """Item 5: rank 2 hung before arriving at collective 8; ranks 0, 1 and 3 wait in it.
    Rank 2's last post (a retry) arrived after rank 0's, so first_stalled_rank, which
    keeps the contract (silent longest by receive time), is 0: the culprit is 2."""
    job_id, _, clock = start(iso, iso_client, tenants)
    post(iso_client, tenants, job_id, [{"rank": r, "step": 7, "age_s": 0.1,
                                        "collective": {"seq": 7, "name": "allreduce"}}
                                       for r in (0, 1, 3)])
    clock.advance(1)
    post(iso_client, tenants, job_id, [{"rank": 0, "step": 8, "age_s": 0.5,
                                        "collective": {"seq": 8, "name": "allreduce"}}])
    clock.advance(1)
    post(iso_client, tenants, job_id, [{"rank": 2, "step": 7, "age_s": 2.1,
                                        "collective": {"seq": 7, "name": "allreduce"}}])
    clock.advance(1)
    post(iso_client, tenants, job_id, [{"rank": r, "step": 8, "age_s": 2.4,
                                        "collective": {"seq": 8, "name": "allreduce"}}
                                       for r in (1, 3)])
    for _ in range(12):
        scan(iso, clock, 5)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 0
    assert h["verdict"]["rank"] == 2 and h["verdict"]["by"] == "collective"
    assert h["verdict"]["evidence"]["collective"] == {"seq": 8, "name": "allreduce",
                                                      "waiting": 3, "missing": [2]}
    assert h["verdict"]["evidence"]["arrived_seq"] == 7
    assert h["verdict"]["evidence"]["receive_time"]
    assert h["verdict"]["text"].startswith("rank 2 on ") and "never reached allreduce #8" in \
        h["verdict"]["text"]
    assert ranks_view(iso_client, tenants, job_id)["verdict"] == h["verdict"], "one answer"
    v = ranks_view(iso_client, tenants, job_id)
    assert {r["rank"]: r["collective"]["seq"] for r in v["ranks"]} == {0: 8, 1: 8, 2: 7, 3: 8}


@pytest.mark.parametrize("hb", [{"mode": "sometimes"}, {"max_busy_s": -1}, {"idle_s": 0}])
def test_bad_heartbeat_settings_are_refused(iso_client, tenants, hb):
    r = iso_client.http.post("/v1/jobs", body=json.dumps({"command": ["x"], "ranks": 1,
                                                           "heartbeat": hb}),
                             headers={**tenants.headers(), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json_body["field"].startswith("heartbeat.")


def test_a_straggler_of_an_undeclared_checkpoint_is_excused_while_its_peers_resume(
        iso, iso_client, tenants):
    """Whole-job pause, then ranks 0-2 come back (their agents report the silence
    they ended); rank 3's first post is late. It is excused for two intervals
    after its peers resumed, then convicted: the excuse is bounded."""
    job_id, _, clock = start(iso, iso_client, tenants, heartbeat={"max_busy_s": 600})
    post(iso_client, tenants, job_id, [{"rank": r, "step": 1, "age_s": 0.1} for r in range(4)])
    writing = {"cpu": 0.9, "io_bps": 300e6, "write_bps": 300e6, "state": "D"}
    waiting = {"cpu": 0.0, "io_bps": 0, "write_bps": 0, "state": "S"}
    for i in range(8):   # 40 s: every rank writes its shard, rank 3 finishes first
        post(iso_client, tenants, job_id, [{"rank": r, "proc": writing if r < 3 or i < 2
                                            else waiting} for r in range(4)])
        scan(iso, clock, 5)
    assert health(iso_client, tenants, job_id)["status"] == "OK"
    for i in range(3):   # ranks 0-2 beat again; rank 3 is not heard yet
        post(iso_client, tenants, job_id,
             [{"rank": r, "step": 2 + i, "age_s": 0.1, "proc": waiting,
               "resumed": {"age_s": 5.0 * i, "gap_s": 40.0}} for r in range(3)]
             + [{"rank": 3, "proc": waiting}])
        if i < 2:
            scan(iso, clock, 5)
            h = health(iso_client, tenants, job_id)
            assert h["status"] == "OK" and h["ranks_by_status"] == {"silent": [3]}, h
    scan(iso, clock, 5.1)   # two intervals after the peers came back: a stall
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 3


def test_without_marks_the_culprit_is_the_tied_rank_unlike_its_waiting_peers(
        iso, iso_client, tenants):
    """Ranks 0-3 made their last beat() in the same step (beats cannot order them);
    ranks 0, 1 and 3 spin in an NCCL wait, rank 2 sleeps on a lock: it is named,
    by its process sample, while first_stalled_rank keeps the contract (0)."""
    job_id, _, clock = start(iso, iso_client, tenants)
    for r in (0, 1, 2, 3):   # last posts 0.2 s apart, every one the beat of step 7
        post(iso_client, tenants, job_id, [{"rank": r, "step": 7, "age_s": 0.1 + 0.2 * r}])
        clock.advance(0.2)
    spin = {"cpu": 1.0, "io_bps": 0, "write_bps": 0, "state": "R"}
    sleep = {"cpu": 0.0, "io_bps": 0, "write_bps": 0, "state": "S"}
    for _ in range(12):
        post(iso_client, tenants, job_id, [{"rank": r, "proc": sleep if r == 2 else spin}
                                           for r in range(4)])
        scan(iso, clock, 5)
    h = health(iso_client, tenants, job_id)
    assert h["status"] == "STALLED" and h["first_stalled_rank"] == 0
    assert h["verdict"]["rank"] == 2 and h["verdict"]["by"] == "process"
    ev = h["verdict"]["evidence"]
    assert (ev["signature"], ev["peers"], ev["state"], ev["cpu"]) == (
        "sleeping", "spinning", "S", 0.0)
