"""Reading a job's rank logs: what the agents shipped to CloudWatch Logs.

Streams are ``<job>/<attempt>/rank-<r>`` (agent/logship.py), each event one
line as ``{"stream": "stdout"|"stderr", "line": ...}``. A page is one
FilterLogEvents call over the attempt's streams (every rank, or one), events
interleaved by time; its continuation is CloudWatch's own token, wrapped in our
signed cursor so it cannot be used for another tenant, job, attempt or filter.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from ..domain import cursor
from ..domain.clock import Clock, iso, parse_iso, utcnow
from ..domain.errors import InvalidArgument
from .jobs import JobsService
from .ports import LogReader

MAX_PAGE_SIZE = 10_000
DEFAULT_PAGE_SIZE = 1_000
_STREAM_RE = re.compile(r"^(?P<job>[^/]+)/(?P<attempt>\d+)/rank-(?P<rank>\d+)$")
_AGO_RE = re.compile(r"^(\d{1,9})([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def stream_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}/{attempt}/rank-{rank}"


def parse_since(value: str | None, now: datetime) -> datetime | None:
    """An RFC 3339 time, or a duration before now: ``90s``, ``10m``, ``2h``, ``1d``."""
    if value is None:
        return None
    m = _AGO_RE.match(value)
    if m:
        return now - timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
    try:
        t = parse_iso(value)
    except (ValueError, TypeError):
        t = None
    if t is None:
        raise InvalidArgument("since must be an RFC 3339 time or a duration such as 10m",
                              field="since")
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def line_json(stream: str, time_ms: int, message: str, event_id: str | None) -> dict:
    m = _STREAM_RE.match(stream)
    rank = int(m.group("rank")) if m else None
    try:
        body = json.loads(message)
        out, text = body["stream"], body["line"]
    except (ValueError, TypeError, KeyError):
        out, text = "stdout", message  # not written by our agent: shown as is
    at = datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc)
    return {"rank": rank, "stream": out, "time": iso(at), "line": text, "id": event_id}


class LogsService:
    def __init__(self, jobs: JobsService, reader: LogReader, *, page_token_key: bytes,
                 clock: Clock = utcnow) -> None:
        self._jobs, self._reader, self._key, self._clock = jobs, reader, page_token_key, clock

    def read(self, tenant: str, job_id: str, *, attempt: int | None = None,
             rank: int | None = None, since: str | None = None,
             page_token: str | None = None, page_size: int = DEFAULT_PAGE_SIZE) -> dict:
        job = self._jobs.get(tenant, job_id)
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be an integer from 1 to {MAX_PAGE_SIZE}",
                                  field="page_size")
        if attempt is None:
            attempt = job.attempt
        elif not 1 <= attempt <= max(job.attempt, 1):
            raise InvalidArgument(f"job {job_id} has attempts 1 to {job.attempt}"
                                  if job.attempt else f"job {job_id} has not run yet",
                                  field="attempt")
        ranks = job.spec["ranks"]
        if rank is not None and not 0 <= rank < ranks:
            raise InvalidArgument(f"rank must be from 0 to {ranks - 1}", field="rank")
        filter_key = f"logs:{job_id}:{attempt}:{'' if rank is None else rank}:{since or ''}"
        start = parse_since(since, self._clock())
        start_ms = None if start is None else int(start.timestamp() * 1000)
        token = None
        if page_token is not None:
            saved = json.loads(cursor.decode(page_token, tenant=tenant, filter_key=filter_key,
                                             secret=self._key))
            token, start_ms = saved["t"], saved["s"]
        result = {"job_id": job_id, "attempt": attempt, "lines": [], "next_page_token": None}
        if attempt == 0:
            return result  # never placed: nothing ran, nothing was written
        streams = [stream_name(job_id, attempt, r)
                   for r in ([rank] if rank is not None else range(ranks))]
        page = self._reader.read(streams, f"{job_id}/{attempt}/", start_ms=start_ms,
                                 token=token, limit=page_size)
        result["lines"] = [line_json(*e) for e in page.events]
        if page.next_token:
            result["next_page_token"] = cursor.encode(
                json.dumps({"t": page.next_token, "s": start_ms}), tenant=tenant,
                filter_key=filter_key, secret=self._key)
        return result
