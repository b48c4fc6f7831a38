"""The rank-side helper: cheap, local, and honest about pauses."""
import os
import subprocess
import sys
import time

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "agent", "rankside")
sys.path.insert(0, os.path.abspath(HERE))

import gpujobs_heartbeat as hb  # noqa: E402


def run_rank(code: str, path: str) -> None:
    env = {**os.environ, "GPUJOBS_HEARTBEAT_FILE": path,
           "PYTHONPATH": os.path.abspath(HERE)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=30)


def test_beats_land_in_the_file_the_agent_reads(tmp_path):
    path = str(tmp_path / "rank-0.beat")
    run_rank("from gpujobs_heartbeat import beat\nfor s in range(20): beat(s)", path)
    rec = hb.read(path)
    # 20 beats, then the exit's declared pause (one more write)
    assert rec.seq == 21 and rec.step == 19 and rec.pause_reason == "exiting"
    assert 0 < time.monotonic_ns() - rec.beat_ns < 30e9


def test_a_rank_leaving_its_interpreter_declares_an_exit_pause(tmp_path):
    """Invariant: a script that is done and tears down (seconds of freeing
    torch on a loaded host, before its agent sees it exit) is in a declared,
    bounded pause, not silent; its step stays the last one it beat."""
    path = str(tmp_path / "rank-0.beat")
    before = time.monotonic_ns()
    run_rank("from gpujobs_heartbeat import beat\nbeat(7)", path)
    rec = hb.read(path)
    assert (rec.step, rec.pause_reason) == (7, "exiting")
    bound = rec.pause_deadline_ns - before
    assert hb.EXIT_MAX_S * 1e9 <= bound < (hb.EXIT_MAX_S + 30) * 1e9
    assert rec.beat_ns >= before, "leaving is a sign of life"
    # a script that never beat never opened the file: nothing is written
    quiet = str(tmp_path / "rank-1.beat")
    run_rank("import gpujobs_heartbeat", quiet)
    assert hb.read(quiet) is None


def test_a_declared_pause_carries_its_bound_and_ends(tmp_path):
    path = str(tmp_path / "rank-0.beat")
    run_rank("import os\nfrom gpujobs_heartbeat import beat, pause\nbeat(1)\n"
             "with pause('checkpoint', max_s=600):\n"
             "    open(os.environ['GPUJOBS_HEARTBEAT_FILE'] + '.mark', 'w').write(\n"
             "        open(os.environ['GPUJOBS_HEARTBEAT_FILE'], 'rb').read().hex())\n"
             "open(os.environ['GPUJOBS_HEARTBEAT_FILE'] + '.after', 'w').write(\n"
             "    open(os.environ['GPUJOBS_HEARTBEAT_FILE'], 'rb').read().hex())\n", path)
    inside = hb._FORMAT.unpack(bytes.fromhex(open(path + ".mark").read()))
    assert inside[4].rstrip(b"\0") == b"checkpoint"
    assert inside[3] - time.monotonic_ns() > 500e9, "about 600 s of pause remain"
    after = hb._FORMAT.unpack(bytes.fromhex(open(path + ".after").read()))
    assert (after[3], after[1]) == (0, 1), "the pause ended; the step stays"
    assert after[2] > inside[2], "leaving the pause is a sign of life"


def test_without_an_agent_beat_is_a_no_op(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUJOBS_HEARTBEAT_FILE"}
    r = subprocess.run([sys.executable, "-c", "from gpujobs_heartbeat import beat, pause\n"
                        "beat(1)\nwith pause('x', max_s=1): pass\nprint('ok')"],
                       env={**env, "PYTHONPATH": os.path.abspath(HERE)},
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "ok"


def test_a_file_never_written_reads_as_never_heard(tmp_path):
    assert hb.read(str(tmp_path / "missing")) is None


class _Mono:
    """A monotonic clock the test moves (ns)."""
    def __init__(self) -> None:
        self.ns = 10**12

    def __call__(self) -> int:
        return self.ns

    def advance(self, s: float) -> None:
        self.ns += int(s * 1e9)


def test_each_step_reports_its_median_time_outside_collectives(tmp_path, monkeypatch):
    """The time a step spends inside collectives (waiting for peers) is not
    the rank's own: the record carries the median of the rest, per step,
    on the rank's own clock; a step that held a declared pause is left out."""
    mono = _Mono()
    monkeypatch.setattr(hb.time, "monotonic_ns", mono)
    path = str(tmp_path / "rank-0.beat")
    w = hb._Writer(path)
    w.write(0)
    assert hb.read(path).step_time_ns is None, "no whole step yet"
    for step in range(1, 4):  # 0.3 s of work, 0.7 s inside an all-reduce
        mono.advance(0.2)
        w.enter()
        mono.advance(0.7)
        w.leave()
        mono.advance(0.1)
        w.write(step)
    assert hb.read(path).step_time_ns == int(0.3e9)
    # concurrent buckets count once: two overlapping, 0.5 s inside in all
    w.enter()
    mono.advance(0.25)
    w.enter()
    mono.advance(0.25)
    w.leave()
    w.leave()
    mono.advance(1.0)
    w.write(4)
    assert hb.read(path).step_time_ns == int(0.3e9), "the median of 0.3, 0.3, 0.3, 1.0"
    # a step with a checkpoint in it is no measure of speed
    for step in range(5, 15):
        mono.advance(0.5)
        w.set_pause(mono.ns + int(60e9), "checkpoint")
        mono.advance(30)
        w.set_pause(0, "")
        w.write(step)
    assert hb.read(path).step_time_ns == int(0.3e9)


def test_a_wrapped_collective_counts_as_inside(tmp_path, monkeypatch):
    mono = _Mono()
    monkeypatch.setattr(hb.time, "monotonic_ns", mono)
    w = hb._Writer(str(tmp_path / "rank-0.beat"))
    monkeypatch.setattr(hb, "_writer", w)
    monkeypatch.setattr(hb, "_checked", True)

    def all_reduce(t):
        mono.advance(2.0)  # waiting for a slow peer
        return t
    wrapped = hb._arriving(all_reduce, "all_reduce")
    w.write(0)
    mono.advance(0.4)
    assert wrapped(7) == 7
    w.write(1)
    assert hb.read(str(tmp_path / "rank-0.beat")).step_time_ns == int(0.4e9)


def test_a_record_of_an_older_helper_reads_without_a_step_time(tmp_path):
    path = tmp_path / "rank-0.beat"
    path.write_bytes(hb._FORMAT_V2.pack(3, 7, 11, 0, b"", 5, b"all_reduce", 3))
    rec = hb.read(str(path))
    assert (rec.step, rec.collective_seq, rec.step_time_ns) == (7, 4, None)
