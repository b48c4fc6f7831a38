"""The agent's side of the gpujobs HTTP API: register the node, report attempt events
(STARTED, EXITED, STOPPED, TIMED_OUT), post the ranks' beats.

Each call is one HTTP request; failures are classified here, once, so that the
callers only decide *when* to try again (backoff.py), never *whether*:

- retryable: no answer (connection refused or reset, timeout), 429, any 5xx,
  and ``409 request_in_progress``; ``retry_after`` carries a Retry-After header;
- AttemptGone: ``409 stale_attempt`` or ``409 already_finished``, the server no
  longer cares about that attempt, so its reports must stop;
- anything else (400, 401, 403, 404, ...): repeating the same request cannot help.

Standard library only (urllib): the agent runs on GPU hosts, where a smaller
dependency set is a smaller thing to keep patched.
"""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .backoff import parse_retry_after

RETRYABLE_CONFLICTS = {"request_in_progress"}
GONE_CONFLICTS = {"stale_attempt", "already_finished"}


class ApiError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 retryable: bool = False, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code
        self.retryable, self.retry_after = retryable, retry_after


class AttemptGone(ApiError):
    """409 stale_attempt / already_finished: stop reporting this attempt."""


def classify(status: int, problem: dict, retry_after: float | None) -> ApiError:
    """The error for an HTTP error answer (``problem`` is its body, {} if not JSON)."""
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    detail = problem.get("detail") or problem.get("title") or ""
    message = f"HTTP {status} {code or ''} {detail}".strip()
    if status == 409 and code in GONE_CONFLICTS:
        return AttemptGone(message, status=status, code=code)
    retryable = status == 429 or status >= 500 or (status == 409 and code in RETRYABLE_CONFLICTS)
    return ApiError(message, status=status, code=code, retryable=retryable,
                    retry_after=retry_after)


class ApiClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0) -> None:
        self._base = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout_s

    def call_in(self, body: dict[str, Any]) -> dict[str, Any]:
        """Register or refresh the node (also its heartbeat): ``PUT
        /v1/nodes/{id}`` with a ``call_in_body``; returns the node."""
        put = {k: v for k, v in body.items() if k != "node_id"}
        return self._request("PUT", f"/v1/nodes/{_seg(body['node_id'])}", put)

    def post_event(self, job_id: str, attempt: int, event: dict[str, Any]) -> dict[str, Any]:
        """Report STARTED / EXITED / STOPPED / TIMED_OUT for ranks of an attempt;
        returns the job. A TIMED_OUT the server no longer wants (the attempt
        ended meanwhile) is AttemptGone, as any other report's."""
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/attempts/{int(attempt)}/events",
                             event)

    def post_heartbeats(self, job_id: str, attempt: int, ranks: list[dict[str, Any]],
                        call_in: dict[str, Any] | None = None) -> dict[str, Any]:
        """Post beats of this node's ranks of an attempt (1 to 1024 entries).
        ``call_in`` (a ``call_in_body``) carries the node's call-in too: the
        answer's ``node`` is then PUT /v1/nodes/{id}'s answer."""
        body: dict[str, Any] = {"attempt": int(attempt), "ranks": ranks}
        if call_in is not None:
            body["call_in"] = call_in
        return self._request("POST", f"/v1/jobs/{_seg(job_id)}/heartbeats", body)

    def _request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self._base + path, method=method, data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            with e:
                problem = _json_object(_read_quietly(e))
                raise classify(e.code, problem, parse_retry_after(e.headers.get("Retry-After"))
                               ) from None
        except (OSError, http.client.HTTPException) as e:
            # URLError, refused/reset connections and timeouts are all OSErrors
            raise ApiError(f"{method} {path}: no answer: {e}", retryable=True) from None
        return _json_object(raw)


def call_in_body(node_id: str, gpus: int, gpu_type: str, labels: dict[str, str], *,
            address: str | None = None, isolation: str | None = None,
            running: list[dict[str, Any]] | None = None,
            inbox_missing: bool = False) -> dict[str, Any]:
    """A node's call-in, as a heartbeat POST carries it (PUT /v1/nodes/{id}
    sends it without ``node_id``, which is in its path).

    ``running``: the attempts ({"job_id", "attempt"}) this agent still runs
    ranks of; the answer's ``attempts`` are those the server still waits for.
    ``inbox_missing``: the inbox's receive was told the queue does not exist
    (the server makes it again)."""
    body: dict[str, Any] = {"node_id": node_id, "gpus": gpus, "gpu_type": gpu_type,
                            "labels": labels}
    if address:
        body["address"] = address
    if isolation:
        body["isolation"] = isolation
    if running is not None:
        body["running"] = running
    if inbox_missing:
        body["inbox_missing"] = True
    return body


def _seg(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _read_quietly(response) -> bytes:
    try:
        return response.read()
    except (OSError, http.client.HTTPException):
        return b""


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
