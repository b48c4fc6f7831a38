"""The agent's message handling, with a fake API and inbox and real rank processes."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agent.api import ApiError
from agent.core import Outcome
from agent.messages import master_port
from agent.ranks import ProcTable
from agent.records import lines_of
from tests.support.procs import alive
from tests.support.waits import wait_until

from .harness import PY, RecordingLauncher, cancel, launch, message, run_until

NODE = {"node_id": "node-1"}


def phase(world, key="job_a/1"):
    return world.state()["attempts"][key]["phase"]


def group_members(ranks, per_rank: int) -> list[int]:
    """Once every rank's group has ``per_rank`` live processes, all their pids."""
    def ready():
        table = ProcTable.read()
        groups = [r.members(table) for r in ranks]
        return all(len(g) == per_rank for g in groups) and [p for g in groups for p in g]
    return wait_until(ready, what=f"{per_rank} processes in each rank's group")


def test_a_duplicate_launch_starts_the_ranks_once(world):
    agent = world.agent()
    m = launch(ranks=[0, 1], command=["sh", "-c", "echo started; exec sleep 30"])
    assert agent.handle(message(m, 1)) is Outcome.DONE
    assert agent.handle(message(m, 2)) is Outcome.DONE
    assert len(world.launchers[0].launched) == 2  # one process per rank, not two
    assert world.inbox.deleted == ["m-1", "m-2"]
    assert world.api.events == [("job_a", 1, {"type": "STARTED", "ranks": [0, 1], **NODE})]
    log = world.paths.log_file("job_a", 1, 0)
    wait_until(lambda: log.exists() and log.read_bytes().endswith(b" stdout F started\n")
               and lines_of(log.read_bytes()) == ["started"], what="rank log")
    # a restarted agent also knows it
    again = world.agent()
    again.recover()
    again.handle(message(m, 3))
    assert world.launchers[1].launched == []


def test_cancel_before_launch_reports_stopped_and_the_launch_never_runs(world):
    agent = world.agent()
    assert agent.handle(message(cancel("job_c"), 1)) is Outcome.DONE
    assert world.api.events == [("job_c", 1, {"type": "STOPPED", "ranks": [], **NODE})]
    assert agent.handle(message(launch("job_c", ranks=[0, 1]), 2)) is Outcome.DONE
    assert world.launchers[0].launched == []
    assert world.api.events[1:] == [("job_c", 1, {"type": "STOPPED", "ranks": [0, 1], **NODE})]
    assert world.inbox.deleted == ["m-1", "m-2"]
    assert not world.paths.log_file("job_c", 1, 0).exists()
    # the tombstone survives a restart
    again = world.agent()
    again.recover()
    again.handle(message(launch("job_c", ranks=[0, 1]), 3))
    assert world.launchers[1].launched == []


def test_cancel_stops_the_whole_process_group_and_reports_stopped(world):
    agent = world.agent(grace_s=10)
    agent.handle(message(launch(ranks=[0, 1], command=["sh", "-c", "sleep 30 & sleep 30; wait"]),
                         1))
    pids = group_members(world.launchers[0].launched, per_rank=4)  # shim, sh, two sleeps
    started = time.monotonic()
    assert agent.handle(message(cancel(), 2)) is Outcome.DONE
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert time.monotonic() - started < 5  # SIGTERM was enough: no wait for the grace period
    assert world.api.of("STOPPED") == [{"type": "STOPPED", "ranks": [0, 1], **NODE}]
    assert not any(alive(pid) for pid in pids)
    assert world.api.of("EXITED") == []  # exits the cancel caused are not failures
    assert phase(world) == "DONE"


def test_cancel_kills_ranks_that_ignore_sigterm_after_the_grace_period(world):
    agent = world.agent(grace_s=0.5)
    agent.handle(message(launch(command=["sh", "-c", 'trap "" TERM; sleep 30 & sleep 30; wait']),
                         1))
    pids = group_members(world.launchers[0].launched, per_rank=4)
    started = time.monotonic()
    agent.handle(message(cancel(), 2))
    run_until(agent, lambda: world.api.of("STOPPED"), what="STOPPED")
    assert time.monotonic() - started >= 0.5
    assert not any(alive(pid) for pid in pids)
    assert world.state()["attempts"]["job_a/1"]["killed"] is True
    assert world.api.of("STOPPED") == [{"type": "STOPPED", "ranks": [0], **NODE}]


