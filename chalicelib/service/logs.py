"""Reading a job's rank logs: what the agents shipped to CloudWatch Logs.

Streams are ``<job>/<attempt>/rank-<r>`` (agent/logship.py), each event one
line as ``{"stream": "stdout"|"stderr", "line": ...}``. A page is read by
FilterLogEvents over the attempt's streams (every rank, or one), events
interleaved by time; its continuation is CloudWatch's own token, wrapped in our
signed cursor so it cannot be used for another tenant, job, attempt or filter.

What the store returns is not trusted to be the job's: a job of more than 100
ranks is read by stream-name prefix, which the embedded moto ignores (it
answers with every stream of the log group). :class:`LogScope` is the one
check of a stream against the job, attempt and rank being read; every event
passes it or is dropped, and a page is only ever handed out positioned after
one of the job's own events (or at the end), the cursor naming that stream so
that a resumed token is checked by the same rule.

A page fits in Lambda's 6 MB response whatever the lines hold: it is cut by
the size its lines take in the proxy payload (domain/limits.py ``fit`` and
``proxy_bytes``, as job pages are), so it may hold fewer lines than
``page_size``, and it is cut where the store's token resumes (the store is
read again up to the last line kept): the next page starts right after the
last line sent. The cursor then carries how many lines fitted (``n``), and
the next page asks the store for twice that many (and so on, up to
``page_size``): a store that caps no answer (moto; CloudWatch answers with at
most 1 MB) is not asked for a hundred megabytes to send five. One line is at
most MAX_LINE_CHARS characters, an event's most in CloudWatch Logs (256 KB),
so one always fits; a longer one (only a store that enforces no limit holds
one) is shown cut, with ``cut: true``.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from ..domain import cursor, limits
from ..domain.clock import Clock, iso, utcnow
from ..domain.errors import InvalidArgument, InvalidPageToken, ServiceUnavailable
from .jobs import JobsService
from .ports import LogReader

MAX_PAGE_SIZE = 10_000
DEFAULT_PAGE_SIZE = 1_000
#: store reads one page may take to step over other streams' events (only a
#: store that ignores the stream filter returns any); each reads up to 10,000
MAX_READS = 100
#: the most characters of one line shown: CloudWatch Logs' largest event (256
#: KB), so a line takes at most 12 bytes a character, 3 MB, of a page's budget
MAX_LINE_CHARS = 262_144

# -- since: the documented forms only ---------------------------------------------------
#: ``since`` may name no time before this (CloudWatch's times count from it) ...
SINCE_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: ... nor one more than this after the server's clock (no line can be there)
SINCE_AHEAD = timedelta(days=1)
_AGO_RE = re.compile(r"([0-9]{1,9})([smhd])", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RFC3339_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]{1,9}))?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))", re.ASCII)
_SINCE_FORMS = ("since must be a duration ago (1 to 9 ASCII digits and s, m, h or d: "
                "30s, 10m, 2h, 3d) or an RFC 3339 time with its offset "
                "(2025-01-31T12:00:00Z, 2025-01-31T13:00:00.5+01:00)")


def _rfc3339(value: str) -> datetime | None:
    """``value`` as RFC 3339's date-time (seconds 00 to 59: no leap second),
    fractions past the microsecond dropped; None when it is not one."""
    m = _RFC3339_RE.fullmatch(value)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zulu, sign, off_h, off_m = m.groups()[6:]
    try:
        offset = timedelta(0) if zulu else timedelta(hours=int(off_h), minutes=int(off_m))
        if not zulu and (int(off_h) > 23 or int(off_m) > 59):
            return None
        tz = timezone(-offset if sign == "-" else offset)
        micro = int((frac or "").ljust(6, "0")[:6])
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=tz)
    except ValueError:  # month 13, February 30th, hour 24, ...
        return None


def parse_since(value: str | None, now: datetime) -> datetime | None:
    """The time ``since`` names: a duration before ``now`` (``30s``, ``10m``,
    ``2h``, ``3d``: ASCII digits, one unit) or an RFC 3339 time with its
    offset, from 1970-01-01T00:00:00Z to a day after ``now``; anything else
    is ``400 invalid_argument`` naming ``since`` (never an overflow)."""
    if value is None:
        return None
    m = _AGO_RE.fullmatch(value)
    if m:
        back = int(m.group(1)) * _UNITS[m.group(2)]  # whole seconds: no timedelta overflow
        if back > (now - SINCE_EARLIEST).total_seconds():
            raise InvalidArgument(f"since {value} ago is before 1970-01-01T00:00:00Z",
                                  field="since")
        return now - timedelta(seconds=back)
    t = _rfc3339(value)
    if t is None:
        raise InvalidArgument(_SINCE_FORMS, field="since")
    if t < SINCE_EARLIEST:
        raise InvalidArgument("since must not be before 1970-01-01T00:00:00Z", field="since")
    if t > now + SINCE_AHEAD:
        raise InvalidArgument("since must not be more than a day ahead of the server's "
                              f"clock ({iso(now)})", field="since")
    return t.astimezone(timezone.utc)


def epoch_ms(t: datetime) -> int:
    """``t`` in whole milliseconds since the epoch, rounded up (so ``since``
    keeps no line before it), in integers (no float rounding)."""
    us = (t - SINCE_EARLIEST) // timedelta(microseconds=1)
    return -(-us // 1000)


# -- streams: the one check --------------------------------------------------------------
def stream_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{job_id}/{attempt}/rank-{rank}"


class LogScope:
    """The streams one read may show: ``<job>/<attempt>/rank-<r>`` of this job
    and attempt, with ``r`` this rank, or any of ``0..ranks-1``, written as
    ``stream_name`` writes it (ASCII digits, no leading zero)."""

    def __init__(self, job_id: str, attempt: int, ranks: int, rank: int | None) -> None:
        self.job_id, self.attempt, self.ranks, self.rank = job_id, attempt, ranks, rank
        self._prefix = f"{job_id}/{attempt}/rank-"

    def rank_of(self, stream: object) -> int | None:
        """The rank of ``stream`` when it is one of this scope's; else None."""
        if not isinstance(stream, str) or not stream.startswith(self._prefix):
            return None
        digits = stream[len(self._prefix):]
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 9:
            return None
        r = int(digits)
        if str(r) != digits or not 0 <= r < self.ranks:
            return None
        return r if self.rank is None or r == self.rank else None

    def owns(self, stream: object) -> bool:
        return self.rank_of(stream) is not None


