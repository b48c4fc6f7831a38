"""``python -m agent``: the host agent's command line.

Every option can also be given as an environment variable GPUJOBS_AGENT_<NAME>
(``--node-id`` is GPUJOBS_AGENT_NODE_ID; ``--label`` is GPUJOBS_AGENT_LABELS,
comma-separated ``k=v``). The command line wins.

The agent token comes from ``--token-file`` (a file of mode 0600: one that the
group or others may read is refused, exit 2; or ``-`` for stdin), or, for
compatibility, from GPUJOBS_AGENT_TOKEN, which is removed from the environment
before anything else runs, so no child inherits it, but which stays in the
kernel's copy of the agent's starting environment, ``/proc/<pid>/environ``,
for root to read: use the file. ``--token`` on the command line is refused
(every user reads argv in ``ps``). See agent/isolation.py and docs/security.md.

Exit status: 0 after SIGTERM or SIGINT; 2 for bad arguments, no AWS credentials, a state directory
in use by another agent or unreadable, or a registration the API refuses
outright (401, 403, 400: a wrong token, node id or URL; retrying cannot help).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from typing import Mapping

from .api import ApiError
from .cgroups import DEFAULT_PIDS_MAX
from .isolation import (
    TOKEN_ENV,
    IsolationError,
    isolation_name,
    make_non_dumpable,
    parse_job_roots,
    read_token_file,
    take_token_from_env,
)
from .logship import LOG_QUOTA_BYTES
from .runner import Settings, StateDirBusy, run
from .state import StateError
from .uidpool import DEFAULT_RANK_UIDS, UidRangeError, check_range, parse_range
from .watchdog import STALL_S

ENV_PREFIX = "GPUJOBS_AGENT_"


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a label is key=value, got {text!r}")
    return key, value


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


def _watchdog(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"0 (no watchdog) or more seconds, got {text}")
    return value


def _poll_wait(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 20:
        raise argparse.ArgumentTypeError("SQS long polls last 0 to 20 seconds")
    return value


def _job_roots(text: str) -> tuple[str, ...]:
    try:
        return parse_job_roots(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _level(text: str) -> str:
    if text.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise argparse.ArgumentTypeError(f"not a log level: {text!r}")
    return text.upper()


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent",
        description="gpujobs host agent: runs the ranks placed on this node. Every option "
                    f"may also come from the environment as {ENV_PREFIX}<NAME>.")

    def opt(name: str, text: str, *, type=str, default=None, required=False) -> None:  # noqa: A002
        env_name = ENV_PREFIX + name.upper().replace("-", "_")
        env_value = environ.get(env_name)
        if env_value is not None:
            try:
                default, required = type(env_value), False
            except (ValueError, argparse.ArgumentTypeError) as e:
                p.error(f"{env_name}={env_value!r}: {e}")
        p.add_argument(f"--{name}", type=type, default=default, required=required,
                       help=f"{text} [{env_name}]")

    opt("node-id", "this node's id (the agent token must be bound to it or to *)",
        required=True)
    opt("gpus", "GPU slots on this node", type=_positive(int), required=True)
    opt("gpu-type", "GPU type, e.g. h100 (jobs asking for a type are placed only on it)",
        required=True)
    opt("api", "base URL of the gpujobs API, e.g. http://127.0.0.1:8000", required=True)
    opt("token-file", "file holding the agent bearer token, readable by its owner alone "
        "(mode 0600: a file the group or others may read is refused) ('-': the first "
        "line of stdin). "
        f"{TOKEN_ENV} also works, but stays readable in /proc/<pid>/environ to root")
    opt("rank-uids", "FIRST-LAST: the pool of uids the agent, run as root, runs each job's "
        "ranks as, one uid per job on this node (no passwd entries needed; a range holding "
        "root, a user, a group or a subuid range is refused). '' runs ranks as the agent "
        "itself, with NO ISOLATION between jobs (isolation none), loudly",
        default=DEFAULT_RANK_UIDS)
    opt("state-dir", "directory for the state file, exit files and heartbeat files",
        required=True)
    opt("job-roots", "folders (':'-separated, absolute) of shared storage where the agent, "
        "as root, makes each job's checkpoint directory and gives it to the job's uid, "
        "following no link; a checkpoint directory elsewhere is made by the ranks as "
        "their own uid. Never the state directory", type=_job_roots, default=())
    opt("job-pids-max", "processes and threads each job's cgroup may hold on this node "
        "(agent/cgroups.py; run as root)", type=_positive(int), default=DEFAULT_PIDS_MAX)
    opt("job-memory-max", "bytes of memory each job's cgroup may use on this node "
        "(default: no limit)", type=_positive(int))
    opt("log-dir", "rank logs go to <log-dir>/<job_id>/<attempt>/rank-<r>.log "
        "(default: <state-dir>/logs)")
    opt("grace-s", "seconds between SIGTERM and SIGKILL on cancel", type=_positive(float),
        default=10.0)
    opt("poll-wait-s", "SQS long-poll wait, 0..20 s", type=_poll_wait, default=20)
    opt("node-heartbeat-s", "seconds between node heartbeats (PUT /v1/nodes/{id}, or on "
        "a heartbeat POST of its ranks)", type=_positive(float), default=10.0)
    opt("busy-call-in-s", "seconds between node heartbeats while the ranks' heartbeat POSTs "
        "succeed (they show the node alive)", type=_positive(float), default=300.0)
    opt("address", "where other nodes reach this one (MASTER_ADDR when it holds rank 0); "
        "default: the node id as a host name")
    opt("watchdog-s", "warn when a pass of the agent's main loop takes longer than this "
        "(0: no watchdog)", type=_watchdog, default=STALL_S)
    opt("log-quota-bytes", "what each rank may ship to CloudWatch Logs in one attempt, "
        "counted as PutLogEvents counts it (each line's UTF-8 plus 26 bytes); past it the "
        "agent ships one line saying so, then nothing more of that rank's output in that "
        "attempt", type=_positive(int), default=LOG_QUOTA_BYTES)
    opt("log-level", "DEBUG, INFO, WARNING or ERROR", type=_level, default="INFO")
    env_labels = environ.get(ENV_PREFIX + "LABELS")
    try:
        labels = [_label(t) for t in env_labels.split(",") if t] if env_labels else None
    except argparse.ArgumentTypeError as e:
        p.error(f"{ENV_PREFIX}LABELS: {e}")
    p.add_argument("--label", "--labels", dest="labels", type=_label, action="append",
                   default=labels,
                   help=f"node label key=value, repeatable [{ENV_PREFIX}LABELS=k=v,k2=v2]; "
                        "command-line labels are added to those")
    return p


def parse_settings(argv: list[str] | None = None,
                   environ: Mapping[str, str] | None = None,
                   stdin=None) -> tuple[Settings, str]:
    environ = os.environ if environ is None else environ
    parser = build_parser(environ)
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--token" or a.startswith("--token=") for a in argv):
        parser.error("--token on the command line is readable by every process on the host "
                     f"(/proc/<pid>/cmdline): use --token-file or {TOKEN_ENV}")
    args = parser.parse_args(argv)
    try:
        token = read_token_file(args.token_file, stdin) if args.token_file \
            else environ.get(TOKEN_ENV)
    except IsolationError as e:
        parser.error(str(e))
    if not token:
        parser.error(f"no agent token: give --token-file or set {TOKEN_ENV}")
    settings = Settings(node_id=args.node_id, gpus=args.gpus, gpu_type=args.gpu_type,
                        api=args.api, token=token, state_dir=args.state_dir,
                        log_dir=args.log_dir, labels=dict(args.labels or []),
                        grace_s=args.grace_s, poll_wait_s=args.poll_wait_s,
                        node_heartbeat_s=args.node_heartbeat_s,
                        busy_call_in_s=args.busy_call_in_s, address=args.address,
                        watchdog_s=args.watchdog_s, log_quota_bytes=args.log_quota_bytes,
                        job_roots=args.job_roots, job_pids_max=args.job_pids_max,
                        job_memory_max=args.job_memory_max)
    try:
        settings.rank_uids = parse_range(args.rank_uids)
    except UidRangeError as e:
        parser.error(str(e))
    return settings, args.log_level


NO_CREDENTIALS = (
    "gpujobs-agent: no AWS credentials to read the inbox with. On a host, give the agent "
    "a role (instance profile) or AWS_PROFILE / AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "and AWS_REGION; against `make up` any will do, e.g. "
    "AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local (see agent/README.md)")


def has_aws_credentials() -> bool:
    """boto3's usual chain (environment, profile, container or instance role)."""
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def main(argv: list[str] | None = None) -> int:
    # before anything else: /proc/<pid>/environ, mem and ptrace closed to ranks;
    # the token out of the environment every child would inherit; private files
    make_non_dumpable()
    environ = dict(os.environ)
    take_token_from_env(os.environ)
    os.umask(0o077)
    settings, level = parse_settings(argv, environ)
    if not has_aws_credentials():  # else every receive fails, retried for ever
        print(NO_CREDENTIALS, file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    wanted = settings.rank_uids
    if os.geteuid() != 0:
        settings.rank_uids = None
    elif wanted is not None:
        try:
            check_range(wanted)
        except UidRangeError as e:
            print(f"gpujobs-agent: {e}; name a free range with --rank-uids FIRST-LAST",
                  file=sys.stderr, flush=True)
            return 2
    if settings.rank_uids is None:
        why = ("--rank-uids is empty" if os.geteuid() == 0 or wanted is None else
               f"not running as root, the agent cannot run ranks as uids {wanted}")
        print(f"gpujobs-agent: WARNING: NO RANK ISOLATION. {why}: every job's ranks run as "
              f"this user, share its files, can signal each other and the agent. The node "
              f"reports isolation \"none\". Run the agent as root, with a --rank-uids pool, "
              f"on hosts that run other people's code.", file=sys.stderr, flush=True)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def ready(node: dict) -> None:
        print(f"gpujobs-agent {settings.node_id} ready: {settings.gpus} x {settings.gpu_type}, "
              f"inbox {node.get('inbox_queue_url')}, state {settings.state_dir}, isolation "
              f"{isolation_name(settings.rank_uids is not None)}"
              + (f" (a uid per job from {settings.rank_uids})"
                 if settings.rank_uids is not None else ""),
              flush=True)

    try:
        return run(settings, stop, on_ready=ready)
    except (StateDirBusy, StateError) as e:
        print(f"gpujobs-agent: {e}", file=sys.stderr, flush=True)
        return 2
    except ApiError as e:  # refused outright: a wrong token, node id or API URL
        print(f"gpujobs-agent: the API refused to register node {settings.node_id}: {e}",
              file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