def test_exit_codes_are_reported_with_ranks_grouped_by_code(world):
    agent = world.agent()
    cmd = [PY, "-c", "import os, sys; sys.exit({'1': 3}.get(os.environ['RANK'], 0))"]
    agent.handle(message(launch(ranks=[0, 1, 2], command=cmd), 1))
    wait_until(lambda: all(world.paths.exit_file("job_a", 1, r).exists() for r in range(3)),
               what="all ranks exited")
    run_until(agent, lambda: phase(world) == "DONE", what="attempt done")
    assert [e for _, _, e in world.api.events] == [
        {"type": "STARTED", "ranks": [0, 1, 2], **NODE},
        {"type": "EXITED", "ranks": [0, 2], "exit_code": 0, **NODE},
        {"type": "EXITED", "ranks": [1], "exit_code": 3, **NODE}]


def test_a_command_not_found_exits_127(world):
    agent = world.agent()
    agent.handle(message(launch(command=["/nonexistent/trainer"]), 1))
    run_until(agent, lambda: world.api.of("EXITED"), what="EXITED")
    assert world.api.of("EXITED") == [{"type": "EXITED", "ranks": [0], "exit_code": 127, **NODE}]
    assert "cannot start" in lines_of(world.paths.log_file("job_a", 1, 0).read_bytes(),
                                      "stderr")[0]


DUMP_ENV = ("import json, os, sys; "
            "json.dump(dict(os.environ), open(os.path.join(sys.argv[1], os.environ['RANK'] "
            "+ '.json.tmp'), 'w')); "
            "os.replace(os.path.join(sys.argv[1], os.environ['RANK'] + '.json.tmp'), "
            "os.path.join(sys.argv[1], os.environ['RANK'] + '.json'))")


def read_envs(out, ranks) -> dict[int, dict]:
    wait_until(lambda: all((out / f"{r}.json").exists() for r in ranks), what="env dumps")
    return {r: json.loads((out / f"{r}.json").read_text()) for r in ranks}


