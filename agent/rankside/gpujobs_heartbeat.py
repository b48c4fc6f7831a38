"""Liveness from inside a training script: ``beat(step)`` once per step.

    from gpujobs_heartbeat import beat, pause

    for step in range(steps):
        train_step()
        beat(step)
    with pause("checkpoint", max_s=600):
        save_checkpoint()

It is cheap (bench/beat_cost.py; figures in docs/benchmarks.md) and makes no
network call: it overwrites one small record in the file named by
GPUJOBS_HEARTBEAT_FILE (set by the host agent for each rank), which the agent
reads and posts every ``interval_s``. A rank whose
process is alive but stops calling ``beat`` goes silent; a declared pause does
not count as silence until ``max_s`` has passed. Outside the agent (no
variable set, or a file that cannot be opened) every call is a no-op: no
error, no file; a script runs unchanged under torchrun or on a laptop.
Installable on its own: ``pip install ./agent/rankside``.

The record is a seqlock: the sequence number is written before and after the
payload, and a reader that sees them differ reads again. Times are
CLOCK_MONOTONIC, shared by every process on the host, so the agent can tell how
much of a pause remains without trusting any wall clock.

Naming the culprit of a hang: mark each collective as the rank enters it,

    with collective("allreduce"):
        dist.all_reduce(grad)

(or ``arrive(seq)``, or ``instrument_collectives()`` once, which wraps the
``torch.distributed`` collectives). The mark is one more write of the same
record, at the same cost as ``beat``. When ranks stall, the one that never
arrived at the collective the others wait in is the culprit.

DDP's gradient all-reduce and its buffer broadcasts are issued by its C++
Reducer, which the wrapped functions never see. One line covers them too:

    model = gpujobs_heartbeat.instrument(DistributedDataParallel(model))

It wraps the collectives and registers a DDP communication hook that marks
each gradient bucket ("ddp_allreduce") before running torch's default
all-reduce, plus a mark per training forward ("ddp_forward"), so a rank that
hangs before its forward is behind its peers. FSDP (``FullyShardedDataParallel``
and ``fully_shard``) issues its all-gathers and reduce-scatters through the
wrapped functions: ``instrument(fsdp_model)`` marks those, no hook needed.

Straggler scores come from the same marks: each step (from one ``beat()`` to
the next) the helper counts the time the rank spent inside collectives (a
wrapped collective from its call to its return; a DDP gradient bucket from
its hook to its all-reduce's completion) and takes the rest, the time outside
collectives, on this process's monotonic clock. The record carries the median
of the last ``STEP_WINDOW`` such times (steps that held a declared pause left
out); the agent reports it as ``step_time_s``. In synchronous training every
rank's step takes the same wall time: the slow rank is the one with the most
time outside collectives, the one its peers wait for.

Pauses without touching the training loop: ``declare_checkpoints()`` wraps
``torch.save`` and ``torch.distributed.checkpoint.save``; ``lightning_callback()``
and ``hf_callback()`` beat once per step and pause around checkpointing and
evaluation, and from the end of training to the process's exit. torch, Lightning and transformers are imported only when asked for.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import statistics
import struct
import threading
import time
from collections import deque
from typing import Callable, Iterator, NamedTuple

# seq, step, beat_ns, pause_deadline_ns, reason, collective seq + 1 (0: none),
# collective name, median step time outside collectives in ns + 1 (0: none), seq
_FORMAT = struct.Struct("<QqQQ32sQ16sQQ")
RECORD_SIZE = _FORMAT.size
# the record before step times (a rank started by an older helper)
_FORMAT_V2 = struct.Struct("<QqQQ32sQ16sQ")
# the record before collective marks
_FORMAT_V1 = struct.Struct("<QqQQ32sQ")
#: the steps whose median time outside collectives the record carries
STEP_WINDOW = 9


class Record(NamedTuple):
    seq: int
    step: int
    beat_ns: int
    pause_deadline_ns: int
    pause_reason: str
    #: the last collective the rank arrived at (None: never marked one)
    collective_seq: int | None = None
    collective_name: str = ""
    #: the median time (ns) of the last STEP_WINDOW steps spent outside
    #: collectives (None: not measured yet)
    step_time_ns: int | None = None


class _Writer:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._seq = 0
        self._step = 0
        self._beat_ns = 0
        self._pause = (0, b"")
        self._pause_to_beat = False  # the pause ends at the next beat()
        self._coll = (0, b"")        # (seq + 1, name)
        # the time of this step inside collectives: a count of collectives
        # in flight (a DDP bucket completes on another thread), since when
        # one has been, and the time inside so far
        self._lock = threading.Lock()
        self._open = 0
        self._open_since = 0
        self._inside_ns = 0
        self._step_start_ns = 0          # the last step's beat (0: none yet)
        self._step_paused = False        # a pause was declared during this step
        self._outside: deque[int] = deque(maxlen=STEP_WINDOW)
        self._step_time = 0              # median + 1 (0: none)

    def write(self, step: int | None) -> None:
        if self._pause_to_beat:
            self._pause, self._pause_to_beat = (0, b""), False
        self._step = self._step + 1 if step is None else int(step)
        self._beat_ns = time.monotonic_ns()
        self._end_step(self._beat_ns)
        self._flush()

    def enter(self) -> None:
        """A collective starts (nested and concurrent ones count once)."""
        with self._lock:
            if self._open == 0:
                self._open_since = time.monotonic_ns()
            self._open += 1

    def leave(self) -> None:
        with self._lock:
            if self._open == 0:
                return
            self._open -= 1
            if self._open == 0:
                self._inside_ns += time.monotonic_ns() - self._open_since

    def _end_step(self, now: int) -> None:
        """A step ended at ``now``: its time outside collectives joins the
        window unless a pause was declared in it (or it is the first)."""
        with self._lock:
            inside = self._inside_ns
            if self._open:
                inside += now - self._open_since
                self._open_since = now
            if self._step_start_ns and not self._step_paused and now >= self._step_start_ns:
                self._outside.append(max(0, now - self._step_start_ns - inside))
                self._step_time = int(statistics.median(self._outside)) + 1
            self._step_start_ns, self._inside_ns, self._step_paused = now, 0, False

    def alive(self) -> None:
        """A beat that is no step: the rank is running now."""
        self._beat_ns = time.monotonic_ns()
        self._flush()

    def arrive(self, seq: int | None, name: str) -> None:
        nxt = self._coll[0] if seq is None else int(seq) + 1
        if seq is None:
            nxt += 1
        self._coll = (nxt, name.encode("utf-8")[:16])
        self._flush()

    def _flush(self) -> None:
        self._seq += 1
        deadline, reason = self._pause
        os.pwrite(self._fd, _FORMAT.pack(self._seq, self._step, self._beat_ns, deadline,
                                         reason, self._coll[0], self._coll[1],
                                         self._step_time, self._seq), 0)

    def set_pause(self, deadline_ns: int, reason: str, until_beat: bool = False) -> None:
        self._pause = (deadline_ns, reason.encode("utf-8")[:32])
        self._pause_to_beat = until_beat
        if deadline_ns:  # the step this pause falls in is no measure of speed
            self._step_paused = True


_writer: _Writer | None = None
_checked = False


def _get() -> _Writer | None:
    global _writer, _checked
    if not _checked:
        _checked = True
        path = os.environ.get("GPUJOBS_HEARTBEAT_FILE")
        if path:
            try:
                _writer = _Writer(path)
            except OSError:  # an environment copied from elsewhere: stay a no-op
                _writer = None
            else:
                atexit.register(_exiting)
    return _writer


#: how long a rank's exit (the interpreter's teardown after the script ended)
#: may take before its silence counts again
EXIT_MAX_S = 120.0


def _exiting() -> None:
    """At interpreter exit: a declared pause, so the silence of a rank whose
    script is done and whose process is tearing down (freeing torch, joining
    threads: seconds on a loaded host) is not taken for a hang before its
    agent sees it exit."""
    if _writer is not None:
        _writer.set_pause(time.monotonic_ns() + int(EXIT_MAX_S * 1e9), "exiting")
        _writer.alive()


def beat(step: int | None = None) -> None:
    """Say this rank is making progress (``step``: the training step, if known)."""
    w = _writer if _checked else _get()
    if w is not None:
        w.write(step)


@contextlib.contextmanager
def pause(reason: str, *, max_s: float) -> Iterator[None]:
    """A declared, bounded pause (a checkpoint, an evaluation): no beats are
    expected inside it, and silence counts only once ``max_s`` has passed."""
    w = _get()
    if w is None:
        yield
        return
    w.set_pause(time.monotonic_ns() + int(max_s * 1e9), reason)
    w._flush()
    try:
        yield
    finally:
        # coming out of the pause is a sign of life: the rank's silence ends
        # here (its step stays), so peers that waited on it are excused while
        # it resumes, even before its next beat() (stall.py: resumed)
        w.set_pause(0, "")
        w.alive()


def pause_until_beat(reason: str, *, max_s: float) -> None:
    """Declare a pause that the next ``beat()`` ends (for hooks that see a
    checkpoint or an evaluation begin but not end)."""
    w = _get()
    if w is not None:
        w.set_pause(time.monotonic_ns() + int(max_s * 1e9), reason, until_beat=True)
        w._flush()


def arrive(seq: int | None = None, name: str = "collective") -> None:
    """Mark that this rank entered collective number ``seq`` (default: the one
    after the last it marked). Call it as the rank enters, before it can block."""
    w = _writer if _checked else _get()
    if w is not None:
        w.arrive(seq, name)


@contextlib.contextmanager
def collective(name: str, seq: int | None = None) -> Iterator[None]:
    """``with collective("allreduce"): dist.all_reduce(t)``: marks the arrival."""
    arrive(seq, name)
    yield


#: the torch.distributed calls that block until every rank arrives
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "broadcast", "broadcast_object_list", "reduce", "gather", "scatter",
               "barrier", "monitored_barrier",
               # what FSDP (both versions) issues its all-gathers and reduce-scatters with
               "all_gather_single", "reduce_scatter_single")
#: the name a mark of a collective carries where its own is longer than the 16
#: bytes the record holds
_SHORT = {"all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
          "all_to_all_single": "all_to_all", "broadcast_object_list": "broadcast_object"}

# set while a communication hook runs the collective it has already marked, so
# the wrapped torch.distributed function it calls does not mark it twice
_in_hook = threading.local()


def _optional(name: str):
    """The module ``name``, or None where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def instrument_collectives(dist=None):
    """Wrap the ``torch.distributed`` collectives so each marks its arrival
    (idempotent). ``dist``: the module (imported here when not given)."""
    if dist is None:  # lazily: no hard dependency on torch
        dist = importlib.import_module("torch.distributed")
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "__gpujobs_wrapped__", False):
            continue
        setattr(dist, name, _arriving(fn, _SHORT.get(name, name)))
    return dist


