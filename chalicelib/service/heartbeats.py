"""Heartbeat ingest and the ranks view.

Every rank is stamped with this function's receive time; the sender's
``sent_at`` is kept beside it for diagnosis only. A declared pause arrives as a
duration and becomes a bound on the collector's clock, so no sender clock ever
decides liveness.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from ..domain import cursor, straggler
from ..domain.attempts import Attempt
from ..domain.clock import Clock, iso, parse_iso, utcnow
from ..domain.errors import AlreadyFinished, ApiError, Forbidden, InvalidArgument, StaleAttempt
from ..domain.health import incident_band
from ..domain.ids import is_job_id
from ..domain.jobs import Job
from ..domain.principal import Principal
from ..domain.stall import Beat, Verdict, judge, received
from ..domain.states import PLACED, JobState
from . import limits
from .ports import Attempts, CollectorStore, HeartbeatStore, JobReads, Telemetry

#: attempts whose placement a process keeps: more than run at once (about
#: 3,200 at 100,000 GPUs), since the reconciler looks up every attempt a node
#: silent by its call-ins holds, each minute; at most one entry a running
#: rank in all (~10 MB at 100,000 ranks)
_PLACEMENTS_CACHED = 16384
#: ranks one page of the ranks view may ask for (the largest world size)
MAX_RANKS_PAGE = 65536


class HeartbeatsServicePorts(JobReads, Attempts, Protocol):
    """What heartbeats read: the job and where its attempt's ranks run."""


