"""An in-memory gpujobs API over real HTTP (http.server in a thread on
127.0.0.1, port 0), following ../shared/API.md, with fault injection.

It serves every endpoint of the contract, including those the real server
does not have yet (nodes, events, heartbeats, ranks), so the SDK and CLI can
be tested against them. Tests script faults with :meth:`FakeApi.fail` and
read what was sent in :attr:`FakeApi.requests`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STATES = {"PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}
TITLES = {"invalid_argument": "Invalid argument", "invalid_page_token": "Invalid page token",
          "unauthenticated": "Unauthenticated", "forbidden": "Forbidden",
          "not_found": "Not found", "already_finished": "Job already finished",
          "request_in_progress": "Request in progress", "stale_attempt": "Stale attempt",
          "idempotency_key_reused": "Idempotency key reused",
          "unavailable": "Service unavailable", "internal": "Internal error",
          "rate_limited": "Too many requests"}
EPOCH = datetime(2025, 1, 31, 12, 0, 0, tzinfo=timezone.utc)
#: chalicelib/domain/dependencies.py and arrays.py
CONDITIONS = ("succeeded", "failed", "ended")
WAITING_WORDS = {"succeeded": "succeed", "failed": "fail", "ended": "end"}
MAX_DEPENDENCIES = 100
MAX_ARRAY_SIZE = 10_000
FEED_WINDOW = 500


def problem(status: int, code: str, detail: str, field: str | None = None) -> dict[str, Any]:
    p = {"type": f"urn:gpujobs:problem:{code}", "title": TITLES.get(code, code), "status": status,
         "detail": detail, "code": code}
    if field is not None:
        p["field"] = field
    return p



def _log_key(line: dict) -> tuple:
    """Where a line sorts in /logs (chalicelib/service/logs.py ``position``)."""
    seq, ident = line.get("seq"), line.get("id") or ""
    if seq is not None:
        return (line["time"], line["rank"], 0, seq, "")
    return (line["time"], line["rank"], 1, len(ident), ident)

class Problem(Exception):
    def __init__(self, status: int, code: str, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.body = status, problem(status, code, detail, field)
        self.headers = headers or {}


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    action: str                  # "drop_before", "drop_after", "status", "hang"
    times: int
    status: int = 503
    code: str = "unavailable"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None    # raw body instead of problem JSON
    ctype: str = "text/html"


class FakeApi:
    def __init__(self, tokens: dict[str, tuple[str, str]] | None = None) -> None:
        self.tokens = tokens or {"t1": ("tenant", "acme"), "t2": ("tenant", "other"),
                                 "a1": ("agent", "*"), "a-node-1": ("agent", "node-1"),
                                 "o1": ("operator", "ops-oncall")}
        self.lock = threading.RLock()
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.tenant_of: dict[str, str] = {}
        self.keys: dict[tuple[str, str], tuple[str, str]] = {}
        self.attempts: dict[str, list[dict[str, Any]]] = {}
        self.beats: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        #: job id -> rank -> the status /ranks says (unset: no status, as an
        #: older server)
        self.rank_statuses: dict[str, dict[int, str]] = {}
        #: more members of a rank's row in the ranks view (step_time_s, slow_score...)
        self.rank_extras: dict[str, dict[int, dict[str, Any]]] = {}
        #: ranks a /ranks page holds, as the server cuts a big attempt's view
        #: (None: every rank in one page)
        self.ranks_page_size: int | None = None
        self.nodes: dict[str, dict[str, Any]] = {}
        #: job id -> its log lines ({"rank", "stream", "time", "line", "id", "attempt"})
        self.logs: dict[str, list[dict[str, Any]]] = {}
        #: lines the logs endpoint has answered with, in all
        self.logs_served = 0
        self.events: dict[str, list[dict[str, Any]]] = {}
        #: what GET /v1/usage answers with (the query is in ``requests``)
        self.usage_rows: list[dict[str, Any]] = []
        #: the operator's priority classes (GPUJOBS_PRIORITY_CLASSES, as
        #: chalicelib/domain/priority.py parses it): name -> value, preempts,
        #: tenants (absent: every tenant); ``default`` is always there
        self.priority_classes: dict[str, dict[str, Any]] = {"default": {"value": 0}}
        self.clock = 0.0                   # seconds since EPOCH; tests move it
        self.on_get_job: list[Callable[[dict[str, Any]], None]] = []
        #: called with the node before each GET /v1/nodes/{id} answers
        self.on_get_node: list[Callable[[dict[str, Any]], None]] = []
        self.release = threading.Event()   # ends "hang" faults
        self._seq = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True,
                                       name="fake-gpujobs-api")

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> "FakeApi":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    # -- test helpers --------------------------------------------------------------
    def fail(self, method: str, path: str, action: str = "status", *, times: int = 1,
             status: int = 503, code: str = "unavailable", headers: dict[str, str] | None = None,
             body: bytes | None = None, ctype: str = "text/html") -> None:
        """The next ``times`` requests matching ``method`` and the ``path``
        regex (full match) get ``action`` instead of the normal answer."""
        with self.lock:
            self.faults.append(Fault(method.upper(), re.compile(path), action, times, status,
                                     code, dict(headers or {}), body, ctype))

    def sent(self, method: str, path: str) -> list[Recorded]:
        rx = re.compile(path)
        with self.lock:
            return [r for r in self.requests if r.method == method and rx.fullmatch(r.path)]

    def now(self) -> str:
        return _ts(self.clock)

    def add_job(self, tenant: str = "acme", **spec: Any) -> dict[str, Any]:
        with self.lock:
            return self._create(tenant, {"command": ["true"], "ranks": 1, **spec})

    def update_job(self, job_id: str, **changes: Any) -> dict[str, Any]:
        with self.lock:
            job = self.jobs[job_id]
            for k, v in changes.items():
                if k == "health":
                    job["health"] = {**job["health"], **v}
                else:
                    job[k] = v
            job["updated_at"] = self.now()
            if "state" in changes and job.get("parent_id"):
                self._array_changed(self.jobs[job["parent_id"]])
            return job

    def end(self, job_id: str, state: str, reason: str | None = None,
            exit_code: int | None = None, **more: Any) -> dict[str, Any]:
        """End a job as the server does (its attempt, then what follows: its
        array's counts and end, its dependents, down the chain)."""
        with self.lock:
            job = self.jobs[job_id]
            default = {"SUCCEEDED": "succeeded", "CANCELLED": "cancelled"}.get(state,
                                                                             "rank_failed")
            self._finish(job, state, reason or default,
                         exit_code if exit_code is not None or state != "SUCCEEDED" else 0,
                         **more)
            return job

    def children(self, parent_id: str) -> list[dict[str, Any]]:
        """The array's children made so far, in index order."""
        with self.lock:
            return sorted((j for j in self.jobs.values() if j.get("parent_id") == parent_id),
                          key=lambda j: j["array_index"])

    def add_node(self, node_id: str, gpus: int = 8, gpu_type: str = "h100",
                 **more: Any) -> dict[str, Any]:
        """A node as GET /v1/nodes serves it (``more`` overrides: gpus_free,
        state, cordon...)."""
        with self.lock:
            node = {"node_id": node_id, "gpus": gpus, "gpus_free": gpus, "gpu_type": gpu_type,
                    "state": "READY", "inbox_queue_url": f"http://127.0.0.1:1/queue/inbox-{node_id}",
                    "last_seen_at": self.now(), "labels": {}, "address": node_id,
                    "isolation": "none", "cordon": None, **more}
            self.nodes[node_id] = node
            return node

    def place(self, job_id: str, nodes: list[str], state: str = "RUNNING") -> dict[str, Any]:
        """Make a new attempt placing rank i on nodes[i % len(nodes)]."""
        with self.lock:
            job = self.jobs[job_id]
            n = job["attempt"] + 1
            ranks = job["spec"]["ranks"]
            att = {"attempt": n, "state": state,
                   "placement": [{"rank": r, "node_id": nodes[r % len(nodes)]}
                                 for r in range(ranks)],
                   "created_at": self.now(), "finished_at": None, "exit": None,
                   "_started": self.clock}
            self.attempts.setdefault(job_id, []).append(att)
            self.update_job(job_id, attempt=n, state=state, pending_reason=None,
                            pending_since=None, waiting_for=None,
                            started_at=self.now() if state == "RUNNING" else None)
            return att

    def preempt(self, job_id: str, victims: list[str]) -> dict[str, Any]:
        """What the placer does for a PENDING job of a class that preempts
        (service/placement.py _preempt_for): the preemption recorded on it
        (``preempting``, its pending reason, a ``preempting`` event naming
        the victims), then each victim's attempt ended ``preempted`` "by
        <job>, priority class <class>", its retry rules deciding."""
        with self.lock:
            job = self.jobs[job_id]
            cls = job["spec"].get("priority_class") or "default"
            freed = sum(self.jobs[v]["spec"]["ranks"] * self.jobs[v]["spec"]["gpus_per_rank"]
                        for v in victims)
            reason = (f"preempting {', '.join(victims)} ({freed} GPUs of lower priority "
                      f"classes) to make room ({cls})")
            job.update(preempting={"jobs": list(victims), "at": self.now(), "class": cls},
                       pending_reason=reason, updated_at=self.now())
            event: dict[str, Any] = {"type": "preempting", "time": self.now(),
                                     "reason": reason, "jobs": list(victims)}
            if job["attempt"]:
                event["attempt"] = job["attempt"]
            self.events.setdefault(job_id, []).append(event)
            for victim_id in victims:
                victim = self.jobs[victim_id]
                att = next((a for a in self.attempts.get(victim_id, [])
                            if a["attempt"] == victim["attempt"] and a["finished_at"] is None),
                           None)
                if att is not None and victim["state"] in ("SCHEDULED", "RUNNING"):
                    self._end_preempted(victim, att, {
                        "reason": "preempted", "exit_code": None,
                        "detail": f"by {job_id}, priority class {cls}"})
            return job

    # -- the API ----------------------------------------------------------------------
    def _check_priority_class(self, tenant: str, b: dict[str, Any]) -> None:
        """chalicelib/api/schemas.py JOB_CREATE's pattern, then service/jobs.py
        create: an unknown class is a 400, one kept for other tenants a 403,
        both naming priority_class."""
        if "priority_class" not in b:
            return
        name = b["priority_class"]
        if not isinstance(name, str):
            raise Problem(400, "invalid_argument", "priority_class must be string",
                          "priority_class")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
            raise Problem(400, "invalid_argument",
                          "priority_class must match pattern ^[A-Za-z0-9._-]{1,64}$",
                          "priority_class")
        classes = self.priority_classes
        if name not in classes:
            names = sorted(classes, key=lambda n: (-classes[n].get("value", 0), n))
            raise Problem(400, "invalid_argument",
                          f"priority_class {name!r} is not one of this deployment's classes: "
                          f"{', '.join(names)}", "priority_class")
        allowed = classes[name].get("tenants")
        if allowed is not None and tenant not in allowed:
            raise Problem(403, "forbidden",
                          f"tenant {tenant} may not submit to priority class {name}",
                          "priority_class")

    def _create(self, tenant: str, body: dict[str, Any], *, parent_id: str | None = None,
                index: int | None = None) -> dict[str, Any]:
        self._seq += 1
        job_id = f"job_{self._seq:026d}"
        # the defaults of chalicelib/domain/spec.py (JobSpec.parse)
        hb = {"interval_s": 10, "false_positive_budget_per_hour": 0.001,
              "miss_probability": 0.01, "startup_grace_s": 120, "mode": "auto",
              "max_busy_s": 900, "idle_s": 300, "slow_score": 0.7,
              **(body.get("heartbeat") or {})}
        retry = {"rules": [], "max_uncounted_retries": 10, **(body.get("retry") or {})}
        spec = {"gpus_per_rank": 1, "priority": 0, "max_attempts": 1, "on_stall": "report",
                "env": {}, "labels": {}, **body, "heartbeat": hb, "retry": retry}
        if "warn_before_s" in spec:
            spec.setdefault("warn_signal", "SIGUSR1")
        if spec.get("depends_on"):
            spec["depends_on"] = [{**d, "condition": d.get("condition", "succeeded")}
                                  for d in spec["depends_on"]]
        job = {"id": job_id, "name": body.get("name"), "state": "PENDING", "spec": spec,
               "attempt": 0, "created_at": self.now(), "updated_at": self.now(),
               "started_at": None, "finished_at": None, "cancel_requested_at": None,
               "cancel_reason": None,
               "health": {"status": "UNKNOWN", "threshold_s": 3.0 * hb["interval_s"],
                          "first_stalled_rank": None, "last_heard_at": None,
                          "detected_at": None, "stalled_ranks": [], "verdict": None},
               "exit": None, "pending_reason": None, "pending_since": self.now(),
               "uncounted_retries": 0, "preempting": None, "waiting_for": None,
               "parent_id": parent_id, "array_index": index, "array": None, "queue": None,
               "usage": None}
        if "array" in spec:
            job["array"] = {"size": spec["array"]["size"], "materialized": 0, "counts": {}}
            self._count(job)
        self.jobs[job_id] = job
        self.tenant_of[job_id] = tenant
        # service/pipelines.py: what it waits for, judged once it exists
        job["waiting_for"] = [d["job_id"] for d in spec.get("depends_on") or []] or None
        self._resolve(job)
        if job["array"] is not None:
            self._array_changed(job)
        return job

    # -- pipelines and sweeps (chalicelib/service/pipelines.py) -------------------
    def _check_pipeline(self, tenant: str, b: dict[str, Any]) -> None:
        """schemas.DEPENDS_ON and ARRAY, validation._array, then
        PipelinesService.unmet: what the server refuses, naming the member."""
        deps = b.get("depends_on")
        if deps is not None:
            if not isinstance(deps, list) or len(deps) > MAX_DEPENDENCIES:
                raise Problem(400, "invalid_argument",
                              f"depends_on must be a list of at most {MAX_DEPENDENCIES}",
                              "depends_on")
            seen = set()
            for i, d in enumerate(deps):
                if not isinstance(d, dict) or not isinstance(d.get("job_id"), str) \
                        or set(d) - {"job_id", "condition"}:
                    raise Problem(400, "invalid_argument", "a dependency is {job_id, condition}",
                                  f"depends_on.{i}")
                if d.get("condition", "succeeded") not in CONDITIONS:
                    raise Problem(400, "invalid_argument",
                                  f"condition must be one of {', '.join(CONDITIONS)}",
                                  f"depends_on.{i}.condition")
                if d["job_id"] in seen:
                    raise Problem(400, "invalid_argument",
                                  f"depends_on names {d['job_id']} twice",
                                  f"depends_on.{i}.job_id")
                seen.add(d["job_id"])
            for i, d in enumerate(deps):
                if self.tenant_of.get(d["job_id"]) != tenant:
                    raise Problem(400, "invalid_argument",
                                  f"job {d['job_id']} not found: a dependency must be an "
                                  "existing job of the same tenant", f"depends_on.{i}.job_id")
        a = b.get("array")
        if a is None:
            return
        size = a.get("size") if isinstance(a, dict) else None
        if not isinstance(size, int) or not 1 <= size <= MAX_ARRAY_SIZE:
            raise Problem(400, "invalid_argument",
                          f"size must be an integer from 1 to {MAX_ARRAY_SIZE}", "array.size")
        for name, values in (a.get("env") or {}).items():
            if len(values) != size:
                raise Problem(400, "invalid_argument",
                              f"array.env.{name} holds {len(values)} values; the array has "
                              f"{size} indexes, one value each", f"array.env.{name}")
        if a.get("max_failed_indexes") is not None and a["max_failed_indexes"] >= size:
            raise Problem(400, "invalid_argument",
                          "max_failed_indexes must be less than the array's size",
                          "array.max_failed_indexes")

    def _resolve(self, job: dict[str, Any]) -> None:
        """PipelinesService.resolve: end a waiting job whose dependency can no
        longer be met, release it when none is left, else say what is left."""
        if job["state"] != "PENDING" or not job.get("waiting_for"):
            return
        deps = {d["job_id"]: d for d in job["spec"].get("depends_on") or []}
        left = []
        for dep_id in job["waiting_for"]:
            dep = deps[dep_id]
            other = self.jobs.get(dep_id)
            state = other["state"] if other else "PENDING"
            if state not in TERMINAL:
                left.append(dep_id)
                continue
            met = dep["condition"] == "ended" or (
                (state == "SUCCEEDED") == (dep["condition"] == "succeeded"))
            if not met:
                # job_store.fail_dependency: waiting_for kept, the pending reason gone
                need = {"succeeded": "it to succeed", "failed": "it to fail"}[dep["condition"]]
                detail = f"{dep_id} ended {state}; this job needed {need}"
                job["pending_reason"] = None
                self.events.setdefault(job["id"], []).append(
                    {"type": "finished", "time": self.now(), "state": "FAILED",
                     "reason": "dependency_failed", "detail": detail})
                self._finish(job, "FAILED", "dependency_failed", None, dependency=dep_id,
                             detail=detail)
                return
        if left:
            first = deps[left[0]]
            reason = f"waiting for {left[0]} to {WAITING_WORDS[first['condition']]}"
            if len(left) > 1:
                reason += f" (and {len(left) - 1} more)"
            job.update(waiting_for=left, pending_reason=reason, updated_at=self.now())
        else:
            job.update(waiting_for=None, pending_reason=None, updated_at=self.now())
            if job["array"] is not None:
                self._array_changed(job)

    def _ended(self, job: dict[str, Any]) -> None:
        """PipelinesService.ended_all: tell the job's array and its dependents."""
        if job.get("parent_id"):
            self._array_changed(self.jobs[job["parent_id"]])
        for other in list(self.jobs.values()):
            if job["id"] in (other.get("waiting_for") or []):
                self._resolve(other)

    def _count(self, parent: dict[str, Any]) -> dict[str, int]:
        """The parent's counters (domain/arrays.py Counts), and its ``array``
        as api/representation.py array_json shows them."""
        kids = [j for j in self.jobs.values() if j.get("parent_id") == parent["id"]]
        c = {"materialized": len(kids),
             "placed": sum(j["state"] in ("SCHEDULED", "RUNNING") for j in kids),
             "succeeded": sum(j["state"] == "SUCCEEDED" for j in kids),
             "failed": sum(j["state"] == "FAILED" for j in kids),
             "cancelled": sum(j["state"] == "CANCELLED" for j in kids)}
        size = parent["spec"]["array"]["size"]
        if parent["state"] in TERMINAL:  # the indexes never made are counted cancelled
            c["cancelled"] += size - c["materialized"]
        ended = c["succeeded"] + c["failed"] + c["cancelled"]
        parent["array"] = {"size": size, "materialized": c["materialized"], "counts": {
            "PENDING": size - c["placed"] - ended, "RUNNING": c["placed"],
            "SUCCEEDED": c["succeeded"], "FAILED": c["failed"], "CANCELLED": c["cancelled"]}}
        return c

    def _array_changed(self, parent: dict[str, Any]) -> None:
        """PipelinesService.array_changed with domain/arrays.py: count, end
        the parent once every index has (or none will run any more), stop the
        open children when it fails fast, else make the next children."""
        if parent["state"] in TERMINAL or parent.get("waiting_for"):
            self._count(parent)
            return
        a = parent["spec"]["array"]
        size = a["size"]
        c = self._count(parent)
        ended = c["succeeded"] + c["failed"] + c["cancelled"]
        open_ = c["materialized"] - ended
        cancelled = parent["cancel_requested_at"] is not None
        failing = a.get("max_failed_indexes") is not None and c["failed"] > a["max_failed_indexes"]
        stopping = cancelled or failing
        if not open_ and (c["materialized"] >= size or stopping):
            never = size - c["materialized"]
            tally = [f"{c['succeeded']} of {size} indexes succeeded"]
            if c["failed"]:
                tally.append(f"{c['failed']} failed")
            if c["cancelled"] or never:
                tally.append(f"{c['cancelled'] + never} cancelled"
                             + (f" ({never} never started)" if never else ""))
            detail = ", ".join(tally)
            if cancelled:
                self._finish(parent, "CANCELLED", "cancelled", None, detail=detail)
            elif failing:
                self._finish(parent, "FAILED", "max_failed_indexes", None,
                             detail=f"{c['failed']} indexes failed, more than "
                                    f"max_failed_indexes {a['max_failed_indexes']}; {detail}")
            elif c["failed"] or c["cancelled"]:
                self._finish(parent, "FAILED", "array_failed", None, detail=detail)
            else:
                parent.update(state="SUCCEEDED", finished_at=self.now(), updated_at=self.now())
                self._ended(parent)
            return
        if stopping:  # every open child cancelled as an intent: the unplaced end now
            kids = [k for k in self.children(parent["id"])
                    if k["state"] not in TERMINAL and not k["cancel_requested_at"]]
            for kid in kids:
                kid.update(cancel_requested_at=self.now(),
                           cancel_reason=parent["cancel_reason"] if cancelled
                           else "more indexes failed than max_failed_indexes")
            for kid in kids:
                if kid["state"] == "PENDING":
                    self._finish(kid, "CANCELLED", "cancelled", None)
            return
        window = min(a.get("max_parallel") or size, FEED_WINDOW, size)
        for i in range(c["materialized"], c["materialized"] + max(0, min(
                window - open_, size - c["materialized"]))):
            spec = {k: v for k, v in parent["spec"].items() if k not in ("array", "depends_on")}
            env = dict(spec.get("env") or {})
            for name, values in (a.get("env") or {}).items():
                env[name] = values[i]
            env.update(GPUJOBS_ARRAY_INDEX=str(i), GPUJOBS_ARRAY_SIZE=str(size))
            spec["env"] = env
            name = parent["name"]
            self._create(self.tenant_of[parent["id"]],
                         {**spec, "name": None if name is None else f"{name}[{i}]"},
                         parent_id=parent["id"], index=i)
        if (c["placed"] or ended) and parent["state"] == "PENDING":
            parent.update(state="RUNNING", started_at=parent["started_at"] or self.now())
        self._count(parent)

    def _list_children(self, t: str, query: dict[str, list[str]]) -> tuple[int, Any, dict]:
        """GET /v1/jobs?parent=: the array's children made so far, in index
        order, with the job list's page and token shape (JobsService.list)."""
        parent = query["parent"][0]
        if self.tenant_of.get(parent) != t:
            raise Problem(404, "not_found", f"job {parent} not found", "parent")
        if self.jobs[parent]["array"] is None:
            raise Problem(400, "invalid_argument", f"job {parent} is not an array", "parent")
        state = (query.get("state") or [None])[0]
        if state is not None and state not in STATES:
            raise Problem(400, "invalid_argument", "state is not a job state", "state")
        size = int((query.get("page_size") or ["50"])[0])
        after = -1
        token = (query.get("page_token") or [None])[0]
        if token is not None:
            try:
                tok = json.loads(base64.urlsafe_b64decode(token.encode()))
                assert tok["t"] == t and tok["s"] == state and tok["p"] == parent
                after = int(tok["a"])
            except (ValueError, KeyError, TypeError, AssertionError):
                raise Problem(400, "invalid_page_token", "page_token is malformed",
                              "page_token") from None
        kids = [j for j in self.children(parent) if j["array_index"] > after
                and (state is None or j["state"] == state)]
        page, more = kids[:size], len(kids) > size
        nxt = None
        if more:
            nxt = base64.urlsafe_b64encode(json.dumps(
                {"t": t, "s": state, "p": parent, "a": page[-1]["array_index"]}).encode()).decode()
        return 200, {"jobs": page, "next_page_token": nxt}, {}

    def _job_for(self, tenant: str, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None or self.tenant_of.get(job_id) != tenant:
            raise Problem(404, "not_found", f"job {job_id} not found", "job_id")
        return job

    def _job_for_agent(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise Problem(404, "not_found", f"job {job_id} not found", "job_id")
        return job

    def _finish(self, job: dict[str, Any], state: str, reason: str, code: int | None,
                **more: Any) -> None:
        job.update(state=state, finished_at=self.now(), updated_at=self.now(),
                   exit={"reason": reason, "exit_code": code, **more})
        if "array" in job["spec"]:
            self._count(job)  # its counts as it ended
        for att in self.attempts.get(job["id"], []):
            if att["attempt"] == job["attempt"] and att["finished_at"] is None:
                att.update(state=state, finished_at=self.now(), exit=dict(job["exit"]))
        self._ended(job)

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               headers: dict[str, str], raw: bytes) -> tuple[int, Any, dict[str, str]]:
        auth = headers.get("authorization", "")
        who = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None

        def tenant() -> str:
            if who is None:
                raise Problem(401, "unauthenticated", "a valid bearer token is required",
                              "Authorization")
            if who[0] != "tenant":
                raise Problem(403, "forbidden", "this endpoint takes a tenant token",
                              "Authorization")
            return who[1]

        def agent(node: str | None = None) -> str:
            if who is None:
                raise Problem(401, "unauthenticated", "a valid bearer token is required",
                              "Authorization")
            if who[0] != "agent" or (node is not None and who[1] not in ("*", node)):
                raise Problem(403, "forbidden", "not allowed for this token", "Authorization")
            return who[1]

        def body() -> Any:
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                raise Problem(400, "invalid_argument", "body is not JSON", "body") from None

        if method == "GET" and path == "/v1/health":
            return 200, {"status": "ok"}, {}

        if method == "GET" and path == "/v1/usage":
            if who is None:
                raise Problem(401, "unauthenticated", "a valid bearer token is required",
                              "Authorization")
            if "start" not in query:
                raise Problem(400, "invalid_argument", "start is required", "start")
            return 200, {"rows": list(self.usage_rows)}, {}

        if path == "/v1/jobs" and method == "POST":
            t = tenant()
            key = headers.get("idempotency-key")
            b = body()
            if not isinstance(b, dict):
                raise Problem(400, "invalid_argument", "body must be an object", "body")
            if not isinstance(b.get("command"), list) or not b["command"]:
                raise Problem(400, "invalid_argument", "command is required", "command")
            if not isinstance(b.get("ranks"), int) or b["ranks"] < 1:
                raise Problem(400, "invalid_argument",
                              "ranks must be bigger than or equal to 1", "ranks")
            self._check_priority_class(t, b)
            self._check_pipeline(t, b)
            if key is not None:
                digest = hashlib.sha256(json.dumps(b, sort_keys=True, separators=(",", ":"))
                                        .encode()).hexdigest()
                held = self.keys.get((t, key))
                if held is not None:
                    if held[0] != digest:
                        raise Problem(422, "idempotency_key_reused",
                                      "Idempotency-Key was already used with a different "
                                      "request body", "Idempotency-Key")
                    job = self.jobs[held[1]]
                    return 201, job, {"Location": f"/v1/jobs/{job['id']}",
                                      "Idempotent-Replayed": "true"}
            job = self._create(t, b)
            if key is not None:
                self.keys[(t, key)] = (digest, job["id"])
            return 201, job, {"Location": f"/v1/jobs/{job['id']}"}

        if path == "/v1/jobs" and method == "GET" and "parent" in query:
            return self._list_children(tenant(), query)

        if path == "/v1/jobs" and method == "GET":
            t = tenant()
            state = (query.get("state") or [None])[0]
            if state is not None and state not in STATES:
                raise Problem(400, "invalid_argument", "state is not a job state", "state")
            raw_size = (query.get("page_size") or ["50"])[0]
            if not raw_size.isdigit() or not 1 <= int(raw_size) <= 500:
                raise Problem(400, "invalid_argument",
                              "page_size must be an integer from 1 to 500", "page_size")
            size = int(raw_size)
            after = None
            token = (query.get("page_token") or [None])[0]
            if token is not None:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(token.encode()))
                    assert tok["t"] == t and tok["s"] == state
                    after = tok["a"]
                except (ValueError, KeyError, TypeError, AssertionError):
                    raise Problem(400, "invalid_page_token", "page_token is malformed",
                                  "page_token") from None
            mine = sorted((j for i, j in self.jobs.items() if self.tenant_of[i] == t
                           and (state is None or j["state"] == state)
                           and (after is None or i < after)),
                          key=lambda j: j["id"], reverse=True)
            page, more = mine[:size], len(mine) > size
            nxt = None
            if more:
                nxt = base64.urlsafe_b64encode(json.dumps(
                    {"t": t, "s": state, "a": page[-1]["id"]}).encode()).decode()
            return 200, {"jobs": page, "next_page_token": nxt}, {}

        m = re.fullmatch(r"/v1/jobs/([^/]+)/(logs|events)", path)
        if m and method == "GET":
            job = self._job_for(tenant(), m.group(1))
            if m.group(2) == "events":
                return 200, {"events": self.events.get(job["id"], [])}, {}
            q = {k: v[0] for k, v in query.items()}
            attempt = int(q.get("attempt", job["attempt"]))
            # as the API answers: by (time, rank, seq), lines without a seq after
            # those with one by id; tokens are positions; tail the newest lines
            lines = sorted((x for x in self.logs.get(job["id"], []) if x["attempt"] == attempt
                            and ("rank" not in q or x["rank"] == int(q["rank"]))
                            and ("since" not in q or x["time"] >= q["since"])), key=_log_key)
            size = int(q.get("page_size", 1000))
            pos = None
            if "page_token" in q:
                try:
                    pos = tuple(json.loads(base64.urlsafe_b64decode(q["page_token"])))
                except ValueError:
                    raise Problem(400, "invalid_page_token", "bad page_token",
                                  "page_token") from None
            if "tail" in q:
                n = int(q["tail"]) if q["tail"].isdigit() else 0
                if not 1 <= n <= 10_000 or pos is not None:
                    raise Problem(400, "invalid_argument", "tail must be from 1 to 10000 "
                                  "and not with a page_token", "tail")
                page, more = lines[-n:], False
            else:
                rest = [x for x in lines if pos is None or list(_log_key(x)) > list(pos)]
                page, more = rest[:size], len(rest) > size
            self.logs_served += len(page)
            at = _log_key(page[-1]) if page else pos
            follow = None if at is None and pos is None and not page else \
                base64.urlsafe_b64encode(json.dumps(at).encode()).decode()
            return 200, {"job_id": job["id"], "attempt": attempt,
                         "lines": [{k: v for k, v in x.items() if k != "attempt"} for x in page],
                         "next_page_token": follow if more else None,
                         "follow_token": follow}, {}
        m = re.fullmatch(r"/v1/jobs/([^/]+)(/cancel|/attempts|/ranks|/heartbeats|"
                         r"/attempts/([^/]+)/events)?", path)
        if m:
            job_id, sub, att_raw = m.group(1), m.group(2) or "", m.group(3)
            if sub == "" and method == "GET":
                job = self._job_for(tenant(), job_id)
                for hook in list(self.on_get_job):
                    hook(job)
                return 200, job, {}
            if sub == "/cancel" and method == "POST":
                t = tenant()
                b = body() if raw else {}
                if not isinstance(b, dict) or set(b) - {"reason"}:
                    raise Problem(400, "invalid_argument", "bad cancel body", "body")
                job = self._job_for(t, job_id)
                if job["cancel_requested_at"] or job["state"] == "CANCELLED":
                    return 202, job, {}
                if job["state"] in TERMINAL:
                    raise Problem(409, "already_finished",
                                  f"job {job_id} already {job['state']}", "job_id")
                job.update(cancel_requested_at=self.now(), cancel_reason=b.get("reason"))
                if job["array"] is not None and not job["waiting_for"]:
                    self._array_changed(job)  # JobsService.cancel: cancel_array
                elif job["state"] == "PENDING":
                    self._finish(job, "CANCELLED", "cancelled", None)
                return 202, job, {}
            if sub == "/attempts" and method == "GET":
                self._job_for(tenant(), job_id)
                return 200, {"attempts": [{k: v for k, v in a.items() if not k.startswith("_")}
                                          for a in self.attempts.get(job_id, [])]}, {}
            if sub == "/ranks" and method == "GET":
                job = self._job_for(tenant(), job_id)
                return 200, self._ranks_page(job, query.get("page_token", [None])[0]), {}
            if sub == "/heartbeats" and method == "POST":
                agent()
                job = self._job_for_agent(job_id)
                b = body()
                if job["state"] in TERMINAL:
                    raise Problem(409, "already_finished", "job finished", "job_id")
                if b.get("attempt") != job["attempt"]:
                    raise Problem(409, "stale_attempt", "not the current attempt", "attempt")
                store = self.beats.setdefault((job_id, job["attempt"]), {})
                for r in b["ranks"]:
                    if not 0 <= r["rank"] < job["spec"]["ranks"]:
                        raise Problem(400, "invalid_argument", "rank out of range", "ranks")
                for r in b["ranks"]:
                    store[r["rank"]] = {"at": self.clock, "step": r.get("step"),
                                        "sent_at": r.get("sent_at")}
                return 202, {"received_at": self.now()}, {}
            if sub.endswith("/events") and method == "POST":
                agent()
                job = self._job_for_agent(job_id)
                b = body()
                if str(job["attempt"]) != att_raw:
                    raise Problem(409, "stale_attempt", "not the current attempt", "attempt")
                kind = b.get("type")
                if kind == "STARTED" and job["state"] == "SCHEDULED":
                    job.update(state="RUNNING", started_at=self.now())
                elif kind == "EXITED" and job["state"] not in TERMINAL:
                    code = b.get("exit_code")
                    if code == 0:
                        self._finish(job, "SUCCEEDED", "succeeded", 0)
                    else:  # as the real server ends it when no retry is left (no retries here)
                        rank = min(b.get("ranks") or [0])
                        node = next((p["node_id"] for a in self.attempts.get(job_id, [])
                                     if a["attempt"] == job["attempt"] for p in a["placement"]
                                     if p["rank"] == rank), None)
                        counted = job["attempt"] - job["uncounted_retries"]
                        sig = (f", {signal.Signals(code - 128).name}"
                               if 128 < code <= 128 + 31 else "")
                        decision = (f"rank_failed (rank {rank}, exit code {code}{sig}): "
                                    "not retried "
                                    f"(counted attempt {counted} of "
                                    f"{job['spec']['max_attempts']}, none left)")
                        self._finish(job, "FAILED", "rank_failed", code, rank=rank,
                                     node_id=node, decision=decision)
                elif kind == "STOPPED" and job["state"] not in TERMINAL:
                    self._finish(job, "CANCELLED", "cancelled", None)
                return 200, job, {}

        m = re.fullmatch(r"/v1/nodes/([^/]+)/(cordon|drain|uncordon)", path)
        if m and method == "POST":
            # app.py cordon_node, drain_node, uncordon_node: the operator first,
            # then the body (schemas.CORDON, DRAIN), then the node
            if who is None:
                raise Problem(401, "unauthenticated", "a valid bearer token is required",
                              "Authorization")
            if who[0] != "operator":
                raise Problem(403, "forbidden", "this endpoint takes an operator token",
                              "Authorization")
            node_id, verb = m.group(1), m.group(2)
            b: Any = {}
            if verb != "uncordon":
                b = (body() if raw else None) or {}
                _check_cordon_body(b, drain=verb == "drain")
            node = self.nodes.get(node_id)
            if node is None:
                raise Problem(404, "not_found", f"node {node_id} not found", "node_id")
            if verb == "uncordon":
                if node.get("cordon") is not None and node["state"] == "DRAINING":
                    node["state"] = "READY"
                node["cordon"] = None
                return 200, node, {}
            wait = bool(b.get("wait"))
            reason = b.get("reason") or ("drained" if verb == "drain" else "cordoned")
            mode = "keep" if verb == "cordon" else ("wait" if wait else "stop")
            # domain/nodes.py cordon_of; a READY node becomes DRAINING, DOWN stays DOWN
            node["cordon"] = {"reason": reason, "by": who[1], "at": self.now(), "drain": mode,
                              "auto": False}
            if node["state"] == "READY":
                node["state"] = "DRAINING"
            if verb == "cordon":
                return 200, node, {}
            if not wait:
                self._preempt_on(node_id, f"node {node_id} drained: {reason}")
            return 202, node, {}

        m = re.fullmatch(r"/v1/nodes(?:/([^/]+))?", path)
        if m:
            node_id = m.group(1)
            if method == "PUT" and node_id:
                agent(node_id)
                b = body()
                held = self.nodes.get(node_id) or {}
                cordon = held.get("cordon")  # a registration keeps the cordon
                node = {"node_id": node_id, "gpus": b["gpus"], "gpus_free": b["gpus"],
                        "gpu_type": b["gpu_type"], "labels": b.get("labels", {}),
                        "state": "DRAINING" if cordon else "READY",
                        "inbox_queue_url": f"http://127.0.0.1:1/queue/inbox-{node_id}",
                        "last_seen_at": self.now(), "address": node_id, "isolation": "none",
                        "cordon": cordon}
                self.nodes[node_id] = node
                return 200, node, {}
            if method == "GET":
                if who is None:
                    raise Problem(401, "unauthenticated", "token required", "Authorization")
                for n in self.nodes.values():
                    n.setdefault("cordon", None)  # every Node has it, null or not
                if node_id is None:
                    return 200, {"nodes": sorted(self.nodes.values(),
                                                 key=lambda n: n["node_id"])}, {}
                if node_id not in self.nodes:
                    raise Problem(404, "not_found", f"node {node_id} not found", "node_id")
                for hook in list(self.on_get_node):
                    hook(self.nodes[node_id])
                return 200, self.nodes[node_id], {}

        raise Problem(404, "not_found", "no such path")

    def _preempt_on(self, node_id: str, detail: str) -> None:
        """service/cordons.py preempt_all: every job whose current attempt has
        a rank on the node ends that attempt as preempted, and its retry rules
        decide (domain/retry.py decide; preempted is an infra cause)."""
        for job_id, job in self.jobs.items():
            if job["state"] not in ("SCHEDULED", "RUNNING") or job["cancel_requested_at"]:
                continue
            att = next((a for a in self.attempts.get(job_id, [])
                        if a["attempt"] == job["attempt"] and a["finished_at"] is None), None)
            if att is None or all(p["node_id"] != node_id for p in att["placement"]):
                continue
            self._end_preempted(job, att, {"reason": "preempted", "exit_code": None,
                                           "node_id": node_id, "detail": detail})

    def _end_preempted(self, job: dict[str, Any], att: dict[str, Any],
                       exit_: dict[str, Any]) -> None:
        """The attempt ends as ``exit_`` (a preemption: no rank, no exit code)
        and the retry rules decide: requeued (PENDING) or FAILED, with a
        retried or finished event (domain/events.py attempt_end)."""
        action, text = _decide(job, exit_)
        exit_ = {**exit_, "decision": text}
        event = {"type": "finished" if action == "fail" else "retried", "time": self.now(),
                 "attempt": job["attempt"], "reason": "preempted", "decision": text}
        if exit_.get("node_id"):
            event["node_id"] = exit_["node_id"]
        if action == "fail":
            self._finish(job, "FAILED", "preempted", None,
                         **{k: v for k, v in exit_.items() if k not in ("reason", "exit_code")})
            event.update(state="FAILED")
        else:
            att.update(state="FAILED", finished_at=self.now(), exit=exit_)
            job.update(state="PENDING", pending_since=self.now(), updated_at=self.now(),
                       uncounted_retries=job["uncounted_retries"]
                       + int(action == "retry_uncounted"))
            event["next_attempt"] = job["attempt"] + 1
        self.events.setdefault(job["id"], []).append(event)

    def _ranks_page(self, job: dict[str, Any], token: str | None) -> dict[str, Any]:
        """A page of /ranks as the server cuts one (HeartbeatService.ranks_page):
        the ranks ``[first, first + ranks_page_size)``, in silence order; the
        token names the next page's first rank (every rank at once by default)."""
        view = self._ranks(job)
        world = job["spec"]["ranks"]
        first = int(token) if token is not None else 0
        last = min(world, first + (self.ranks_page_size or world))
        view["ranks"] = [r for r in view["ranks"] if first <= r["rank"] < last]
        view["next_page_token"] = str(last) if last < world else None
        return view

    def _ranks(self, job: dict[str, Any]) -> dict[str, Any]:
        threshold = job["health"]["threshold_s"]
        atts = self.attempts.get(job["id"], [])
        current = atts[-1] if atts else None
        rows = []
        if current is not None:
            beats = self.beats.get((job["id"], current["attempt"]), {})
            for p in current["placement"]:
                b = beats.get(p["rank"])
                since = b["at"] if b else current["_started"]
                silence = round(self.clock - since, 3)
                rows.append({"rank": p["rank"], "node_id": p["node_id"],
                             "last_heard_at": _ts(b["at"]) if b else None,
                             "silence_s": silence, "step": b["step"] if b else None,
                             "stalled": silence > threshold})
                if p["rank"] in self.rank_statuses.get(job["id"], {}):
                    rows[-1]["status"] = self.rank_statuses[job["id"]][p["rank"]]
                rows[-1].update(self.rank_extras.get(job["id"], {}).get(p["rank"], {}))
        rows.sort(key=lambda r: (-r["silence_s"], r["rank"]))
        return {"attempt": job["attempt"], "threshold_s": threshold, "now": self.now(),
                "ranks": rows, "verdict": job["health"].get("verdict")}

    # -- HTTP ---------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec = Recorded(self.command, url.path, parse_qs(url.query), headers, raw)
                with api.lock:
                    api.requests.append(rec)
                    fault = None
                    for f in api.faults:
                        if f.times > 0 and f.method == self.command and f.path.fullmatch(url.path):
                            f.times -= 1
                            fault = f
                            break
                if fault is not None and fault.action == "drop_before":
                    return self._drop()
                if fault is not None and fault.action == "hang":
                    api.release.wait(30)
                    return self._drop()
                if fault is not None and fault.action == "status":
                    if fault.body is not None:
                        return self._send(fault.status, fault.body, fault.headers,
                                          fault.ctype)
                    return self._send(fault.status, problem(fault.status, fault.code,
                                                            "injected fault"), fault.headers)
                with api.lock:
                    try:
                        status, payload, extra = api.handle(self.command, url.path,
                                                            parse_qs(url.query), headers, raw)
                    except Problem as p:
                        status, payload, extra = p.status, p.body, p.headers
                    payload = json.loads(json.dumps(payload))  # a snapshot, not a live dict
                if fault is not None and fault.action == "drop_after":
                    return self._drop()
                self._send(status, payload, extra)

            def _drop(self) -> None:
                self.close_connection = True

            def _send(self, status: int, payload: Any, headers: dict[str, str],
                      ctype: str | None = None) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype or (
                    "application/problem+json" if status >= 400 else "application/json"))
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        return Handler