def _arriving(fn, name: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not getattr(_in_hook, "marked", False):
            arrive(None, name)
        w = _writer
        if w is None:
            return fn(*args, **kwargs)
        w.enter()
        try:
            return fn(*args, **kwargs)
        finally:
            w.leave()
    vars(wrapper)["__gpujobs_wrapped__"] = True  # marks a wrapper: wrapping is idempotent
    return wrapper


def instrument(model=None, *, hook=None, state=None):
    """``model = instrument(DistributedDataParallel(model))``: one line that marks
    every collective the job runs, returning ``model`` (idempotent).

    It wraps the ``torch.distributed`` collectives (``instrument_collectives()``),
    which also covers FSDP's all-gathers and reduce-scatters, issued through
    them. For a ``DistributedDataParallel`` model, whose gradient all-reduce and
    buffer broadcasts its C++ Reducer issues without them, it also registers a
    communication hook that marks each gradient bucket's arrival
    ("ddp_allreduce") and then runs ``hook(state, bucket)`` (default: torch's
    ``allreduce_hook`` on the model's process group, what DDP does without a
    hook), and marks each training forward (grad enabled: "ddp_forward",
    before DDP's buffer broadcast), so a rank that hangs before its forward is
    behind its peers' marks. Call it before the first forward; a model that
    already has a communication hook keeps it (and gets the forward marks only).
    Outside an agent (no GPUJOBS_HEARTBEAT_FILE) it returns ``model`` untouched
    and imports nothing.
    """
    if _get() is None:
        return model
    instrument_collectives()
    if model is None or getattr(model, "_gpujobs_instrumented", False):
        return model
    ddp = importlib.import_module("torch.nn.parallel").DistributedDataParallel
    if isinstance(model, ddp):
        if hook is None:
            hook = importlib.import_module(
                "torch.distributed.algorithms.ddp_comm_hooks.default_hooks").allreduce_hook
        if state is None:  # what torch's own hooks take: the model's process group
            state = getattr(model, "process_group", None)
        try:
            model.register_comm_hook(state, _marking_hook(hook, "ddp_allreduce"))
        except RuntimeError:  # "can only be called once": the user's own hook stays
            pass
        torch = importlib.import_module("torch")

        def mark_forward(module, args):
            if torch.is_grad_enabled():  # evaluation forwards may differ between ranks
                arrive(None, "ddp_forward")
        model.register_forward_pre_hook(mark_forward, prepend=True)
    model._gpujobs_instrumented = True
    return model


def _marking_hook(hook, name: str):
    """A DDP communication hook that marks the arrival, then runs ``hook``."""
    @functools.wraps(hook)
    def marked(state, bucket):
        arrive(None, name)
        w = _writer
        if w is not None:
            w.enter()  # inside until the bucket's all-reduce completes
        _in_hook.marked = True
        try:
            fut = hook(state, bucket)
        except BaseException:
            if w is not None:
                w.leave()
            raise
        finally:
            _in_hook.marked = False
        if w is None:
            return fut

        def done(f):
            w.leave()
            return f.value()
        return fut.then(done)
    return marked


def pausing(fn, reason: str = "checkpoint", *, max_s: float = 1800.0):
    """``fn`` run inside a declared pause (idempotent)."""
    if getattr(fn, "__gpujobs_wrapped__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with pause(reason, max_s=max_s):
            return fn(*args, **kwargs)
    vars(wrapper)["__gpujobs_wrapped__"] = True  # marks a wrapper: wrapping is idempotent
    return wrapper


def declare_checkpoints(*, max_s: float = 1800.0, torch=None, dcp=None) -> list[str]:
    """Make ``torch.save`` and ``torch.distributed.checkpoint.save`` declare a
    pause of at most ``max_s``; returns what was wrapped. Modules are imported
    here when not given; one that is not installed is skipped."""
    done = []
    if torch is None:
        torch = _optional("torch")
    if torch is not None and hasattr(torch, "save"):
        torch.save = pausing(torch.save, "checkpoint", max_s=max_s)
        done.append("torch.save")
    if dcp is None:
        dcp = _optional("torch.distributed.checkpoint")
    if dcp is not None:
        for name in ("save", "async_save", "save_state_dict"):
            if hasattr(dcp, name):
                setattr(dcp, name, pausing(getattr(dcp, name), "checkpoint", max_s=max_s))
                done.append(f"torch.distributed.checkpoint.{name}")
    return done


#: what a callback declares once training ends: the trainer's teardown and the
#: interpreter's exit take seconds with torch and a framework loaded (more on a
#: loaded host; docs/benchmarks.md), longer than a short stall threshold, and no
#: rank beats again
SHUTDOWN = "shutdown"


def lightning_callback(*, max_checkpoint_s: float = 1800.0, max_eval_s: float = 3600.0,
                       max_shutdown_s: float = 60.0, base=None):
    """A PyTorch Lightning callback: a beat per training batch, a pause around
    validation and around each checkpoint save, and once training ends a
    pause of at most ``max_shutdown_s`` until the next beat (the process's
    exit). ``base``: the Callback class (``lightning.pytorch.Callback``, else
    ``pytorch_lightning.Callback``)."""
    if base is None:
        module = _optional("lightning.pytorch") or importlib.import_module("pytorch_lightning")
        base = module.Callback

    class GpujobsHeartbeat(base):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            beat(int(trainer.global_step))

        def on_validation_start(self, trainer, pl_module):
            pause_until_beat("evaluation", max_s=max_eval_s)

        def on_validation_end(self, trainer, pl_module):
            beat(int(trainer.global_step))

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            # called as the checkpoint is assembled, before it is written: the
            # pause lasts until the next beat, after the write
            pause_until_beat("checkpoint", max_s=max_checkpoint_s)

        def on_train_end(self, trainer, pl_module):
            beat(int(trainer.global_step))
            pause_until_beat(SHUTDOWN, max_s=max_shutdown_s)

    return GpujobsHeartbeat()


def hf_callback(*, max_checkpoint_s: float = 1800.0, max_eval_s: float = 3600.0,
                max_shutdown_s: float = 60.0, base=None):
    """A Hugging Face ``TrainerCallback``: a beat per step; when the step's
    control says an evaluation or a save follows, a pause until the next beat;
    once training ends, a pause of at most ``max_shutdown_s`` until the next
    beat (the process's exit)."""
    if base is None:
        base = importlib.import_module("transformers").TrainerCallback

    class GpujobsHeartbeat(base):
        def on_step_end(self, args, state, control, **kwargs):
            beat(int(state.global_step))
            if getattr(control, "should_evaluate", False):
                pause_until_beat("evaluation", max_s=max_eval_s + (
                    max_checkpoint_s if getattr(control, "should_save", False) else 0))
            elif getattr(control, "should_save", False):
                pause_until_beat("checkpoint", max_s=max_checkpoint_s)

        def on_evaluate(self, args, state, control, **kwargs):
            if getattr(control, "should_save", False):
                pause_until_beat("checkpoint", max_s=max_checkpoint_s)

        def on_train_end(self, args, state, control, **kwargs):
            beat(int(state.global_step))
            pause_until_beat(SHUTDOWN, max_s=max_shutdown_s)

    return GpujobsHeartbeat()


def _read_plain(path: str, max_bytes: int) -> bytes | None:
    """The whole file at ``path`` if it holds at most ``max_bytes``, else None
    (also when it is missing). A plain read that trusts the file: the agent
    reads a rank's record through its own reader, which refuses whatever a
    hostile rank may put there (agent/rankfiles.py)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = os.pread(fd, max_bytes + 1, 0)
    finally:
        os.close(fd)
    return raw if len(raw) <= max_bytes else None


def read(path: str,
         read_bytes: Callable[[str, int], bytes | None] | None = None) -> Record | None:
    """The agent's side: the rank's latest record, or None if it never beat
    (or the file holds no record: a record is exactly one of the sizes
    helpers write, three as they grew). ``read_bytes(path, max_bytes)``: how the file is read,
    the whole file or None (missing, larger, or refused); default a plain
    read. The seqlock is read again while a write was caught half-way."""
    get = read_bytes if read_bytes is not None else _read_plain
    for _ in range(100):
        raw = get(path, RECORD_SIZE)
        if raw is None:
            return None
        step_time = 0
        if len(raw) == _FORMAT_V1.size:
            seq, step, beat_ns, deadline, reason, seq_end = _FORMAT_V1.unpack(raw)
            coll, name = 0, b""
        elif len(raw) == _FORMAT_V2.size:
            seq, step, beat_ns, deadline, reason, coll, name, seq_end = _FORMAT_V2.unpack(raw)
        elif len(raw) != RECORD_SIZE:
            return None
        else:
            seq, step, beat_ns, deadline, reason, coll, name, step_time, seq_end = \
                _FORMAT.unpack(raw)
        if seq == seq_end:
            return Record(seq, step, beat_ns, deadline,
                          reason.rstrip(b"\0").decode("utf-8", "replace"),
                          coll - 1 if coll else None,
                          name.rstrip(b"\0").decode("utf-8", "replace"),
                          step_time - 1 if step_time else None)
    return None
