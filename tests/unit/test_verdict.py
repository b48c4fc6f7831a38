"""The one verdict (domain/verdict.py) and the evidence that excuses waiting
ranks (domain/stall.py): which rank is named, by what, in which words."""
from datetime import datetime, timedelta, timezone

from chalicelib.domain.stall import Beat, judge

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
SLEEP = ["hang (ddp_train.py:70)", "main (ddp_train.py:95)", "<module> (ddp_train.py:120)"]
BARRIER = ["barrier (torch/distributed/distributed_c10d.py:5356)",
           "wrapper (torch/distributed/c10d_logger.py:83)", "main (ddp_train.py:101)"]
BACKWARD = ["_engine_run_backward (torch/autograd/graph.py:979)",
            "backward (torch/autograd/__init__.py:395)", "backward (torch/_tensor.py:623)",
            "main (ddp_train.py:90)"]


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def kw(**over):
    return {"now": at(200), "started_at": at(0), "threshold_s": 30.0, "startup_grace_s": 60.0,
            "interval_s": 10.0, **over}


def node(r: int) -> str:
    return "local-1" if r < 2 else "local-2"


def silent(r: int, **f) -> Beat:
    """A rank last heard at 150 (50 s ago: past the 30 s threshold)."""
    return Beat(r, node(r), **{"heard_at": at(150), "beat_at": at(149.5), "step": 7, **f})


def sample(state="S", cpu=0.0, stack=None, code=None, **more) -> dict:
    proc = {"cpu": cpu, "state": state, "io_bps": 0, "write_bps": 0, **more}
    if stack is not None:
        proc["stack"] = {"frames": stack, "code": code, "age_s": 1.0}
    return proc


def test_a_stopped_rank_is_named_by_its_state_whatever_the_silence_order():
    beats = [silent(r, proc=sample("T" if r == 2 else "S"), sampled_at=at(199))
             for r in range(4)]
    v = judge(beats, **kw())
    assert v.first.rank == 0, "first_stalled_rank keeps API.md's silence order"
    assert (v.culprit["rank"], v.culprit["by"], v.culprit["node_id"]) == (2, "process", "local-2")
    assert v.culprit["text"] == "rank 2 on local-2 is stopped (state T) while ranks 0-1,3 wait"
    assert v.suspect_node is None, "a named rank is no node failure"


def test_the_rank_whose_stack_is_not_in_a_collective_is_named_with_its_stack():
    beats = [silent(r, proc=sample(stack=BACKWARD if r < 2 else BARRIER), sampled_at=at(199))
             for r in range(3)]
    beats.append(silent(3, proc=sample(stack=SLEEP, code="time.sleep(3600)"),
                        sampled_at=at(199)))
    v = judge(beats, **kw())
    assert (v.culprit["rank"], v.culprit["by"], v.culprit["confidence"]) == (3, "stack", "high")
    assert v.culprit["stack"] == "ddp_train.py:70 in hang → time.sleep(3600)"
    assert v.culprit["text"] == ("rank 3 on local-2 is not in a collective (ddp_train.py:70 in "
                                 "hang → time.sleep(3600)) while ranks 0-2 wait in backward, "
                                 "barrier")
    # the stacks as they were when it was decided, the named rank's first: what
    # the stall event shows under its sentence
    assert v.culprit["stacks"][0] == {"rank": 3,
                                      "where": "ddp_train.py:70 in hang → time.sleep(3600)"}
    assert [s["rank"] for s in v.culprit["stacks"]] == [3, 0, 1, 2]
    assert v.culprit["stacks"][1]["where"] == "ddp_train.py:90 in main"


def test_ranks_that_went_quiet_together_are_a_tie_not_the_lowest_rank():
    beats = [silent(r, beat_at=at(149.5 + r * 0.01)) for r in range(4)]
    v = judge(beats, **kw())
    assert v.culprit["rank"] is None and v.culprit["ranks"] == [0, 1, 2, 3]
    assert v.culprit["text"] == ("ranks 0-3 went quiet together (within 0.2 s): nothing tells "
                                 "which stopped first")
    assert v.suspect_node is None or v.culprit["by"] == "silence"


