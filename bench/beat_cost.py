"""What `beat()` costs a training step, against the bare write it is made of.

Prints microseconds per call of gpujobs_heartbeat.beat and of a bare os.pwrite
of the same 80 bytes, measured interleaved in the same run, and their ratio.
"""
from __future__ import annotations

import _quiet  # noqa: F401 - first: no INFO logs or EMF records unless GPUJOBS_VERBOSE=1

import os
import pathlib
import statistics
import sys
import tempfile
import timeit

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "agent" / "rankside"))

import gpujobs_heartbeat as hb  # noqa: E402

N, ROUNDS = 20000, 15


def main() -> None:
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
        print(f"beat-bench: us_per_beat={b * 1e6:.2f} ratio_vs_pwrite={b / p:.2f}")


if __name__ == "__main__":
    main()
