"""The agent posts only ranks that beat: silence must reach the server as silence."""
import os
import sys

from agent.api import ApiError, AttemptGone
from agent.beats import BeatPoster
from agent.state import RUNNING, AttemptRecord, RankRecord

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "agent", "rankside"))
import gpujobs_heartbeat as hb  # noqa: E402


class FakeApi:
    def __init__(self, fail=None):
        self.posts, self.fail, self.calls_in = [], fail, []

    def post_heartbeats(self, job_id, attempt, ranks, call_in=None):
        if self.fail:
            raise self.fail
        self.posts.append((job_id, attempt, ranks))
        self.calls_in.append(call_in)
        return {"received_at": "2026-01-01T00:00:00.000Z"} if call_in is None else \
            {"received_at": "2026-01-01T00:00:00.000Z", "node": {"node_id": call_in["node_id"]}}


class Clock:
    def __init__(self):
        self.ns = 10**12

    def __call__(self):
        return self.ns


def attempt(tmp_path, ranks=(0, 1)):
    rec = AttemptRecord(job_id="job_x", attempt=1, phase=RUNNING, ranks=list(ranks),
                        heartbeat_interval_s=1.0)
    for r in ranks:
        rec.procs[r] = RankRecord(rank=r, local_rank=r, slots=[r], exit_file="", log_file="",
                                  heartbeat_file=str(tmp_path / f"rank-{r}"))
    return rec


def writer(rec, r):
    return hb._Writer(rec.procs[r].heartbeat_file)


def test_a_rank_that_stopped_beating_is_not_posted(tmp_path):
    rec, clock, api = attempt(tmp_path), Clock(), FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock, wall=lambda: "2026-01-01T00:00:00.000Z")
    w0, w1 = writer(rec, 0), writer(rec, 1)
    w0.write(1)
    w1.write(1)
    poster.tick([rec])
    assert [e["rank"] for e in api.posts[-1][2]] == [0, 1]
    w0.write(2)  # rank 1 is silent from here on
    clock.ns += int(1e9)
    poster.tick([rec])
    [entry] = api.posts[-1][2]
    assert entry["rank"] == 0 and entry["step"] == 2 and entry["age_s"] >= 0
    clock.ns += int(1e9)
    poster.tick([rec])
    assert len(api.posts) == 2, "nothing new: nothing posted"


def test_a_ranks_step_time_outside_collectives_rides_with_its_beat(tmp_path):
    rec, clock, api = attempt(tmp_path, ranks=(0,)), Clock(), FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock, wall=lambda: "2026-01-01T00:00:00.000Z")
    w = writer(rec, 0)
    w.write(1)
    poster.tick([rec])
    assert "step_time_s" not in api.posts[-1][2][0], "no whole step measured yet"
    w.write(2)
    clock.ns += int(1e9)
    poster.tick([rec])
    [entry] = api.posts[-1][2]
    assert isinstance(entry["step_time_s"], float) and 0 <= entry["step_time_s"] < 5


def test_posts_wait_for_the_interval(tmp_path):
    rec, clock, api = attempt(tmp_path, ranks=(0,)), Clock(), FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock)
    w = writer(rec, 0)
    w.write(1)
    poster.tick([rec])
    w.write(2)
    clock.ns += int(0.5e9)
    poster.tick([rec])
    assert len(api.posts) == 1
    clock.ns += int(0.5e9)
    poster.tick([rec])
    assert len(api.posts) == 2


def test_a_declared_pause_is_posted_with_its_remaining_time(tmp_path, monkeypatch):
    rec, clock, api = attempt(tmp_path, ranks=(0,)), Clock(), FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock)
    w = writer(rec, 0)
    w.set_pause(clock.ns + int(600e9), "checkpoint")
    monkeypatch.setattr(hb.time, "monotonic_ns", clock)
    w.write(5)
    poster.tick([rec])
    clock.ns += int(2e9)
    poster.tick([rec])
    entry = api.posts[-1][2][0]
    assert "step" not in entry, "no new beat inside the pause"
    assert entry["pause"] == {"reason": "checkpoint", "remaining_s": 598.0}


def test_a_failed_post_is_retried_and_nothing_is_marked_posted(tmp_path):
    rec, clock = attempt(tmp_path, ranks=(0,)), Clock()
    api = FakeApi(fail=ApiError("down", retryable=True))
    poster = BeatPoster(api, monotonic_ns=clock)
    writer(rec, 0).write(1)
    poster.tick([rec])
    api.fail = None
    poster.tick([rec])
    assert [e["rank"] for e in api.posts[-1][2]] == [0], "retried at once, same beat"


def test_a_stale_attempt_ends_posting(tmp_path):
    rec, clock = attempt(tmp_path, ranks=(0,)), Clock()
    api = FakeApi(fail=AttemptGone("409 stale_attempt", status=409, code="stale_attempt"))
    poster = BeatPoster(api, monotonic_ns=clock)
    w = writer(rec, 0)
    w.write(1)
    poster.tick([rec])
    api.fail = None
    w.write(2)
    clock.ns += int(5e9)
    poster.tick([rec])
    assert api.posts == []