def test_within_the_band_a_rank_a_step_behind_is_named():
    beats = [silent(r, step=8 if r != 1 else 7) for r in range(3)]
    v = judge(beats, **kw())
    assert v.culprit["rank"] == 1 and v.culprit["text"] == (
        "rank 1 on local-1 went quiet a step behind ranks 0,2")


def ckpt(waiter_seq: int = 42, **rank0) -> list[Beat]:
    """Rank 0 saves in a declared pause (its marks at collective 41); ranks
    1-3 arrived at the next barrier (42) and wait there, silent."""
    zero = silent(0, paused_until=at(400), arrived_seq=41, arrived_name="barrier", **rank0)
    return [zero, *(silent(r, arrived_seq=waiter_seq, arrived_name="barrier")
                    for r in (1, 2, 3))]


def test_ranks_waiting_in_a_collective_on_a_peer_in_a_declared_pause_are_not_stalled():
    v = judge(ckpt(), **kw())
    assert v.first is None and v.culprit is None
    assert {r.rank: r.status for r in v.ranks} == {0: "paused", 1: "waiting", 2: "waiting",
                                                   3: "waiting"}


def test_a_rank_not_ahead_of_the_paused_peer_is_not_waiting_on_it():
    # rank 3 stopped at the paused rank's own collective: it waits on nobody
    beats = ckpt()
    beats[3] = silent(3, arrived_seq=41, arrived_name="barrier")
    v = judge(beats, **kw())
    assert [r.rank for r in v.stalled] == [3] and v.culprit["rank"] == 3


def test_the_excuse_ends_with_the_pause():
    v = judge(ckpt(), **kw(now=at(401)))
    assert 0 in [r.rank for r in v.stalled] and v.culprit is not None


def test_without_marks_a_waiting_stack_is_excused_and_a_sleeping_one_is_not():
    zero = silent(0, paused_until=at(400))
    beats = [zero, silent(1, proc=sample(stack=BARRIER), sampled_at=at(199)),
             silent(2, proc=sample(stack=SLEEP, code="time.sleep(3600)"), sampled_at=at(199))]
    v = judge(beats, **kw())
    assert {r.rank: r.status for r in v.ranks} == {0: "paused", 1: "waiting", 2: "stalled"}


def test_a_silent_peer_busy_on_cpu_excuses_sleeping_gloo_waiters_but_nccl_spinners_not():
    busy = silent(0, proc=sample("R", cpu=1.0), sampled_at=at(199))
    gloo = [busy, *(silent(r, proc=sample("S"), sampled_at=at(199)) for r in (1, 2, 3))]
    v = judge(gloo, max_busy_s=300.0, **kw())
    assert [r.status for r in sorted(v.ranks, key=lambda r: r.rank)] == [
        "stalled", "waiting", "waiting", "waiting"]
    assert v.culprit["rank"] == 0
    # NCCL waiters spin: spinning tells no worker from a waiter, nobody is excused
    nccl = [silent(r, proc=sample("R", cpu=1.0), sampled_at=at(199)) for r in range(4)]
    assert len(judge(nccl, max_busy_s=300.0, **kw()).stalled) == 4


def idle(r: int, stack=None, state="S", code=None) -> Beat:
    """An uninstrumented rank (never beat) whose samples showed no work since 20."""
    return Beat(r, node(r), proc=sample(state, stack=stack, code=code), sampled_at=at(399),
                active_at=at(20))


def test_an_uninstrumented_hang_is_found_by_stacks_and_the_loose_rank_named():
    beats = [idle(r, BARRIER) for r in range(3)] + [idle(3, SLEEP, code="time.sleep(3600)")]
    v = judge(beats, mode="auto", idle_s=300.0, **kw(now=at(321)))
    assert not v.instrumented
    assert {r.rank: r.status for r in v.ranks} == {0: "waiting", 1: "waiting", 2: "waiting",
                                                   3: "stalled"}
    assert v.first.rank == 3 and v.culprit["rank"] == 3 and v.culprit["by"] == "stack"
    # not before idle_s
    assert judge(beats, mode="auto", idle_s=300.0, **kw(now=at(319))).first is None


