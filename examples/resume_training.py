"""A training loop that resumes from its last checkpoint when gpujobs retries it.

Every rank of every attempt of a job gets the same ``GPUJOBS_CHECKPOINT_DIR``
(``<spec checkpoint_dir>/<job id>``, on storage every node mounts) and the
attempt's number in ``GPUJOBS_ATTEMPT`` (and ``TORCHELASTIC_RESTART_COUNT``,
one less, for code written for torchrun). So a retried attempt, wherever it is
placed, finds what the last one saved. This script:

- loads ``rank-<RANK>.json`` from that directory, if there is one, and goes on
  from the step it holds;
- saves every ``--save-every`` steps, atomically (a new file, then a rename:
  a rank killed mid-save leaves the last good checkpoint);
- saves at once when the time limit's warning arrives (``warn_signal``,
  SIGUSR1 by default, ``warn_before_s`` ahead of ``max_runtime_s``), and on
  SIGTERM (a cancel, a stall restart, the limit itself) before it exits;
- beats once a step (``gpujobs_heartbeat``, on every rank's PYTHONPATH), so
  the stall detector knows each rank's progress.

Submit it (see the README's lifecycle section)::

    gpujobs submit --ranks 2 --checkpoint-dir /shared/ckpt --max-attempts 3 \\
        --max-runtime 4h --warn-before 5m -- python examples/resume_training.py --steps 1000

``--fail-first-attempt-at STEP`` makes the first attempt crash at that step
(after saving it), to watch the next attempt resume.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

try:
    from gpujobs_heartbeat import beat
except ImportError:  # run outside gpujobs: no heartbeats
    def beat(step: int | None = None) -> None:
        pass


def load(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds per step")
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--checkpoint-dir", help="without GPUJOBS_CHECKPOINT_DIR")
    parser.add_argument("--fail-first-attempt-at", type=int, metavar="STEP")
    args = parser.parse_args(argv)

    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("GPUJOBS_ATTEMPT", "1"))
    where = os.environ.get("GPUJOBS_CHECKPOINT_DIR") or args.checkpoint_dir
    if not where:
        parser.error("no checkpoint directory: set checkpoint_dir in the job's spec")
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, f"rank-{rank}.json")
    state = load(path) or {"step": 0, "loss": 1.0}
    if state["step"]:
        print(f"rank {rank} attempt {attempt}: resuming from step {state['step']}", flush=True)
    else:
        print(f"rank {rank} attempt {attempt}: starting from step 0", flush=True)

    warned = []

    def on_warning(signum, frame):  # the time limit is near: save at the next step
        warned.append(signum)

    def on_term(signum, frame):  # stopped: save what there is, then go
        save(path, state)
        print(f"rank {rank}: stopped at step {state['step']}, saved", flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGUSR1, on_warning)
    signal.signal(signal.SIGTERM, on_term)

    for step in range(state["step"] + 1, args.steps + 1):
        time.sleep(args.step_s)  # the work of one step
        state = {"step": step, "loss": round(1.0 / step, 6)}
        beat(step)
        if warned:
            save(path, state)
            print(f"rank {rank}: time limit near: saved step {step}", flush=True)
            warned.clear()
        elif step % args.save_every == 0:
            save(path, state)
        if attempt == 1 and step == args.fail_first_attempt_at:
            save(path, state)
            print(f"rank {rank}: crashing at step {step} (--fail-first-attempt-at)",
                  flush=True)
            return 1
    save(path, state)
    print(f"rank {rank}: done at step {state['step']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
