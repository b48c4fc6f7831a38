"""``gpujobs``: the command line of the gpujobs API.

Only click is imported at start; the HTTP client (requests) and the tables
(rich) are imported by the commands that use them, so ``gpujobs --help`` and
``-o json`` commands start fast.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn

import click

from . import __version__
from .config import (
    ENV_VARS,
    KEYS,
    ConfigError,
    config_path,
    load_file,
    resolve,
    save_file,
    state_dir,
)
from .errors import ApiError, GpujobsError, TransportError
from .term import clean, dumps, wants_colour

if TYPE_CHECKING:  # pragma: no cover
    from datetime import datetime

    from rich.console import Console, RenderableType

    from .client import Client
    from .config import LocalStack, Resolved
    from .models import Attempt, Cordon, Job, JobHealth, LogLine, Node, Ranks, Usage, Verdict

# -- exit codes (documented in --help and client/README.md; tested) ---------------
EXIT_OK = 0
EXIT_API_ERROR = 1        # the API refused the request (a 4xx other than 404, 409)
EXIT_USAGE = 2            # bad flags or arguments, no token, unreadable config or spec file
EXIT_NOT_FOUND = 3        # 404: no such job (or not yours), node or path
EXIT_CONFLICT = 4         # 409: already finished, stale attempt, request still in progress
EXIT_SERVER = 5           # 5xx or 429 after the retry budget, or an answer that is not JSON
EXIT_CONNECTION = 6       # no answer: connection refused or dropped, timeout
EXIT_WAIT_TIMEOUT = 7     # --wait / --timeout: the job not terminal, the node not drained, in time
# how a followed job ended (watch, submit --wait, cancel --wait): SUCCEEDED is 0;
# the two others have a code each, after the existing ones, under 64 (sysexits)
# and 126 (the shell's), as `sky logs` gives FAILED and CANCELLED codes of their own
EXIT_FAILED = 8           # the job ended FAILED
EXIT_CANCELLED = 9        # the job ended CANCELLED (not for cancel --wait: that is 0, asked for)
EXIT_INTERRUPTED = 130    # Ctrl-C
EXIT_BUG = 70             # an unexpected error in the CLI itself (a bug; GPUJOBS_DEBUG=1 shows it)

EPILOG = """\b
Configuration (highest first): --api-url/--token, GPUJOBS_API_URL/GPUJOBS_TOKEN,
the config file ($XDG_CONFIG_HOME/gpujobs/config.toml, see `gpujobs config`),
the file a running `make up` writes (.gpujobs-local/cli.toml, found from
anywhere in the checkout), then http://127.0.0.1:8000.

\b
Exit codes:
  0  ok
  1  the API refused the request (400, 401, 403, 413, 415, 422, ...)
  2  usage: bad flags or arguments, no token, bad config or spec file,
     nothing configured outside a checkout (no local stack to find)
  3  not found (404)
  4  conflict (409: already_finished, stale_attempt, request_in_progress)
  5  server error or unavailable (5xx, 429) after retries
  6  cannot reach the API (connection refused or dropped, timeout), or
     no local stack running (none found in the checkout, down, starting)
  7  gave up waiting (--timeout of submit --wait, cancel --wait, watch,
     nodes drain --wait)
  8  the job ended FAILED (watch, submit --wait, cancel --wait)
  9  the job ended CANCELLED (watch, submit --wait; cancel --wait: 0)
  70 unexpected error in the CLI itself (a bug; GPUJOBS_DEBUG=1 shows it)
  130 interrupted (Ctrl-C)

\b
With -o json, stdout holds JSON only; an error is one JSON object on stderr:
{"error": {problem JSON}, "exit_code": N}.
"""

STATE_STYLE = {"PENDING": "yellow", "SCHEDULED": "cyan", "RUNNING": "bold blue",
               "SUCCEEDED": "bold green", "FAILED": "bold red", "CANCELLED": "magenta"}
HEALTH_STYLE = {"OK": "green", "STALLED": "bold red", "UNKNOWN": "dim"}


class WaitGaveUp(GpujobsError):
    def __init__(self, message: str, job: "Job") -> None:
        super().__init__(message)
        self.job = job


class NodeWaitGaveUp(GpujobsError):
    """``nodes drain --wait --timeout``: the node still had GPUs in use (exit 7)."""

    def __init__(self, message: str, node: "Node") -> None:
        super().__init__(message)
        self.node = node
        self.hint = (f"the drain goes on; `gpujobs nodes {node.node_id}` shows what is left, "
                     f"`gpujobs nodes drain {node.node_id}` (without --wait) preempts it")


class JobEnded(GpujobsError):
    """A followed job ended FAILED or CANCELLED: exit 8 or 9. The command has
    already printed the final state (stdout); with -o json, stderr also gets
    the error object, as for any non-zero exit."""

    def __init__(self, job: "Job") -> None:
        super().__init__(f"job {job.id} ended {job.state}{exit_note(job)}")
        self.job = job


def exit_note(job: "Job") -> str:
    """' (rank_failed, exit code 1)': how a finished job ended, or ''; a
    pipeline's or an array's end with its detail: ' (dependency_failed:
    job_x ended FAILED; this job needed it to succeed)'."""
    if job.exit is None:
        return ""
    from .pipelines import PIPELINE_REASONS
    if job.exit.reason in PIPELINE_REASONS and job.exit.detail:
        return f" ({job.exit.reason}: {job.exit.detail})"
    code = "" if job.exit.exit_code is None else f", exit code {job.exit.exit_code}"
    return f" ({job.exit.reason}{code})"


def exit_text_of(job: "Job") -> str:
    """The job's exit in words (lifecycle.exit_text), or '-'."""
    if job.exit is None:
        return "-"
    from .lifecycle import exit_text
    return exit_text(job.exit.raw)


def decision_note(job: "Job") -> str:
    """' — not retried (rule 1 says fail)': the retry rules' decision on how a
    finished job ended, or ''."""
    if job.exit is None or not job.exit.decision:
        return ""
    from .lifecycle import decision_rest
    rest = decision_rest(job.exit.raw)
    return f" — {rest}" if rest else ""


def check_outcome(job: "Job", *, asked_to_cancel: bool = False) -> None:
    """Exit 8 when ``job`` ended FAILED, 9 when CANCELLED, unless the command
    asked for the cancel (cancel --wait: then CANCELLED is the success)."""
    if job.state == "FAILED" or (job.state == "CANCELLED" and not asked_to_cancel):
        raise JobEnded(job)


# -- settings shared by the group and every command --------------------------------
def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None and value != ():
            ctx.meta[f"gpujobs.{key}"] = value
        return value
    return callback


def _setting(key: str, default: Any = None) -> Any:
    return click.get_current_context().meta.get(f"gpujobs.{key}", default)


def common_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--api-url, --token, -o/--output, --request-timeout and --retries,
    accepted before or after the command."""
    f = click.option("--retries", type=click.IntRange(0, 20), default=None, expose_value=False,
                     envvar="GPUJOBS_RETRIES", callback=_remember("retries"),
                     help="Retries of a failed request, where safe (default 4) "
                          "[env GPUJOBS_RETRIES].")(f)
    f = click.option("--request-timeout", type=click.FloatRange(min=0.1), default=None,
                     expose_value=False, callback=_remember("timeout"), metavar="SECONDS",
                     help="Timeout of each HTTP request (default 10).")(f)
    f = click.option("-o", "--output", type=click.Choice(["table", "json"], case_sensitive=False),
                     default=None, expose_value=False, callback=_remember("output"),
                     help="table (for people, the default) or json (for scripts).")(f)
    f = click.option("--token", default=None, expose_value=False, callback=_remember("token"),
                     metavar="TOKEN", help="Bearer token [env GPUJOBS_TOKEN].")(f)
    f = click.option("--api-url", default=None, expose_value=False, callback=_remember("api_url"),
                     metavar="URL", help="API base URL [env GPUJOBS_API_URL].")(f)
    return f


def json_mode() -> bool:
    return str(_setting("output") or "table").lower() == "json"


def make_client(need_token: bool = True) -> "Client":
    cfg = resolve(_setting("api_url"), _setting("token"))
    click.get_current_context().meta["gpujobs.resolved"] = cfg  # for the errors' hints
    if need_token and not cfg.token:
        raise no_token_error(cfg)
    from .client import Client
    from .retry import RetryPolicy
    retries = _setting("retries")
    policy = RetryPolicy() if retries is None else RetryPolicy(max_attempts=retries + 1)
    return Client(cfg.api_url, cfg.token or "", timeout=_setting("timeout", 10.0), retry=policy)


#: how long a command that follows a job (watch, logs -f, the --wait of submit,
#: cancel and nodes drain) keeps retrying one read through an outage: a
#: restart of the control plane takes 6 to 14 s on the 2-core machine
RIDE_OUT_S = 60.0


class Outage:
    """What a following command says on stderr while the API does not
    answer and once it does again (nothing with -o json: stderr is for the
    error object), and the local stack's new address when a restarted stack
    wrote one (its PORT may be another)."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self.since: float | None = None
        self.quiet = json_mode()
        self.flags = (_setting("api_url"), _setting("token"))

    def say(self, text: str) -> None:
        if not self.quiet:
            click.echo(clean(f"gpujobs: {text}", newlines=True), err=True)

    def on_retry(self, attempt: int, delay: float, error: GpujobsError) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self.say(f"the API at {self.client.api_url} does not answer ({error}); retrying "
                     f"for up to {RIDE_OUT_S:g} s (a restart of the control plane takes "
                     "seconds), then going on from where this left off")
        cfg = resolve(*self.flags)
        if cfg.sources.get("api_url") == "local stack" and cfg.api_url != self.client.api_url:
            self.say(f"the local stack now answers at {cfg.api_url} (its file "
                     f"{cfg.local_path})")
            self.client.api_url = cfg.api_url
        if cfg.sources.get("token") == "local stack" and cfg.token:
            self.client.token = cfg.token

    def on_recover(self, attempts: int, elapsed_s: float) -> None:
        if self.since is not None:
            self.say(f"the API answers again, after {time.monotonic() - self.since:.1f} s; "
                     "going on")
        self.since = None


def ride_out(client: "Client") -> "Client":
    """``client``, from now on retrying each read through an outage of up to
    RIDE_OUT_S (capped backoff with jitter, --retries still caps the sends),
    for the commands that follow a job: a restart of the stack costs them a
    pause, not the command; they go on from where they were."""
    from .retry import RetryPolicy
    retries = _setting("retries")
    client.retry = RetryPolicy(max_attempts=1_000_000 if retries is None else retries + 1,
                               max_elapsed_s=RIDE_OUT_S, base_delay_s=0.25, max_delay_s=4.0)
    outage = Outage(client)
    client.on_retry, client.on_recover = outage.on_retry, outage.on_recover
    return client


# -- where the API is, in words: which of these went wrong -------------------------------
class NoApi(GpujobsError):
    """No API to talk to, said as what it is: no token configured for an
    API, no local stack found, the local stack down or starting, or a
    folder outside the checkout (where no stack can be found). Each has its
    own ``code`` (``-o json``) and exit code: 2 for what configuration
    fixes, 6 for a stack that is not running (no API to reach)."""

    def __init__(self, code: str, title: str, detail: str, hint: str, exit_code: int) -> None:
        super().__init__(f"{title}: {detail}")
        self.code, self.title, self.detail, self.hint = code, title, detail, hint
        self.exit_code = exit_code


CONFIGURE_OTHER = ("for another API, set GPUJOBS_API_URL and GPUJOBS_TOKEN (or `gpujobs config "
                   "set api_url URL` and `gpujobs config set token TOKEN`)")


def _source_words(cfg: "Resolved", key: str) -> str:
    """Where a setting came from, as a person would look for it."""
    return {"flag": f"--{key.replace('_', '-')}", "env": ENV_VARS[key],
            "file": f"the config file {cfg.path}",
            "local stack": f"the local stack's file {cfg.local_path}",
            "default": "the default"}.get(cfg.sources.get(key, ""), "?")


def stack_error(where: "LocalStack") -> NoApi | None:
    """The error that says where the local stack stands, when it is not
    running (None when it is)."""
    run_it = f"`make up` at {where.checkout}" if where.checkout else "`make up` in the checkout"
    if where.state == "outside":
        return NoApi(
            "outside_checkout", "No API configured, and no local stack to find from here",
            f"{where.cwd} is outside a gpujobs checkout, and gpujobs finds a running `make up` "
            "only from inside its checkout (its .gpujobs-local/cli.toml)",
            "run the command from inside the checkout, or set GPUJOBS_STATE_DIR to its "
            f".gpujobs-local folder; {CONFIGURE_OTHER}", EXIT_USAGE)
    if where.state == "none":
        detail = (f"GPUJOBS_STATE_DIR={where.state_dir} is no stack's state folder"
                  if where.checkout is None or os.environ.get("GPUJOBS_STATE_DIR") else
                  f"no `make up` has run in the checkout {where.checkout} (it has no "
                  ".gpujobs-local folder)")
        return NoApi("no_stack", "No local stack found", detail,
                     f"start one with {run_it} and wait for its line with \"ready\"; "
                     + CONFIGURE_OTHER, EXIT_CONNECTION)
    if where.state == "down":
        return NoApi(
            "stack_down", "The local stack is down",
            f"{where.state_dir} has no {where.file.name if where.file else 'cli.toml'}, which "
            "`make up` writes once it is ready and removes when it stops, and no process "
            "holds the folder",
            f"start it again with {run_it} (it keeps every job), wait for its line with "
            "\"ready\", then run the command again", EXIT_CONNECTION)
    if where.state == "starting":
        return NoApi(
            "stack_starting", "The local stack is starting",
            f"a `make up` holds {where.state_dir} but has not written its address yet (it does "
            "once the API and its agents are ready)",
            "wait for its line with \"ready\", then run the command again", EXIT_CONNECTION)
    return None


def no_token_error(cfg: "Resolved") -> NoApi:
    """No token: for an API the user named, that is all there is to say;
    with nothing configured, where the local stack stands says why."""
    if cfg.sources.get("api_url") in ("default", "local stack"):
        from .config import local_stack
        err = stack_error(local_stack())
        if err is not None:
            return err
    return NoApi("no_token", "No API token",
                 f"nothing gives a token for {cfg.api_url} (from "
                 f"{_source_words(cfg, 'api_url')})",
                 "pass --token, set GPUJOBS_TOKEN, or run `gpujobs config set token TOKEN`",
                 EXIT_USAGE)


