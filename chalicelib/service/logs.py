"""Reading a job's rank logs: what the agents shipped to CloudWatch Logs.

Streams are ``<job>/<attempt>/rank-<r>`` (agent/logship.py), each event one
line as ``{"stream": "stdout"|"stderr", "line": ..., "seq": N, "next": M}``,
its time the time the line was written on the host, ``seq`` its byte offset
in the rank's file (strictly increasing within a stream; events shipped
before it have none, and a message not of that form is shown as stdout text)
and ``next`` where the rank's next line starts (shown as ``next_seq``; null
when unknown: a reader that finds a rank's next line at a larger ``seq`` has
missed lines between).

Order: lines are sorted by (time, rank, seq), those without a seq after the
ones with one at their (time, rank), by event id (``position``). The store
(FilterLogEvents, interleaved) answers in time order only, ties across
streams in an order of its own (moto: stream by stream, in the order the
streams were made), so each read is sorted here, and a line is only sent once
every event of its millisecond has been read (the store answered with a later
time, or has no more).

Pages: a page token is our own position, not the store's token: it carries
the last line sent (time, rank, seq or event id), and the next page reads the
store from that millisecond (``startTime``) and drops every line at or before
the position. So a token resumes exactly where its page ended, no line lost or
repeated, whatever the store's tokens do with lines appended meanwhile; a
line appended later with a time before the position (an agent shipping a
backlog late) is not in the pages after it (``gpujobs logs -f`` re-reads a
lookback for those). The lines of the position's millisecond are read again
each page (the cursor counts them, ``d``, so the first read asks for enough):
more lines in one millisecond than a page still make progress, at the cost of
reading them all for each page. Every page also hands out ``follow_token``,
the same position even on the last page (where ``next_page_token`` is null):
polling with it returns what was appended after it.

``tail=N`` is the last N lines, searched for backwards (``LogsService._tail``
says how, and what it costs), with a follow token after the newest.

What the store returns is not trusted to be the job's: a job of more than 100
ranks is read by stream-name prefix, which the embedded moto ignores (it
answers with every stream of the log group). :class:`LogScope` is the one
check of a stream against the job, attempt and rank being read; every event
passes it or is dropped, and a token is only positioned on one of the scope's
ranks (checked again on resume).

A page fits in Lambda's 6 MB response whatever the lines hold: it is cut by
the size its lines take in the proxy payload (service/limits.py ``fit`` and
``proxy_bytes``, as job pages are), so it may hold fewer lines than
``page_size``; the next page starts right after the last line sent. The
cursor then carries how many lines fitted (``n``), and the next page asks the
store for twice that many (and so on, up to ``page_size``): a store that caps
no answer (moto; CloudWatch answers with at most 1 MB) is not asked for a
hundred megabytes to send five. One line is at most MAX_LINE_CHARS
characters, an event's most in CloudWatch Logs (256 KB), so one always fits; a
longer one (only a store that enforces no limit holds one) is shown cut, with
``cut: true``. A tail cut to fit holds the newest lines that fit.

Reads are bounded: a page or a tail probe that takes MAX_READS store reads
without completing (a store that ignores the stream filter answering with
other streams' events, or one millisecond of more lines than that) is a 503.
"""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

from ..domain import cursor
from ..domain.clock import Clock, iso, utcnow
from ..domain.errors import InvalidArgument, InvalidPageToken, ServiceUnavailable
from . import limits
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
#: the most lines ``tail`` asks for
MAX_TAIL = 10_000
#: a line's ``seq`` (a byte offset) and a cursor's count of lines in one
#: millisecond are at most this (JSON's exact integers)
MAX_SEQ = 2 ** 53
MAX_TIES = 2 ** 53

# -- since: the documented forms only ---------------------------------------------------
#: ``since`` may name no time before this (CloudWatch's times count from it) ...
SINCE_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: ... nor one more than this after the server's clock (no line can be there)
SINCE_AHEAD = timedelta(days=1)
SINCE_AHEAD_MS = 86_400_000
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


def seq_of(body: object) -> int | None:
    """The line's ``seq`` (its byte offset in the rank's file, strictly
    increasing within a stream) when the agent wrote one: a whole number."""
    if not isinstance(body, dict):
        return None
    seq = body.get("seq")
    return seq if type(seq) is int and 0 <= seq <= MAX_SEQ else None


def next_seq_of(body: dict, seq: int | None) -> int | None:
    """Where the rank's next line starts in its file (the agent's ``next``):
    a whole number after ``seq``, else None (unknown)."""
    after = body.get("next")
    ok = seq is not None and type(after) is int and seq < after <= MAX_SEQ
    return after if ok else None


