"""What `beat()` costs a training step, against the bare write it is made of.

Prints microseconds per call of gpujobs_heartbeat.beat and of a bare os.pwrite
of the same 80 bytes, measured interleaved in the same run, and their ratio;
then what the collective-arrival marker costs (``arrive()`` and ``with
collective(...)``, through the module as a training loop calls them) against
the module's ``beat()``, also interleaved. Ends with ``beat-bench:
us_per_beat=.. ratio_vs_pwrite=..`` and ``marker-bench: ..``; ``--quick`` (the
smoke test) times fewer calls.
"""
from __future__ import annotations

import os
import pathlib
import statistics
import sys
import tempfile
import timeit

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "agent" / "rankside"))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gpujobs_heartbeat as hb  # noqa: E402

from bench import harness  # noqa: E402


def main() -> None:
    args = harness.parser(__doc__).parse_args()
    N, ROUNDS = (2000, 3) if args.quick else (20000, 15)
    with tempfile.TemporaryDirectory() as d:
        w = hb._Writer(os.path.join(d, "beat"))
        fd = os.open(os.path.join(d, "bare"), os.O_RDWR | os.O_CREAT)
        payload = b"\0" * hb.RECORD_SIZE
        beat, bare = [], []
        for _ in range(ROUNDS):
            beat.append(timeit.timeit(lambda: w.write(None), number=N) / N)
            bare.append(timeit.timeit(lambda: os.pwrite(fd, payload, 0), number=N) / N)
        b, p = statistics.median(beat), statistics.median(bare)
        print(f"beat(): {b * 1e6:.2f} us   bare pwrite: {p * 1e6:.2f} us   ratio {b / p:.2f}")
        harness.machine_line("beat", us_per_beat=f"{b * 1e6:.2f}", ratio_vs_pwrite=f"{b / p:.2f}")
        hb._writer, hb._checked = w, True   # as after the first call with the env set

        def marked():
            with hb.collective("allreduce"):
                pass
        mod, arr, ctx = [], [], []
        for _ in range(ROUNDS):
            mod.append(timeit.timeit(lambda: hb.beat(), number=N) / N)
            arr.append(timeit.timeit(lambda: hb.arrive(), number=N) / N)
            ctx.append(timeit.timeit(marked, number=N) / N)
        m, a, c = statistics.median(mod), statistics.median(arr), statistics.median(ctx)
        print(f"module beat(): {m * 1e6:.2f} us   arrive(): {a * 1e6:.2f} us   "
              f"with collective(): {c * 1e6:.2f} us")
        harness.machine_line("marker", us_per_arrive=f"{a * 1e6:.2f}",
                             arrive_vs_beat=f"{a / m:.2f}", collective_cm_vs_beat=f"{c / m:.2f}")


if __name__ == "__main__":
    main()
