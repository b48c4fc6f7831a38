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
    assert rec.seq == 20 and rec.step == 19 and rec.pause_deadline_ns == 0
    assert 0 < time.monotonic_ns() - rec.beat_ns < 30e9


def test_a_declared_pause_carries_its_bound_and_ends(tmp_path):
    path = str(tmp_path / "rank-0.beat")
    run_rank("import os\nfrom gpujobs_heartbeat import beat, pause\nbeat(1)\n"
             "with pause('checkpoint', max_s=600):\n"
             "    open(os.environ['GPUJOBS_HEARTBEAT_FILE'] + '.mark', 'w').write(\n"
             "        open(os.environ['GPUJOBS_HEARTBEAT_FILE'], 'rb').read().hex())\n", path)
    inside = hb._FORMAT.unpack(bytes.fromhex(open(path + ".mark").read()))
    assert inside[4].rstrip(b"\0") == b"checkpoint"
    assert inside[3] - time.monotonic_ns() > 500e9, "about 600 s of pause remain"
    after = hb.read(path)
    assert after.pause_deadline_ns == 0 and after.step == 1


def test_without_an_agent_beat_is_a_no_op(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUJOBS_HEARTBEAT_FILE"}
    r = subprocess.run([sys.executable, "-c", "from gpujobs_heartbeat import beat, pause\n"
                        "beat(1)\nwith pause('x', max_s=1): pass\nprint('ok')"],
                       env={**env, "PYTHONPATH": os.path.abspath(HERE)},
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "ok"


def test_a_file_never_written_reads_as_never_heard(tmp_path):
    assert hb.read(str(tmp_path / "missing")) is None
