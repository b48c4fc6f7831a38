"""The rank-side helper as a package of its own (issue 23, item 5): it builds
offline with the setuptools at hand, installs with pip, and outside an agent
(under torchrun, on a laptop) every call is a no-op: no error, no file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RANKSIDE = Path(__file__).resolve().parents[2] / "agent" / "rankside"

# what a training script does with the helper, outside any agent
SCRIPT = """
import os, sys
import gpujobs_heartbeat as hb
assert os.path.dirname(hb.__file__) == sys.argv[1], hb.__file__  # the installed copy
hb.beat()
for step in range(3):
    hb.beat(step)
    hb.arrive(name="all_reduce")
    with hb.collective("barrier"):
        pass
with hb.pause("checkpoint", max_s=60):
    hb.beat(99)
hb.pause_until_beat("evaluation", max_s=60)

class FakeDist:                          # torch.distributed stand-ins: wrapping works
    def all_reduce(self, t): return t
class FakeTorch:
    def save(self, obj, f): return "saved"
dist, torch = FakeDist(), FakeTorch()
hb.instrument_collectives(dist)
assert dist.all_reduce(5) == 5
assert hb.declare_checkpoints(torch=torch, dcp=object()) == ["torch.save"]
assert torch.save({}, "x") == "saved"
model = object()
assert hb.instrument(model) is model     # the one line users write: a no-op here
assert "torch" not in sys.modules
print("no-op ok")
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """``pip install ./agent/rankside`` (a copy, so the build leaves nothing in
    the repository) into a target directory, offline, with this venv's setuptools."""
    work = tmp_path_factory.mktemp("rankside")
    src = work / "src"
    shutil.copytree(RANKSIDE, src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                  "*.egg-info"))
    target = work / "site"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index",
         "--no-deps", "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return target


def test_it_installs_as_a_distribution_of_its_own(installed):
    assert (installed / "gpujobs_heartbeat.py").read_bytes() == \
        (RANKSIDE / "gpujobs_heartbeat.py").read_bytes()
    [meta] = installed.glob("gpujobs_heartbeat-*.dist-info")
    text = (meta / "METADATA").read_text()
    assert "Name: gpujobs-heartbeat" in text and "Requires-Dist" not in text


@pytest.mark.parametrize("where", ["laptop", "torchrun"])
def test_outside_an_agent_every_call_is_a_no_op(installed, tmp_path, where):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(installed),
           "TMPDIR": str(home)}
    if where == "torchrun":  # what torchrun sets, and no GPUJOBS_HEARTBEAT_FILE
        env.update(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
    run = subprocess.run([sys.executable, "-B", "-c", SCRIPT, str(installed)], cwd=cwd,
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "no-op ok" and run.stderr == ""
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == [], "no files anywhere"


def test_a_heartbeat_file_that_cannot_be_opened_is_a_no_op_too(installed, tmp_path):
    """An environment copied from an agent's rank onto another host."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(installed),
           "GPUJOBS_HEARTBEAT_FILE": str(tmp_path / "no" / "such" / "dir" / "rank-0")}
    run = subprocess.run([sys.executable, "-B", "-c", SCRIPT, str(installed)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert not (tmp_path / "no").exists()
