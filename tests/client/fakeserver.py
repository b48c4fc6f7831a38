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


def problem(status: int, code: str, detail: str, field: str | None = None) -> dict[str, Any]:
    p = {"type": f"urn:gpujobs:problem:{code}", "title": TITLES.get(code, code), "status": status,
         "detail": detail, "code": code}
    if field is not None:
        p["field"] = field
    return p


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
                                 "a1": ("agent", "*"), "a-node-1": ("agent", "node-1")}
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
        self.nodes: dict[str, dict[str, Any]] = {}
        #: job id -> its log lines ({"rank", "stream", "time", "line", "id", "attempt"})
        self.logs: dict[str, list[dict[str, Any]]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.clock = 0.0                   # seconds since EPOCH; tests move it
        self.on_get_job: list[Callable[[dict[str, Any]], None]] = []
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
            return job

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
                            pending_since=None,
                            started_at=self.now() if state == "RUNNING" else None)
            return att

    # -- the API ----------------------------------------------------------------------
    def _create(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        job_id = f"job_{self._seq:026d}"
        # the defaults of chalicelib/domain/jobs.py with_defaults
        hb = {"interval_s": 10, "false_positive_budget_per_hour": 0.001,
              "miss_probability": 0.01, "startup_grace_s": 120, "mode": "auto",
              "max_busy_s": 900, "idle_s": 300, **(body.get("heartbeat") or {})}
        retry = {"rules": [], "max_uncounted_retries": 10, **(body.get("retry") or {})}
        spec = {"gpus_per_rank": 1, "priority": 0, "max_attempts": 1, "on_stall": "report",
                "env": {}, "labels": {}, **body, "heartbeat": hb, "retry": retry}
        if "warn_before_s" in spec:
            spec.setdefault("warn_signal", "SIGUSR1")
        job = {"id": job_id, "name": body.get("name"), "state": "PENDING", "spec": spec,
               "attempt": 0, "created_at": self.now(), "updated_at": self.now(),
               "started_at": None, "finished_at": None, "cancel_requested_at": None,
               "cancel_reason": None,
               "health": {"status": "UNKNOWN", "threshold_s": 3.0 * hb["interval_s"],
                          "first_stalled_rank": None, "last_heard_at": None,
                          "detected_at": None, "stalled_ranks": [], "verdict": None},
               "exit": None, "pending_reason": None, "pending_since": self.now(),
               "uncounted_retries": 0}
        self.jobs[job_id] = job
        self.tenant_of[job_id] = tenant
        return job

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
        for att in self.attempts.get(job["id"], []):
            if att["attempt"] == job["attempt"] and att["finished_at"] is None:
                att.update(state=state, finished_at=self.now(), exit=dict(job["exit"]))

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
            lines = [x for x in self.logs.get(job["id"], []) if x["attempt"] == attempt
                     and ("rank" not in q or x["rank"] == int(q["rank"]))
                     and ("since" not in q or x["time"] >= q["since"])]
            start = int(q.get("page_token", 0))
            size = int(q.get("page_size", 1000))
            page = lines[start:start + size]
            more = start + size < len(lines)
            return 200, {"job_id": job["id"], "attempt": attempt,
                         "lines": [{k: v for k, v in x.items() if k != "attempt"} for x in page],
                         "next_page_token": str(start + size) if more else None}, {}
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
                if job["state"] == "PENDING":
                    self._finish(job, "CANCELLED", "cancelled", None)
                return 202, job, {}
            if sub == "/attempts" and method == "GET":
                self._job_for(tenant(), job_id)
                return 200, {"attempts": [{k: v for k, v in a.items() if not k.startswith("_")}
                                          for a in self.attempts.get(job_id, [])]}, {}
            if sub == "/ranks" and method == "GET":
                job = self._job_for(tenant(), job_id)
                return 200, self._ranks(job), {}
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

        m = re.fullmatch(r"/v1/nodes(?:/([^/]+))?", path)
        if m:
            node_id = m.group(1)
            if method == "PUT" and node_id:
                agent(node_id)
                b = body()
                node = {"node_id": node_id, "gpus": b["gpus"], "gpus_free": b["gpus"],
                        "gpu_type": b["gpu_type"], "labels": b.get("labels", {}),
                        "state": "READY",
                        "inbox_queue_url": f"http://127.0.0.1:1/queue/inbox-{node_id}",
                        "last_seen_at": self.now()}
                self.nodes[node_id] = node
                return 200, node, {}
            if method == "GET":
                if who is None:
                    raise Problem(401, "unauthenticated", "token required", "Authorization")
                if node_id is None:
                    return 200, {"nodes": sorted(self.nodes.values(),
                                                 key=lambda n: n["node_id"])}, {}
                if node_id not in self.nodes:
                    raise Problem(404, "not_found", f"node {node_id} not found", "node_id")
                return 200, self.nodes[node_id], {}

        raise Problem(404, "not_found", "no such path")

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


def _ts(seconds: float) -> str:
    t = EPOCH + timedelta(seconds=seconds)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")