def explain(e: GpujobsError) -> GpujobsError:
    """``e`` said as what went wrong where the user can act: an API that
    does not answer where only the local stack could be (down, never
    started, outside the checkout), or a token the API does not know (and
    where that token came from)."""
    ctx = click.get_current_context(silent=True)
    cfg = ctx.meta.get("gpujobs.resolved") if ctx is not None else None
    if cfg is None or e.hint is not None:
        return e
    from .errors import Unauthenticated
    if isinstance(e, TransportError):
        source = cfg.sources.get("api_url")
        if source in ("default", "local stack"):
            from .config import local_stack
            where = local_stack()
            err = stack_error(where)
            if err is not None:
                return err
            from .client import never_sent
            refused = e.__cause__ is not None and never_sent(e.__cause__)
            if source == "local stack" and where.state == "running" and refused:
                return NoApi(
                    "stack_down", "The local stack is down",
                    f"nothing answers at {cfg.api_url}, the address in {cfg.local_path} "
                    f"({e})",
                    "it was stopped without removing that file (kill -9), or is restarting: "
                    f"start it with `make up` at {where.checkout or 'the checkout'}, or wait "
                    "for its line with \"ready\", then run the command again",
                    EXIT_CONNECTION)
        e.hint = (f"is the API running at {cfg.api_url}? (the address from "
                  f"{_source_words(cfg, 'api_url')})")
    elif isinstance(e, Unauthenticated):
        came_from = _source_words(cfg, "token")
        hint = (f"the API at {cfg.api_url} does not know the token from {came_from} "
                f"({_mask(cfg.token) or 'none'})")
        if cfg.sources.get("token") != "local stack" and cfg.local_path is not None \
                and load_file(cfg.local_path).get("token"):
            hint += (f"; the running local stack's own token is in {cfg.local_path}: leave "
                     f"out {came_from} to use it")
        else:
            hint += ("; pass one it knows with --token, GPUJOBS_TOKEN or `gpujobs config set "
                     "token TOKEN`")
        e.hint = hint
    return e


# -- output ---------------------------------------------------------------------------
def out_json(value: Any) -> None:
    click.echo(dumps(value, indent=2))


def console(stderr: bool = False) -> "Console":
    from rich.console import Console
    c = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c.width = 1000  # piped: whole lines, no truncated columns
    return c


def styled_state(state: str) -> str:
    return f"[{STATE_STYLE.get(state, '')}]{state}[/]" if state in STATE_STYLE else state


def gang_text(spec: dict) -> str:
    """``4 ranks x 1 GPU (h100)``, ``1 rank x 8 GPUs (any type)``."""
    ranks, gpus = int(spec.get("ranks") or 1), int(spec.get("gpus_per_rank") or 1)
    return (f"{ranks} rank{'s' if ranks != 1 else ''} x {gpus} GPU{'s' if gpus != 1 else ''} "
            f"({spec.get('gpu_type') or 'any type'})")


def short_time(value: str | None) -> str:
    if not value:
        return "-"
    return value.replace("T", " ").split(".")[0].rstrip("Z") + "Z"


#: a rank status's words where they are not its name's (rank_status)
STATUS_WORDS = {"live": "ok", "awaiting_first_beat": "waiting for the first beat"}


def rank_status(r) -> str:
    """A rank's status as the server says it, in words: ``STALLED``, ``ok``
    (live), ``waiting``, ``waiting for the first beat``, ``not
    instrumented``...; from a server that sends no status, what its silence
    says."""
    if r.stalled or r.status == "stalled":
        return "STALLED"
    if r.status is None:
        return "ok" if r.last_heard_at else "not heard yet"
    return STATUS_WORDS.get(r.status, r.status.replace("_", " "))


def health_text(job: "Job") -> str:
    """The job's health status as rich markup, with what the server knows
    of its instrumentation while it runs unjudged by beats (mode auto, no
    beat yet): ``UNKNOWN (waiting for the first beat)`` while
    ``health.instrumented`` is null (within the startup grace: the first
    beat may still come), ``UNKNOWN (not instrumented)`` once it is false."""
    h = job.health
    text = f"[{HEALTH_STYLE.get(h.status, '')}]{h.status}[/]"
    mode = (job.spec.get("heartbeat") or {}).get("mode", "auto")
    if job.state == "RUNNING" and h.status == "UNKNOWN" and mode == "auto" \
            and "instrumented" in h.raw and h.raw["instrumented"] is not True:
        text += (" (waiting for the first beat)" if h.raw["instrumented"] is None
                 else " (not instrumented)")
    return text


def fmt_silence(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def ranges(numbers: Iterable[int]) -> str:
    """0,1,2,5 -> '0-2,5'."""
    nums = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


def escape(text: Any) -> str:
    """Text from the server (names, reasons, stacks, details), as rich markup
    that prints it literally and obeys none of its control sequences
    (gpujobs_client/term.py)."""
    from rich.markup import escape as rich_escape
    return rich_escape(clean("" if text is None else str(text), newlines=True))


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


# -- which rank stopped: the server's verdict, shown first everywhere -----------------
def verdict_of(job: "Job", ranks: "Ranks | None" = None) -> "Verdict | None":
    """The verdict /ranks sent with the ranks, else the job's health.verdict."""
    return (ranks.verdict if ranks is not None else None) or job.health.verdict


def verdict_lines(v: "Verdict") -> list[str]:
    """The verdict as people read it (rich markup): its sentence first, then
    the named rank's stack when known, then how it was reached."""
    lines = [f"[bold red]Verdict:[/] [bold]{escape(v.text)}[/]"]
    if v.stack:
        lines.append(f"Stack: {escape(v.stack)}")
    lines.append(f"[dim]by {escape(v.by)}, confidence {escape(v.confidence)}[/]")
    return lines


#: how the order of the ranks by silence is labelled wherever it is shown:
#: evidence the verdict weighs, never a second verdict (issue 47)
SILENCE_ORDER = "silence order (evidence, not the verdict)"
#: the caption of a rank table's order
TABLE_ORDER = "silent longest first"


def silence_note(h: "JobHealth") -> str:
    """Secondary, and labelled as evidence: the rank silent longest
    (health.first_stalled_rank, the contract's "first stalled" rank), which
    is not necessarily the one that stopped: every rank of one node's post
    shares its receive time, and ties go to the lowest rank."""
    heard = short_time(h.last_heard_at) if h.last_heard_at else "never"
    note = f"{SILENCE_ORDER}: rank {h.first_stalled_rank} silent longest (last heard {heard})"
    co = [c.get("rank") for c in h.raw.get("co_first") or [] if isinstance(c, dict)]
    if co:
        note += f"  co-first {escape(ranges(r for r in co if r is not None))}"
    if h.raw.get("suspect_node"):
        note += f"  suspect node {escape(h.raw['suspect_node'])}"
    return note


def incident_note(h: "JobHealth") -> str:
    """When the open (or last) stall was detected, and which ranks it holds."""
    return f"stall detected {short_time(h.detected_at)}; {stalled_ranks_text(h)}"


def stack_line(stack: dict[str, Any]) -> str:
    """One entry of a rank_stopped event's stacks: 'rank 3: train.py:88 in forward → ...'."""
    return f"rank {stack.get('rank')}: {stack.get('where') or '?'}"


# -- errors -------------------------------------------------------------------------
def exit_code_for(e: BaseException) -> int:
    if isinstance(e, ApiError):
        if e.status == 404:
            return EXIT_NOT_FOUND
        if e.status == 409:
            return EXIT_CONFLICT
        if e.status >= 500 or e.status == 429:
            return EXIT_SERVER
        return EXIT_API_ERROR
    if isinstance(e, TransportError):
        return EXIT_CONNECTION
    if isinstance(e, ConfigError):
        return EXIT_USAGE
    if isinstance(e, NoApi):
        return e.exit_code
    if isinstance(e, (WaitGaveUp, NodeWaitGaveUp)):
        return EXIT_WAIT_TIMEOUT
    if isinstance(e, JobEnded):
        return EXIT_FAILED if e.job.state == "FAILED" else EXIT_CANCELLED
    return EXIT_SERVER  # InvalidResponse and other protocol trouble


def report(e: GpujobsError) -> int:
    """Print ``e`` readably on stderr (never a traceback); return the exit code."""
    code = exit_code_for(e)
    hint = getattr(e, "hint", None)
    if json_mode():
        if isinstance(e, ApiError):
            err: dict[str, Any] = dict(e.problem)
        elif isinstance(e, TransportError):
            err = {"code": "connection_error", "title": "Cannot reach the API", "detail": str(e)}
        elif isinstance(e, ConfigError):
            err = {"code": "config_error", "title": "Configuration error", "detail": str(e)}
        elif isinstance(e, NoApi):
            err = {"code": e.code, "title": e.title, "detail": e.detail}
        elif isinstance(e, WaitGaveUp):
            err = {"code": "wait_timeout", "title": "Gave up waiting", "detail": str(e),
                   "job": e.job.raw}
        elif isinstance(e, NodeWaitGaveUp):
            err = {"code": "wait_timeout", "title": "Gave up waiting", "detail": str(e),
                   "node": e.node.raw}
        elif isinstance(e, JobEnded):
            failed = e.job.state == "FAILED"
            err = {"code": "job_failed" if failed else "job_cancelled",
                   "title": "The job failed" if failed else "The job was cancelled",
                   "detail": str(e), "job": e.job.raw}
        else:
            err = {"code": "invalid_response", "title": "Invalid response", "detail": str(e)}
        if hint:
            err["hint"] = hint
        click.echo(dumps({"error": err, "exit_code": code}), err=True)
        return code
    if isinstance(e, JobEnded):
        return code  # the command printed the job's final state already
    if isinstance(e, ApiError):
        title = e.title or "Error"
        line = f"Error: {title} ({e.status} {e.code})"
        if e.detail:
            line += f": {e.detail}"
        if e.field:
            line += f" [field: {e.field}]"
        if e.attempts > 1:
            line += f" (after {e.attempts} attempts)"
    elif isinstance(e, TransportError):
        line = f"Error: cannot reach the API: {e}"
        if e.attempts > 1:
            line += f" (after {e.attempts} attempts)"
    else:
        line = f"Error: {e}"
    click.echo(clean(line, newlines=True), err=True)
    if hint:
        click.echo(clean(f"Hint: {hint}", newlines=True), err=True)
    return code


#: the command line as given (GpujobsGroup.main): whether -o json was asked
#: for is known from it even when click stops before reading that option
_ARGV: list[str] = []


def json_asked() -> bool:
    """-o json, in the settings read so far or anywhere on the command line
    before a ``--`` (what follows is a job's command)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and json_mode():
        return True
    args = _ARGV[:_ARGV.index("--")] if "--" in _ARGV else _ARGV
    for i, arg in enumerate(args):
        if arg in ("-o", "--output") and i + 1 < len(args) and args[i + 1].lower() == "json":
            return True
        if arg.lower() in ("-ojson", "--output=json"):
            return True
    return False


def usage_json(e: click.ClickException) -> int:
    """A usage error (bad flags, arguments or values), as -o json says every
    error is: one JSON object on stderr, the flag named in ``field``."""
    err: dict[str, Any] = {"code": "usage", "title": "Usage error", "detail": e.format_message()}
    if isinstance(e, click.BadParameter):
        param = e.param
        field = e.param_hint if isinstance(e.param_hint, str) else (
            None if param is None else param.opts[0] if isinstance(param, click.Option)
            else param.human_readable_name)
        if field:
            err["field"] = field.strip("'\"")
    click.echo(dumps({"error": err, "exit_code": e.exit_code}), err=True)
    return e.exit_code


class GpujobsGroup(click.Group):
    """Turns SDK errors into a message and an exit code, never a traceback;
    with -o json, every error (usage errors too) is the JSON object."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        _ARGV[:] = list(sys.argv[1:] if args is None else args)
        return super().main(list(_ARGV), prog_name, complete_var, standalone_mode, **extra)

    def make_context(self, info_name: str | None, args: list[str],
                     parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            if not json_asked():
                raise
            raise click.exceptions.Exit(usage_json(e)) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpujobsError as e:
            ctx.exit(report(explain(e)))
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except click.ClickException as e:
            if not json_asked():
                raise
            ctx.exit(usage_json(e))
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:  # a bug in the CLI: say so briefly
            if os.environ.get("GPUJOBS_DEBUG"):
                raise
            click.echo(f"Error: unexpected {type(e).__name__} in the gpujobs CLI: {e} "
                       "(set GPUJOBS_DEBUG=1 for a traceback)", err=True)
            ctx.exit(EXIT_BUG)


@click.group(cls=GpujobsGroup, epilog=EPILOG,
             context_settings={"help_option_names": ["-h", "--help"]})
@common_options
@click.version_option(__version__, "--version", prog_name="gpujobs")
def cli() -> None:
    """Submit, inspect and cancel multi-rank GPU jobs on gpujobs.

    \b
    Quick start:
      gpujobs config set token t1
      gpujobs submit --ranks 2 --gpu-type h100 --name demo -- python train.py --lr 3e-4
      gpujobs list
      gpujobs watch JOB_ID
      gpujobs ranks JOB_ID
      gpujobs cancel JOB_ID --wait
      gpujobs resubmit JOB_ID --with ranks=4
    """


# -- submit -----------------------------------------------------------------------
def _pairs(values: Iterable[str], what: str, *, from_env: bool = False) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
        if not sep:
            if not from_env:
                raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=what)
            if key not in os.environ:
                raise click.BadParameter(f"{key} is not KEY=VALUE and not set in the environment",
                                         param_hint=what)
            value = os.environ[key]
        out[key] = value
    return out


class DurationType(click.ParamType):
    """Whole seconds from 90, 90s, 15m, 4h, 2d or 1h30m (gpujobs_client.lifecycle),
    at most a year (the API's limit)."""
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from .lifecycle import MAX_LIMIT_S, LifecycleError, parse_duration
        try:
            seconds = parse_duration(str(value))
        except LifecycleError as e:
            self.fail(str(e), param, ctx)
        if seconds > MAX_LIMIT_S:
            self.fail(f"{value!r} is longer than a year (365d), the longest limit", param, ctx)
        return seconds


class IntervalType(click.ParamType):
    """A heartbeat interval in seconds, fractions allowed: 10, 0.5, 10s, 2m
    (heartbeat.interval_s: 0.01 to 3,600, API.md)."""
    name = "seconds"
    MIN_S, MAX_S = 0.01, 3600.0

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
            scale = 1.0
            for suffix in ("ms", "s", "m", "h"):
                if text.endswith(suffix):
                    text, scale = text[:-len(suffix)], unit[suffix]
                    break
            try:
                seconds = float(text) * scale
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds (10, 0.5, 10s, 500ms, 2m)",
                          param, ctx)
            if seconds != seconds or seconds in (float("inf"), float("-inf")):
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not self.MIN_S <= seconds <= self.MAX_S:
            self.fail(f"{value!r} is outside 0.01 s to 3600 s (1 h), the interval's range",
                      param, ctx)
        return round(seconds, 6)


#: what each on_stall does, in words (describe, submit)
ON_STALL_WORDS = {"report": "report it (the job keeps running)",
                  "restart": "stop the attempt and start a new one while attempts remain"}


class RetryRuleType(click.ParamType):
    """One retry rule from WHAT[=ACTION] (gpujobs_client.lifecycle.parse_retry_on)."""
    name = "rule"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        from .lifecycle import LifecycleError, parse_retry_on
        try:
            return parse_retry_on(str(value))
        except LifecycleError as e:
            self.fail(str(e), param, ctx)