def _check_cordon_body(b: Any, *, drain: bool) -> None:
    """chalicelib/api/schemas.py CORDON and DRAIN, as the server judges them."""
    if not isinstance(b, dict):
        raise Problem(400, "invalid_argument", "body must be an object", "body")
    allowed = {"reason", "wait"} if drain else {"reason"}
    for key in b:
        if key not in allowed:
            raise Problem(400, "invalid_argument", f"{key} is not allowed", key)
    reason = b.get("reason")
    if "reason" in b and (not isinstance(reason, str) or not 1 <= len(reason) <= 1024):
        raise Problem(400, "invalid_argument", "reason must be 1 to 1024 characters", "reason")
    if "wait" in b and not isinstance(b["wait"], bool):
        raise Problem(400, "invalid_argument", "wait must be a boolean", "wait")


def _decide(job: dict[str, Any], exit_: dict[str, Any]) -> tuple[str, str]:
    """(action, decision) of chalicelib/domain/retry.py decide for an end
    with no exit code and no rank (a preemption): its rules by reason, else
    an uncounted retry while the cap allows."""
    spec = job["spec"]
    policy = spec.get("retry") or {}
    cap = policy.get("max_uncounted_retries", 10)
    max_attempts = spec.get("max_attempts", 1)
    reason = exit_["reason"]
    cause = f"{reason} ({exit_['detail']})" if exit_.get("detail") else reason
    action, by = "retry_uncounted", "default"
    for i, rule in enumerate(policy.get("rules") or [], 1):
        if ("reasons" not in rule or reason in rule["reasons"]) and "exit_codes" not in rule \
                and "signals" not in rule:
            action, by = rule["action"], f"rule {i}"
            break
    if action == "fail":
        return "fail", f"{cause}: not retried ({by} says fail)"
    uncounted = job["uncounted_retries"]
    if action == "retry_uncounted":
        if uncounted < cap:
            return "retry_uncounted", (f"{cause}: retried, not counted (uncounted retry "
                                       f"{uncounted + 1} of {cap})")
        note = f"all {cap} uncounted retries used, so it counts; "
    else:
        note = "" if by == "default" else f"{by}; "
    counted = job["attempt"] - uncounted
    if counted < max_attempts:
        return "retry", f"{cause}: retried ({note}counted attempt {counted} of {max_attempts})"
    return "fail", (f"{cause}: not retried ({note}counted attempt {counted} of {max_attempts}, "
                    "none left)")


def _ts(seconds: float) -> str:
    t = EPOCH + timedelta(seconds=seconds)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
