"""The rank helper's collective marks (item 5) and declared-pause helpers (item 4),
tested with fakes of the torch, Lightning and transformers surfaces."""
import os
import subprocess
import sys
import time
import types

import pytest

HERE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "agent", "rankside"))
sys.path.insert(0, HERE)

import gpujobs_heartbeat as hb  # noqa: E402


@pytest.fixture
def rank(tmp_path, monkeypatch):
    """The helper writing to a fresh beat file, as inside a rank."""
    path = str(tmp_path / "rank-0")
    monkeypatch.setattr(hb, "_writer", hb._Writer(path))
    monkeypatch.setattr(hb, "_checked", True)
    return path


def test_collective_marks_ride_in_the_beat_file(rank):
    hb.beat(5)
    assert hb.read(rank).collective_seq is None
    with hb.collective("allreduce"):
        pass
    hb.arrive()
    r = hb.read(rank)
    assert r.collective_seq == 1 and r.collective_name == "collective" and r.step == 5
    hb.arrive(41, "broadcast")
    r = hb.read(rank)
    assert (r.collective_seq, r.collective_name) == (41, "broadcast")
    assert r.seq == 4, "each mark is one more write of the record (1 beat, 3 marks)"


def test_a_mark_costs_about_what_a_beat_costs(rank):
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        hb.beat(i)
    beat_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n):
        hb.arrive(i, "allreduce")
    mark_s = time.perf_counter() - t0
    assert mark_s < 3 * beat_s + 0.05, (mark_s, beat_s)


def test_a_record_of_the_previous_format_still_reads(tmp_path):
    path = tmp_path / "old"
    path.write_bytes(hb._FORMAT_V1.pack(3, 7, 11, 0, b"", 3))
    r = hb.read(str(path))
    assert (r.seq, r.step, r.collective_seq) == (3, 7, None)


def fake_dist():
    calls = []
    dist = types.SimpleNamespace()
    for name in ("all_reduce", "broadcast", "barrier"):
        def fn(*a, _name=name, **k):
            calls.append((_name, hb.read(PATH[0]).collective_name))
            return "done"
        setattr(dist, name, fn)
    return dist, calls


PATH = [None]


def test_instrumented_torch_distributed_marks_each_collective_before_it_runs(rank):
    PATH[0] = rank
    dist, calls = fake_dist()
    hb.instrument_collectives(dist)
    hb.instrument_collectives(dist)  # idempotent
    assert dist.all_reduce("t") == "done"
    dist.barrier()
    assert calls == [("all_reduce", "all_reduce"), ("barrier", "barrier")]
    assert hb.read(rank).collective_seq == 1


def test_declared_checkpoints_pause_torch_save_and_dcp_save(rank):
    seen = []

    def save(obj, f):
        seen.append(hb.read(rank).pause_reason)
    torch = types.SimpleNamespace(save=save)
    dcp = types.SimpleNamespace(save=save)
    assert hb.declare_checkpoints(max_s=60, torch=torch, dcp=dcp) == [
        "torch.save", "torch.distributed.checkpoint.save"]
    hb.declare_checkpoints(max_s=60, torch=torch, dcp=dcp)  # idempotent
    torch.save({}, "x")
    dcp.save({}, "y")
    assert seen == ["checkpoint", "checkpoint"]
    assert hb.read(rank).pause_deadline_ns == 0, "the pause ends with the save"


def test_the_lightning_callback_beats_and_pauses_around_checkpoints_and_validation(rank):
    class Callback:  # the surface of lightning.pytorch.Callback used
        pass
    cb = hb.lightning_callback(max_checkpoint_s=60, base=Callback)
    trainer = types.SimpleNamespace(global_step=3)
    cb.on_train_batch_end(trainer, None, None, None, 0)
    assert hb.read(rank).step == 3
    cb.on_validation_start(trainer, None)
    assert hb.read(rank).pause_reason == "evaluation"
    cb.on_validation_end(trainer, None)
    assert hb.read(rank).pause_deadline_ns == 0
    cb.on_save_checkpoint(trainer, None, {})
    r = hb.read(rank)
    assert r.pause_reason == "checkpoint" and r.pause_deadline_ns > time.monotonic_ns()
    trainer.global_step = 4
    cb.on_train_batch_end(trainer, None, None, None, 1)
    r = hb.read(rank)
    assert r.step == 4 and r.pause_deadline_ns == 0, "the next beat ends the pause"


def test_the_hf_callback_pauses_when_the_step_is_followed_by_eval_or_save(rank):
    class TrainerCallback:
        pass
    cb = hb.hf_callback(max_checkpoint_s=60, max_eval_s=120, base=TrainerCallback)
    state = types.SimpleNamespace(global_step=9)
    plain = types.SimpleNamespace(should_evaluate=False, should_save=False)
    cb.on_step_end(None, state, plain)
    assert hb.read(rank).step == 9 and hb.read(rank).pause_deadline_ns == 0
    cb.on_step_end(None, state, types.SimpleNamespace(should_evaluate=False, should_save=True))
    assert hb.read(rank).pause_reason == "checkpoint"
    state.global_step = 10
    cb.on_step_end(None, state, types.SimpleNamespace(should_evaluate=True, should_save=True))
    r = hb.read(rank)
    assert r.pause_reason == "evaluation"
    assert 170e9 < r.pause_deadline_ns - time.monotonic_ns() <= 180e9, "eval + save bound"


def test_the_callbacks_pause_from_the_end_of_training_to_the_exit(rank):
    """No beat follows on_train_end, and the teardown and the interpreter's
    exit outlast a short threshold: a bounded pause covers them."""
    class Callback:
        pass
    lightning = hb.lightning_callback(max_shutdown_s=30, base=Callback)
    lightning.on_train_end(types.SimpleNamespace(global_step=8), None)
    r = hb.read(rank)
    assert r.step == 8 and r.pause_reason == "shutdown"
    assert 29e9 < r.pause_deadline_ns - time.monotonic_ns() <= 30e9
    hf = hb.hf_callback(max_shutdown_s=45, base=Callback)
    hf.on_train_end(None, types.SimpleNamespace(global_step=9), None)
    r = hb.read(rank)
    assert r.step == 9 and r.pause_reason == "shutdown"
    assert 44e9 < r.pause_deadline_ns - time.monotonic_ns() <= 45e9
    hb.beat(10)  # training again (a second fit): the next beat ends it
    assert hb.read(rank).pause_deadline_ns == 0


def test_no_framework_is_imported_until_asked_for():
    code = ("import sys, gpujobs_heartbeat\n"
            "print(any(m in sys.modules for m in ('torch', 'lightning', 'transformers')))")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": HERE},
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "False"