def line_json(rank: int, time_ms: int, message: str, event_id: str | None) -> dict:
    seq: int | None = None
    after: int | None = None
    try:
        body = json.loads(message)
        out, text = body["stream"], body["line"]
        if out not in ("stdout", "stderr") or not isinstance(text, str):
            raise TypeError(out)
        seq = seq_of(body)
        after = next_seq_of(body, seq)
    except (ValueError, TypeError, KeyError):
        out, text = "stdout", message  # not written by our agent: shown as is
    at = datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc)
    line = {"rank": rank, "stream": out, "time": iso(at), "line": text, "seq": seq,
            "next_seq": after, "id": event_id}
    if len(text) > MAX_LINE_CHARS:  # never from CloudWatch Logs (an event is at most 256 KB)
        line.update(line=text[:MAX_LINE_CHARS], cut=True)
    return line


def position(rank: int, time_ms: int, seq: int | None, event_id: str | None) -> tuple:
    """Where a line sorts: by time, then rank, then ``seq``; lines without
    one after those with one, by event id, shorter first, then as text: so
    decimal ids sort as numbers (CloudWatch's are 56 digits, in the order it
    took them; moto's a counter, "10" after "9")."""
    if seq is not None:
        return (time_ms, rank, 0, seq, "")
    return (time_ms, rank, 1, len(event_id or ""), event_id or "")


class _Line:
    """One of the scope's events, its line and where it sorts."""
    __slots__ = ("event", "json", "key")

    def __init__(self, rank: int, time_ms: int, message: str, event_id: str | None) -> None:
        self.event = (rank, time_ms, message, event_id)
        self.json = line_json(rank, time_ms, message, event_id)
        self.key = position(rank, time_ms, self.json["seq"], event_id)


def _size(line: _Line) -> int:
    return limits.proxy_bytes(line.json)