def test_an_idle_uninstrumented_job_with_no_sign_of_a_hang_is_not_convicted():
    # a single rank asleep (waiting for data, a sleep job): idle is not hung
    v = judge([idle(0, SLEEP)], mode="auto", idle_s=300.0, **kw(now=at(1000)))
    assert v.first is None and v.ranks[0].status == "not_instrumented"


def test_an_uninstrumented_stopped_rank_is_convicted_by_its_state():
    beats = [idle(0), idle(1, state="T")]
    v = judge(beats, mode="auto", idle_s=300.0, **kw(now=at(321)))
    assert [r.rank for r in v.stalled] == [1] and v.culprit["rank"] == 1


def test_a_rank_stopped_before_its_first_step_is_named_in_seconds_not_minutes():
    """Invariant (issue 44): a rank the host sees stopped (T) and idle for
    STOPPED_S is stalled and named by its state, in every mode but off, long
    before idle_s, the threshold or the startup grace: before gloo's 120 s
    timeout makes its healthy peers exit. Not before STOPPED_S, not on an old
    sample, and never a rank in any other state."""
    def ranks(stopped_at: float, sampled_at: float = 399) -> list[Beat]:
        return [Beat(r, node(r), proc=sample("T" if r == 3 else "S"),
                     sampled_at=at(sampled_at), active_at=at(stopped_at))
                for r in range(4)]

    for mode in ("auto", "beats", "process"):
        v = judge(ranks(stopped_at=368), mode=mode, idle_s=300.0,
                  **kw(now=at(400), started_at=at(340), startup_grace_s=300.0))
        assert [r.rank for r in v.stalled] == [3], mode
        assert (v.culprit["rank"], v.culprit["by"], v.culprit["confidence"]) == (
            3, "process", "high"), mode
        assert v.culprit["text"].startswith("rank 3 on local-2 is stopped (state T)"), mode
        assert judge(ranks(stopped_at=371), mode=mode, idle_s=300.0,
                     **kw(now=at(400), started_at=at(340), startup_grace_s=300.0)).stalled == [], mode
    old = judge(ranks(stopped_at=345, sampled_at=350), mode="auto", idle_s=300.0,
                **kw(now=at(400), started_at=at(340), startup_grace_s=300.0))
    assert 3 not in [r.rank for r in old.stalled], "an old T sample says nothing now"
    assert judge(ranks(stopped_at=368), mode="off",
                 **kw(now=at(400), started_at=at(340), startup_grace_s=300.0)).stalled == []


def test_when_every_idle_rank_waits_all_are_stalled_and_the_verdict_is_a_tie():
    beats = [idle(r, BARRIER) for r in range(4)]
    v = judge(beats, mode="auto", idle_s=300.0, **kw(now=at(321)))
    assert len(v.stalled) == 4 and v.culprit["rank"] is None
    assert v.culprit["text"] == "ranks 0-3 went quiet together: nothing tells which stopped first"


def test_once_a_rank_exited_0_its_peers_quiet_in_teardown_get_the_grace_to_end():
    beats = [Beat(0, "local-1", heard_at=at(150), ended="exited"),
             *(silent(r) for r in (1, 2, 3))]
    # 50 s of silence: past the 30 s threshold, within it plus the 60 s grace
    assert judge(beats, finishing=True, **kw()).first is None
    assert judge(beats, finishing=False, **kw()).first is not None
    # a teardown that hangs is convicted once the grace has passed too
    assert judge(beats, finishing=True, **kw(now=at(240.001))).first is not None


def test_a_stack_in_the_standard_library_is_shown_at_the_ranks_own_frame():
    from chalicelib.domain.stacks import where
    stack = {"frames": ["__call__ (lib/python3.11/weakref.py:590)", "main (ddp_train.py:153)"],
             "code": "loss.backward()"}
    assert where(stack) == "ddp_train.py:153 in main → loss.backward()"