class HeartbeatsService:
    def __init__(self, store: HeartbeatsServicePorts, beats: HeartbeatStore, collector: CollectorStore, *,
                 scans_per_hour: float, telemetry: Telemetry, clock: Clock = utcnow,
                 page_token_key: bytes = b"") -> None:
        self.store, self.beats, self.collector = store, beats, collector
        self._token_key = page_token_key
        self.telemetry = telemetry
        self._scans_per_hour, self._clock = scans_per_hour, clock
        # an attempt's placement never changes: remember it, work it out once
        self._placements: OrderedDict[tuple[str, int], dict[int, str]] = OrderedDict()

    def node_of(self, job_id: str, attempt: int) -> dict[int, str]:
        """rank -> node of an attempt ({} for none): fixed for an attempt."""
        placed = self._cached((job_id, attempt))
        if placed is None:
            a = self.store.attempt(job_id, attempt)
            placed = {} if a is None else self._remember(a)
        return placed

    def _placed(self, a: Attempt) -> dict[int, str]:
        """rank -> node of an attempt just read, worked out once an attempt."""
        placed = self._cached((a.job_id, a.attempt))
        return self._remember(a) if placed is None else placed

    def _cached(self, key: tuple[str, int]) -> dict[int, str] | None:
        placed = self._placements.get(key)
        if placed is not None:
            self._placements.move_to_end(key)
        return placed

    def _remember(self, a: Attempt) -> dict[int, str]:
        placed = self._placements[(a.job_id, a.attempt)] = a.rank_nodes()
        if len(self._placements) > _PLACEMENTS_CACHED:
            self._placements.popitem(last=False)
        return placed

    def ingest(self, principal: Principal, job_id: str, body: dict) -> datetime:
        now = self._clock()
        if principal.kind != "agent":
            raise Forbidden("heartbeats take an agent token", field="Authorization")
        job = self._current(job_id, body["attempt"]) if is_job_id(job_id) else None
        if job is None or (principal.name != "*" and principal.name not in set(
                self.node_of(job_id, body["attempt"]).values())):
            # the same answer for a job that does not exist: an agent token must
            # not tell whether a tenant's job exists (docs/security.md)
            raise not_placed_here(principal, job_id, body["attempt"])
        if job.state.terminal:
            raise AlreadyFinished(f"job {job_id} already {job.state.value}", field="job_id")
        if body["attempt"] != job.attempt or job.state not in PLACED:
            # a PENDING job's attempt number is its last, ended attempt
            raise StaleAttempt(f"attempt {body['attempt']} is not the current attempt "
                               f"({job.attempt}) of job {job_id}", field="attempt")
        node_of = self.node_of(job_id, job.attempt)
        entries: list[Beat] = []
        for i, r in enumerate(body["ranks"]):
            rank = r["rank"]
            if rank >= job.spec.ranks:
                raise InvalidArgument(f"rank {rank} is outside 0..{job.spec.ranks - 1}",
                                      field=f"ranks.{i}.rank")
            if principal.name != "*" and node_of.get(rank) != principal.name:
                raise Forbidden(f"rank {rank} is not placed on node {principal.name}",
                                field=f"ranks.{i}.rank")
            entries.append(received(r, node_id=node_of.get(rank, ""), now=now,
                                    sent_at=self._sent_at(r, i)))
        self.beats.record(job_id, job.attempt, entries, now, node_of)
        self.collector.mark_ingest(now)
        self.telemetry.count("HeartbeatsIngested", len(body["ranks"]))
        return now

    def _current(self, job_id: str, attempt: int) -> Job | None:
        """The job the beats are for. Read eventually consistent first (half
        the units, on every POST): beats a read a second stale accepts for
        an attempt that just ended are stored and never read. A refusal is
        decided on a strongly consistent read (its 409 stops the ranks)."""
        job = self.store.get(job_id, consistent=False)
        if job is None or job.state.terminal or job.attempt != attempt or \
                job.state not in PLACED:
            job = self.store.get(job_id)
        return job

    @staticmethod
    def _sent_at(r: dict, i: int) -> datetime | None:
        if "sent_at" not in r:
            return None
        try:
            return parse_iso(r["sent_at"])
        except (ValueError, TypeError):
            raise InvalidArgument("sent_at must be an RFC 3339 time",
                                  field=f"ranks.{i}.sent_at") from None

    def attempt_beats(self, job: Job, now: datetime) -> tuple[list[Beat], datetime, bool] | None:
        """The current attempt's beats, ranks recorded as exited or stopped
        marked so (read fresh: they change while the attempt runs), when the
        attempt started, and whether a rank of it exited 0 (it is finishing)."""
        if job.attempt == 0:
            return None
        a = self.store.attempt(job.job_id, job.attempt)
        if a is None:
            return None
        node_of = self._placed(a)
        ended = {**{r: "stopped" for r in a.stopped}, **{r: "exited" for r in a.exited}}
        beats = [replace(b, ended=ended[b.rank]) if b.rank in ended else b
                 for b in self.beats.read(job.job_id, job.attempt, node_of)]
        finishing = any(code == 0 for code in a.exit_codes.values())
        return beats, attempt_start(job, a.created_at, now), finishing

    def verdict(self, job: Job, now: datetime) -> Verdict | None:
        """The judgement of the current attempt's ranks (pure: domain.stall.judge).
        Only a RUNNING job is judged; any other is shown as it is (mode off)."""
        read = self.attempt_beats(job, now)
        if read is None:
            return None
        beats, started, finishing = read
        hb = job.spec.heartbeat
        return judge(beats, now=now, started_at=started, threshold_s=job.health["threshold_s"],
                     band_floor_s=incident_band(job.health),
                     startup_grace_s=hb.startup_grace_s, interval_s=hb.interval_s,
                     mode=hb.mode if job.state is JobState.RUNNING else "off",
                     max_busy_s=hb.max_busy_s, idle_s=hb.idle_s, finishing=finishing)

    def ranks_page(self, job: Job, *, page_size: int | None = None,
                   page_token: str | None = None) -> dict:
        """The ranks view, a page at a time: a page holds the ranks ``[from,
        from + page_size)`` of the current attempt (every rank by default), in
        the view's order (silent longest first), cut by size so the response
        stays inside Lambda's limit. ``next_page_token`` resumes at the first
        rank not sent; ranks are fixed for an attempt, so pages neither skip
        nor repeat a rank, and a token is bound to the job and its attempt."""
        world = job.spec.ranks
        if page_size is not None and not 1 <= page_size <= MAX_RANKS_PAGE:
            raise InvalidArgument(f"page_size must be an integer from 1 to {MAX_RANKS_PAGE}",
                                  field="page_size")
        bound = f"ranks={job.job_id}#{job.attempt}"
        first = 0
        if page_token is not None:
            key = cursor.decode(page_token, tenant=job.tenant, filter_key=bound,
                                secret=self._token_key)
            first = int(key) if key.isdigit() else world
        last = min(world, first + (page_size or world))
        out = self.ranks(job)
        wanted = [r for r in out["ranks"] if first <= r["rank"] < last]
        in_rank_order = sorted(wanted, key=lambda r: r["rank"])
        fits = limits.fit(in_rank_order, limits.proxy_bytes)
        if fits < len(in_rank_order):
            last = in_rank_order[fits]["rank"]
            wanted = [r for r in wanted if r["rank"] < last]
        out["ranks"] = wanted
        out["next_page_token"] = None if last >= world or job.attempt == 0 else \
            cursor.encode(str(last), tenant=job.tenant, filter_key=bound, secret=self._token_key)
        return out

    def ranks(self, job: Job) -> dict:
        """Every rank of the current attempt, silent longest first."""
        now = self._clock()
        hb = job.spec.heartbeat
        threshold = job.health.get("threshold_s")
        out: dict[str, Any] = {
            "attempt": job.attempt, "threshold_s": threshold, "now": iso(now), "ranks": [],
            "mode": hb.mode, "judged": job.state is JobState.RUNNING,
            "threshold_inputs": {
                "ranks": job.spec.ranks, "interval_s": hb.interval_s,
                "miss_probability": hb.miss_probability,
                "false_positive_budget_per_hour": hb.false_positive_budget_per_hour,
                "scans_per_hour": self._scans_per_hour,
                "k": None if not threshold else round(threshold / hb.interval_s),
                "startup_grace_s": hb.startup_grace_s}}
        # the scan's answer, the same object as the job's health.verdict: a
        # fresh judgement here could name another rank than every other surface
        out["verdict"] = job.health.get("verdict")
        verdict = self.verdict(job, now)
        if verdict is None:
            return out
        out["instrumented"] = verdict.instrumented
        # scored as the scan scores them: live, un-paused ranks (straggler.py)
        step_times = {r.rank: r.beat.step_time_s for r in verdict.ranks
                      if r.beat is not None and straggler.counts(r.status, r.paused)}
        scores = straggler.scores(step_times)
        slow = job.health.get("slow")
        for r in verdict.ranks:
            b = r.beat
            row = {"rank": r.rank, "node_id": r.node_id,
                   "last_heard_at": r.last_heard_at and iso(r.last_heard_at),
                   "silence_s": round(r.silence_s, 3), "step": r.step, "stalled": r.stalled,
                   "paused": r.paused, "status": r.status,
                   "beat_at": r.beat_at and iso(r.beat_at), "proc": None, "collective": None,
                   "step_time_s": None if b is None else b.step_time_s,
                   "slow_score": scores.get(r.rank),
                   "slow_text": straggler.slow_text(slow, r.rank)}
            if b is not None and b.sampled_at is not None:
                row["proc"] = {**(b.proc or {}), "sampled_at": iso(b.sampled_at),
                               "io_at": b.io_at and iso(b.io_at),
                               "active_at": b.active_at and iso(b.active_at)}
            if b is not None and b.arrived_seq is not None:
                row["collective"] = {"seq": b.arrived_seq, "name": b.arrived_name}
            out["ranks"].append(row)
        return out


def not_placed_here(principal: Principal, job_id: str, attempt: int) -> ApiError:
    """The one answer an agent gets for a job, or attempt, it holds no rank of,
    whether or not that job exists."""
    who = "any node" if principal.name == "*" else f"node {principal.name}"
    return Forbidden(f"no rank of job {job_id} attempt {attempt} is placed on {who}",
                     field="job_id")


def attempt_start(job: Job, created_at: datetime | None, now: datetime) -> datetime:
    """When the current attempt began: its STARTED, else its placement (the
    job's ``started_at`` may belong to an earlier attempt)."""
    starts = [t for t in (job.started_at, created_at) if t is not None]
    return max(starts) if starts else now
