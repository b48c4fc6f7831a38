"""Ranks never outlive their attempt: an agent that learns its attempt is over
stops its ranks (SIGTERM, grace, SIGKILL), with real processes. Each test is
named for how the agent learns it: a beat answered 409, or a registration
answered without the attempt (it was failed while the node was DOWN)."""
from __future__ import annotations

import sys

from agent.api import AttemptGone
from agent.beats import BeatPoster
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import group_commands, launch, message, run_until

NODE = {"node_id": "node-1"}
#: beats once, then sleeps; ignores SIGTERM, so only the SIGKILL after the grace ends it
STUBBORN = [sys.executable, "-c",
            "import signal, time; from gpujobs_heartbeat import beat; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); beat(step=1); time.sleep(60)"]


class GoneBeats:
    """post_heartbeats answers 409 stale_attempt, as for an attempt failed meanwhile."""

    def __init__(self) -> None:
        self.calls = 0

    def post_heartbeats(self, job_id, attempt, ranks, call_in=None):
        self.calls += 1
        raise AttemptGone("HTTP 409 stale_attempt", status=409, code="stale_attempt")


def phase(world, key="job_a/1"):
    return world.state()["attempts"][key]["phase"]


def started(world, n_ranks: int):
    """The ranks of the first launch, once each has beaten (SIGTERM is ignored by then)."""
    ranks = world.launchers[0].launched
    assert len(ranks) == n_ranks
    for r in range(n_ranks):
        hb = world.paths.heartbeat_file("job_a", 1, r)
        wait_until(lambda hb=hb: hb.exists() and hb.stat().st_size > 0, what=f"rank {r} beat")
    return ranks


def test_a_beat_answered_409_stale_attempt_stops_the_attempts_ranks(world):
    agent = world.agent(grace_s=0.3)
    agent.handle(message(launch(ranks=[0, 1], command=STUBBORN), 1))
    ranks = started(world, 2)
    api = GoneBeats()
    poster = BeatPoster(api, on_gone=agent.attempt_gone)
    poster.tick(agent.state.attempts.values())
    assert api.calls == 1
    assert phase(world) == "STOPPING", "the 409 started the stop"
    assert all(alive(r.pid) for r in ranks), "SIGTERM is ignored: the grace runs"
    run_until(agent, lambda: phase(world) == "DONE", what="ranks killed after the grace")
    assert not any(alive(r.pid) for r in ranks)
    assert world.state()["attempts"]["job_a/1"]["killed"]
    assert world.api.of("STOPPED") == [], "quiet: nobody waits for these ranks"
    poster.tick(agent.state.attempts.values())
    assert api.calls == 1, "no more beats for it"


def test_a_registration_answered_without_the_attempt_stops_its_ranks_and_reports_stopped(world):
    agent = world.agent(grace_s=0.3)
    agent.handle(message(launch(ranks=[0, 1], command=STUBBORN), 1))
    ranks = started(world, 2)
    sent = agent.running_attempts()
    assert sent == [{"job_id": "job_a", "attempt": 1}]
    # the node was DOWN meanwhile: the server failed the attempt and no longer waits for it
    assert agent.registered({"node_id": "node-1", "attempts": []}, sent) == ["job_a/1"]
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert not any(alive(r.pid) for r in ranks)
    assert world.state()["attempts"]["job_a/1"]["killed"], "SIGKILL after the grace"
    assert world.api.of("STOPPED") == [{"type": "STOPPED", "ranks": [0, 1], **NODE}]
    assert agent.running_attempts() == []


def test_a_registration_answer_keeps_what_the_server_waits_for_and_what_it_could_not_know(
        world):
    agent = world.agent()
    agent.handle(message(launch("job_a", ranks=[0]), 1))
    sent = agent.running_attempts()
    # launched while the registration was on its way: the answer cannot know it
    agent.handle(message(launch("job_b", ranks=[0]), 2))
    answer = {"node_id": "node-1", "attempts": [{"job_id": "job_a", "attempt": 1}]}
    assert agent.registered(answer, sent) == []
    assert agent.registered({"node_id": "node-1"}, agent.running_attempts()) == [], \
        "an older server's answer (no attempts) stops nothing"
    a, b = world.launchers[0].launched
    assert alive(a.pid) and alive(b.pid)
    assert {phase(world, "job_a/1"), phase(world, "job_b/1")} == {"RUNNING"}
    # the rank's own child: polled, as it execs a moment after the launch
    wait_until(lambda: "sleep" in group_commands(a), what="job_a's rank still running sleep")
