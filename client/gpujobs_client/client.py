"""The HTTP client: one method per endpoint of the API (see API.md).

``requests`` is imported on the first request, not with this module, so that
``import gpujobs_client`` (and the CLI's ``--help``) stay fast.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence
from urllib.parse import quote

from . import __version__
from .errors import ApiError, GpujobsError, TransportError, error_from_problem
from .models import (
    Attempt,
    FeedEvent,
    FeedPage,
    HeartbeatAck,
    Job,
    JobEvent,
    JobPage,
    LogLine,
    Node,
    Ranks,
)
from .retry import (
    RETRY_CODES,
    RETRY_STATUSES_ANY,
    RETRY_STATUSES_IDEMPOTENT,
    RetryPolicy,
    parse_retry_after,
)

if TYPE_CHECKING:  # pragma: no cover
    import requests

DEFAULT_API_URL = "http://127.0.0.1:8000"
_NO_BODY = object()


class InvalidResponse(GpujobsError):
    """A success status whose body is not the JSON the contract promises."""


class WaitTimeout(GpujobsError):
    """:meth:`Client.wait_for_job` gave up; ``job`` is the last state seen."""

    def __init__(self, message: str, job: Job) -> None:
        super().__init__(message)
        self.job = job


class NodeWaitTimeout(GpujobsError):
    """:meth:`Client.wait_for_drain` gave up; ``node`` is the last state seen."""

    def __init__(self, message: str, node: Node) -> None:
        super().__init__(message)
        self.node = node


def new_idempotency_key() -> str:
    return str(uuid.uuid4())


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seg(value: Any) -> str:
    """One path segment, escaped (a job id cannot reach another path)."""
    return quote(str(value), safe="")


RetryHook = Callable[[int, float, GpujobsError], None]


#: how far before the newest line it yielded ``iter_logs(follow=True)`` reads
#: again, for lines shipped late (a rank's agent restarted)
FOLLOW_LOOKBACK_S = 30.0


def _ms(t: str) -> int:
    """An API time (RFC 3339, milliseconds, Z) in ms since the epoch."""
    when = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    return round(when.timestamp() * 1000)


def _rfc3339_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class _LogFollow:
    """Where ``iter_logs`` is, per rank: the last line it yielded of each."""

    def __init__(self, lookback_s: float, from_start: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lookback_ms = int(lookback_s * 1000)
        self.clock = clock
        #: a read that took long (ridden through a restart) widens the
        #: lookback by as long, until this (clock) time
        self.extra_ms, self.extra_until = 0, 0.0
        #: per rank: its last yielded line's (time, seq, id) and ``next_seq``
        self.last: dict[int | None, tuple[tuple[int, int | None, tuple], int | None]] = {}
        self.newest: int | None = None
        #: the ranks read (a rank not seen yet holds the lookback back)
        self.ranks: set[int] = set()
        #: reading from each rank's first line: a rank's first line is at 0
        self.from_start = from_start

    @staticmethod
    def _key(line: LogLine) -> tuple[int, int | None, tuple]:
        t = _ms(line.time) if line.time else 0
        ident = line.id or ""
        return t, line.seq, (len(ident), ident)

    def skips(self, line: LogLine) -> bool:
        """Whether lines of ``line``'s rank come between it and the last one
        yielded (the last's ``next_seq``, or 0 from the start, is before
        ``line``'s seq): they landed late, behind a page already read, and
        the rank is to be read again from its last line."""
        if line.rank is None or line.seq is None:
            return False
        last = self.last.get(line.rank)
        expected = last[1] if last is not None else 0 if self.from_start else None
        return expected is not None and line.seq > expected

    def resume_from(self, rank: int) -> str | None:
        """Where a read of ``rank`` alone starts: its last yielded line's
        millisecond (None: from the start)."""
        last = self.last.get(rank)
        return None if last is None else _rfc3339_ms(last[0][0])

    def seen(self, line: LogLine) -> bool:
        """Records ``line`` as yielded; False when it is not after the last
        line yielded of its rank (a repeat)."""
        key = self._key(line)
        last = self.last.get(line.rank)
        if last is not None:
            before = last[0]
            if key[1] is not None and before[1] is not None:
                if key[1] <= before[1]:
                    return False
            elif (key[0], key[1] is None, key[2]) <= (before[0], before[1] is None, before[2]):
                return False
        self.last[line.rank] = key, line.next_seq
        self.newest = key[0] if self.newest is None else max(self.newest, key[0])
        return True

    def waited(self, seconds: float) -> None:
        """A read took ``seconds`` (its retries rode through a restart of the
        control plane or of an agent): the lines written meanwhile may be
        shipped that much later than the others, so the lookback grows by as
        long for the next lookback's worth of time."""
        now = self.clock()
        if now >= self.extra_until:
            self.extra_ms = 0
        ms = int(seconds * 1000)
        if ms >= self.extra_ms:
            self.extra_ms, self.extra_until = ms, now + self.lookback_ms / 1000

    def since(self) -> str | None:
        """Where the next poll reads from: the oldest of the ranks' last
        times, no further back than the lookback before the newest (ranks not
        seen yet count as that bound; widened after a long read, see
        :meth:`waited`); None before any line."""
        if self.newest is None:
            return None
        extra = self.extra_ms if self.clock() < self.extra_until else 0
        bound = self.newest - self.lookback_ms - extra
        if self.ranks - set(self.last):
            return _rfc3339_ms(bound)
        oldest = min(key[0] for key, _ in self.last.values())
        return _rfc3339_ms(max(bound, oldest))


class Client:
    """A client of the gpujobs API.

    >>> c = Client("http://127.0.0.1:8000", "t1")
    >>> job = c.create_job(command=["python", "train.py"], ranks=2, gpu_type="h100")
    >>> for j in c.iter_jobs(state="RUNNING"): ...

    ``api_url`` and ``token`` default to ``GPUJOBS_API_URL`` and
    ``GPUJOBS_TOKEN`` (then ``http://127.0.0.1:8000`` and no token).
    ``timeout`` is per request (seconds, or a ``(connect, read)`` pair);
    ``retry`` is the :class:`RetryPolicy`; ``on_retry(attempt, delay, error)``
    is called before each wait, and may change ``api_url`` and ``token``
    (each send reads them); ``on_recover(attempts, elapsed_s)`` when a
    request that had to be retried got its answer.
    """

    def __init__(self, api_url: str | None = None, token: str | None = None, *,
                 timeout: float | tuple[float, float] = 10.0,
                 retry: RetryPolicy | None = None, on_retry: RetryHook | None = None,
                 on_recover: Callable[[int, float], None] | None = None,
                 session: "requests.Session | None" = None,
                 user_agent: str | None = None) -> None:
        self.api_url = (api_url or os.environ.get("GPUJOBS_API_URL") or DEFAULT_API_URL).rstrip("/")
        self.token = token if token is not None else os.environ.get("GPUJOBS_TOKEN") or None
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self.on_retry = on_retry
        self.on_recover = on_recover
        self.user_agent = user_agent or f"gpujobs-client/{__version__}"
        self._session = session

    @classmethod
    def from_config(cls, **kw: Any) -> "Client":
        """``api_url`` and ``token`` as the CLI resolves them: environment,
        then the config file, then a running local stack's file, then the
        default."""
        from .config import resolve
        cfg = resolve()
        return cls(cfg.api_url, cfg.token, **kw)

    # -- plumbing ---------------------------------------------------------------
    @property
    def session(self) -> "requests.Session":
        if self._session is None:
            import requests
            self._session = requests.Session()
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                body: Any = _NO_BODY, headers: Mapping[str, str] | None = None,
                idempotent: bool | None = None, auth: bool = True,
                timeout: float | tuple[float, float] | None = None) -> "requests.Response":
        """Send one API request, retrying as :mod:`gpujobs_client.retry` says.

        Returns the response of a 1xx-3xx answer; raises :class:`ApiError`
        for a problem and :class:`TransportError` when no answer came.
        ``idempotent`` defaults to True for GET, HEAD, PUT and DELETE;
        ``timeout`` overrides the client's for this request (a long poll).
        """
        import requests

        method = method.upper()
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS")
        h = {"Accept": "application/json, application/problem+json",
             "User-Agent": self.user_agent}
        data = None
        if body is not _NO_BODY:
            # serialised once: every retry sends the very same bytes
            data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        clean_params = {k: v for k, v in (params or {}).items() if v is not None}

        policy = self.retry
        started = policy.clock()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            error: GpujobsError
            # the address and token of each send: on_retry may have changed them
            # (the CLI does, when a restarted local stack wrote a new address)
            url = self.api_url + path
            sent = dict(h)
            if auth and self.token and "Authorization" not in h:
                sent["Authorization"] = f"Bearer {self.token}"
            try:
                resp = self.session.request(method, url, params=clean_params, data=data,
                                            headers=sent, timeout=timeout or self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                error = TransportError(_describe_transport(e, url), method=method, url=url,
                                       attempts=attempt, cause=e)
                retryable = idempotent or never_sent(e)
            except requests.RequestException as e:  # a bad URL and the like: not transient
                raise TransportError(f"cannot send {method} {url}: {e}", method=method, url=url,
                                     attempts=attempt, cause=e) from e
            else:
                if resp.status_code < 400:
                    if attempt > 1 and self.on_recover is not None:
                        self.on_recover(attempt, policy.clock() - started)
                    return resp
                error = _api_error(resp, method, url, attempt)
                retryable = (resp.status_code in RETRY_STATUSES_ANY
                             or error.code in RETRY_CODES
                             or (idempotent and resp.status_code in RETRY_STATUSES_IDEMPOTENT))
                retry_after = parse_retry_after(resp.headers.get("Retry-After"))
            if not retryable or attempt >= policy.max_attempts:
                raise error
            delay = policy.delay(attempt, retry_after)
            if policy.clock() - started + delay > policy.max_elapsed_s:
                raise error
            if self.on_retry is not None:
                self.on_retry(attempt, delay, error)
            policy.sleep(delay)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        try:
            return resp.json()
        except ValueError as e:
            raise InvalidResponse(f"{method} {path}: {resp.status_code} answer is not JSON") from e

    # -- health -----------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``GET /v1/health``: ``{"status": "ok"}`` once the API can reach its tables."""
        return self._json("GET", "/v1/health", auth=False)

    # -- jobs -------------------------------------------------------------------
    def create_job(self, spec: Mapping[str, Any] | None = None, /, *,
                   idempotency_key: str | None = None, priority_class: str | None = None,
                   **fields: Any) -> Job:
        """``POST /v1/jobs``. The body is ``spec`` updated with ``fields``
        (``command`` and ``ranks`` are required by the server); every member
        of the create body passes through as given, e.g. ``working_dir``, and
        the lifecycle's ``retry={"rules": [...], "max_uncounted_retries": N}``,
        ``max_runtime_s``, ``warn_before_s``, ``warn_signal``,
        ``max_pending_s``, ``checkpoint_dir`` (docs/api.md; the helpers of
        :mod:`gpujobs_client.lifecycle` read ``"4h"`` and ``"exit:42=fail"``).

        Pipelines and sweeps (the helpers of :mod:`gpujobs_client.pipelines`
        read ``"0-99%8"`` and ``after_ok=[...]``):

        - ``depends_on=[{"job_id": "job_...", "condition": "succeeded"}]``
          (up to 100; ``condition`` is ``succeeded``, the default, ``failed``:
          ended FAILED or CANCELLED, or ``ended``: any end). Each must be an
          existing job of the tenant, else :class:`InvalidArgument` naming
          ``depends_on.<i>.job_id``. The job stays PENDING, ``waiting_for``
          listing what is left and ``pending_reason`` "waiting for job_x to
          succeed"; once a dependency can no longer be met it ends FAILED with
          ``exit.reason`` ``dependency_failed`` (``exit.dependency`` names it).
        - ``array={"size": N, "max_parallel": P, "max_failed_indexes": F,
          "env": {"LR": [N values]}}`` (``size`` 1 to 10,000; the others
          optional): the job is an array's parent, which never runs itself,
          and its N children (indexes 0 to N-1, at most P running at once,
          each with its own retries) get ``GPUJOBS_ARRAY_INDEX``,
          ``GPUJOBS_ARRAY_SIZE`` and the index's value of each ``env`` list.
          More than F failed indexes fail the array at once. ``job.array``
          counts the indexes by state; ``list_jobs(parent=job.id)`` lists the
          children; ``cancel_job`` of the parent cancels every index.

        ``priority_class`` names one of the operator's priority classes
        (sent only when given; the server's default is ``default``): higher
        classes are placed first, and a class that preempts may take the
        GPUs of running jobs of lower classes. ``priority`` orders the
        tenant's own jobs within the class. An unknown class is
        :class:`InvalidArgument` (400), a class the operator keeps for other
        tenants :class:`Forbidden` (403); both name ``field="priority_class"``.

        An ``Idempotency-Key`` is always sent: ``idempotency_key`` or a fresh
        uuid4, the same one on every retry of this call, so a retry after a
        lost answer returns the job the first send made (``job.replayed``)
        instead of making a second. ``job.idempotency_key`` is the key sent;
        pass it again to repeat the create safely from another process.
        """
        body = {**(spec or {}), **fields}
        if priority_class is not None:
            body["priority_class"] = priority_class
        key = idempotency_key or new_idempotency_key()
        resp = self.request("POST", "/v1/jobs", body=body, headers={"Idempotency-Key": key},
                            idempotent=True)
        data = _resp_json(resp, "POST /v1/jobs")
        return Job.from_json(data, replayed=resp.headers.get("Idempotent-Replayed") == "true",
                             idempotency_key=key)

    def get_job(self, job_id: str) -> Job:
        """``GET /v1/jobs/{job_id}``; :class:`NotFound` if it is not the tenant's."""
        return Job.from_json(self._json("GET", f"/v1/jobs/{_seg(job_id)}"))

    def list_jobs(self, *, state: str | None = None, page_size: int | None = None,
                  page_token: str | None = None, parent: str | None = None) -> JobPage:
        """One page of ``GET /v1/jobs``, newest first; with ``parent`` (an
        array's id), that array's children made so far, in index order.
        ``next_page_token`` is None exactly when the listing is over; a page
        may be short or empty before that (pass the same ``parent`` and
        ``state`` with the token). An unknown ``parent`` is :class:`NotFound`,
        a job that is not an array :class:`InvalidArgument`, both naming
        ``field="parent"``."""
        return JobPage.from_json(self._json(
            "GET", "/v1/jobs",
            params={"state": state, "page_size": page_size, "page_token": page_token,
                    "parent": parent}))

    def iter_pages(self, *, state: str | None = None, page_size: int | None = None,
                   page_token: str | None = None,
                   parent: str | None = None) -> Iterator[JobPage]:
        """Every page from ``page_token`` (or the first) to the end."""
        for data in self._follow("/v1/jobs", {"state": state, "page_size": page_size,
                                              "page_token": page_token, "parent": parent}):
            yield JobPage.from_json(data)

    def _follow(self, path: str, params: dict[str, Any]) -> Iterator[Any]:
        """Every page of ``GET path`` from ``params``' page_token (or the
        first) to the one without a ``next_page_token``; a token the server
        returns twice is :class:`InvalidResponse`, not a loop. A bare list
        (an older server's unpaged answer) is the one page."""
        seen: set[str] = set()
        while True:
            data = self._json("GET", path, params=params)
            yield data
            token = data.get("next_page_token") if isinstance(data, dict) else None
            if not token:
                return
            if token in seen:
                raise InvalidResponse("the server returned a page token twice")
            seen.add(token)
            params = {**params, "page_token": token}

    def iter_jobs(self, *, state: str | None = None, page_size: int | None = None,
                  limit: int | None = None, parent: str | None = None) -> Iterator[Job]:
        """Every job (newest first, each once), or with ``parent`` every
        child of that array made so far (in index order), following
        ``next_page_token`` to the end, or until ``limit`` jobs were yielded."""
        if limit is not None and limit <= 0:
            return
        count = 0
        for page in self.iter_pages(state=state, page_size=page_size, parent=parent):
            for job in page.jobs:
                yield job
                count += 1
                if limit is not None and count >= limit:
                    return

    def cancel_job(self, job_id: str, reason: str | None = None) -> Job:
        """``POST /v1/jobs/{job_id}/cancel`` (202). The cancel is recorded; a
        PENDING job is CANCELLED at once, a placed one when its agents confirm;
        an array's parent cancels every index, and is CANCELLED once they all
        have ended. Repeating it is harmless. :class:`AlreadyFinished` if the job
        succeeded or failed first."""
        body = {"reason": reason} if reason is not None else {}
        return Job.from_json(self._json("POST", f"/v1/jobs/{_seg(job_id)}/cancel", body=body,
                                        idempotent=True))

    def wait_for_job(self, job_id: str, *, interval_s: float = 2.0,
                     timeout_s: float | None = None,
                     on_poll: Callable[[Job], None] | None = None,
                     sleep: Callable[[float], None] = time.sleep) -> Job:
        """Poll ``get_job`` until the job is terminal; :class:`WaitTimeout`
        after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if on_poll is not None:
                on_poll(job)
            if job.is_terminal:
                return job
            if deadline is not None and time.monotonic() + interval_s > deadline:
                raise WaitTimeout(f"job {job_id} still {job.state} after {timeout_s}s", job)
            sleep(interval_s)

    def list_attempts(self, job_id: str) -> list[Attempt]:
        """``GET /v1/jobs/{job_id}/attempts``, oldest first."""
        data = self._json("GET", f"/v1/jobs/{_seg(job_id)}/attempts")
        return [Attempt.from_json(a) for a in data.get("attempts") or []]

    def list_events(self, job_id: str) -> list[JobEvent]:
        """``GET /v1/jobs/{job_id}/events``: the job's story, oldest first."""
        data = self._json("GET", f"/v1/jobs/{_seg(job_id)}/events")
        return [JobEvent.from_json(e) for e in data.get("events") or []]

    def events_page(self, *, after: str | None = None, type: str | None = None,
                    job_id: str | None = None, page_size: int | None = None,
                    wait_s: int | None = None) -> FeedPage:
        """One page of ``GET /v1/events``, the tenant's feed, oldest first:
        the events after the cursor ``after`` (None: from the oldest kept),
        only of ``type`` and ``job_id`` if given; with ``wait_s`` (0-20) an
        empty answer is held that long for the next event."""
        read = float(self.timeout[1] if isinstance(self.timeout, tuple) else self.timeout)
        return FeedPage.from_json(self._json(
            "GET", "/v1/events", params={"after": after, "type": type, "job_id": job_id,
                                         "page_size": page_size, "wait_s": wait_s},
            timeout=(read, read + (wait_s or 0))))

    def iter_events(self, *, after: str | None = None, type: str | None = None,
                    job_id: str | None = None, follow: bool = False, wait_s: int = 20,
                    on_cursor: Callable[[str], None] | None = None) -> Iterator[FeedEvent]:
        """Every event of the feed after ``after``, each once, in order; to
        the end (an empty page), or with ``follow`` for ever, long-polling
        ``wait_s`` at a time. ``on_cursor`` gets each page's ``next_cursor``
        once its events were yielded (where to resume)."""
        cursor = after
        while True:
            page = self.events_page(after=cursor, type=type, job_id=job_id,
                                    wait_s=wait_s if follow else None)
            yield from page.events
            cursor = page.next_cursor
            if on_cursor is not None:
                on_cursor(cursor)
            if not page.events and not follow:
                return

    def get_logs(self, job_id: str, *, attempt: int | None = None, rank: int | None = None,
                 since: str | None = None, page_token: str | None = None,
                 page_size: int | None = None, tail: int | None = None) -> dict[str, Any]:
        """One page of ``GET /v1/jobs/{job_id}/logs`` as the API returns it
        (``tail``: the newest lines, 1 to 10,000; not with ``page_token``)."""
        return self._json("GET", f"/v1/jobs/{_seg(job_id)}/logs", params={
            "attempt": attempt, "rank": rank, "since": since, "page_token": page_token,
            "page_size": page_size, "tail": tail})

    def iter_logs(self, job_id: str, *, attempt: int | None = None, rank: int | None = None,
                  since: str | None = None, follow: bool = False, interval_s: float = 1.0,
                  page_size: int | None = None, tail: int | None = None,
                  lookback_s: float = FOLLOW_LOOKBACK_S,
                  sleep: Callable[[float], None] = time.sleep) -> Iterator[LogLine]:
        """Every line of the job's ranks (one rank with ``rank``), in the
        API's order (time, rank, seq), of the newest attempt unless
        ``attempt`` names one; with ``tail``, only the newest ``tail`` lines
        (0: none, then what comes with ``follow``).

        With ``follow``, keeps polling for new lines until the job is
        terminal, then reads to the end once more and returns. Lines of
        different ranks may arrive late and out of time order (an agent
        restarted ships its backlog seconds later), so each poll reads
        ``since`` the oldest of the ranks' last printed times, but no further
        back than ``lookback_s`` before the newest line yielded (a rank not
        seen yet counts as that bound), and yields a line only if it comes
        after the last one yielded of its rank (by seq, or time and id for
        lines without one): each line once, every rank's in order. A read
        that took long (its retries rode through a restart: see
        :class:`RetryPolicy`) widens the lookback by as long for the next
        ``lookback_s``, since the lines written meanwhile ship that much later.

        Lines that landed late behind where a read already is (older than
        the lookback, or than a page already read while the read paged on)
        are found by their rank's next line: its ``seq`` is past the last
        yielded line's ``next_seq``. That rank's lines are then left for the
        rest of the read and read again alone from its last line (one rank's
        lines land in their order, so its own pages skip none): in order,
        none skipped, with or without ``follow``."""
        follower = _LogFollow(lookback_s, from_start=since is None and tail is None)
        if follow:
            ranks = int(self.get_job(job_id).spec.get("ranks") or 1)
            follower.ranks = {rank} if rank is not None else set(range(ranks))
        query_since, token = since, None
        if tail is not None:
            page = self.get_logs(job_id, attempt=attempt, rank=rank, since=since,
                                 tail=max(tail, 1))
            got = int(page.get("attempt") or 0)
            attempt = attempt if attempt is not None or not got else got
            lines = [LogLine.from_json(d, got) for d in page.get("lines") or []]
            shown = max(0, len(lines) - tail)  # tail 0: the newest line, as printed before
            for line in lines[:shown]:
                follower.seen(line)
            for line in lines[shown:]:
                follower.seen(line)
                yield line
            if not follow:
                return
            query_since = follower.since() or since
        ending = False
        while True:
            behind: set[int] = set()  # ranks whose next line showed lines skipped
            while True:  # to the end of what has been shipped
                asked = time.monotonic()
                page = self.get_logs(job_id, attempt=attempt, rank=rank, since=query_since,
                                     page_token=token, page_size=page_size)
                follower.waited(time.monotonic() - asked)
                got = int(page.get("attempt") or 0)
                if attempt is None and got:
                    attempt = got  # the attempt being read, also by a rank read again
                for d in page.get("lines") or []:
                    line = LogLine.from_json(d, got)
                    if line.rank is not None and (line.rank in behind
                                                  or follower.skips(line)):
                        behind.add(line.rank)
                    elif follower.seen(line):
                        yield line
                token = page.get("next_page_token")
                if not token:
                    break
            for r in sorted(behind):
                yield from self._read_rank_again(job_id, attempt, r, follower, page_size)
            if not follow or ending:
                return
            # the agents ship a rank's lines before reporting its exit: once the
            # job is terminal, one more read to the end has them all
            asked = time.monotonic()
            ending = self.get_job(job_id).is_terminal
            follower.waited(time.monotonic() - asked)
            if not ending:
                sleep(interval_s)
            query_since = follower.since() or since

    def _read_rank_again(self, job_id: str, attempt: int | None, rank: int,
                         follower: _LogFollow, page_size: int | None) -> Iterator[LogLine]:
        """The lines of ``rank`` after the last one ``follower`` yielded, read
        for that rank alone."""
        since, token = follower.resume_from(rank), None
        while True:
            page = self.get_logs(job_id, attempt=attempt, rank=rank, since=since,
                                 page_token=token, page_size=page_size)
            got = int(page.get("attempt") or 0)
            for d in page.get("lines") or []:
                line = LogLine.from_json(d, got)
                if follower.seen(line):
                    yield line
            token = page.get("next_page_token")
            if not token:
                return

    # -- ranks and heartbeats ---------------------------------------------------
    def get_ranks(self, job_id: str) -> Ranks:
        """``GET /v1/jobs/{job_id}/ranks``, every page: the current attempt's
        ranks, longest silent first (ties by rank).

        The server cuts a big attempt's view (tens of thousands of ranks) into
        pages of rank ranges, each in silence order; the pages are read to the
        end and their ranks put in that order together. Each rank's silence is
        as of its own page's read, and the other fields (``now``, the verdict)
        are the first page's."""
        first, *rest = self._follow(f"/v1/jobs/{_seg(job_id)}/ranks", {})
        if rest:
            rows = [r for page in (first, *rest) for r in page.get("ranks") or []]
            rows.sort(key=lambda r: (-float(r.get("silence_s") or 0), r.get("rank", 0)))
            first = {**first, "ranks": rows, "next_page_token": None}
        return Ranks.from_json(first)

    def post_heartbeats(self, job_id: str, attempt: int,
                        ranks: Iterable[Mapping[str, Any] | Sequence[int]]) -> HeartbeatAck:
        """``POST /v1/jobs/{job_id}/heartbeats`` (agent token). ``ranks`` are
        ``{"rank", "step", "sent_at"}`` mappings or ``(rank, step)`` pairs;
        a missing ``sent_at`` is now. Repeats are harmless, so it is retried."""
        now = now_rfc3339()
        beats = []
        for r in ranks:
            if isinstance(r, Mapping):
                beats.append({"sent_at": now, **r})
            else:
                rank, step = r
                beats.append({"rank": int(rank), "step": int(step), "sent_at": now})
        return HeartbeatAck.from_json(self._json(
            "POST", f"/v1/jobs/{_seg(job_id)}/heartbeats",
            body={"attempt": int(attempt), "ranks": beats}, idempotent=True))

    def post_event(self, job_id: str, attempt: int, type: str, ranks: Iterable[int], *,
                   exit_code: int | None = None) -> Job:
        """``POST /v1/jobs/{job_id}/attempts/{attempt}/events`` (agent token):
        ``STARTED``, ``EXITED`` (with ``exit_code``) or ``STOPPED``. Repeats
        are harmless, so it is retried. :class:`StaleAttempt` for an attempt
        that is not current."""
        body: dict[str, Any] = {"type": type, "ranks": [int(r) for r in ranks]}
        if exit_code is not None:
            body["exit_code"] = int(exit_code)
        return Job.from_json(self._json(
            "POST", f"/v1/jobs/{_seg(job_id)}/attempts/{_seg(int(attempt))}/events",
            body=body, idempotent=True))

    # -- nodes ------------------------------------------------------------------
    def put_node(self, node_id: str, *, gpus: int, gpu_type: str,
                 labels: Mapping[str, str] | None = None) -> Node:
        """``PUT /v1/nodes/{node_id}`` (agent token): register or update."""
        return Node.from_json(self._json(
            "PUT", f"/v1/nodes/{_seg(node_id)}",
            body={"gpus": int(gpus), "gpu_type": gpu_type, "labels": dict(labels or {})}))

    def list_nodes(self) -> list[Node]:
        """``GET /v1/nodes``. Accepts ``{"nodes": [...]}`` (following a
        ``next_page_token`` if the server pages) or a bare list."""
        return [Node.from_json(n) for data in self._follow("/v1/nodes", {})
                for n in (data if isinstance(data, list) else data.get("nodes") or [])]

    def get_node(self, node_id: str) -> Node:
        """``GET /v1/nodes/{node_id}``."""
        return Node.from_json(self._json("GET", f"/v1/nodes/{_seg(node_id)}"))

    # -- webhooks (docs/api.md "Webhooks") ---------------------------------------
    def create_webhook(self, url: str, *, types: Iterable[str] | None = None,
                       description: str | None = None) -> dict[str, Any]:
        """``POST /v1/webhooks`` (201): the webhook, with its ``secret``
        (``whsec_...``), shown in this answer only. Not retried after a
        send whose answer was lost (a retry could make a second webhook)."""
        body: dict[str, Any] = {"url": url}
        if types:
            body["types"] = list(types)
        if description is not None:
            body["description"] = description
        return self._json("POST", "/v1/webhooks", body=body)

    def list_webhooks(self) -> list[dict[str, Any]]:
        """``GET /v1/webhooks``: the tenant's webhooks, oldest first, no secrets."""
        return list(self._json("GET", "/v1/webhooks").get("webhooks") or [])

    def get_webhook(self, webhook_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/webhooks/{_seg(webhook_id)}")

    def delete_webhook(self, webhook_id: str) -> None:
        """``DELETE /v1/webhooks/{id}`` (204)."""
        self.request("DELETE", f"/v1/webhooks/{_seg(webhook_id)}")

    def webhook_deliveries(self, webhook_id: str, *, page_size: int | None = None,
                           page_token: str | None = None) -> dict[str, Any]:
        """One page of the webhook's deliveries log, newest first:
        ``{"deliveries": [...], "next_page_token": ...}``."""
        return self._json("GET", f"/v1/webhooks/{_seg(webhook_id)}/deliveries",
                          params={"page_size": page_size, "page_token": page_token})

    def test_webhook(self, webhook_id: str) -> dict[str, Any]:
        """``POST /v1/webhooks/{id}/test`` (202): queues a signed
        ``webhook.test`` event for it; the event."""
        return self._json("POST", f"/v1/webhooks/{_seg(webhook_id)}/test")["event"]

    def usage(self, start: str, *, end: str | None = None, granularity: str | None = None,
              group_by: str | None = None, tenant: str | None = None) -> list[dict[str, Any]]:
        """``GET /v1/usage``: the rows of GPU time held, productive and lost
        by cause, per period (``hour`` or ``day``) and group (``gpu_type``,
        ``job`` or ``label:<key>``); an operator's token reads ``tenant``
        (or every tenant). Times are RFC 3339."""
        return list(self._json("GET", "/v1/usage", params={
            "start": start, "end": end, "granularity": granularity, "group_by": group_by,
            "tenant": tenant}).get("rows") or [])

    # -- operator actions on nodes (an operator token; docs/security.md) -------
    # Not keyed, but safe to repeat, so retried as cancel_job is: a second
    # cordon records the same cordon again, a second drain finds the node's
    # attempts already preempted (and the node cordoned, so none came back),
    # a second uncordon finds no cordon to lift.
    def cordon_node(self, node_id: str, reason: str | None = None) -> Node:
        """``POST /v1/nodes/{node_id}/cordon`` (200): the node takes no new
        placements (``DRAINING``); its running jobs run on. Cordoning again
        replaces the reason. :class:`Forbidden` without an operator token,
        :class:`NotFound` for an unknown node."""
        body = {"reason": reason} if reason else {}
        return Node.from_json(self._json("POST", f"/v1/nodes/{_seg(node_id)}/cordon",
                                         body=body, idempotent=True))

    def drain_node(self, node_id: str, reason: str | None = None, *,
                   wait: bool = False) -> Node:
        """``POST /v1/nodes/{node_id}/drain`` (202): a cordon, and every
        attempt running on the node is preempted (SIGTERM and its grace
        period, then requeued as the job's retry rules say: by default
        without counting), or with ``wait`` left to finish. The node is
        drained once ``gpus_free == gpus`` (:meth:`wait_for_drain`)."""
        body: dict[str, Any] = {"reason": reason} if reason else {}
        if wait:
            body["wait"] = True
        return Node.from_json(self._json("POST", f"/v1/nodes/{_seg(node_id)}/drain",
                                         body=body, idempotent=True))

    def uncordon_node(self, node_id: str) -> Node:
        """``POST /v1/nodes/{node_id}/uncordon`` (200): the cordon (or drain)
        is lifted and the node takes placements again (``READY``). A node
        without a cordon is left as it is."""
        return Node.from_json(self._json("POST", f"/v1/nodes/{_seg(node_id)}/uncordon",
                                         idempotent=True))

    def wait_for_drain(self, node_id: str, *, interval_s: float = 2.0,
                       timeout_s: float | None = None,
                       on_poll: Callable[[Node], None] | None = None,
                       sleep: Callable[[float], None] = time.sleep) -> Node:
        """Poll ``get_node`` until every GPU of the node is free
        (``gpus_free == gpus``); :class:`NodeWaitTimeout` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            node = self.get_node(node_id)
            if on_poll is not None:
                on_poll(node)
            if node.gpus_used == 0:
                return node
            if deadline is not None and time.monotonic() + interval_s > deadline:
                raise NodeWaitTimeout(
                    f"node {node_id} still has {node.gpus_used} of {node.gpus} GPUs in use "
                    f"after {timeout_s:g}s", node)
            sleep(interval_s)


# -- helpers ------------------------------------------------------------------------
def _resp_json(resp: "requests.Response", what: str) -> Any:
    try:
        return resp.json()
    except ValueError as e:
        raise InvalidResponse(f"{what}: {resp.status_code} answer is not JSON") from e


def _api_error(resp: "requests.Response", method: str, url: str, attempts: int) -> ApiError:
    problem: dict[str, Any] | None = None
    try:
        data = resp.json()
        if isinstance(data, dict):
            problem = data
    except ValueError:
        pass
    if problem is None or not isinstance(problem.get("status"), int):
        from http import HTTPStatus
        try:
            title = HTTPStatus(resp.status_code).phrase
        except ValueError:
            title = resp.reason or "HTTP error"
        text = (resp.text or "").strip()
        problem = {"type": "about:blank", "title": (problem or {}).get("title") or title,
                   "status": resp.status_code,
                   "detail": (problem or {}).get("detail") or text[:300],
                   "code": (problem or {}).get("code") or f"http_{resp.status_code}"}
    return error_from_problem(problem, headers=dict(resp.headers), method=method, url=url,
                              attempts=attempts)


def never_sent(e: BaseException) -> bool:
    """True when the connection was never made, so the server cannot have
    seen the request: safe to retry whatever the method."""
    import requests
    if isinstance(e, requests.ConnectTimeout):
        return True
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    reason = e.args[0] if e.args else None
    if isinstance(reason, MaxRetryError):
        reason = reason.reason
    return isinstance(reason, NewConnectionError)


def _describe_transport(e: BaseException, url: str) -> str:
    import requests
    if isinstance(e, requests.ConnectTimeout):
        return f"timed out connecting to {url}"
    if isinstance(e, requests.Timeout):
        return f"timed out waiting for {url}"
    if never_sent(e):
        return f"cannot connect to {url} (is the API running?)"
    return f"connection to {url} failed: {type(e).__name__}"