class WarnSignalType(click.ParamType):
    """A warning signal: SIGUSR1, USR1 or usr1 (one of lifecycle.WARN_SIGNALS)."""
    name = "signal"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        from .lifecycle import WARN_SIGNALS
        name = str(value).strip().upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name not in WARN_SIGNALS:
            self.fail(f"{value!r} is not one of {', '.join(WARN_SIGNALS)}", param, ctx)
        return name


class ArrayRangeType(click.ParamType):
    """An array's indexes from 0-N[%P] or SIZE[%P] (gpujobs_client.pipelines.parse_array)."""
    name = "range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> dict[str, int]:
        if isinstance(value, dict):
            return value
        from .pipelines import PipelineError, parse_array
        try:
            return parse_array(str(value))
        except PipelineError as e:
            self.fail(str(e), param, ctx)


class ArrayEnvType(click.ParamType):
    """NAME=V0,V1,...: one value per index (gpujobs_client.pipelines.parse_array_env)."""
    name = "env"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, list[str]]:
        if isinstance(value, tuple):
            return value
        from .pipelines import PipelineError, parse_array_env
        try:
            return parse_array_env(str(value))
        except PipelineError as e:
            self.fail(str(e), param, ctx)


def pipeline_members(body: dict[str, Any], *, array_range: dict[str, int] | None,
                     array_env: tuple[tuple[str, list[str]], ...],
                     max_failed_indexes: int | None,
                     after: Iterable[tuple[str, str]]) -> None:
    """The pipeline and sweep flags of ``submit`` into ``body`` (the spec
    file's, flags over it): ``--array``, ``--array-env`` and
    ``--max-failed-indexes`` into ``array`` (each member they set replaces
    the file's), the ``--after*`` flags into ``depends_on`` (replacing the
    file's). Checked here as the server would, naming the flag."""
    from .pipelines import PipelineError, check_array_env, check_max_failed, depends_on
    pairs = list(after)
    if pairs:
        try:
            body["depends_on"] = depends_on(pairs)
        except PipelineError as e:
            raise click.BadParameter(str(e), param_hint="--after/--after-ok/--after-notok") \
                from None
    if array_range is None and not array_env and max_failed_indexes is None:
        return
    existing = body.get("array")
    array = dict(existing) if isinstance(existing, dict) else {}
    if array_range is not None:
        array.update(array_range)
    if array_env:
        env = array.get("env")
        array["env"] = {**(env if isinstance(env, dict) else {}), **dict(array_env)}
    if max_failed_indexes is not None:
        array["max_failed_indexes"] = max_failed_indexes
    if "size" not in array:
        flag = "--array-env" if array_env else "--max-failed-indexes"
        raise click.BadParameter("needs --array (or array.size in --file)", param_hint=flag)
    for flag, check in (("--array-env", lambda: check_array_env(
            array, [name for name, _ in array_env])),
            ("--max-failed-indexes", lambda: check_max_failed(array))):
        try:
            check()
        except PipelineError as e:
            raise click.BadParameter(str(e), param_hint=flag) from None
    body["array"] = array


def _absolute_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise click.BadParameter(f"{value!r} is not an absolute path", ctx, param)
    return value


def lifecycle_members(body: dict[str, Any], *, max_runtime: int | None,
                      warn_before: int | None, warn_signal: str | None,
                      max_pending: int | None, checkpoint_dir: str | None,
                      retry_on: tuple[dict[str, Any], ...],
                      max_uncounted_retries: int | None) -> None:
    """The lifecycle flags of ``submit`` into ``body`` (the spec file's,
    flags over it): time limits, the checkpoint directory, the retry rules
    (``--retry-on`` replaces the file's ``retry.rules``, in the order given)."""
    for key, value in (("max_runtime_s", max_runtime), ("warn_before_s", warn_before),
                       ("warn_signal", warn_signal), ("max_pending_s", max_pending),
                       ("checkpoint_dir", checkpoint_dir)):
        if value is not None:
            body[key] = value
    if retry_on or max_uncounted_retries is not None:
        existing = body.get("retry")
        policy = dict(existing) if isinstance(existing, dict) else {}
        if retry_on:
            policy["rules"] = [dict(r) for r in retry_on]
        if max_uncounted_retries is not None:
            policy["max_uncounted_retries"] = max_uncounted_retries
        body["retry"] = policy
    runtime, warn = body.get("max_runtime_s"), body.get("warn_before_s")
    if warn_before is not None and not (isinstance(runtime, int) and warn_before < runtime):
        raise click.BadParameter("must be shorter than --max-runtime (which it needs)",
                                 param_hint="--warn-before")
    if warn_signal is not None and warn is None:
        raise click.BadParameter("needs --warn-before", param_hint="--warn-signal")


def stall_members(body: dict[str, Any], *, on_stall: str | None,
                  heartbeat_interval: float | None) -> None:
    """``--on-stall`` and ``--heartbeat-interval`` into ``body`` (the spec
    file's, flags over it): ``on_stall``, and ``heartbeat.interval_s`` beside
    the file's other heartbeat members."""
    if on_stall is not None:
        body["on_stall"] = on_stall.lower()
    if heartbeat_interval is not None:
        existing = body.get("heartbeat")
        body["heartbeat"] = {**(existing if isinstance(existing, dict) else {}),
                             "interval_s": heartbeat_interval}