def line_json(rank: int, time_ms: int, message: str, event_id: str | None) -> dict:
    try:
        body = json.loads(message)
        out, text = body["stream"], body["line"]
        if out not in ("stdout", "stderr") or not isinstance(text, str):
            raise TypeError(out)
    except (ValueError, TypeError, KeyError):
        out, text = "stdout", message  # not written by our agent: shown as is
    at = datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc)
    line = {"rank": rank, "stream": out, "time": iso(at), "line": text, "id": event_id}
    if len(text) > MAX_LINE_CHARS:  # never from CloudWatch Logs (an event is at most 256 KB)
        line.update(line=text[:MAX_LINE_CHARS], cut=True)
    return line


def line_bytes(event: tuple) -> int:
    """What the line of ``event`` (rank, time, message, id) takes in a
    response's proxy payload (domain/limits.py), at most about 3 MB."""
    return limits.proxy_bytes(line_json(*event))


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
        start_ms = None if start is None else epoch_ms(start)
        scope = LogScope(job_id, attempt, ranks, rank)
        token, fitted = None, None
        if page_token is not None:
            token, start_ms, fitted = self._resume(page_token, tenant, filter_key, scope)
        result = {"job_id": job_id, "attempt": attempt, "lines": [], "next_page_token": None}
        if attempt == 0:
            return result  # never placed: nothing ran, nothing was written
        streams = [stream_name(job_id, attempt, r)
                   for r in ([rank] if rank is not None else range(ranks))]
        first = page_size if fitted is None else min(page_size, 2 * fitted)
        events, next_token, after, fitted = self._page(
            scope, streams, f"{job_id}/{attempt}/", start_ms, token, page_size, first)
        if fitted is None and first < page_size and events:
            fitted = len(events)  # asked for fewer: twice as many next time, up to page_size
        result["lines"] = [line_json(r, *rest) for r, *rest in events]
        if next_token:
            body: dict = {"t": next_token, "s": start_ms, "a": after}
            if fitted is not None:
                body["n"] = fitted
            result["next_page_token"] = cursor.encode(
                json.dumps(body), tenant=tenant, filter_key=filter_key, secret=self._key)
        return result

    def _resume(self, page_token: str, tenant: str, filter_key: str,
                scope: LogScope) -> tuple[str, int | None, int | None]:
        """The store's token, the start and how many lines fitted the last
        page (None: it was not cut by size) a cursor carries; the stream it
        names (``a``, the one its position follows) must be the scope's."""
        saved = cursor.decode(page_token, tenant=tenant, filter_key=filter_key, secret=self._key)
        bad = InvalidPageToken("page_token is malformed, was tampered with, or belongs "
                               "to another tenant, job, attempt or filter", field="page_token")
        try:
            body = json.loads(saved)
            token, start_ms, after = body["t"], body["s"], body["a"]
            fitted = body.get("n")
        except (ValueError, TypeError, KeyError, AttributeError):
            raise bad from None
        if not isinstance(token, str) or not token or not (
                start_ms is None or type(start_ms) is int):
            raise bad
        if not (fitted is None or (type(fitted) is int and 1 <= fitted <= MAX_PAGE_SIZE)):
            raise bad
        if after is not None and not scope.owns(after):
            raise bad  # a position among another job's (or attempt's, or rank's) lines
        return token, start_ms, fitted

    def _page(self, scope: LogScope, streams: list[str], prefix: str, start_ms: int | None,
              token: str | None, limit: int, first: int
              ) -> tuple[list[tuple], str | None, str | None, int | None]:
        """Up to ``limit`` of the scope's events from ``token`` on, as (rank,
        time, message, id), the store's token after them and the stream that
        token follows, and how many fitted when the page was cut by size
        (else None). ``first``: how many events the first read asks for (at
        most ``limit``). Events outside the scope are dropped; the token handed
        back is never positioned after one of them: over a run of other
        streams' events the store is read on (its own limit at the maximum),
        and a page that holds both is read again from its start up to the
        last event kept. A store that honours the filter answers in one read.

        Also cut by size: no more of the scope's events than fit a response
        (``limits.fit`` of ``line_bytes``), the page read again up to the last
        of them, so its token resumes right after the last line sent."""
        ask, fitted = first, None
        page = self._reader.read(streams, prefix, start_ms=start_ms, token=token, limit=ask)
        for _ in range(MAX_READS):
            mine = [i for i, e in enumerate(page.events) if scope.owns(e[0])]
            last_mine = bool(page.events) and bool(mine) and mine[-1] == len(page.events) - 1
            kept = [(scope.rank_of(page.events[i][0]), *page.events[i][1:]) for i in mine]
            wanted = limits.fit(kept[:limit], line_bytes)
            if wanted < min(limit, len(kept)):
                fitted = wanted  # cut by size
            if len(mine) <= wanted and (last_mine or not page.next_token or not page.events):
                after = page.events[-1][0] if page.events and page.next_token else None
                return kept, page.next_token, after, fitted
            if mine:  # both kinds, or more than fit: again, up to the last one kept
                ask = mine[min(wanted, len(mine)) - 1] + 1
            else:  # only other streams' events: step over them
                token, ask = page.next_token, MAX_PAGE_SIZE
            page = self._reader.read(streams, prefix, start_ms=start_ms, token=token, limit=ask)
        raise ServiceUnavailable(
            f"the log store answered {MAX_READS} reads with other streams' events "
            "(it ignores the stream filter); this page could not be completed")
