"""A rank's last beats reach the server before its end is reported (issue 47,
item 3): real rank processes write their beats with the helper; the agent's
reports and the poster's posts go to one fake API that keeps their order."""
from __future__ import annotations

import os
import sys

from agent.api import ApiError
from agent.beats import BeatPoster
from tests.support.waits import wait_until

from .harness import PY, FakeApi, launch, message, run_until

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "agent", "rankside"))
import gpujobs_heartbeat as hb  # noqa: E402

#: beats steps 1..15, waits for the test's go (a file), beats 16..60, exits 0
STEPS = ("import os, sys, time\n"
         "from gpujobs_heartbeat import beat\n"
         "for i in range(1, 16): beat(step=i)\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
         "for i in range(16, 61): beat(step=i)\n")


class OrderedApi(FakeApi):
    """Reports and heartbeat posts in the one order the server got them."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, object]] = []
        #: (index in the log, the report) of each event report
        self.reports: list[tuple[int, dict]] = []
        self.beats_fail: ApiError | None = None

    def post_event(self, job_id, attempt, event):
        answer = super().post_event(job_id, attempt, event)
        self.log.append(("event", event["type"]))
        self.reports.append((len(self.log) - 1, event))
        return answer

    def post_heartbeats(self, job_id, attempt, ranks, call_in=None):
        if self.beats_fail is not None:
            raise self.beats_fail
        self.log.append(("beats", {e["rank"]: e.get("step") for e in ranks if "step" in e}))
        return {"received_at": "2026-01-01T00:00:00.000Z"}

    def steps(self, upto: int | None = None) -> dict[int, int]:
        """The last step posted of each rank (in the log's first ``upto`` entries)."""
        out: dict[int, int] = {}
        for kind, what in self.log[:upto]:
            if kind == "beats":
                out.update(what)  # type: ignore[arg-type]
        return out


def _running_at_step_15(world, tmp_path, api):
    agent = world.agent(api=api)
    poster = BeatPoster(api)
    agent.beats = poster  # as the runner wires them
    go = tmp_path / "go"
    agent.handle(message(launch(ranks=[0, 1], command=[PY, "-c", STEPS, str(go)]), 1))
    rec = agent.state.attempts["job_a/1"]

    def written(r):
        record = hb.read(rec.procs[r].heartbeat_file)
        return record is not None and record.step == 15
    wait_until(lambda: written(0) and written(1), what="both ranks at step 15")
    poster.tick([rec])  # the interval's post (interval 10 s: the next one is not due)
    assert api.steps() == {0: 15, 1: 15}
    return agent, go


def test_a_ranks_last_step_is_posted_before_its_exit_is_reported(world, tmp_path):
    """Invariant: when a rank's EXITED reaches the server, the server already
    holds that rank's last step (60), not the step of the last interval's
    post (15): the beats a rank wrote since that post go first. The node
    reports exits as it sees them, both ranks in one report or one by one
    (a loaded host), so each report is checked for the ranks it names."""
    api = OrderedApi()
    agent, go = _running_at_step_15(world, tmp_path, api)
    go.touch()
    run_until(agent, lambda: sorted(r for e in api.of("EXITED") for r in e["ranks"]) == [0, 1],
              what="both ranks' EXITED reported")
    for at, report in api.reports:
        if report["type"] == "EXITED":
            posted = api.steps(upto=at)
            assert {r: posted.get(r) for r in report["ranks"]} == \
                {r: 60 for r in report["ranks"]}, api.log
            assert report["exit_code"] == 0


def test_a_failed_last_post_holds_the_exit_only_for_a_while(world, tmp_path):
    """Invariant: the last beats never hold a rank's end for good: while
    their post fails the EXITED report waits, and goes once LOG_WAIT_S
    (5 s on the agent's clock) has passed since it was queued."""
    api = OrderedApi()
    agent, go = _running_at_step_15(world, tmp_path, api)
    api.beats_fail = ApiError("HTTP 503", status=503, code="unavailable")
    world.now = 1000.0
    go.touch()
    wait_until(lambda: all(world.paths.exit_file("job_a", 1, r).exists() for r in (0, 1)),
               what="both ranks exited")
    run_until(agent, lambda: agent.state.pending and agent.state.pending[-1].event["type"]
              == "EXITED", what="EXITED queued")
    for _ in range(3):
        agent.tick()
    assert not api.of("EXITED"), "held while the last beats could not be posted"
    world.now += 5.0
    agent.tick()
    assert api.of("EXITED"), "sent once the wait is over"
    assert os.path.exists(go)