def load_spec_file(path: str) -> dict[str, Any]:
    """A job spec from JSON or YAML (``-`` reads stdin)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise click.BadParameter(f"cannot read {path}: {e.strerror or e}",
                                 param_hint="--file") from e
    try:
        if path.lower().endswith(".json"):
            data = json.loads(text)
        else:
            import yaml  # YAML is a superset of JSON, so this reads both
            data = yaml.safe_load(text)
    # YAMLError, JSONDecodeError, also ValueError (a bad date): any parse failure is a bad --file
    except Exception as e:  # noqa: BLE001 - deliberate, see above
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise click.BadParameter(f"{path} is not valid JSON or YAML: {first}",
                                 param_hint="--file") from e
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path} must hold a mapping (a job spec)", param_hint="--file")
    return data


@cli.command(context_settings={"allow_interspersed_args": False})
@common_options
@click.option("-f", "--file", "spec_file", metavar="PATH",
              help="Job spec as JSON or YAML (API.md body); '-' reads stdin. Flags override it.")
@click.option("--name", help="Job name (at most 128 characters).")
@click.option("--ranks", type=click.IntRange(min=1), help="World size (required here or in --file).")
@click.option("--gpus-per-rank", type=click.IntRange(min=1), help="GPUs per rank (default 1).")
@click.option("--gpu-type", help="Place only on nodes of this GPU type, e.g. h100.")
@click.option("--priority-class", metavar="NAME",
              help="One of the operator's priority classes (default: default). Higher "
                   "classes are placed first, and a class that preempts may take the GPUs of "
                   "running jobs of lower classes; the server refuses an unknown class (400) "
                   "and one the operator keeps for other tenants (403).")
@click.option("--priority", type=int, help="Orders your own jobs within their priority class: "
              "higher places first (default 0).")
@click.option("--max-attempts", type=click.IntRange(min=1), help="Attempts in all (default 1).")
@click.option("-C", "--working-dir", metavar="DIR",
              help="Absolute directory every rank runs in (default: the agent's own).")
@click.option("--max-runtime", type=DurationType(), metavar="DURATION",
              help="Longest one attempt may run (90, 90s, 15m, 4h, 2d, 1h30m); then SIGTERM, "
                   "the grace period, SIGKILL, and the attempt ends as timeout (default: no "
                   "limit).")
@click.option("--warn-before", type=DurationType(), metavar="DURATION",
              help="Send --warn-signal to every rank this long before --max-runtime, so it "
                   "can checkpoint.")
@click.option("--warn-signal", type=WarnSignalType(), metavar="SIGNAL",
              help="The warning signal (default SIGUSR1): SIGUSR1, SIGUSR2, SIGINT, SIGHUP, "
                   "SIGALRM, SIGTERM, SIGWINCH, SIGURG.")
@click.option("--max-pending", type=DurationType(), metavar="DURATION",
              help="Longest the job may wait to be placed, each time it waits; then it ends "
                   "FAILED with reason pending_timeout (default: no limit).")
@click.option("--on-stall", type=click.Choice(["report", "restart"], case_sensitive=False),
              help="What a stall does (on_stall): report it, the job running on (the "
                   "default), or restart: stop the attempt and start a new one while "
                   "attempts remain (--max-attempts), so a hung job gives back its GPUs.")
@click.option("--heartbeat-interval", type=IntervalType(), metavar="SECONDS",
              help="How often the ranks beat (heartbeat.interval_s, 0.01 to 3600 s: 10, 0.5, "
                   "10s, 2m; default 10): the stall threshold is a multiple of it.")
@click.option("--checkpoint-dir", metavar="DIR", callback=_absolute_dir,
              help="Absolute directory on shared storage: every attempt's ranks get "
                   "GPUJOBS_CHECKPOINT_DIR=DIR/<job id>, the same across retries.")
@click.option("--retry-on", "retry_on", type=RetryRuleType(), multiple=True,
              metavar="WHAT[=ACTION]",
              help="A retry rule; repeatable, the first matching rule decides. WHAT: a reason "
                   "(rank_failed, node_lost, stalled, timeout, preempted, agent_lost, "
                   "port_in_use; several "
                   "with commas), exit:CODE[,CODE...] or signal:NAME[,NAME...]. ACTION: retry "
                   "(default; counts against --max-attempts), uncounted (retried without "
                   "counting) or fail (no retry). E.g. --retry-on exit:42=fail "
                   "--retry-on signal:SIGKILL=uncounted. Replaces the file's retry.rules.")
@click.option("--max-uncounted-retries", type=click.IntRange(0, 1000), metavar="N",
              help="How many retries may go uncounted (default 10); past it they count.")
@click.option("--after-ok", "after_ok", multiple=True, metavar="JOB",
              help="Wait until JOB has SUCCEEDED (Slurm's afterok); should it end otherwise, "
                   "this job ends FAILED with reason dependency_failed, and so does what "
                   "waits on it. Repeatable, with --after and --after-notok: up to 100 of "
                   "your jobs in all. Replaces the file's depends_on.")
@click.option("--after-notok", "after_notok", multiple=True, metavar="JOB",
              help="Wait until JOB has FAILED or was CANCELLED (afternotok); should it "
                   "succeed, this job ends FAILED (dependency_failed). Repeatable.")
@click.option("--after", "after_any", multiple=True, metavar="JOB",
              help="Wait until JOB has ended, however it ends (afterany). Repeatable.")
@click.option("--array", "array_range", type=ArrayRangeType(), metavar="0-N[%P]",
              help="Make the job an array (a sweep): indexes 0 to N, each run as a job of "
                   "its own (its own retries) with GPUJOBS_ARRAY_INDEX and GPUJOBS_ARRAY_SIZE "
                   "in its env; %P runs at most P at once. 0-99%8, 100%8 (the same) or "
                   "0-99; indexes always start at 0.")
@click.option("--array-env", "array_env", type=ArrayEnvType(), multiple=True,
              metavar="NAME=V0,V1,...",
              help="One value per index: index i gets NAME=Vi (array.env); repeatable. "
                   "Values are split on commas (put values holding one in --file).")
@click.option("--max-failed-indexes", type=click.IntRange(min=0), metavar="N",
              help="Fail the array as soon as more than N indexes have failed (each after "
                   "its own retries): no more start and the running ones are cancelled "
                   "(default: no limit).")
@click.option("-e", "--env", "env", multiple=True, metavar="KEY=VALUE",
              help="Environment of every rank; repeatable. KEY alone passes the local value.")
@click.option("-l", "--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="Label; repeatable.")
@click.option("--idempotency-key", metavar="KEY",
              help="Reuse to repeat a submit safely (default: a fresh uuid4, shown on output).")
@click.option("--dry-run", is_flag=True, help="Print the request body and send nothing.")
@click.option("-q", "--quiet", is_flag=True,
              help="Print only the job id, for scripts: JOB=$(gpujobs submit -q ...).")
@click.option("--wait", is_flag=True, help="Then wait until the job is terminal; exit 0 if it "
              "SUCCEEDED, 8 if FAILED, 9 if CANCELLED.")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds between polls with --wait.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0),
              help="Give up waiting after this many seconds (exit 7; the job goes on).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(spec_file: str | None, name: str | None, ranks: int | None,
           gpus_per_rank: int | None, gpu_type: str | None, priority_class: str | None,
           priority: int | None, max_attempts: int | None, working_dir: str | None, max_runtime: int | None,
           warn_before: int | None, warn_signal: str | None, max_pending: int | None,
           on_stall: str | None, heartbeat_interval: float | None, checkpoint_dir: str | None, retry_on: tuple[dict[str, Any], ...],
           max_uncounted_retries: int | None, after_ok: tuple[str, ...],
           after_notok: tuple[str, ...], after_any: tuple[str, ...],
           array_range: dict[str, int] | None, array_env: tuple[tuple[str, list[str]], ...],
           max_failed_indexes: int | None, env: tuple[str, ...], labels: tuple[str, ...],
           idempotency_key: str | None, dry_run: bool, quiet: bool, wait: bool,
           interval: float, wait_timeout: float | None,
           command: tuple[str, ...]) -> None:
    """Submit a job: gpujobs submit --ranks 2 -- python train.py --lr 3e-4

    Everything after the options (or after `--`) is the command each rank runs.
    The submit is safe to retry: it sends an Idempotency-Key, the same on every
    retry, and prints it; pass it back with --idempotency-key to repeat the
    submit from a script without making a second job. With --wait, follow
    the job to its end and exit by how it ended (0, 8 FAILED, 9 CANCELLED).

    \b
    Retries and time limits:
      gpujobs submit --ranks 8 --max-attempts 3 --max-runtime 4h --warn-before 5m \\
        --max-pending 30m --checkpoint-dir /shared/ckpt \\
        --retry-on exit:42=fail --retry-on signal:SIGKILL=uncounted -- python train.py
    No rule matching, node_lost, preempted, agent_lost and port_in_use are retried without
    counting (up to --max-uncounted-retries), anything else is retried while
    --max-attempts allows.

    \b
    Priority classes (the operator's, GPUJOBS_PRIORITY_CLASSES):
      gpujobs submit --ranks 8 --priority-class urgent -- python eval.py
    A higher class is placed first. A class that preempts takes the GPUs of
    running jobs of lower classes when it does not fit: they get SIGTERM and
    their grace period, then requeue (not counted by default); `gpujobs
    describe` shows which jobs it is preempting.

    \b
    Pipelines (each step waits for the one before it):
      PREP=$(gpujobs submit -q --ranks 1 -- python prepare.py)
      TRAIN=$(gpujobs submit -q --ranks 8 --after-ok $PREP -- python train.py)
      gpujobs submit --ranks 1 --after $TRAIN -- python evaluate.py
    A waiting job stays PENDING ("waiting for job_x to succeed"); once what
    it waits for can no longer happen it ends FAILED (dependency_failed),
    and so does what waits on it: nothing waits forever.

    \b
    Sweeps (job arrays):
      gpujobs submit --ranks 1 --array 0-99%8 --array-env LR=... -- python train.py
    makes 100 indexes, at most 8 running at once; `gpujobs list --parent
    JOB` lists them, `gpujobs describe JOB` counts them by state, and
    `gpujobs cancel JOB` cancels every one.
    """
    body: dict[str, Any] = load_spec_file(spec_file) if spec_file else {}
    for key, value in (("name", name), ("ranks", ranks), ("gpus_per_rank", gpus_per_rank),
                       ("gpu_type", gpu_type), ("priority_class", priority_class),
                       ("priority", priority), ("max_attempts", max_attempts), ("working_dir", working_dir)):
        if value is not None:
            body[key] = value
    lifecycle_members(body, max_runtime=max_runtime, warn_before=warn_before,
                      warn_signal=warn_signal, max_pending=max_pending,
                      checkpoint_dir=checkpoint_dir, retry_on=retry_on,
                      max_uncounted_retries=max_uncounted_retries)
    stall_members(body, on_stall=on_stall, heartbeat_interval=heartbeat_interval)
    pipeline_members(body, array_range=array_range, array_env=array_env,
                     max_failed_indexes=max_failed_indexes,
                     after=[*(("succeeded", j) for j in after_ok),
                            *(("failed", j) for j in after_notok),
                            *(("ended", j) for j in after_any)])
    for key, values, from_env in (("env", env, True), ("labels", labels, False)):
        pairs = _pairs(values, "--env" if key == "env" else "--label", from_env=from_env)
        if pairs:
            existing = body.get(key)
            body[key] = {**(existing if isinstance(existing, dict) else {}), **pairs}
    if command:
        body["command"] = list(command)
    if not body.get("command"):
        raise click.UsageError("no command: give it after the options, e.g. "
                               "`gpujobs submit --ranks 2 -- python train.py`, or in --file")
    if body.get("ranks") is None:
        raise click.UsageError("--ranks is required (or `ranks` in --file)")
    if dry_run:
        out_json(body)
        return

    from .client import new_idempotency_key
    send_job(body, idempotency_key or new_idempotency_key(), quiet=quiet, wait=wait,
             interval=interval, wait_timeout=wait_timeout)


def send_job(body: dict[str, Any], key: str, *, quiet: bool, wait: bool, interval: float,
             wait_timeout: float | None, client: "Client | None" = None,
             again: str = "the same arguments", origin: "Job | None" = None) -> None:
    """``POST /v1/jobs`` with ``body`` and the Idempotency-Key ``key``, then
    what submit prints (the job; its id alone with ``quiet``; the job as JSON
    with -o json) and, with ``wait``, the job followed to its end. ``origin``:
    the job a resubmit copied."""
    client = client or make_client()
    try:
        job = client.create_job(body, idempotency_key=key)
    except (TransportError, ApiError) as e:
        if isinstance(e, TransportError) or e.status >= 500 or e.status == 429:
            e.hint = (f"the job may or may not have been created; repeat with "
                      f"--idempotency-key {key} and {again} to make sure, "
                      "without risking a second job")
        elif e.field == "priority_class":
            e.hint = priority_class_hint(e, body.get("priority_class"))
        elif e.field:
            e.hint = pipeline_hint(e.field, body)
        raise
    if json_mode():
        if wait and not job.is_terminal:  # stdout: one object, the job as it ended
            job = wait_terminal(client, job.id, interval, wait_timeout)
        out_json(job.raw)
        if wait:
            check_outcome(job)
        return
    if quiet:
        click.echo(job.id)
        if wait:
            check_outcome(wait_terminal(client, job.id, interval, wait_timeout))
        return
    c = console()
    verb = "Already submitted (same Idempotency-Key and body)" if job.replayed else "Submitted"
    c.print(f"{verb}: [bold]{job.id}[/] {styled_state(job.state)}")
    if origin is not None:
        c.print(f"  resubmitted from: {origin.id}, {styled_state(origin.state)}"
                f"{escape(exit_note(origin))}")
    spec = job.spec
    c.print(f"  name: {escape(job.name or '-')}   {escape(gang_text(spec))}   "
            f"stall threshold: {job.health.threshold_s}s")
    from .models import DEFAULT_PRIORITY_CLASS
    if job.priority_class != DEFAULT_PRIORITY_CLASS:
        c.print(f"  priority: {escape(priority_text(job))}")
    from .lifecycle import limits_lines, retry_policy_text
    if (spec.get("retry") or {}).get("rules"):
        c.print(f"  retry: {escape(retry_policy_text(spec))}")
    limits = limits_lines(spec)
    if limits:
        c.print(f"  limits: {escape('; '.join(limits))}")
    if spec.get("on_stall") == "restart":
        c.print(f"  on stall: {ON_STALL_WORDS['restart']}")
    from .pipelines import array_spec_text, dependencies_summary
    if spec.get("depends_on"):
        c.print(f"  after: {escape(dependencies_summary(spec))}")
    if isinstance(spec.get("array"), dict):
        c.print(f"  array: {escape(array_spec_text(spec['array']))}")
    if job.state == "PENDING" and job.waiting_for and job.pending_reason:
        c.print(f"  pending reason: {escape(job.pending_reason)}")
    elif job.exit is not None and job.is_terminal:
        c.print(f"  ended {styled_state(job.state)}: {escape(exit_text_of(job))}")
    c.print(f"  idempotency key: {escape(key)}")
    if not wait:
        nxt = f"gpujobs list --parent {job.id}" if job.is_array else f"gpujobs watch {job.id}"
        c.print(f"  next: {nxt}", style="dim")
        return
    if not job.is_terminal:
        c.print("Waiting for the job to end (Ctrl-C stops waiting; the job goes on)...",
                style="dim")
        job = wait_terminal(client, job.id, interval, wait_timeout)
    c.print(f"Job finished: {styled_state(job.state)}"
            f"{escape(exit_note(job) + decision_note(job))}")
    check_outcome(job)



def pipeline_hint(field: str, body: dict[str, Any]) -> str | None:
    """What to do about the server's 400 naming a member of depends_on or
    array, in the flags that set it."""
    if field.startswith("depends_on"):
        named = ""
        parts = field.split(".")
        deps = body.get("depends_on") or []
        if len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(deps):
            d = deps[int(parts[1])]
            flag = {"succeeded": "--after-ok", "failed": "--after-notok",
                    "ended": "--after"}.get(d.get("condition") or "succeeded", "--after-ok")
            named = f" ({flag} {d.get('job_id')})"
        return (f"each --after, --after-ok and --after-notok{named} must name an existing job "
                "of yours, once (`gpujobs list` shows them)")
    if field.startswith("array.env."):
        return (f"--array-env {field.split('.', 2)[2]}=... needs exactly one value per "
                "index of --array")
    if field.startswith("array"):
        return "see `gpujobs submit --help` for --array, --array-env and --max-failed-indexes"
    return None


def priority_class_hint(e: ApiError, name: Any) -> str:
    """What to do about the server's 400 or 403 naming priority_class."""
    if e.status == 403:
        return (f"the operator keeps priority class {name} for some tenants only (the class's "
                "tenants in GPUJOBS_PRIORITY_CLASSES, docs/security.md); submit without "
                "--priority-class, or ask the operator to open it to your tenant")
    return ("the priority classes are the operator's (GPUJOBS_PRIORITY_CLASSES): name one "
            "the error lists, or leave out --priority-class for the default class")


# -- resubmit -------------------------------------------------------------------------
#: the members of POST /v1/jobs (API.md; chalicelib/api/schemas.py JOB_CREATE): a
#: job's spec is its create body with the defaults filled, so these members of it
#: make a body the server takes back as it is (the dashboard's Resubmit sends the same)
CREATE_FIELDS = ("name", "command", "working_dir", "env", "ranks", "gpus_per_rank", "gpu_type",
                 "priority", "priority_class", "max_attempts", "retry", "max_runtime_s",
                 "warn_before_s", "warn_signal", "max_pending_s", "checkpoint_dir", "heartbeat",
                 "on_stall", "depends_on", "array", "labels")
#: members whose values are strings whatever they look like
_STRING_MAPS = ("env", "labels")


def create_body(spec: dict[str, Any]) -> dict[str, Any]:
    """The create body of a job like this one: its spec's create members."""
    import copy
    return {k: copy.deepcopy(spec[k]) for k in CREATE_FIELDS if spec.get(k) is not None}


def apply_with(body: dict[str, Any], items: Iterable[str]) -> list[str]:
    """``--with MEMBER=VALUE`` into ``body``, in order: MEMBER is a create
    member or a dotted path into one (``heartbeat.interval_s``,
    ``env.SEED``); VALUE is JSON when it reads as JSON (``4``, ``true``,
    ``["a", "b"]``), else the text itself (a ``command`` given as text is
    split as a shell would); ``env.*`` and ``labels.*`` are always text;
    ``null`` removes the member (the server's default then). Returns the
    members changed, for the output."""
    import shlex
    changed = []
    for item in items:
        path, sep, raw = item.partition("=")
        keys = [k.strip() for k in path.split(".")]
        if not sep or not all(keys):
            raise click.BadParameter(f"{item!r} is not MEMBER=VALUE (e.g. ranks=4, "
                                     "max_runtime_s=3600, env.SEED=2)", param_hint="--with")
        if keys[0] not in CREATE_FIELDS:
            raise click.BadParameter(f"{keys[0]!r} is not a member of a job's spec: one of "
                                     f"{', '.join(CREATE_FIELDS)}", param_hint="--with")
        value: Any
        if len(keys) == 2 and keys[0] in _STRING_MAPS:
            value = raw
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                value = shlex.split(raw) if keys == ["command"] else raw
        target = body
        for key in keys[:-1]:
            nxt = target.get(key)
            if not isinstance(nxt, dict):
                if nxt is not None:
                    raise click.BadParameter(f"{'.'.join(keys[:-1])} is not an object in the "
                                             "job's spec", param_hint="--with")
                nxt = target[key] = {}
            target = nxt
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
        changed.append(".".join(keys))
    return changed


@cli.command()
@common_options
@click.argument("job_id")
@click.option("--with", "overrides", multiple=True, metavar="MEMBER=VALUE",
              help="Change one member of the spec; repeatable, in order. MEMBER: a member "
                   "of the create body or a dotted path into one (ranks, name, "
                   "max_runtime_s, heartbeat.interval_s, env.SEED, labels.try); VALUE: JSON "
                   "(4, true, [\"python\", \"x.py\"]) or else text; null removes it.")
@click.option("--idempotency-key", metavar="KEY",
              help="Reuse to repeat this resubmit safely (default: a fresh uuid4 each time, "
                   "shown on output: each resubmit makes a new job).")
@click.option("--dry-run", is_flag=True, help="Print the request body and send nothing.")
@click.option("-q", "--quiet", is_flag=True,
              help="Print only the new job's id: NEW=$(gpujobs resubmit -q JOB).")
@click.option("--wait", is_flag=True, help="Then wait until the new job is terminal; exit 0 "
              "if it SUCCEEDED, 8 if FAILED, 9 if CANCELLED.")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds between polls with --wait.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0),
              help="Give up waiting after this many seconds (exit 7; the job goes on).")
def resubmit(job_id: str, overrides: tuple[str, ...], idempotency_key: str | None,
             dry_run: bool, quiet: bool, wait: bool, interval: float,
             wait_timeout: float | None) -> None:
    """Submit a job again: its spec as submitted (GET /v1/jobs/JOB's spec),
    with --with's changes, as a new job.

    \b
      gpujobs resubmit JOB
      NEW=$(gpujobs resubmit -q JOB --with ranks=4 --with max_runtime_s=7200)
      gpujobs resubmit JOB --with env.SEED=2 --with 'command=python3 train.py --lr 1e-4'

    Every member the job was submitted with is sent again (command, ranks,
    env, labels, limits, retry rules, heartbeat, dependencies, array...); an
    array's index is resubmitted as a job of its own with that index's env.
    A new Idempotency-Key is made each time (shown), so each resubmit makes
    a new job; pass one back with --idempotency-key to repeat a resubmit
    safely. Prints the new job as submit does (-q: its id only).
    """
    client = make_client()
    try:
        origin = client.get_job(job_id)
    except ApiError as e:
        if e.status == 404:
            e.hint = "`gpujobs list` shows your jobs; another tenant's job cannot be resubmitted"
        raise
    body = create_body(origin.spec)
    apply_with(body, overrides)
    if not body.get("command") or body.get("ranks") is None:
        raise click.UsageError(f"job {origin.id}'s spec has no command or ranks to submit "
                               "again (give them with --with)")
    if dry_run:
        out_json(body)
        return
    from .client import new_idempotency_key
    again = f"`gpujobs resubmit {job_id}` with the same --with"
    send_job(body, idempotency_key or new_idempotency_key(), quiet=quiet, wait=wait,
             interval=interval, wait_timeout=wait_timeout, client=client, again=again,
             origin=origin)


# -- get ------------------------------------------------------------------------------
def priority_text(job: "Job") -> str:
    """``class urgent, priority 0``: the job's priority class and its own
    priority within it."""
    return f"class {job.priority_class}, priority {job.priority}"


def preempting_text(job: "Job") -> str | None:
    """``preempting job_a, job_b (since 2025-01-31 12:00:00Z)``: the running jobs
    of lower classes a PENDING job waits for, while it does; None otherwise."""
    p = job.preempting
    if p is None or job.state != "PENDING":
        return None
    since = f" (since {short_time(p.at)})" if p.at else ""
    return f"preempting {', '.join(p.jobs) or '?'}{since}"


def pipeline_rows(job: "Job") -> list[tuple[str, str]]:
    """describe's rows of a pipeline or a sweep (plain text): what a waiting
    job waits for, each dependency and where it stands, a child's parent and
    index, an array's spec and its indexes by state."""
    from . import pipelines
    rows: list[tuple[str, str]] = []
    if job.waiting_for and job.state == "PENDING":
        rows.append(("waiting for", pipelines.shown_ids(job.waiting_for)))
    deps = pipelines.dependency_lines(job)
    if deps:
        rows.append(("dependencies", "\n".join(deps)))
    if job.parent_id is not None:
        rows.append(("parent", job.parent_id))
        rows.append(("index", pipelines.index_text(job) or "-"))
    spec_array = job.spec.get("array")
    if isinstance(spec_array, dict):
        rows.append(("array", pipelines.array_spec_text(spec_array)))
    if job.array is not None:
        made = job.array.materialized
        counts = pipelines.counts_text(job.array, ended=job.is_terminal)
        if not job.is_terminal and made < job.array.size:
            counts += f"\n{made} of {job.array.size} made so far"
        rows.append(("indexes", counts))
    return rows