def test_a_rank_coming_back_from_a_long_silence_reports_when_and_how_long(tmp_path, monkeypatch):
    # the server excuses peers still quiet right after a whole-job pause ends,
    # so the agent says when the rank's last long silence ended and its length
    rec, clock, api = attempt(tmp_path, ranks=(0,)), Clock(), FakeApi()
    monkeypatch.setattr(hb.time, "monotonic_ns", clock)
    poster = BeatPoster(api, monotonic_ns=clock)
    w = writer(rec, 0)
    for step in (1, 2):   # beating every interval: nothing to report
        w.write(step)
        poster.tick([rec])
        assert "resumed" not in api.posts[-1][2][0]
        clock.ns += int(1e9)
    for _ in range(5):    # an undeclared checkpoint: five silent intervals
        poster.tick([rec])
        clock.ns += int(1e9)
    w.write(3)
    poster.tick([rec])
    assert api.posts[-1][2][0]["resumed"] == {"age_s": 0.0, "gap_s": 6.0}
    clock.ns += int(1e9)
    w.write(4)
    poster.tick([rec])
    assert api.posts[-1][2][0]["resumed"] == {"age_s": 1.0, "gap_s": 6.0}, "reported until replaced"


def test_a_gap_only_from_a_failed_post_is_not_a_long_silence(tmp_path, monkeypatch):
    rec, clock = attempt(tmp_path, ranks=(0,)), Clock()
    monkeypatch.setattr(hb.time, "monotonic_ns", clock)
    api = FakeApi()
    poster = BeatPoster(api, monotonic_ns=clock)
    w = writer(rec, 0)
    w.write(1)
    poster.tick([rec])
    clock.ns += int(1e9)
    w.write(2)
    api.fail = ApiError("boom")
    poster.tick([rec])
    api.fail = None
    clock.ns += int(1e9)
    w.write(3)
    poster.tick([rec])
    assert "resumed" not in api.posts[-1][2][0], "two intervals between posted beats is no silence"


class CallIn:
    """runner.CallIn's shape: a body made as it goes out, the answers acted on."""

    def __init__(self):
        self.made, self.answers = 0, []

    def body(self):
        self.made += 1
        return {"node_id": "n1", "gpus": 8, "running": [{"job_id": "job_x", "attempt": 1}]}

    def answered(self, node, body):
        self.answers.append((node, body["running"]))
        return node


def test_a_call_in_rides_on_the_first_post_due_and_its_answer_is_acted_on(tmp_path):
    """One request an interval on a busy node: the call-in is carried by a
    heartbeat POST that goes out anyway, once, and its answer is the node's."""
    rec, clock, api, call_in = attempt(tmp_path), Clock(), FakeApi(), CallIn()
    poster = BeatPoster(api, monotonic_ns=clock)
    writer(rec, 0).write(1)
    writer(rec, 1).write(1)
    node = poster.tick([rec], call_in=call_in)
    assert node == {"node_id": "n1"} and call_in.answers == [(node, [{"job_id": "job_x",
                                                                      "attempt": 1}])]
    assert len(api.posts) == 1 and api.calls_in[0]["node_id"] == "n1"
    assert poster.tick([rec]) is None and len(api.posts) == 1, "not due: nothing posted"


def test_a_call_in_brings_an_attempt_not_yet_due_forward(tmp_path):
    """The attempt's next visit is pulled forward to carry the call-in, so the
    node's two clocks fall into one phase: no second request that interval."""
    rec, clock, api, call_in = attempt(tmp_path), Clock(), FakeApi(), CallIn()
    poster, w0 = BeatPoster(api, monotonic_ns=clock), writer(rec, 0)
    w0.write(1)
    poster.tick([rec])
    clock.ns += int(0.4e9)       # 0.6 s before the attempt's next visit
    w0.write(2)
    assert poster.tick([rec], call_in=call_in) == {"node_id": "n1"}
    assert [c is not None for c in api.calls_in] == [False, True]
    clock.ns += int(0.9e9)       # the visit the call-in moved: 1 s after it, not before
    w0.write(3)
    poster.tick([rec])
    assert len(api.posts) == 2
    clock.ns += int(0.1e9)
    poster.tick([rec])
    assert len(api.posts) == 3


def test_a_call_in_nothing_could_carry_is_left_to_the_caller(tmp_path):
    """No beat to post (the ranks are silent, unsampled), a failed post, or an
    attempt that is over: None, and the runner calls in by PUT."""
    rec, clock, call_in = attempt(tmp_path), Clock(), CallIn()
    api = FakeApi()
    assert BeatPoster(api, monotonic_ns=clock).tick([rec], call_in=call_in) is None
    assert api.posts == [] and call_in.made == 0
    writer(rec, 0).write(1)
    for fail in (ApiError("HTTP 503", status=503, retryable=True),
                 AttemptGone("HTTP 409 stale_attempt", status=409, code="stale_attempt")):
        poster = BeatPoster(FakeApi(fail=fail), monotonic_ns=clock)
        assert poster.tick([rec], call_in=call_in) is None
    assert call_in.answers == []
