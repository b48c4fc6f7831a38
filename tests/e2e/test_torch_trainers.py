"""The standard checkpoint pattern under the trainers' own callbacks (issue 23,
item 3): rank 0 saves for 30 s while its peers wait, in a job set to restart
on a stall, through the local stack as tests/e2e/test_torch_ddp.py runs it
(4 ranks of 2 GPU slots over the 2 agents, gloo on CPU, the agent's
torchrun environment alone).

* examples/lightning_train.py: a Lightning ``Trainer`` with
  ``gpujobs_heartbeat.lightning_callback()`` and ``ModelCheckpoint``; the
  peers wait in Lightning's barrier after ``Trainer.save_checkpoint``.
* examples/hf_train.py: a Hugging Face ``Trainer`` with
  ``gpujobs_heartbeat.hf_callback()``; it has no barrier after a save, so
  the peers wait in the next step's gradient all-reduce.

Either must run through in one attempt with no false alarm."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest

from tests.support.cli import logs_until, stall_lines
from tests.support.reach import example
from tests.support.torch_jobs import (
    assert_ran_through_without_an_alarm,
    ddp_spec,
    submit,
    watch,
)

pytestmark = pytest.mark.e2e
STEPS = 8


def watch_ranks(gpujobs, job_id: str):
    """`gpujobs watch` to the job's end, and what `gpujobs ranks` said of each
    rank meanwhile, polled: [(seconds since the submit, {rank: status})]."""
    done: dict = {}

    def run() -> None:
        try:
            done["r"] = watch(gpujobs, job_id)
        except BaseException as e:  # noqa: BLE001 - raised again below, in the test
            done["error"] = e

    t = threading.Thread(target=run)
    t0 = time.monotonic()
    t.start()
    seen = []
    while t.is_alive():
        r = gpujobs("ranks", job_id, "-o", "json")
        if r.returncode == 0:
            seen.append((round(time.monotonic() - t0), {
                x["rank"]: x.get("status") for x in json.loads(r.stdout)["ranks"]}))
        t.join(2)
    if "error" in done:
        raise AssertionError(f"`gpujobs watch {job_id}` did not finish; the ranks meanwhile: "
                             f"{seen[-3:]}") from done["error"]
    return done["r"], seen


def trainer_spec(python: str, script: str, ckpt_dir) -> dict:
    spec = ddp_spec(python, STEPS=str(STEPS), CKPT_EVERY="5", CKPT_STEP="5", CKPT_S="30",
                    CKPT_DIR=str(ckpt_dir), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    spec.update(name=script.replace("_", "-"), command=[python, example(f"{script}.py")],
                on_stall="restart", max_attempts=2)  # a false alarm would restart it
    return spec


@pytest.mark.parametrize("script", ["lightning_train", "hf_train"])
def test_a_30s_checkpoint_of_rank_0_under_the_trainer_callback_is_no_stall(
        gpujobs, tmp_path, torch_python, script, shared_dir):
    job_id = submit(gpujobs, tmp_path, trainer_spec(torch_python, script, shared_dir))
    r, seen = watch_ranks(gpujobs, job_id)
    assert_ran_through_without_an_alarm(gpujobs, job_id, r)
    # what excused the silence: the callback's declared pauses, and no rank
    # ever looked stalled (the end of training included: its teardown and the
    # interpreter's exit outlast the 4 s threshold)
    assert any(st.get(0) == "paused" for _, st in seen), seen
    assert not any("stalled" in st.values() for _, st in seen), seen
    d = gpujobs("describe", job_id)
    assert d.returncode == 0 and stall_lines(d.stdout) == [], d.stdout

    out = logs_until(gpujobs, job_id, r"rank \d: \d+ steps", 4)
    saved = float(re.search(r"checkpoint of step 5 saved in ([\d.]+) s", out).group(1))
    assert saved >= 29, out
    for rank in range(4):
        assert f"rank {rank}: {STEPS} steps" in out, out