def _utcnow() -> "datetime":
    """Now, for what is left of a job's limits (the tests set it)."""
    from datetime import datetime, timezone
    return datetime.now(timezone.utc)


def job_panel(job: "Job") -> "RenderableType":
    from rich.table import Table

    from . import lifecycle
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    spec = job.spec
    h = job.health
    t.add_row("id", job.id)
    t.add_row("name", escape(job.name or "-"))
    t.add_row("state", styled_state(job.state))
    waited_too_long = job.exit is not None and job.exit.reason == "pending_timeout"
    if job.pending_reason and (job.state == "PENDING" or waited_too_long):
        t.add_row("pending reason", escape(job.pending_reason))
    for label, value in lifecycle.queue_lines(job.queue):
        t.add_row(label, escape(value))
    for label, value in pipeline_rows(job):
        t.add_row(label, escape(value))
    if job.is_array:  # the parent never runs: its indexes do, each with its attempts
        t.add_row("attempt", f"none of its own (each index: max {spec.get('max_attempts', 1)})")
    else:
        t.add_row("attempt", lifecycle.attempt_text(
            job.attempt, int(spec.get("max_attempts", 1)), job.uncounted_retries))
    t.add_row("retry", escape(lifecycle.retry_policy_text(spec)))
    limits = lifecycle.limits_lines(spec)
    if limits:
        t.add_row("limits", escape("\n".join(limits)))
    left = lifecycle.time_left_text(job.state, spec, started_at=job.started_at,
                                    pending_since=job.pending_since, now=_utcnow())
    if left:
        t.add_row("time left", escape(left))
    if spec.get("on_stall") in ON_STALL_WORDS:
        t.add_row("on stall", ON_STALL_WORDS[spec["on_stall"]])
    t.add_row("ranks", escape(gang_text(spec)))
    t.add_row("priority", "\n".join(escape(line) for line in (
        priority_text(job), preempting_text(job)) if line))
    t.add_row("command", escape(" ".join(spec.get("command") or [])))
    if spec.get("working_dir"):
        t.add_row("working dir", escape(spec["working_dir"]))
    if spec.get("checkpoint_dir"):
        t.add_row("checkpoints", escape(f"{str(spec['checkpoint_dir']).rstrip('/')}/{job.id}"
                                        " (GPUJOBS_CHECKPOINT_DIR)"))
    if spec.get("labels"):
        t.add_row("labels", escape(", ".join(f"{k}={v}" for k, v in spec["labels"].items())))
    t.add_row("created", short_time(job.created_at))
    t.add_row("started", short_time(job.started_at))
    t.add_row("finished", short_time(job.finished_at))
    if job.cancel_requested_at:
        reason = f" ({escape(job.cancel_reason)})" if job.cancel_reason else ""
        t.add_row("cancel requested", short_time(job.cancel_requested_at) + reason)
    health = f"{health_text(job)}  threshold {h.threshold_s}s"
    if h.raw.get("suppressed"):
        health += f"  (suppressed: {escape(h.raw['suppressed'])})"
    lines = [health, *(verdict_lines(h.verdict) if h.verdict else [])]
    if h.first_stalled_rank is not None:
        lines.append(incident_note(h))
        lines.append(silence_note(h))
    lines += slow_lines(job)
    t.add_row("health", "\n".join(lines))
    if job.exit is not None:
        t.add_row("exit", escape(lifecycle.exit_text(job.exit.raw)))
    return t


@cli.command()
@common_options
@click.argument("job_id")
def get(job_id: str) -> None:
    """Show one job."""
    job = make_client().get_job(job_id)
    if json_mode():
        out_json(job.raw)
    else:
        console().print(job_panel(job))


# -- list -------------------------------------------------------------------------------
@cli.command(name="list")
@common_options
@click.option("--state", type=click.Choice(
    ["PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"],
    case_sensitive=False), help="Only jobs in this state.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many jobs (default 20).")
@click.option("--all", "all_", is_flag=True, help="Every job: follow every page to the end.")
@click.option("--page-size", type=click.IntRange(1, 500), help="Jobs per request (1-500).")
@click.option("--page-token", help="Resume from a next_page_token.")
@click.option("--parent", metavar="JOB", help="An array's indexes (its child jobs made so far), "
              "in index order, with an INDEX column.")
def list_(state: str | None, limit: int | None, all_: bool, page_size: int | None,
          page_token: str | None, parent: str | None) -> None:
    """List your jobs, newest first, or an array's indexes (--parent).

    Shows up to --limit jobs (20 by default), or with --all every job; pages
    are followed with the server's next_page_token, so no job is repeated or
    skipped while others are created.

    \b
      gpujobs list --state running
      gpujobs list --parent JOB --state failed     # a sweep's failed indexes
    """
    if all_ and limit is not None:
        raise click.UsageError("--all and --limit exclude each other")
    state = state.upper() if state else None
    cap = None if all_ else (limit or 20)
    client = make_client()
    jobs: list[Job] = []
    token = page_token
    while True:
        size = page_size or 100
        if cap is not None:
            # never ask for more than is still wanted, so that next_page_token
            # resumes exactly after the last job shown
            size = min(size, cap - len(jobs), 500)
        try:
            page = client.list_jobs(state=state, page_size=size, page_token=token,
                                    parent=parent)
        except ApiError as e:
            if parent is not None and e.field == "parent":
                e.hint = ("--parent takes an array's job id (one submitted with --array); "
                          "`gpujobs list` shows your jobs")
            raise
        jobs.extend(page.jobs)
        token = page.next_page_token
        if token is None or (cap is not None and len(jobs) >= cap):
            break
    if json_mode():
        out_json({"jobs": [j.raw for j in jobs], "next_page_token": token})
        return
    c = console()
    if not jobs and parent is not None:
        c.print(f"No {state + ' ' if state else ''}indexes of {escape(parent)}"
                f"{'' if state else ' made yet'}.")
    elif not jobs:
        c.print("No jobs." if not state else f"No {state} jobs.")
    else:
        from rich.table import Table
        t = Table(box=None, header_style="bold", pad_edge=False)
        waiting = any(j.pending_reason for j in jobs)
        # the class only when one of the jobs shown is not in the default: the
        # table of a deployment without priority classes is as it was
        from .models import DEFAULT_PRIORITY_CLASS
        classes = any(j.priority_class != DEFAULT_PRIORITY_CLASS for j in jobs)
        # an array's indexes (--parent) lead with their index; the arrays
        # among the jobs shown get their indexes by state
        indexed = parent is not None
        arrays = any(j.is_array for j in jobs)
        cols = ("ID", "NAME", "STATE", "RANKS", "ATTEMPT", "HEALTH", "CREATED")
        for col in (("INDEX",) if indexed else ()) + cols + (("CLASS",) if classes else ()) + (
                ("INDEXES",) if arrays else ()) + (("PENDING REASON",) if waiting else ()):
            t.add_column(col, no_wrap=col in ("ID", "STATE", "CREATED"),
                         justify="right" if col == "INDEX" else "left")
        from .pipelines import counts_text
        for j in jobs:
            row = [j.id, escape(j.name or "-"), styled_state(j.state), str(j.ranks or "-"),
                   str(j.attempt), health_cell(j), short_time(j.created_at)]
            if indexed:
                row.insert(0, "-" if j.array_index is None else str(j.array_index))
            if classes:
                row.append(escape(j.priority_class))
            if arrays:
                row.append(escape(counts_text(j.array, ended=j.is_terminal))
                           if j.array is not None else "")
            if waiting:
                row.append(escape(j.pending_reason or "") if j.state == "PENDING" else "")
            t.add_row(*row)
        c.print(t)
    if token is not None:
        again = "".join(f" {flag} {escape(value)}" for flag, value in
                        (("--parent", parent), ("--state", state)) if value)
        c.print(f"More {'indexes' if parent else 'jobs'}: gpujobs list{again} --page-token "
                f"{escape(token)}  (or --all)", style="dim")


def health_cell(job: "Job") -> str:
    """`list`'s HEALTH: the job's health alone, its status and, for a
    stall, the verdict's sentence (cut at 60 characters); never how the job
    ended: a verdict by a rank's exit is the exit's story (`describe`'s
    exit), not health (issue 47)."""
    h = job.health
    cell = health_text(job)
    if h.verdict and h.verdict.by != "exit":
        cell += f" {escape(shorten(h.verdict.text, 60))}"
    return cell


# -- cancel -----------------------------------------------------------------------------
def wait_terminal(client: "Client", job_id: str, interval: float, timeout: float | None,
                  on_poll: Callable[["Job"], None] | None = None) -> "Job":
    from .client import WaitTimeout
    ride_out(client)  # the wait rides through a restart, as watch does
    try:
        return client.wait_for_job(job_id, interval_s=interval, timeout_s=timeout,
                                   on_poll=on_poll)
    except WaitTimeout as e:
        raise WaitGaveUp(str(e), e.job) from None


@cli.command()
@common_options
@click.argument("job_id")
@click.option("--reason", help="Why (kept on the job; the first reason wins).")
@click.option("--wait", is_flag=True, help="Then wait until the job is terminal.")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds between polls with --wait.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0),
              help="Give up waiting after this many seconds (exit 7).")
def cancel(job_id: str, reason: str | None, wait: bool, interval: float,
           wait_timeout: float | None) -> None:
    """Request the cancel of a job (202 Accepted).

    A job not yet placed is cancelled at once; a placed one when its agents
    confirm every rank stopped; an array cancels every index so, and ends
    CANCELLED once they all have ended. With --wait, poll until the job is terminal and
    show its final state: exit 0 when it ended CANCELLED (what was asked) or
    SUCCEEDED before the cancel took effect, 8 when it ended FAILED. Repeating
    a cancel is harmless.
    """
    client = make_client()
    job = client.cancel_job(job_id, reason)
    if not json_mode():
        c = console()
        c.print(f"Cancel accepted (202) for [bold]{job.id}[/]: state {styled_state(job.state)}, "
                f"cancel requested at {short_time(job.cancel_requested_at)}")
        if job.is_array and not job.is_terminal:
            c.print("  every index is cancelled too (as intents); the array ends CANCELLED "
                    "once they all have ended", style="dim")
    if wait and not job.is_terminal:
        if not json_mode():
            c.print("Waiting for the agents to stop every rank...", style="dim")
        job = wait_terminal(client, job.id, interval, wait_timeout)
    if json_mode():
        out_json(job.raw)
    elif wait or job.is_terminal:
        if job.state == "CANCELLED":
            c.print(f"Job [bold]{job.id}[/] is {styled_state(job.state)}.")
        else:
            c.print(f"Job [bold]{job.id}[/] finished as {styled_state(job.state)}"
                    f"{escape(exit_note(job))} before the cancel took effect.")
    if wait:
        check_outcome(job, asked_to_cancel=True)


# -- attempts ---------------------------------------------------------------------------
def attempt_exit(a: Any) -> str:
    """An attempt's EXIT cell: ``rank_failed (1)``, ``preempted: node n1
    drained: bad ECC`` (its detail), ``-`` while it runs."""
    if a.exit is None:
        return "-"
    text = a.exit.reason + ("" if a.exit.exit_code is None else f" ({a.exit.exit_code})")
    return f"{text}: {a.exit.detail}" if a.exit.detail else text


def placement_summary(placement: Iterable[Any]) -> str:
    by_node: dict[str, list[int]] = {}
    for p in placement:
        by_node.setdefault(p.node_id, []).append(p.rank)
    return "  ".join(f"{node}: {ranges(r)}" for node, r in by_node.items()) or "-"


@cli.command()
@common_options
@click.argument("job_id")
def attempts(job_id: str) -> None:
    """List a job's attempts (placements), oldest first."""
    items = make_client().list_attempts(job_id)
    if json_mode():
        out_json({"attempts": [a.raw for a in items]})
        return
    c = console()
    if not items:
        c.print("No attempts yet: the job has not been placed.")
        return
    from rich.table import Table
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("ATTEMPT", "STATE", "PLACEMENT (node: ranks)", "CREATED", "FINISHED", "EXIT"):
        t.add_column(col)
    for a in items:
        t.add_row(str(a.attempt), styled_state(a.state), escape(placement_summary(a.placement)),
                  short_time(a.created_at), short_time(a.finished_at), escape(attempt_exit(a)))
    c.print(t)


