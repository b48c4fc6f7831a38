"""What a rank's Python stack says: where it is, and whether it waits for peers.

The agent samples a silent rank's stack (``py-spy dump``, innermost frame
first, each frame as py-spy prints it: ``func (file:line)``) and posts it with
the rank's process sample (api/schemas.py HEARTBEATS ``proc.stack``). Ranks
blocked in a collective all sleep in the kernel alike (a gloo receive and a
``time.sleep`` both show state S and no CPU), but their stacks differ: the
waiting ones are inside ``torch.distributed`` (or inside ``backward``, where
DDP's Reducer waits for its gradient all-reduce), the one that hung is not.

Pure functions: the agent uses :func:`focus` to pick the frame whose source
line it reads (``code``), the verdict uses :func:`waiting_in` and
:func:`where`.
"""
from __future__ import annotations

import re

#: a frame as py-spy prints it: ``forward (train.py:88)``
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?):(?P<line>\d+)\)$")
#: frames of these libraries are the machinery a rank waits in, not its own code
_LIBRARY = ("torch/", "torch\\", "threading.py", "queue.py", "selectors.py",
            "multiprocessing/", "concurrent/", "asyncio/", "socket.py", "subprocess.py")
#: torch.distributed functions that set up the process group: peers wait there
#: for a rank that never joined
_RENDEZVOUS = ("init_process_group", "rendezvous", "_store_based_barrier",
               "_create_c10d_store", "_env_rendezvous_handler", "_tcp_rendezvous_handler",
               "new_group", "init_device_mesh")
#: wrappers torch puts around its collectives, named instead of the collective
_WRAPPERS = ("wrapper", "inner", "_fn", "decorate_context")


#: what a stored stack's frames and source line may take, UTF-8: 16 frames
#: of 200 ASCII characters and the line fit whole; wider characters lose the
#: outermost frames, so a host's heartbeat item (32 ranks) stays far under
#: DynamoDB's 400 KB whatever a rank's code is named
MAX_STACK_BYTES = 4096


def bounded(stack: dict) -> dict:
    """``stack`` (api/schemas.py STACK, validated: a line of at most 200
    characters, 800 bytes) within MAX_STACK_BYTES: its innermost frames, as
    many as fit beside its source line."""
    room = MAX_STACK_BYTES - len(stack.get("code", "").encode("utf-8"))
    for i, frame in enumerate(stack["frames"]):
        room -= len(frame.encode("utf-8"))
        if room < 0:
            return {**stack, "frames": stack["frames"][:i]}
    return stack


def parse(frame: str) -> tuple[str, str, int] | None:
    """``(func, file, line)`` of one frame, or None if it is not py-spy's form."""
    m = _FRAME.match(frame)
    return None if m is None else (m["func"], m["file"], int(m["line"]))


def _library(file: str) -> bool:
    """Torch's, a package's or the standard library's file (the agent names
    the latter from ``lib/pythonX.Y/``), not the rank's own code."""
    return file.startswith(_LIBRARY) or "-packages/" in file or "lib/python" in file


def focus(frames: list[str]) -> int | None:
    """The index of the frame to show: the innermost frame of the rank's own
    code (not torch's, not the standard library's waiting machinery), else
    the innermost frame; None for an empty stack."""
    parsed = [parse(f) for f in frames]
    for i, p in enumerate(parsed):
        if p is not None and not _library(p[1]):
            return i
    return 0 if frames else None


def waiting_in(stack: dict | None) -> str | None:
    """What the stack blocks in that needs its peers: a ``torch.distributed``
    collective (its name), ``rendezvous`` (joining the process group),
    ``backward`` (DDP's gradient all-reduce waits there), ``ddp_forward``
    (DDP's buffer broadcast); None when it is in none of them."""
    frames = [p for p in (parse(f) for f in (stack or {}).get("frames") or ()) if p]
    for func, file, _ in frames:
        norm = file.replace("\\", "/")
        if "torch/distributed/" in norm:
            if func in _RENDEZVOUS:
                return "rendezvous"
            if func not in _WRAPPERS and not func.startswith("<"):
                return func
        elif norm.endswith("torch/nn/parallel/distributed.py"):
            return "ddp_forward"
        elif norm.endswith("torch/autograd/graph.py") and func == "_engine_run_backward":
            return "backward"
    return None


def where(stack: dict | None) -> str | None:
    """One line for a person: ``train.py:88 in forward → time.sleep(3600)``
    (the focused frame, then its source line when the agent could read it),
    or None for no stack."""
    frames = (stack or {}).get("frames") or []
    i = focus(frames)
    if i is None:
        return None
    p = parse(frames[i])
    head = frames[i] if p is None else f"{p[1]}:{p[2]} in {p[0]}"
    code = (stack or {}).get("code")
    return f"{head} → {code}" if code else head