class LogsService:
    def __init__(self, jobs: JobsService, reader: LogReader, *, page_token_key: bytes,
                 clock: Clock = utcnow) -> None:
        self._jobs, self._reader, self._key, self._clock = jobs, reader, page_token_key, clock

    def read(self, tenant: str, job_id: str, *, attempt: int | None = None,
             rank: int | None = None, since: str | None = None,
             page_token: str | None = None, page_size: int = DEFAULT_PAGE_SIZE,
             tail: int | None = None) -> dict:
        job = self._jobs.get(tenant, job_id)
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be an integer from 1 to {MAX_PAGE_SIZE}",
                                  field="page_size")
        if tail is not None and not 1 <= tail <= MAX_TAIL:
            raise InvalidArgument(f"tail must be an integer from 1 to {MAX_TAIL}", field="tail")
        if tail is not None and page_token is not None:
            raise InvalidArgument("tail starts a read and page_token continues one: "
                                  "give one or the other", field="tail")
        if attempt is None:
            attempt = job.attempt
        elif not 1 <= attempt <= max(job.attempt, 1):
            raise InvalidArgument(f"job {job_id} has attempts 1 to {job.attempt}"
                                  if job.attempt else f"job {job_id} has not run yet",
                                  field="attempt")
        ranks = job.spec.ranks
        if rank is not None and not 0 <= rank < ranks:
            raise InvalidArgument(f"rank must be from 0 to {ranks - 1}", field="rank")
        filter_key = f"logs:{job_id}:{attempt}:{'' if rank is None else rank}:{since or ''}"
        now = self._clock()
        start = parse_since(since, now)
        start_ms = None if start is None else epoch_ms(start)
        scope = LogScope(job_id, attempt, ranks, rank)
        after: tuple | None = None
        ties, fitted = 0, None
        if page_token is not None:
            start_ms, after, ties, fitted = self._resume(page_token, tenant, filter_key, scope)
        result: dict = {"job_id": job_id, "attempt": attempt, "lines": [],
                        "next_page_token": None, "follow_token": None}
        if attempt == 0:
            return result  # never placed: nothing ran, nothing was written
        streams = [stream_name(job_id, attempt, r)
                   for r in ([rank] if rank is not None else range(ranks))]
        prefix = f"{job_id}/{attempt}/"

        def token(lines: list[_Line], more: bool, fitted: int | None) -> None:
            last, count = after, ties
            if lines:
                last = lines[-1].key
                same = sum(1 for x in lines if x.key[0] == last[0])
                count = same + (ties if after is not None and after[0] == last[0] else 0)
            body: dict = {"s": start_ms, "p": None if last is None else _pos_json(last),
                          "d": count}
            if fitted is not None:
                body["n"] = fitted
            text = cursor.encode(json.dumps(body), tenant=tenant, filter_key=filter_key,
                                 secret=self._key)
            result["follow_token"] = text
            result["next_page_token"] = text if more else None

        if tail is not None:
            lines = self._tail(scope, streams, prefix, tail, start_ms or 0, epoch_ms(now))
            result["lines"] = [x.json for x in lines]
            token(lines, False, None)
            return result
        want = page_size if fitted is None else min(page_size, 2 * fitted)
        lines, more, cut = self._page(scope, streams, prefix, start_ms, after, want,
                                      ties + want + 1)
        if cut is None and want < page_size and lines:
            cut = len(lines)  # asked for fewer: twice as many next time, up to page_size
        result["lines"] = [x.json for x in lines]
        token(lines, more, cut)
        return result

    def _resume(self, page_token: str, tenant: str, filter_key: str, scope: LogScope
                ) -> tuple[int | None, tuple | None, int, int | None]:
        """The start (``since``), the position of the last line sent (None:
        none yet), how many lines at its millisecond were at or before it,
        and how many lines fitted the last page (None: it was not cut by
        size) a cursor carries; its position must be among the scope's ranks."""
        saved = cursor.decode(page_token, tenant=tenant, filter_key=filter_key, secret=self._key)
        bad = InvalidPageToken("page_token is malformed, was tampered with, or belongs "
                               "to another tenant, job, attempt or filter", field="page_token")
        try:
            body = json.loads(saved)
            start_ms, pos, ties = body["s"], body["p"], body["d"]
            fitted = body.get("n")
        except (ValueError, TypeError, KeyError, AttributeError):
            raise bad from None
        if not (start_ms is None or (type(start_ms) is int and start_ms >= 0)):
            raise bad
        if not (type(ties) is int and 0 <= ties <= MAX_TIES):
            raise bad
        if not (fitted is None or (type(fitted) is int and 1 <= fitted <= MAX_PAGE_SIZE)):
            raise bad
        if pos is None:
            return start_ms, None, 0, fitted
        if not (isinstance(pos, list) and len(pos) == 4):
            raise bad
        time_ms, rank, seq, event_id = pos
        if type(time_ms) is not int or time_ms < 0 or type(rank) is not int:
            raise bad
        if not (seq is None or (type(seq) is int and 0 <= seq <= MAX_SEQ)):
            raise bad
        if not (event_id is None or isinstance(event_id, str)) or (
                seq is None and event_id is None):
            raise bad
        if scope.rank_of(stream_name(scope.job_id, scope.attempt, rank)) is None:
            raise bad  # a position among another rank's lines (or one out of range)
        return start_ms, position(rank, time_ms, seq, event_id), ties, fitted

    def _scoped(self, scope: LogScope, event: tuple) -> _Line | None:
        r = scope.rank_of(event[0])
        return None if r is None else _Line(r, *event[1:])

    def _page(self, scope: LogScope, streams: list[str], prefix: str, start_ms: int | None,
              after: tuple | None, want: int, ask: int
              ) -> tuple[list[_Line], bool, int | None]:
        """The first ``want`` of the scope's lines after position ``after``
        (from ``start_ms``, or the position's millisecond), in order; whether
        more follow now; and how many fitted when the page was cut by size
        (else None). ``ask``: how many events the first read asks for (the
        lines at the position's millisecond already sent, the page and one).

        The store answers in time order, ties in no order we rely on: a line
        is placed once every event of its millisecond has been read, that is
        once the store has answered with a later time (or has no more). So
        the store is read on, by its token, while fewer than ``want`` lines
        are placed (each read twice as large, a read of none of the scope's
        at the most); lines at or before ``after`` are dropped."""
        begin = after[0] if after is not None else start_ms
        kept: list[_Line] = []
        overflow, token = False, None
        ask = min(MAX_PAGE_SIZE, ask)
        for _ in range(MAX_READS):
            page = self._reader.read(streams, prefix, start_ms=begin, token=token, limit=ask)
            mine = 0
            for event in page.events:
                line = self._scoped(scope, event)
                if line is None:
                    continue
                mine += 1
                if after is None or line.key > after:
                    kept.append(line)
            kept.sort(key=lambda x: x.key)
            if len(kept) > want:
                overflow = True
                del kept[want:]
            if not page.next_token:
                return self._fit(kept, overflow)
            if page.events:
                boundary = max(e[1] for e in page.events)
                placed = sum(1 for x in kept if x.key[0] < boundary)
                if placed >= want:
                    return self._fit(kept[:placed], True)
            token = page.next_token
            ask = MAX_PAGE_SIZE if not mine else min(MAX_PAGE_SIZE, 2 * ask)
        raise ServiceUnavailable(
            f"the log store answered {MAX_READS} reads without completing this page "
            "(other streams' events, or more lines in one millisecond than it holds); "
            "retry")

    @staticmethod
    def _fit(lines: list[_Line], more: bool) -> tuple[list[_Line], bool, int | None]:
        """``lines`` cut to what fits a response, whether more follow, and how
        many fitted when cut by size."""
        n = limits.fit(lines, _size)
        if n < len(lines):
            return lines[:n], True, n
        return lines, more, None

    def _probe(self, scope: LogScope, streams: list[str], prefix: str, start_ms: int,
               most: int) -> list[_Line] | None:
        """Every one of the scope's lines from ``start_ms`` on, when there are
        at most ``most`` of them; None when there are more (reading stops at
        ``most + 1``)."""
        got: list[_Line] = []
        token, ask = None, min(MAX_PAGE_SIZE, most + 1)
        for _ in range(MAX_READS):
            page = self._reader.read(streams, prefix, start_ms=start_ms, token=token, limit=ask)
            mine = 0
            for event in page.events:
                line = self._scoped(scope, event)
                if line is not None:
                    got.append(line)
                    mine += 1
            if len(got) > most:
                return None
            if not page.next_token:
                return got
            token = page.next_token
            ask = min(MAX_PAGE_SIZE, most + 1 - len(got)) if mine else MAX_PAGE_SIZE
        raise ServiceUnavailable(
            f"the log store answered {MAX_READS} reads without completing this tail; retry")

    def _tail(self, scope: LogScope, streams: list[str], prefix: str, n: int, lowest: int,
              now_ms: int) -> list[_Line]:
        """The last ``n`` of the scope's lines at or after ``lowest``, oldest
        first, cut to the newest that fit a response.

        FilterLogEvents reads forward only, so the window is searched for:
        a probe from a start reads forward, at most 2n+1 lines. From
        ``lowest`` (``since``, or the epoch) first: most jobs' whole log; when
        that holds more than 2n, from a second before now, then 2, 4, 8 s ...
        back until a probe holds at least n lines (it does before it reaches
        ``lowest``); between the last start
        with too few and the first with too many, a binary search on the
        millisecond, until a probe holds n to 2n lines: that probe is the
        read. Each probe costs at most 2n+1 lines; there are at most
        1 + log2(window / 1 s) + log2(window in ms) of them (about 70 for a
        month), 1 for a job of at most 2n lines. Should even one millisecond
        hold more than 2n lines, it is read whole (MAX_READS bounds it)."""
        most = 2 * n
        lines = self._probe(scope, streams, prefix, lowest, most)
        if lines is None:
            too_many, too_few = lowest, now_ms + SINCE_AHEAD_MS
            step, back = 1000, True  # back: still stepping back from now
            while lines is None and too_few - too_many > 1:
                back = back and now_ms - step > too_many
                w = now_ms - step if back else (too_many + too_few) // 2
                got = self._probe(scope, streams, prefix, w, most)
                if got is None:
                    too_many, back = w, False
                elif len(got) >= n:
                    lines = got
                else:
                    too_few, step = w, 2 * step
            if lines is None:  # more than 2n lines in one millisecond: read it whole
                lines = self._newest(scope, streams, prefix, too_many, n)
        lines.sort(key=lambda x: x.key)
        lines = lines[-n:]
        fits = limits.fit(lines[::-1], _size)
        return lines[len(lines) - fits:]

    def _newest(self, scope: LogScope, streams: list[str], prefix: str, start_ms: int,
                n: int) -> list[_Line]:
        """The newest ``n`` of the scope's lines from ``start_ms`` on, every one
        of them read (at most MAX_READS reads of MAX_PAGE_SIZE)."""
        kept: list[_Line] = []
        token = None
        for _ in range(MAX_READS):
            page = self._reader.read(streams, prefix, start_ms=start_ms, token=token,
                                     limit=MAX_PAGE_SIZE)
            kept += [x for x in (self._scoped(scope, e) for e in page.events) if x is not None]
            kept.sort(key=lambda x: x.key)
            del kept[:-n]
            if not page.next_token:
                return kept
            token = page.next_token
        raise ServiceUnavailable(
            f"the log store answered {MAX_READS} reads without completing this tail; retry")


def _pos_json(key: tuple) -> list:
    """A position (``position``) as a cursor carries it: [time, rank, seq, id]."""
    time_ms, rank, no_seq, seq, event_id = key
    return [time_ms, rank, None, event_id] if no_seq else [time_ms, rank, seq, None]