# -- ranks ------------------------------------------------------------------------------
def ranks_table(ranks: "Ranks", max_rows: int | None = None,
                verdict: "Verdict | None" = None) -> "RenderableType":
    """The ranks, longest silent first (the server's order), the title says
    so; the verdict's ranks marked "← named" (or "← tied" on a tie) and shown
    even past ``max_rows``."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    # the caption is a line of its own: a table's title wraps at the table's width
    caption = Text(f"attempt {ranks.attempt} · stall threshold {ranks.threshold_s}s · "
                   f"{TABLE_ORDER} (silence order: evidence, not the verdict)", style="dim")
    t = Table(box=None, header_style="bold", pad_edge=False)
    # slow_score (1.0: as fast as the fastest rank), once the server scores any rank
    scored = any(r.raw.get("slow_score") is not None for r in ranks.ranks)
    cols = ("RANK", "NODE", "STEP", "SILENCE", "LAST HEARD", "STATUS",
            *(("SCORE",) if scored else ()), "")
    for col in cols:
        t.add_column(col, justify="right" if col in ("RANK", "STEP", "SILENCE", "SCORE")
                     else "left")
    named = set(verdict.ranks) if verdict else set()
    mark = "← tied" if verdict and verdict.is_tie else "← named"
    rows = ranks.ranks if max_rows is None else (
        ranks.ranks[:max_rows] + [r for r in ranks.ranks[max_rows:] if r.rank in named])
    for r in rows:
        status = escape(rank_status(r))
        score = r.raw.get("slow_score")
        t.add_row(str(r.rank), escape(r.node_id or "-"), "-" if r.step is None else str(r.step),
                  fmt_silence(r.silence_s), short_time(r.last_heard_at), status,
                  *((("-" if score is None else f"{float(score):.2f}"),) if scored else ()),
                  mark if r.rank in named else ("← slow" if r.raw.get("slow_text") else ""),
                  style="bold red" if r.stalled or r.rank in named else None)
    if len(rows) < len(ranks.ranks):
        t.caption = f"... {len(ranks.ranks) - len(rows)} more ranks, less silent"
    return Group(caption, t)


def stalled_ranks_text(h: "JobHealth") -> str:
    """``stalled ranks: 0-63`` when the record lists them all; ``65,536
    stalled (first: 0-63)`` when it lists only its first few (the server keeps
    at most 64: the count is the whole)."""
    listed = ranges(h.stalled_ranks) or str(h.first_stalled_rank)
    count = h.raw.get("stalled_count")
    if isinstance(count, int) and count > len(h.stalled_ranks):
        return f"{count:,} stalled (first: {listed})"
    return f"stalled ranks: {listed}"


def slow_lines(job: "Job", ranks: "Ranks | None" = None) -> list[str]:
    """The sentence of each rank called slow now (API.md "Stragglers"), as
    the server words it: "rank 1 on local-2 is slow: its steps take 2.4× the
    fastest rank's" (rich markup). From the ranks view's ``slow_text``, else
    the job's health (``slow_ranks``, and each episode's sentence in ``slow``)."""
    h = job.health.raw
    slow = [int(r) for r in h.get("slow_ranks") or []]
    texts: dict[int, str] = {}
    for r in slow:
        state = ((h.get("slow") or {}).get("ranks") or {}).get(str(r)) or {}
        texts[r] = state.get("text") or f"rank {r} is slow"
    for row in (ranks.ranks if ranks is not None else []):
        if row.raw.get("slow_text"):
            texts[row.rank] = row.raw["slow_text"]
    return [f"[yellow]{escape(texts[r])}[/]" for r in sorted(texts)]


def stall_callout(job: "Job", ranks: "Ranks | None") -> str | None:
    """What `ranks` and `watch` print about a stall: the verdict first, its
    sentence word for word, then the incident, then, labelled as evidence,
    the silence order (the rank silent longest)."""
    h = job.health
    v = verdict_of(job, ranks)
    lines = verdict_lines(v) if v else []
    if v is None and h.status == "STALLED":
        lines.append("[bold red]STALLED[/]: the server names no rank that stopped")
    if h.first_stalled_rank is not None:
        lines.append(f"[dim]{incident_note(h)}[/]")
        lines.append(f"[dim]{silence_note(h)}[/]")
    elif v is None and ranks is not None and ranks.stalled:
        lines.append(f"[red]{len(ranks.stalled)} rank(s) over the threshold[/], not yet flagged "
                     "by the stall scan.")
    lines += slow_lines(job, ranks)
    return "\n".join(lines) or None


@cli.command()
@common_options
@click.argument("job_id")
def ranks(job_id: str) -> None:
    """Per-rank liveness of the current attempt, longest silent first.

    Every rank: the pages the server cuts a big attempt's view into are all
    read (each rank's silence as of its page's read). The server's verdict
    (which rank stopped, and why) comes first, its ranks marked in the
    table; stalled ranks are highlighted.

    Stragglers: each rank the server calls slow gets its sentence, e.g.
    "rank 1 on local-2 is slow: its steps take 2.4× the fastest rank's",
    and the SCORE column shows each rank's slow_score (the fastest rank's
    step time outside collectives over its own: 1.00 is the fastest, 0.50
    twice as slow). A rank is called slow only when its score stays below
    the job's heartbeat.slow_score (default 0.7) across a sustained window.
    """
    client = make_client()
    job = client.get_job(job_id)
    rk = client.get_ranks(job_id)
    if json_mode():
        out_json({"verdict": job.health.raw.get("verdict"), **rk.raw, "health": job.health.raw})
        return
    c = console()
    c.print(f"[bold]{job.id}[/] {styled_state(job.state)}  health "
            f"{health_text(job)}")
    callout = stall_callout(job, rk)
    if callout:
        c.print(callout)
    if rk.ranks:
        c.print(ranks_table(rk, verdict=verdict_of(job, rk)))
    else:
        c.print("No ranks: the job has no current attempt.")


# -- watch ------------------------------------------------------------------------------
def watch_view(job: "Job", rk: "Ranks | None", note: str | None, interval: float,
               max_rows: int) -> "RenderableType":
    from rich.console import Group
    from rich.text import Text
    parts: list[Any] = []
    head = (f"[bold]{job.id}[/] {escape(job.name or '')}  {styled_state(job.state)}  attempt "
            f"{job.attempt}  health {health_text(job)}")
    from .lifecycle import time_left_text
    left = time_left_text(job.state, job.spec, started_at=job.started_at,
                          pending_since=job.pending_since, now=_utcnow())
    if left:
        head += f"  {escape(left)}"
    parts.append(Text.from_markup(head))
    callout = stall_callout(job, rk)
    if callout:
        parts.append(Text.from_markup(callout))
    if rk is not None and rk.ranks:
        parts.append(ranks_table(rk, max_rows, verdict_of(job, rk)))
    elif note:
        parts.append(Text(clean(note), style="dim"))
    if job.is_terminal:
        parts.append(Text.from_markup(
            f"Job finished: {styled_state(job.state)}"
            f"{escape(exit_note(job) + decision_note(job))}"))
    else:
        parts.append(Text(f"refreshing every {interval:g}s; Ctrl-C stops watching "
                          "(the job goes on)", style="dim"))
    return Group(*parts)


#: a job of more ranks is watched by its health alone (the verdict, the
#: first stalled ranks, the counts): its every rank, each refresh, would be
#: megabytes a read (a 65,536-rank view is some 13 MB, past Lambda's 6 MB)
WATCH_MAX_RANKS = 4096


def snapshot(client: "Client", job_id: str) -> tuple["Job", "Ranks | None", str | None]:
    job = client.get_job(job_id)
    if job.array is not None:  # an array runs no ranks of its own: its indexes by state
        from .pipelines import counts_text
        return job, None, f"indexes {counts_text(job.array, ended=job.is_terminal)}"
    if job.waiting_for and job.state == "PENDING":
        return job, None, job.pending_reason or f"waiting for {', '.join(job.waiting_for)}"
    if job.attempt == 0 or job.state == "PENDING":
        from .lifecycle import queue_lines
        return job, None, "; ".join(["waiting for placement" + (
            f": {job.pending_reason}" if job.pending_reason else ""),
            *(f"{label} {value}" for label, value in queue_lines(job.queue))])
    if (job.ranks or 0) > WATCH_MAX_RANKS:
        return job, None, (f"{job.ranks:,} ranks: each rank's row is in `gpujobs ranks "
                           f"{job.id}` and on the dashboard's rank heatmap")
    try:
        return job, client.get_ranks(job_id), None
    except ApiError as e:  # ranks are extra: the job itself was read
        return job, None, f"ranks unavailable: {e.summary()}"


@cli.command()
@common_options
@click.argument("job_id")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0),
              help="Stop after this many seconds if the job is still going (exit 7).")
@click.option("--max-ranks", type=click.IntRange(min=1), default=32, show_default=True,
              help="Rank rows shown (the longest silent).")
def watch(job_id: str, interval: float, wait_timeout: float | None, max_ranks: int) -> None:
    """Follow a job live until it is terminal: state, attempt, per-rank steps and silence.

    A rank the server calls slow is said in a sentence ("rank 1 on local-2 is
    slow: its steps take 2.4× the fastest rank's"), as `ranks` says it.

    Exits by how the job ended: 0 SUCCEEDED, 8 FAILED, 9 CANCELLED (7 at
    --timeout). With -o json, prints one JSON object per refresh (JSON Lines):
    {"job": ..., "ranks": ... or null}.
    """
    client = ride_out(make_client())
    deadline = None if wait_timeout is None else time.monotonic() + wait_timeout

    def check_deadline(job: "Job") -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitGaveUp(f"job {job.id} still {job.state} after {wait_timeout:g}s", job)

    if json_mode():
        while True:
            job, rk, _ = snapshot(client, job_id)
            click.echo(dumps({"job": job.raw, "ranks": rk.raw if rk else None}))
            if job.is_terminal:
                check_outcome(job)
                return
            check_deadline(job)
            time.sleep(interval)

    from rich.live import Live
    c = console()
    job, rk, note = snapshot(client, job_id)
    try:
        with Live(watch_view(job, rk, note, interval, max_ranks), console=c,
                  refresh_per_second=4, auto_refresh=False) as live:
            while not job.is_terminal:
                check_deadline(job)
                time.sleep(interval)
                job, rk, note = snapshot(client, job_id)
                live.update(watch_view(job, rk, note, interval, max_ranks), refresh=True)
    finally:
        # rich's Live ends its last frame with a newline only on a terminal: piped
        # or redirected, the final line would have none (and glue onto the next)
        if not c.is_terminal:
            c.line()
    check_outcome(job)


# -- logs ---------------------------------------------------------------------------------
def _log_out(line: "LogLine", prefix: bool, raw: bool = False, color: str = "auto") -> None:
    """One line on stdout (stderr for the rank's stderr): escape sequences
    other than colour shown, not obeyed, and colour only on a terminal
    (``color``) unless ``raw`` asks for the line exactly as the rank wrote it."""
    if json_mode():
        click.echo(dumps({**line.raw, "attempt": line.attempt}))
        return
    err = line.stream == "stderr"
    text = line.line if raw else clean(
        line.line, colour=wants_colour(sys.stderr if err else sys.stdout, color))
    head = f"[rank {line.rank}] " if prefix else ""
    # color=True: what is left is what was decided here (click would strip only CSI)
    click.echo(head + text, err=err, color=True)


@cli.command()
@common_options
@click.argument("job_id")
@click.option("--rank", type=click.IntRange(min=0), help="Only this rank's lines.")
@click.option("--all-ranks", is_flag=True, help="Every rank's lines, interleaved by time "
              "and prefixed by their rank (the default).")
@click.option("--attempt", type=click.IntRange(min=1), help="This attempt (default: the newest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--since", metavar="WHEN", help="Only lines since an RFC 3339 time with its "
              "offset (2025-01-31T12:00:00Z) or a duration ago: 30s, 10m, 2h, 3d. The server "
              "checks it: any other form is its 400 (exit 1).")
@click.option("--tail", type=click.IntRange(min=0, max=10_000), metavar="N",
              help="Only the last N lines of the ranks together, 0 to 10,000, found by the "
                   "server (then new ones with -f).")
@click.option("--interval", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds between polls with -f.")
@click.option("--color", "--colour", "color", type=click.Choice(["auto", "always", "never"]),
              default="auto", show_default=True,
              help="Keep the ranks' colour (SGR) sequences: auto keeps them on a terminal "
                   "unless NO_COLOR is set.")
@click.option("--raw", is_flag=True,
              help="Print the lines exactly as the ranks wrote them, escape sequences and "
                   "all: a rank's output can then set your terminal's title, write your "
                   "clipboard (OSC 52) or move the cursor.")
def logs(job_id: str, rank: int | None, all_ranks: bool, attempt: int | None, follow: bool,
         since: str | None, tail: int | None, interval: float, color: str, raw: bool) -> None:
    """Print what the job's ranks wrote (stdout to stdout, stderr to stderr).

    Lines come from CloudWatch Logs, where the agents ship them, by time (when
    the line was written), then rank, then seq (its offset in the rank's
    file); with several ranks each line starts with [rank N]. With -o json,
    one JSON object per line: {"rank", "stream", "time", "line", "seq", "id",
    "attempt"}.

    -f prints each line once, every rank's in order, although ranks' lines
    may arrive late (each poll reads again the last 30 s): a line shipped
    more than 30 s late is shown by a plain `gpujobs logs` but may be missed
    by -f. It returns once the job has ended and its last lines are read.

    Control characters are shown, not obeyed (ESC as ^[, BEL as ^G, as cat -v
    shows them), but for colour, kept on a terminal (--color); --raw prints
    the lines untouched.
    """
    if rank is not None and all_ranks:
        raise click.UsageError("--rank and --all-ranks exclude each other")
    client = make_client()
    if follow:
        ride_out(client)
    prefix = rank is None
    for line in client.iter_logs(job_id, attempt=attempt, rank=rank, since=since, tail=tail,
                                 follow=follow, interval_s=interval):
        _log_out(line, prefix, raw, color)


# -- events -------------------------------------------------------------------------------
#: the types of the tenant's feed (API.md "Events, webhooks and EventBridge")
FEED_TYPES = ("job.created", "job.state_changed", "job.retried", "job.stalled", "job.rank_slow",
              "webhook.disabled")


def _cursor_file(api_url: str, token: str, job_id: str | None, type_: str | None) -> pathlib.Path:
    """Where ``events -f`` keeps its cursor: one file per API, tenant
    (by a hash of its token) and filter, as the cursor is bound to them."""
    key = "\x1f".join((api_url, hashlib.sha256(token.encode()).hexdigest(), job_id or "",
                       type_ or ""))
    return state_dir() / "events" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".cursor")


def _save_cursor(path: pathlib.Path, cursor: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(cursor, encoding="utf-8")
    os.replace(tmp, path)  # whole or not at all: a kill never leaves half a cursor


@cli.command()
@common_options
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing events as they happen (long polls); resume where the "
                   "last --follow with the same filter stopped.")
@click.option("--job", "job_id", metavar="JOB_ID", help="Only this job's events.")
@click.option("--type", "type_", type=click.Choice(FEED_TYPES), help="Only events of this type.")
@click.option("--after", metavar="CURSOR", help="Start after this cursor (a next_cursor of "
              "the same filter), not at the oldest event kept or the saved one.")
def events(follow: bool, job_id: str | None, type_: str | None, after: str | None) -> None:
    """Print what happens to your jobs: the tenant's event feed, oldest first.

    One line per event: its time, job, type and what it says ("RUNNING ->
    FAILED (attempt 2): rank_failed: rank 3 on node-2 exited 1"). With -o json,
    one event object per line, as the API serves it.

    Without --follow, every event kept (8 days) or after --after, then it
    returns. With --follow it prints each event as it is recorded, each once
    and in order, and keeps its cursor under $XDG_STATE_HOME/gpujobs after
    every page, so that a later --follow with the same filter resumes there.
    """
    client = make_client()
    saved = _cursor_file(client.api_url, client.token or "", job_id, type_) if follow else None
    if follow:
        ride_out(client)
        if after is None and saved is not None and saved.is_file():
            after = saved.read_text(encoding="utf-8").strip() or None
    for e in client.iter_events(after=after, type=type_, job_id=job_id, follow=follow,
                                on_cursor=(lambda c: _save_cursor(saved, c)) if saved else None):
        if json_mode():
            click.echo(dumps(e.raw))
            continue
        click.echo(f"{short_time(e.time)}  {e.job_id}  {e.type:<17}  {clean(e.text)}")


# -- describe -----------------------------------------------------------------------------
#: each cause of lost GPU time in words (``job.usage.lost_gpu_seconds``)
CAUSE_WORDS = {"failed_attempt": "failed", "node_lost": "node lost", "startup": "startup",
               "stalled": "stalled", "preempted": "preempted", "cancelled": "cancelled",
               "checkpoint": "checkpoint", "timeout": "timed out"}
#: each part's mark and colour in the usage bar (a cause not listed: the last)
BAR_MARKS = {"productive": ("█", "green"), "startup": ("░", "cyan"), "stalled": ("▒", "yellow"),
             "failed_attempt": ("▓", "red"), "": ("▚", "magenta")}
BAR_WIDTH = 40


def gpu_amount(seconds: float, unit: str) -> str:
    """GPU-seconds in ``unit`` (``GPU-h``: one decimal; ``GPU-min``: one
    decimal; ``GPU-s``: whole)."""
    if unit == "GPU-h":
        return f"{seconds / 3600:.1f}"
    if unit == "GPU-min":
        return f"{seconds / 60:.1f}"
    return f"{seconds:.0f}"


def failed_words(attempts: Iterable["Attempt"], reasons: tuple[str, ...]) -> str:
    """``attempt 1 (rank 3 exited 1)``, ``attempts 1, 2``: the attempts that
    ended for ``reasons``, as ``job.usage``'s cause names them."""
    ended = [(a.attempt, a.exit) for a in attempts
             if a.exit is not None and a.exit.reason in reasons]
    if len(ended) == 1:
        n, e = ended[0]
        why = f" (rank {e.rank} exited {e.exit_code})" \
            if e.rank is not None and e.exit_code is not None else ""
        return f"attempt {n}{why}"
    if ended:
        return "attempts " + ", ".join(str(n) for n, _ in ended)
    return ""


def usage_parts(usage: "Usage") -> list[tuple[str, int]]:
    """(part, GPU-seconds) of a job's usage: productive first, then each
    cause, largest first."""
    lost = sorted(usage.lost_gpu_seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    return [("productive", usage.productive_gpu_seconds), *lost]


def usage_sentence(usage: "Usage", attempts: Iterable["Attempt"] = ()) -> str:
    """``held 12.4 GPU-h: 10.1 productive (81 %), 1.6 failed attempt 1 (rank
    3 exited 1), 0.5 stalled, 0.2 startup``: what the job's GPU time bought
    (``job.usage``), in GPU-h (GPU-min under an hour, GPU-s under a
    minute); ``(estimated: no steps recorded)`` when the split is an
    estimate."""
    held = usage.gpu_seconds
    if held <= 0:
        return "held no GPU time yet"
    unit = "GPU-h" if held >= 3600 else "GPU-min" if held >= 60 else "GPU-s"
    attempts = list(attempts)
    words = []
    for part, seconds in usage_parts(usage):
        if part == "productive":
            share = f" ({100 * seconds / held:.0f} %)"
            words.append(f"{gpu_amount(seconds, unit)} productive{share}")
            continue
        label = CAUSE_WORDS.get(part, part.replace("_", " "))
        which = failed_words(attempts, ("rank_failed", "port_in_use")) \
            if part == "failed_attempt" else ""
        words.append(f"{gpu_amount(seconds, unit)} {label}{' ' + which if which else ''}")
    estimated = " (estimated: no steps recorded)" if usage.estimated else ""
    return f"held {gpu_amount(held, unit)} {unit}: {', '.join(words)}{estimated}"


def usage_bar(usage: "Usage", width: int = BAR_WIDTH) -> str:
    """The usage as a bar of ``width`` marks (rich markup), one run of marks
    a part, in the sentence's order, by largest remainder."""
    parts = [(p, s) for p, s in usage_parts(usage) if s > 0]
    total = sum(s for _, s in parts)
    if total <= 0:
        return ""
    exact = [width * s / total for _, s in parts]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: -(exact[i] - cells[i]))[:width - sum(cells)]:
        cells[i] += 1
    out = []
    for (part, _), n in zip(parts, cells):
        mark, colour = BAR_MARKS.get(part, BAR_MARKS[""])
        if n:
            out.append(f"[{colour}]{mark * n}[/]")
    return "".join(out)


@cli.command()
@common_options
@click.argument("job_id")
def describe(job_id: str) -> None:
    """Everything about a job: spec, state, why it waits, attempts (node -> ranks),
    health and the story of its transitions.

    A job with dependencies shows each one and where it stands (waiting,
    met, can no longer be met); an array's index its parent and index; an
    array its indexes by state (`gpujobs list --parent JOB` lists them)."""
    client = make_client()
    job = client.get_job(job_id)
    items = client.list_attempts(job_id)
    events = client.list_events(job_id)
    if json_mode():
        out_json({"job": job.raw, "attempts": [a.raw for a in items],
                  "events": [e.raw for e in events]})
        return
    from rich.table import Table
    c = console()
    c.print(job_panel(job))
    if job.is_array:
        c.print()
        c.print(f"Its indexes: gpujobs list --parent {job.id}", style="dim")
    if job.usage is not None and not job.is_array:
        c.print()
        c.print("[bold]usage[/]")
        c.print(escape(usage_sentence(job.usage, items)))
        bar = usage_bar(job.usage)
        if bar:
            c.print(bar)
    if items:
        c.print()
        t = Table(box=None, header_style="bold", pad_edge=False, title="attempts",
                  title_justify="left", title_style="bold")
        for col in ("ATTEMPT", "STATE", "PLACEMENT (node: ranks)", "CREATED", "FINISHED", "EXIT"):
            t.add_column(col)
        for a in items:
            t.add_row(str(a.attempt), styled_state(a.state),
                      escape(placement_summary(a.placement)), short_time(a.created_at),
                      short_time(a.finished_at), escape(attempt_exit(a)))
        c.print(t)
    c.print()
    t = Table(box=None, header_style="bold", pad_edge=False, title="events",
              title_justify="left", title_style="bold")
    for col in ("TIME", "ATTEMPT", "EVENT", "REASON"):
        t.add_column(col)
    for e in events:
        said = (e.reason or "") + (f" on {e.node_id}" if e.node_id else "")
        reason = "\n".join([escape(said),
                            *([f"  {escape(e.detail)}"] if e.detail else []),
                            *([f"  {escape(e.decision)}"] if e.decision else []),
                            *([f"  jobs preempted: {escape(', '.join(e.jobs))}"] if e.jobs else []),
                            *(f"  {escape(stack_line(s))}" for s in e.stacks)])
        t.add_row(short_time(e.time), "-" if e.attempt is None else str(e.attempt),
                  escape(e.type), reason)
    c.print(t)


# -- nodes --------------------------------------------------------------------------------
#: what each drain mode (Cordon.drain) does to the node's running jobs, in words
DRAIN_WORDS = {"keep": "its running jobs run on",
               "stop": "its running jobs are preempted (SIGTERM, grace period, then requeued)",
               "wait": "its running jobs may finish"}
#: the same, short, for the table
DRAIN_SHORT = {"stop": "drain: jobs preempted", "wait": "drain --wait: jobs finish first"}
OPERATOR_HINT = ("cordon, drain and uncordon take an operator token (a tokens file entry "
                 '{"token": "...", "operator": "<your name>"}, see docs/security.md), not a '
                 "tenant's or an agent's: pass it with --token or GPUJOBS_TOKEN")


def cordon_text(cordon: "Cordon") -> str:
    """``bad ECC (by ops-oncall)``, ``retire (by ops-oncall; drain: jobs
    preempted)``, ``auto-cordoned: attempts of 3 jobs of 2 tenants ended rank_failed
    here within 3600 s (by gpujobs, auto)``: a cordon's reason, who and what it does."""
    notes = [f"by {cordon.by or '?'}" + (", auto" if cordon.auto else "")]
    if cordon.drain in DRAIN_SHORT:
        notes.append(DRAIN_SHORT[cordon.drain])
    return f"{cordon.reason or '-'} ({'; '.join(notes)})"


def gpus_in_use(node: "Node") -> str:
    used = node.gpus_used
    return "?" if used is None else f"{used} of {node.gpus} GPUs in use"


def nodes_table(items: list["Node"]) -> "RenderableType":
    from rich.table import Table
    t = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("NODE", "GPU TYPE", "GPUS", "FREE", "STATE", "LAST SEEN", "LABELS"):
        t.add_column(col, justify="right" if col in ("GPUS", "FREE") else "left")
    cordoned = any(n.cordon for n in items)
    if cordoned:
        t.add_column("CORDON")
    for n in items:
        row = [escape(n.node_id), escape(n.gpu_type or "-"), str(n.gpus or 0),
               "-" if n.gpus_free is None else str(n.gpus_free), escape(n.state or "-"),
               short_time(n.last_seen_at),
               escape(", ".join(f"{k}={v}" for k, v in n.labels.items()) or "-")]
        if cordoned:
            row.append(escape(cordon_text(n.cordon)) if n.cordon else "")
        t.add_row(*row)
    return t


def node_summary(node: "Node") -> str:
    """One line (rich markup) on what the node does now: ``node-1: DRAINING —
    bad ECC (by ops-oncall) since ...; its running jobs run on; 6 of 8 GPUs in
    use``, or ``node-1: READY, takes placements; ...``."""
    head = f"[bold]{escape(node.node_id)}[/]: {escape(node.state or '-')}"
    c = node.cordon
    if c is None:
        return f"{head}, takes placements; {gpus_in_use(node)}"
    return (f"{head} — {escape(c.reason or '-')} (by {escape(c.by or '?')}"
            f"{', auto' if c.auto else ''}, since {escape(short_time(c.at))}); no new placements, "
            f"{escape(DRAIN_WORDS.get(c.drain, c.drain))}; {gpus_in_use(node)}")


def operator_call(call: Callable[[], "Node"]) -> "Node":
    """An operator action: a 403 says which token it needs, a 404 how to
    find the nodes."""
    from .errors import Forbidden, NotFound
    try:
        return call()
    except Forbidden as e:
        e.hint = OPERATOR_HINT
        raise
    except NotFound as e:
        e.hint = "`gpujobs nodes` lists the registered nodes"
        raise


class NodesGroup(GpujobsGroup):
    """``gpujobs nodes`` lists, ``gpujobs nodes NODE_ID`` shows one node (as
    before the subcommands), ``gpujobs nodes cordon|drain|uncordon|show ...``
    run the subcommand: a first argument that names no subcommand is a node
    id (``gpujobs nodes show cordon`` shows a node named ``cordon``)."""

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "show", self.commands["show"], args
        return super().resolve_command(ctx, args)

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "[NODE_ID | COMMAND [ARGS]...]"]


@cli.group(cls=NodesGroup, invoke_without_command=True)
@common_options
@click.pass_context
def nodes(ctx: click.Context) -> None:
    """List the GPU nodes, their state and cordon (or show one: gpujobs nodes NODE_ID).

    A cordoned node is DRAINING: it takes no new placements, and the CORDON
    column says why, by whom (an operator's name, or "gpujobs, auto" when the
    node cordoned itself after repeated rank_failed attempts) and what it
    does to the jobs running there.

    cordon, drain and uncordon take an operator token (docs/security.md);
    a tenant's or an agent's is refused (403, exit 1).

    \b
      gpujobs nodes cordon node-3 --reason "bad ECC on GPU 3"
      gpujobs nodes drain node-3 --reason "bad ECC on GPU 3"          # preempt its jobs
      gpujobs nodes drain node-3 --reason retire --wait --timeout 3600  # let them finish
      gpujobs nodes uncordon node-3
    """
    if ctx.invoked_subcommand is not None:
        return
    items = make_client().list_nodes()
    if json_mode():
        out_json({"nodes": [n.raw for n in items]})
        return
    c = console()
    if not items:
        c.print("No nodes registered.")
        return
    c.print(nodes_table(items))


@nodes.command(name="show")
@common_options
@click.argument("node_id")
def nodes_show(node_id: str) -> None:
    """Show one node (also: gpujobs nodes NODE_ID)."""
    node = make_client().get_node(node_id)
    if json_mode():
        out_json(node.raw)
        return
    c = console()
    c.print(nodes_table([node]))
    if node.cordon is not None:
        c.print(node_summary(node))


@nodes.command(name="cordon")
@common_options
@click.argument("node_id")
@click.option("--reason", help="Why (shown with the node; cordoning again replaces it).")
def nodes_cordon(node_id: str, reason: str | None) -> None:
    """Stop new placements on a node (DRAINING); its jobs run on.

    Needs an operator token. Repeating it is harmless (the reason is replaced).
    `gpujobs nodes uncordon NODE_ID` lifts it.
    """
    client = make_client()
    node = operator_call(lambda: client.cordon_node(node_id, reason))
    if json_mode():
        out_json(node.raw)
        return
    console().print(f"Cordoned: {node_summary(node)}")


@nodes.command(name="drain")
@common_options
@click.argument("node_id")
@click.option("--reason", help="Why (shown with the node and in each preempted job's retry "
              "decision).")
@click.option("--wait", is_flag=True, help="Let the running jobs finish instead of preempting "
              "them, and wait until the node's GPUs are all free (exit 0).")
@click.option("--interval", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Seconds between polls with --wait.")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=0),
              help="With --wait, give up after this many seconds (exit 7; the drain goes on).")
def nodes_drain(node_id: str, reason: str | None, wait: bool, interval: float,
                wait_timeout: float | None) -> None:
    """Cordon a node and stop its running jobs (202 Accepted).

    Without --wait, every attempt running on the node is preempted: its ranks
    get SIGTERM and their grace period (to checkpoint), then the job goes
    back to PENDING with exit reason preempted, and its retry rules decide
    (by default a retry that does not count against --max-attempts). With
    --wait the jobs finish as they would, and the command polls the node until
    every GPU is free: exit 0 once drained, 7 at --timeout. Needs an operator
    token; `gpujobs nodes uncordon NODE_ID` lifts the drain.
    """
    if wait_timeout is not None and not wait:
        raise click.UsageError("--timeout needs --wait")
    client = make_client()
    node = operator_call(lambda: client.drain_node(node_id, reason, wait=wait))
    c = None if json_mode() else console()
    if c is not None:
        c.print(f"Drain accepted (202): {node_summary(node)}")
    if wait and node.gpus_used != 0:
        if c is not None:
            c.print("Waiting for its jobs to finish (Ctrl-C stops waiting; the drain goes "
                    "on)...", style="dim")
        last = node.gpus_used

        def progress(n: "Node") -> None:
            nonlocal last
            if c is not None and n.gpus_used != last:
                last = n.gpus_used
                c.print(f"  {gpus_in_use(n)}")

        from .client import NodeWaitTimeout
        ride_out(client)
        try:
            node = client.wait_for_drain(node_id, interval_s=interval, timeout_s=wait_timeout,
                                         on_poll=progress)
        except NodeWaitTimeout as e:
            raise NodeWaitGaveUp(str(e), e.node) from None
    if json_mode():
        out_json(node.raw)
    elif wait:
        assert c is not None
        c.print(f"Drained: [bold]{escape(node.node_id)}[/] has no job left "
                f"({gpus_in_use(node)}).")


@nodes.command(name="uncordon")
@common_options
@click.argument("node_id")
def nodes_uncordon(node_id: str) -> None:
    """Lift a node's cordon or drain: it takes placements again (READY).

    Needs an operator token. A node without a cordon is left as it is.
    """
    client = make_client()
    node = operator_call(lambda: client.uncordon_node(node_id))
    if json_mode():
        out_json(node.raw)
        return
    console().print(f"Uncordoned: {node_summary(node)}")


# -- health -------------------------------------------------------------------------------
@cli.command()
@common_options
def health() -> None:
    """Check that the API answers (GET /v1/health, no token needed)."""
    client = make_client(need_token=False)
    data = client.health()
    if json_mode():
        out_json(data)
    else:
        click.echo(clean(f"{client.api_url}: {data.get('status', data)}"))


# -- webhooks -------------------------------------------------------------------------------
#: the event types a webhook may ask for (docs/api.md "Webhooks"): the feed's
WEBHOOK_TYPES = FEED_TYPES


def webhook_line(w: dict[str, Any]) -> str:
    types = ", ".join(w.get("types") or [])
    if set(w.get("types") or []) == set(WEBHOOK_TYPES):
        types = "all types"
    out = f"{w['id']}  {w.get('state', '?'):<8}  {w.get('url')}  ({types})"
    if w.get("description"):
        out += f"  {w['description']}"
    return clean(out)


def delivery_line(d: dict[str, Any]) -> str:
    status = d.get("status_code")
    if d.get("error") is None:
        result = f"delivered ({status})"
    else:
        result = f"failed ({status if status is not None else 'no answer'}): {d['error']}"
        if d.get("next_retry_at"):
            result += f"; next try {short_time(d['next_retry_at'])}"
    return clean(f"{short_time(d.get('at'))}  {d.get('event_id')}  attempt {d.get('attempt')}  "
                 f"{result}")


@cli.group(cls=GpujobsGroup)
def webhooks() -> None:
    """Push the tenant's job events to your own HTTPS endpoint (signed webhooks).

    Each delivery is a POST signed as Standard Webhooks 1.0 says (headers
    webhook-id, webhook-timestamp, webhook-signature; verify them with the
    secret that `add` prints once: client/README.md "Webhooks"). Failures are
    retried for more than 24 hours; `deliveries` shows every attempt.

    \b
      gpujobs webhooks add https://hooks.example.com/gpujobs --type job.stalled
      gpujobs webhooks list
      gpujobs webhooks test wh_...
      gpujobs webhooks deliveries wh_...
      gpujobs webhooks rm wh_...
    """


@webhooks.command(name="add")
@common_options
@click.argument("url")
@click.option("--type", "types", multiple=True, type=click.Choice(WEBHOOK_TYPES),
              help="An event type to deliver (repeat for more; default: all).")
@click.option("--description", help="A note of yours, shown with the webhook.")
def webhooks_add(url: str, types: tuple[str, ...], description: str | None) -> None:
    """Register a webhook for URL; prints its secret, once."""
    made = make_client().create_webhook(url, types=types or None, description=description)
    if json_mode():
        out_json(made)
        return
    click.echo(clean(f"Webhook {made['id']} created: {made['url']}"))
    click.echo(clean(f"Types: {', '.join(made.get('types') or [])}"))
    click.echo(clean(f"Secret (shown only now, keep it): {made['secret']}"))
    click.echo("Verify each delivery's webhook-signature with it (client/README.md, Webhooks).")


@webhooks.command(name="list")
@common_options
def webhooks_list() -> None:
    """List your webhooks (never their secrets)."""
    found = make_client().list_webhooks()
    if json_mode():
        out_json({"webhooks": found})
        return
    if not found:
        click.echo("No webhooks.")
    for w in found:
        click.echo(webhook_line(w))


@webhooks.command(name="rm")
@common_options
@click.argument("webhook_id")
def webhooks_rm(webhook_id: str) -> None:
    """Delete a webhook: it gets no more deliveries."""
    make_client().delete_webhook(webhook_id)
    if json_mode():
        out_json({"deleted": webhook_id})
    else:
        click.echo(clean(f"Webhook {webhook_id} deleted."))


@webhooks.command(name="deliveries")
@common_options
@click.argument("webhook_id")
@click.option("--page-size", type=click.IntRange(1, 100), default=20, show_default=True,
              help="Records a page.")
@click.option("--page-token", help="The next page's token, as a previous page printed it.")
def webhooks_deliveries(webhook_id: str, page_size: int, page_token: str | None) -> None:
    """Show a webhook's delivery attempts, newest first."""
    page = make_client().webhook_deliveries(webhook_id, page_size=page_size,
                                            page_token=page_token)
    if json_mode():
        out_json(page)
        return
    found = page.get("deliveries") or []
    if not found:
        click.echo(clean(f"No deliveries for {webhook_id} yet."))
    for d in found:
        click.echo(delivery_line(d))
    if page.get("next_page_token"):
        click.echo(clean(f"More: gpujobs webhooks deliveries {webhook_id} "
                         f"--page-token {page['next_page_token']}"))


@webhooks.command(name="test")
@common_options
@click.argument("webhook_id")
def webhooks_test(webhook_id: str) -> None:
    """Send a signed test event (type webhook.test) to a webhook."""
    event = make_client().test_webhook(webhook_id)
    if json_mode():
        out_json(event)
        return
    click.echo(clean(f"Test event {event['id']} queued for {webhook_id}; see it arrive with: "
                     f"gpujobs webhooks deliveries {webhook_id}"))


# -- config -------------------------------------------------------------------------------
def _mask(token: str | None) -> str | None:
    if not token:
        return None
    return token[:4] + "…" if len(token) > 8 else "…"


@cli.group(cls=GpujobsGroup)
def config() -> None:
    """Read or write the config file ($XDG_CONFIG_HOME/gpujobs/config.toml).

    Keys: api_url, token. Flags and environment variables override the file.
    """


def _check_key(key: str) -> str:
    key = key.lower().replace("-", "_")
    if key not in KEYS:
        raise click.BadParameter(f"{key!r} is not one of: {', '.join(KEYS)}", param_hint="KEY")
    return key


@config.command(name="set")
@common_options
@click.argument("key")
@click.argument("value", required=False)
def config_set(key: str, value: str | None) -> None:
    """Set KEY to VALUE (without VALUE, prompt for it, hidden for the token)."""
    key = _check_key(key)
    if value is None:
        value = click.prompt(key, hide_input=key == "token")
    if not value:
        raise click.BadParameter("the value must not be empty (use `gpujobs config unset`)")
    path = config_path()
    values = load_file(path)
    values[key] = value.rstrip("/") if key == "api_url" else value
    save_file(path, values)
    if json_mode():
        out_json({"path": str(path), "key": key})
    else:
        click.echo(f"{key} saved in {path}")


@config.command(name="unset")
@common_options
@click.argument("key")
def config_unset(key: str) -> None:
    """Remove KEY from the config file."""
    key = _check_key(key)
    path = config_path()
    values = load_file(path)
    values.pop(key, None)
    save_file(path, values)
    if not json_mode():
        click.echo(f"{key} removed from {path}")
    else:
        out_json({"path": str(path), "key": key})


@config.command(name="show")
@common_options
@click.option("--show-token", is_flag=True, help="Print the token itself, not a masked prefix.")
def config_show(show_token: bool) -> None:
    """Show the settings in effect and where each one comes from."""
    cfg = resolve(_setting("api_url"), _setting("token"))
    token = cfg.token if show_token else _mask(cfg.token)
    data = {"api_url": cfg.api_url, "token": token, "sources": cfg.sources,
            "config_file": str(cfg.path),
            "local_stack_file": None if cfg.local_path is None else str(cfg.local_path)}
    if json_mode():
        out_json(data)
        return
    click.echo(f"api_url  {cfg.api_url}  ({cfg.sources['api_url']})")
    click.echo(f"token    {token or '(none)'}  ({cfg.sources['token']})")
    click.echo(f"file     {cfg.path}")
    if cfg.local_path is not None:
        click.echo(f"local    {cfg.local_path}  (written by the running make up)")


@config.command(name="get")
@common_options
@click.argument("key", type=click.Choice(KEYS))
def config_get(key: str) -> None:
    """Print one setting in effect, as it is (for scripts:
    curl "$(gpujobs config get api_url)/v1/health")."""
    cfg = resolve(_setting("api_url"), _setting("token"))
    value = cfg.api_url if key == "api_url" else cfg.token
    if json_mode():
        out_json({"key": key, "value": value, "source": cfg.sources[key]})
        return
    if value is None:
        raise click.UsageError(f"no {key} is set (see gpujobs config show)")
    click.echo(value)


@config.command(name="path")
def config_path_cmd() -> None:
    """Print the config file's path."""
    click.echo(str(config_path()))



# -- usage (GET /v1/usage) -------------------------------------------------------------
_AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def when(value: str, option: str, now: "datetime") -> str:
    """``7d``, ``12h``, ``30m``, ``2w`` ago, or an RFC 3339 time, as the API
    takes it."""
    from datetime import datetime, timedelta, timezone

    text = value.strip()
    if text[:-1].isdigit() and text[-1:] in _AGO:
        t = now - timedelta(seconds=int(text[:-1]) * _AGO[text[-1]])
    else:
        try:
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter("a duration ago (7d, 12h, 30m, 2w) or an RFC 3339 time",
                                     param_hint=option) from None
        t = t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _period(row: dict[str, Any], granularity: str) -> str:
    start = str(row.get("start") or "")
    return start[:10] if granularity == "day" else f"{start[:10]} {start[11:16]}"


def _group_title(by: str | None) -> str | None:
    if by is None:
        return None
    return {"gpu_type": "GPU type", "job": "Job"}.get(by, by.partition(":")[2] or by)


def usage_table(rows: list[dict[str, Any]], *, by: str | None, granularity: str) -> list[list[str]]:
    """The rows as sreport prints them: a header, then a line per row and a
    total; GPU-hours to 2 decimals, one column per cause of loss."""
    causes = sorted({c for r in rows for c in (r.get("lost_gpu_seconds") or {})})
    priced = any("cost" in r for r in rows)
    title = _group_title(by)
    head = ["Period", "Tenant"] + ([title] if title else []) + \
        ["GPU-h", "Productive", "Goodput"] + [c.replace("_", " ").capitalize() for c in causes] + \
        ["Jobs"] + (["Cost"] if priced else [])
    table = [head]

    def line(first: list[str], held: int, productive: int, lost: dict[str, int], jobs: str,
             cost: float | None) -> list[str]:
        good = f"{100 * productive / held:.0f} %" if held else "-"
        return first + [f"{held / 3600:.2f}", f"{productive / 3600:.2f}", good] + \
            [f"{lost.get(c, 0) / 3600:.2f}" for c in causes] + [jobs] + \
            ([("-" if cost is None else f"{cost:.2f}")] if priced else [])

    totals: dict[str, int] = {}
    total_cost: float | None = 0.0
    for r in rows:
        value = next(iter((r.get("group") or {}).values()), None) if title else None
        first = [_period(r, granularity), str(r.get("tenant"))] + \
            ([("(none)" if value is None else str(value))] if title else [])
        lost = r.get("lost_gpu_seconds") or {}
        table.append(line(first, int(r["gpu_seconds"]), int(r["productive_gpu_seconds"]), lost,
                          str(r.get("jobs", "")), r.get("cost")))
        totals["held"] = totals.get("held", 0) + int(r["gpu_seconds"])
        totals["productive"] = totals.get("productive", 0) + int(r["productive_gpu_seconds"])
        for c, v in lost.items():
            totals[c] = totals.get(c, 0) + int(v)
        if priced:
            total_cost = None if total_cost is None or r.get("cost") is None \
                else total_cost + r["cost"]
    table.append(line(["Total", ""] + ([""] if title else []), totals.get("held", 0),
                      totals.get("productive", 0), totals, "", total_cost))
    return table


def render_table(table: list[list[str]]) -> list[str]:
    """Columns as sreport draws them: text left, figures right, a rule of
    dashes under the header and above the total."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    left = {0, 1, 2} if table[0][2] not in ("GPU-h",) else {0, 1}

    def fmt(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    rule = "  ".join("-" * w for w in widths)
    return [fmt(table[0]), rule, *(fmt(r) for r in table[1:-1]), rule, fmt(table[-1])]


def usage_csv(rows: list[dict[str, Any]], *, by: str | None) -> str:
    """The rows as CSV (parsable, as sreport -P): exact GPU-seconds and hours,
    one column per cause of loss; no total."""
    import csv
    import io

    causes = sorted({c for r in rows for c in (r.get("lost_gpu_seconds") or {})})
    priced = any("cost" in r for r in rows)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["start", "end", "tenant"] + ([by] if by else []) +
               ["gpu_seconds", "productive_gpu_seconds"] + [f"lost_{c}_gpu_seconds" for c in causes] +
               ["gpu_hours", "productive_gpu_hours", "jobs"] + (["cost"] if priced else []))
    for r in rows:
        lost = r.get("lost_gpu_seconds") or {}
        value = next(iter((r.get("group") or {}).values()), None) if by else None
        w.writerow([r.get("start"), r.get("end"), r.get("tenant")] +
                   ([("" if value is None else value)] if by else []) +
                   [r.get("gpu_seconds"), r.get("productive_gpu_seconds")] +
                   [lost.get(c, 0) for c in causes] +
                   [r.get("gpu_hours"), r.get("productive_gpu_hours"), r.get("jobs")] +
                   ([("" if r.get("cost") is None else r["cost"])] if priced else []))
    return out.getvalue()


@cli.command(name="usage")
@common_options
@click.option("--since", default="7d", show_default=True, metavar="WHEN",
              help="From when: a duration ago (7d, 12h, 30m, 2w) or an RFC 3339 time.")
@click.option("--until", metavar="WHEN", help="Up to when (default: now); as --since.")
@click.option("--by", "by", metavar="GROUP",
              help="Group by gpu_type, job or label:<key> (e.g. label:team).")
@click.option("--granularity", type=click.Choice(["day", "hour"]), default="day",
              show_default=True, help="A row per day (UTC) or per hour.")
@click.option("--tenant", help="An operator's token: this tenant only (default: every tenant).")
@click.option("--csv", "as_csv", is_flag=True, help="CSV instead of the table (for spreadsheets).")
def usage_cmd(since: str, until: str | None, by: str | None, granularity: str,
              tenant: str | None, as_csv: bool) -> None:
    """GPU-hours held, productive and lost by cause, per day or hour (GET /v1/usage).

    \b
      gpujobs usage --since 7d --by label:team
      gpujobs usage --since 2026-12-01T00:00:00Z --until 1d --by gpu_type --granularity hour
      gpujobs usage --since 30d --by job --csv > usage.csv
    """
    now = _utcnow()
    start = when(since, "--since", now)
    end = when(until, "--until", now) if until else None
    rows = make_client().usage(start, end=end, granularity=granularity, group_by=by,
                               tenant=tenant)
    if json_mode():
        out_json({"rows": rows})
        return
    if as_csv:
        click.echo(clean(usage_csv(rows, by=by), newlines=True), nl=False)
        return
    click.echo(clean(f"Usage {start} - {end or when('0s', '--until', now)}"
                     f"{f' by {by}' if by else ''}, per {granularity}"))
    click.echo("Usage reported in GPU-hours")
    if not rows:
        click.echo("No usage in this period.")
        return
    for text in render_table(usage_table(rows, by=by, granularity=granularity)):
        click.echo(clean(text))

def main() -> NoReturn:
    cli.main(prog_name="gpujobs")
    raise SystemExit(0)  # pragma: no cover - cli.main always exits


if __name__ == "__main__":
    main()