def test_rank_environment_and_gpu_slots(world, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    base = {"PATH": os.environ["PATH"], "KEEP": "base", "OVERRIDE": "base",
            "GPUJOBS_AGENT_TOKEN": "secret", "AWS_SECRET_ACCESS_KEY": "key"}
    agent = world.agent(gpus=8, base_env=base)
    # slots 0 and 1 are taken by a running rank
    agent.handle(message(launch("job_busy", ranks=[0], gpus_per_rank=2), 1))
    agent.handle(message(launch("job_env", attempt=3, ranks=[5, 4], world_size=8,
                                gpus_per_rank=2, command=[PY, "-c", DUMP_ENV, str(out)],
                                env={"OVERRIDE": "job", "RANK": "99", "NCCL_DEBUG": "INFO"},
                                master_addr="10.1.2.3", master_port=29501), 2))
    envs = read_envs(out, [4, 5])
    for r, local, slots in [(4, 0, "2,3"), (5, 1, "4,5")]:
        e = envs[r]
        assert (e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == \
            (str(r), str(local), "8", "2")
        assert e["CUDA_VISIBLE_DEVICES"] == slots
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("10.1.2.3", "29501")
        assert (e["GPUJOBS_JOB_ID"], e["GPUJOBS_ATTEMPT"]) == ("job_env", "3")
        assert e["GPUJOBS_HEARTBEAT_FILE"] == str(world.paths.heartbeat_file("job_env", 3, r))
        assert e["GPUJOBS_HEARTBEAT_FILE"].startswith(str(world.paths.state_dir))
        assert os.path.isdir(os.path.dirname(e["GPUJOBS_HEARTBEAT_FILE"]))
        assert (e["OVERRIDE"], e["NCCL_DEBUG"]) == ("job", "INFO")
        assert "KEEP" not in e, "the agent's own variables are not the rank's"
        assert "GPUJOBS_AGENT_TOKEN" not in e and "AWS_SECRET_ACCESS_KEY" not in e
    assert envs[4]["GPUJOBS_HEARTBEAT_FILE"] != envs[5]["GPUJOBS_HEARTBEAT_FILE"]
    # once job_env's ranks are gone their slots are free again, the busy ones are not
    run_until(agent, lambda: phase(world, "job_env/3") == "DONE", what="job_env done")
    agent.handle(message(launch("job_next", ranks=[0], gpus_per_rank=3,
                                command=[PY, "-c", DUMP_ENV, str(out)]), 3))
    assert read_envs(out, [0])[0]["CUDA_VISIBLE_DEVICES"] == "2,3,4"


#: what an agent's environment holds on a host and in the local stack (its
#: tables, its endpoints, its credentials, its token); none of it is a rank's
AGENT_CONFIG = {
    "GPUJOBS_AWS_ENDPOINT_URL": "http://127.0.0.1:41234", "GPUJOBS_JOBS_TABLE": "gpujobs-x-jobs",
    "GPUJOBS_NODES_TABLE": "gpujobs-x-nodes", "GPUJOBS_PENDING_QUEUE_URL": "http://q/pending",
    "GPUJOBS_TOKENS_FILE": "/s/tokens.json", "GPUJOBS_PAGE_TOKEN_KEY": "page-key-0123456789",
    "GPUJOBS_AGENT_TOKEN": "agent-token-0123456789", "GPUJOBS_AGENT_GRACE_S": "3",
    "GPUJOBS_TENANT_MAX_PENDING_JOBS": "1000", "GPUJOBS_PY_SPY": "/usr/bin/py-spy",
    "AWS_ACCESS_KEY_ID": "AKIAAGENT0123", "AWS_SECRET_ACCESS_KEY": "agent-secret-key",
    "AWS_SESSION_TOKEN": "agent-session", "AWS_PROFILE": "agent-profile",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": "http://127.0.0.1:41234",
    "PYTHONPATH": "/agent/site", "VIRTUAL_ENV": "/agent/venv", "IAM_RECORD_DIR": "/agent/rec",
    "LD_PRELOAD": "/agent/hook.so",
}
#: the host's basics a rank keeps (agent/README.md, "What a rank gets")
HOST_BASICS = {"PATH": os.environ["PATH"], "HOME": "/home/agent", "USER": "agent",
               "LOGNAME": "agent", "SHELL": "/bin/sh", "TERM": "dumb", "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "LANGUAGE": "en", "TZ": "UTC", "LC_ALL": "C.UTF-8",
               "LC_TIME": "C"}
#: what the agent sets for every rank (agent/README.md, "What a rank gets")
SET_FOR_RANKS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "NODE_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_VISIBLE_DEVICES", "GPUJOBS_JOB_ID",
                 "GPUJOBS_ATTEMPT", "GPUJOBS_NODE_ID", "GPUJOBS_HEARTBEAT_FILE", "PYTHONPATH"}


def test_a_rank_gets_the_hosts_basics_its_jobs_env_and_ours_and_nothing_else(world, tmp_path):
    """Issue 24, item 1: a real rank's environment is built from an allow-list,
    not from the agent's environment less some secrets. It holds the host's
    basics, the job's own ``env``, and what the agent sets for ranks; none of
    the agent's GPUJOBS_* or AWS_* configuration (endpoints, table names,
    credentials, the token) nor anything else of the agent's (its PYTHONPATH,
    LD_PRELOAD), names or values. The job's PYTHONPATH follows the helper's."""
    out = tmp_path / "env"
    out.mkdir()
    agent = world.agent(base_env={**AGENT_CONFIG, **HOST_BASICS})
    job_env = {"MY_SETTING": "mine", "PYTHONPATH": "/job/lib", "AWS_REGION": "eu-west-1"}
    agent.handle(message(launch("job_walls", command=[PY, "-c", DUMP_ENV, str(out)],
                                env=job_env), 1))
    e = read_envs(out, [0])[0]
    # PEP 538: the shim's Python may set LC_CTYPE for its child under a C locale
    python_own = {"LC_CTYPE"} - set(HOST_BASICS)
    assert set(e) - python_own == set(HOST_BASICS) | set(job_env) | SET_FOR_RANKS, \
        sorted(set(e) ^ (set(HOST_BASICS) | set(job_env) | SET_FOR_RANKS))
    assert {k: e[k] for k in HOST_BASICS} == HOST_BASICS
    assert (e["MY_SETTING"], e["AWS_REGION"]) == ("mine", "eu-west-1"), "the job's own env"
    assert e["PYTHONPATH"] == os.pathsep.join([str(world.paths.rankside_dir), "/job/lib"])
    leaked = {k: v for k, v in AGENT_CONFIG.items()  # (short values match by chance)
              if len(v) >= 6 and any(v in value for value in e.values())}
    assert not leaked, f"the agent's values reached the rank: {leaked}"


def test_one_gpu_ranks_see_the_nodes_slots_of_their_attempt_as_under_torchrun(world, tmp_path):
    """torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) picks the rank's own
    GPU: every slot of the attempt on the node is visible, in local-rank order,
    and no slot of another job (issue 23, item 5)."""
    out = tmp_path / "env"
    out.mkdir()
    agent = world.agent(gpus=8, base_env={"PATH": os.environ["PATH"]})
    agent.handle(message(launch("job_busy", ranks=[0], gpus_per_rank=1), 1))  # holds slot 0
    agent.handle(message(launch("job_ddp", attempt=3, ranks=[4, 5, 6], world_size=12,
                                gpus_per_rank=1, command=[PY, "-c", DUMP_ENV, str(out)]), 2))
    envs = read_envs(out, [4, 5, 6])
    rec = world.state()["attempts"]["job_ddp/3"]["procs"]
    for r, local in [(4, 0), (5, 1), (6, 2)]:
        e = envs[r]
        visible = [int(s) for s in e["CUDA_VISIBLE_DEVICES"].split(",")]
        assert visible == [1, 2, 3], "the attempt's slots on this node, not job_busy's 0"
        assert e["LOCAL_RANK"] == str(local)
        assert [visible[int(e["LOCAL_RANK"])]] == rec[str(r)]["slots"], \
            "device LOCAL_RANK is the rank's own slot"
        # what torchrun sets, and Lightning, Accelerate and the HF Trainer read
        assert {k: e[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "NODE_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                                  "ROLE_WORLD_SIZE", "ROLE_NAME")} == {
            "RANK": str(r), "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1",
            "NODE_RANK": "1", "GROUP_WORLD_SIZE": "4", "ROLE_RANK": str(r),
            "ROLE_WORLD_SIZE": "12", "ROLE_NAME": "default"}
        assert e["TORCHELASTIC_RESTART_COUNT"] == "2", "attempt 3 is the second restart"
        assert e["TORCHELASTIC_RUN_ID"] == "job_ddp"
        assert "TORCHELASTIC_USE_AGENT_STORE" not in e
        assert e["OMP_NUM_THREADS"] == "1"


def test_the_jobs_omp_num_threads_wins_and_no_agent_store_is_claimed(world, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    agent = world.agent(base_env={"PATH": os.environ["PATH"],
                                  "TORCHELASTIC_USE_AGENT_STORE": "True"})
    agent.handle(message(launch("job_omp", command=[PY, "-c", DUMP_ENV, str(out)],
                                env={"OMP_NUM_THREADS": "8"}), 1))
    e = read_envs(out, [0])[0]
    assert e["OMP_NUM_THREADS"] == "8"
    assert (e["TORCHELASTIC_RESTART_COUNT"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) == \
        ("0", "0", "1")
    assert "TORCHELASTIC_USE_AGENT_STORE" not in e, "torch would wait for a store nobody runs"


def test_master_address_and_port_defaults(world, tmp_path):
    out = tmp_path / "env"
    out.mkdir()
    agent = world.agent()
    portless = launch("job_d", attempt=2, command=[PY, "-c", DUMP_ENV, str(out)])
    del portless["master_port"]  # a LAUNCH from before they carried one
    agent.handle(message(portless, 1))
    e = read_envs(out, [0])[0]
    assert (e["MASTER_ADDR"], e["MASTER_PORT"], e["CUDA_VISIBLE_DEVICES"]) == \
        ("127.0.0.1", str(master_port("job_d", 2)), "0")


def test_a_launch_that_does_not_fit_is_put_back_until_slots_free_up(world):
    agent = world.agent(gpus=2)
    agent.handle(message(launch("job_big", gpus_per_rank=2), 1))
    assert agent.handle(message(launch("job_next"), 2)) is Outcome.DEFER
    assert world.inbox.log[-1] == ("defer", "m-2")
    assert len(world.launchers[0].launched) == 1
    agent.handle(message(cancel("job_big"), 3))
    run_until(agent, lambda: world.api.of("STOPPED"), what="job_big stopped")
    assert agent.handle(message(launch("job_next"), 4)) is Outcome.DONE
    assert world.state()["attempts"]["job_next/1"]["procs"]["0"]["slots"] == [0]


def test_messages_are_deleted_only_after_acting_on_them(world):
    agent = world.agent()
    snapshots = {}

    def on_delete(msg):  # what is on disk and running at the moment of the delete
        state = world.state()
        rec = state["attempts"]["job_a/1"]
        snapshots[msg.message_id] = {
            "phase": rec["phase"], "cancelled": rec["cancelled"],
            "alive": [alive(p["pid"]) for p in rec["procs"].values()],
            "pending": [p["event"]["type"] for p in state["pending"]],
            "reported": [e["type"] for _, _, e in world.api.events]}
    world.inbox.on_delete = on_delete
    agent.handle(message(launch(ranks=[0, 1]), 1))
    agent.handle(message(cancel(), 2))
    assert snapshots["m-1"] == {"phase": "RUNNING", "cancelled": False, "alive": [True, True],
                                "pending": ["STARTED"], "reported": []}
    assert snapshots["m-2"]["phase"] == "STOPPING" and snapshots["m-2"]["cancelled"]
    assert world.inbox.deleted == ["m-1", "m-2"]
    # reports go out after the delete
    assert world.api.of("STARTED") == [{"type": "STARTED", "ranks": [0, 1], **NODE}]


def test_a_message_that_cannot_be_acted_on_is_left_for_the_dead_letter_queue(world):
    agent = world.agent()
    for n, body in enumerate(["not json", json.dumps(launch(job_id="../../etc")),
                              json.dumps({"type": "REBOOT"})]):
        assert agent.handle(message(body, n)) is Outcome.LEAVE
    assert world.inbox.log == [] and world.launchers[0].launched == []


def test_reports_are_kept_while_the_api_is_down_and_sent_in_order_after(world):
    world.now = 1000.0  # the agent's clock, moved by hand past backoff delays
    world.api.fail_with = ApiError("HTTP 503", status=503, retryable=True)
    agent = world.agent()
    agent.handle(message(launch(command=["sh", "-c", "exit 2"]), 1))
    run_until(agent, lambda: phase(world) == "DONE", what="attempt done")
    assert world.api.events == []
    assert [p["event"]["type"] for p in world.state()["pending"]] == ["STARTED", "EXITED"]
    calls = world.api.calls
    agent.tick()
    agent.tick()
    assert world.api.calls == calls  # backing off, not hammering
    world.api.fail_with = None
    world.now += 60
    agent.tick()
    assert [e for _, _, e in world.api.events] == [
        {"type": "STARTED", "ranks": [0], **NODE},
        {"type": "EXITED", "ranks": [0], "exit_code": 2, **NODE}]
    assert world.state()["pending"] == []


def test_an_attempt_the_server_no_longer_cares_about_is_stopped_and_not_reported(world):
    world.api.gone.add(("job_a", 1))  # every report answers 409 stale_attempt
    agent = world.agent()
    agent.handle(message(launch(command=["sleep", "30"]), 1))
    rank = world.launchers[0].launched[0]
    run_until(agent, lambda: phase(world) == "DONE", what="stale attempt stopped")
    assert not alive(rank.pid)
    assert world.api.events == [] and world.state()["pending"] == []


def test_a_newer_attempt_of_the_job_stops_the_older_one_quietly(world):
    agent = world.agent()
    agent.handle(message(launch("job_a", 1), 1))
    old = world.launchers[0].launched[0]
    agent.handle(message(launch("job_a", 2), 2))
    run_until(agent, lambda: phase(world, "job_a/1") == "DONE", what="attempt 1 stopped")
    assert not alive(old.pid) and phase(world, "job_a/2") == "RUNNING"
    assert [(a, e["type"]) for _, a, e in world.api.events] == [(1, "STARTED"), (2, "STARTED")]
    agent.handle(message(launch("job_a", 1), 3))  # a late duplicate of the old attempt
    assert len(world.launchers[0].launched) == 2


def test_a_cancel_of_an_attempt_that_ended_is_answered_again(world):
    agent = world.agent()
    agent.handle(message(launch(command=["true"]), 1))
    run_until(agent, lambda: phase(world) == "DONE", what="done")
    agent.handle(message(cancel(), 2))
    assert world.api.of("STOPPED") == [{"type": "STOPPED", "ranks": [0], **NODE}]


def test_attempts_that_ended_long_ago_are_forgotten_but_their_logs_kept(world):
    world.now = 1000.0
    agent = world.agent()
    agent.handle(message(launch(command=["sh", "-c", "echo bye"]), 1))
    run_until(agent, lambda: phase(world) == "DONE", what="done")
    assert world.paths.exit_file("job_a", 1, 0).exists()
    world.now += 15 * 86400
    agent.tick()
    assert "job_a/1" not in world.state()["attempts"]
    assert not world.paths.exit_file("job_a", 1, 0).exists()
    assert lines_of(world.paths.log_file("job_a", 1, 0).read_bytes()) == ["bye"]


def test_a_rank_whose_log_cannot_be_written_exits_127(world):
    world.paths.log_dir.parent.mkdir(parents=True, exist_ok=True)
    world.paths.log_dir.write_text("a file where the log directory should be")
    agent = world.agent()
    agent.handle(message(launch(ranks=[0, 1]), 1))
    run_until(agent, lambda: world.api.of("EXITED"), what="EXITED")
    assert world.api.of("EXITED") == [{"type": "EXITED", "ranks": [0, 1], "exit_code": 127,
                                       **NODE}]
    assert world.launchers[0].launched[0].pid is None


class FailingOnce:
    """A launcher that raises on its second launch the first time (a launch failing
    half-way with an error the agent survives)."""

    def __init__(self, launcher):
        self.launcher, self.failed = launcher, False

    def __getattr__(self, name):
        return getattr(self.launcher, name)

    def launch(self, *args, **kwargs):
        if len(self.launcher.launched) == 1 and not self.failed:
            self.failed = True
            raise OSError("too many open files")
        return self.launcher.launch(*args, **kwargs)


def test_a_launch_that_failed_half_way_is_finished_when_the_message_comes_back(world):
    inner = RecordingLauncher()
    world.launchers.append(inner)
    agent = world.agent(launcher=FailingOnce(inner))
    with pytest.raises(OSError):
        agent.handle(message(launch(ranks=[0, 1]), 1))
    assert world.inbox.deleted == [] and len(inner.launched) == 1
    agent.handle(message(launch(ranks=[0, 1]), 2))  # the redelivery
    assert len(inner.launched) == 2  # rank 1 started now, rank 0 not again
    assert phase(world) == "RUNNING" and world.inbox.deleted == ["m-2"]
    assert world.api.of("STARTED") == [{"type": "STARTED", "ranks": [0, 1], **NODE}]


def test_ranks_import_the_agents_copy_of_the_helper_from_its_state_folder(world):
    """Invariant: the rank-side helper a rank imports is a copy in the agent's
    state folder (which ranks pass through), never only the agent's install,
    which may be out of a rank's reach (a checkout under a 0700 home, as
    root); the copy is the agent's own file, 0644 in a 0755 folder, written
    again whole at each start."""
    import stat

    from agent.core import HELPER, RANKSIDE

    copy = world.paths.rankside_dir / HELPER
    world.agent()
    assert copy.read_bytes() == (Path(RANKSIDE) / HELPER).read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o644
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o755
    copy.write_text("stale")
    world.agent()
    assert copy.read_bytes() == (Path(RANKSIDE) / HELPER).read_bytes(), "renewed at start"
    assert sorted(p.name for p in copy.parent.iterdir()) == [HELPER], "no temporary left"
