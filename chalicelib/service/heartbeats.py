"""Heartbeat ingest and the ranks view.

Every rank is stamped with this function's receive time; the sender's
``sent_at`` is kept beside it for diagnosis only. A declared pause arrives as a
duration and becomes a bound on the collector's clock, so no sender clock ever
decides liveness.
"""
from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

from ..domain import cursor, limits
from ..domain.clock import Clock, iso, parse_iso, plus, utcnow
from ..domain.errors import AlreadyFinished, Forbidden, InvalidArgument, NotFound, StaleAttempt
from ..domain.ids import is_job_id
from ..domain.jobs import Job
from ..domain.principal import Principal
from ..domain.stall import view
from ..domain.states import PLACED
from .ports import CollectorStore, HeartbeatStore, JobStore, Telemetry

_PLACEMENTS_CACHED = 1024
#: ranks one page of the ranks view may ask for (the largest world size)
MAX_RANKS_PAGE = 65536


class HeartbeatsService:
    def __init__(self, store: JobStore, beats: HeartbeatStore, collector: CollectorStore, *,
                 scans_per_hour: float, telemetry: Telemetry, clock: Clock = utcnow,
                 page_token_key: bytes = b"") -> None:
        self.store, self.beats, self.collector = store, beats, collector
        self._token_key = page_token_key
        self.telemetry = telemetry
        self._scans_per_hour, self._clock = scans_per_hour, clock
        # an attempt's placement never changes: remember it, read it once
        self._placements: OrderedDict[tuple[str, int], tuple[dict[int, str], datetime | None]] \
            = OrderedDict()

    def placement(self, job_id: str, attempt: int) -> tuple[dict[int, str], datetime | None]:
        """(rank -> node, the attempt's creation time): fixed for an attempt."""
        key = (job_id, attempt)
        if key in self._placements:
            self._placements.move_to_end(key)
            return self._placements[key]
        a = self.store.attempt(job_id, attempt)
        if a is None:
            return {}, None
        value = ({r: n for n, rs in a.node_ranks.items() for r in rs}, a.created_at)
        self._placements[key] = value
        if len(self._placements) > _PLACEMENTS_CACHED:
            self._placements.popitem(last=False)
        return value

    def node_of(self, job_id: str, attempt: int) -> dict[int, str]:
        return self.placement(job_id, attempt)[0]

    def ingest(self, principal: Principal, job_id: str, body: dict) -> datetime:
        now = self._clock()
        if principal.kind != "agent":
            raise Forbidden("heartbeats take an agent token", field="Authorization")
        job = self.store.get(job_id) if is_job_id(job_id) else None
        if job is None:
            raise NotFound(f"job {job_id} not found", field="job_id")
        if job.state.terminal:
            raise AlreadyFinished(f"job {job_id} already {job.state.value}", field="job_id")
        if body["attempt"] != job.attempt or job.state not in PLACED:
            # a PENDING job's attempt number is its last, ended attempt
            raise StaleAttempt(f"attempt {body['attempt']} is not the current attempt "
                               f"({job.attempt}) of job {job_id}", field="attempt")
        node_of = self.node_of(job_id, job.attempt)
        beats, pauses = [], []
        for i, r in enumerate(body["ranks"]):
            rank = r["rank"]
            if rank >= job.spec["ranks"]:
                raise InvalidArgument(f"rank {rank} is outside 0..{job.spec['ranks'] - 1}",
                                      field=f"ranks.{i}.rank")
            if principal.name != "*" and node_of.get(rank) != principal.name:
                raise Forbidden(f"rank {rank} is not placed on node {principal.name}",
                                field=f"ranks.{i}.rank")
            beat = {"rank": rank, "step": r.get("step"), "sent_at": self._sent_at(r, i)}
            if "age_s" in r:  # a duration on the agent's clock: the ordering hint
                beat["beat_at"] = plus(now, -r["age_s"])
            if "pause" in r:
                beat["paused_until"] = plus(now, r["pause"]["remaining_s"])
                beat["pause_reason"] = r["pause"].get("reason", "paused")
            # an entry with only a pause declares it without being a beat
            (pauses if "pause" in r and "step" not in r else beats).append(beat)
        if beats:
            self.beats.write(job_id, job.attempt, beats, node_of, now)
        for p in pauses:  # a pause is not a beat: the last beat's time stands
            self.beats.pause(job_id, job.attempt, p["rank"], node_of.get(p["rank"], ""),
                             p["paused_until"], p["pause_reason"], now)
        self.collector.mark_ingest(now)
        self.telemetry.count("HeartbeatsIngested", len(body["ranks"]))
        return now

    @staticmethod
    def _sent_at(r: dict, i: int) -> datetime | None:
        if "sent_at" not in r:
            return None
        try:
            return parse_iso(r["sent_at"])
        except (ValueError, TypeError):
            raise InvalidArgument("sent_at must be an RFC 3339 time",
                                  field=f"ranks.{i}.sent_at") from None

    def ranks_page(self, job: Job, *, page_size: int | None = None,
                   page_token: str | None = None) -> dict:
        """The ranks view, a page at a time: a page holds the ranks ``[from,
        from + page_size)`` of the current attempt (every rank by default), in
        the view's order (silent longest first), cut by size so the response
        stays inside Lambda's limit. ``next_page_token`` resumes at the first
        rank not sent; ranks are fixed for an attempt, so pages neither skip
        nor repeat a rank, and a token is bound to the job and its attempt."""
        world = int(job.spec["ranks"])
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
        hb = job.spec["heartbeat"]
        threshold = job.health.get("threshold_s")
        out = {"attempt": job.attempt, "threshold_s": threshold, "now": iso(now), "ranks": [],
               "threshold_inputs": {
                   "ranks": job.spec["ranks"], "interval_s": hb["interval_s"],
                   "miss_probability": hb["miss_probability"],
                   "false_positive_budget_per_hour": hb["false_positive_budget_per_hour"],
                   "scans_per_hour": self._scans_per_hour,
                   "k": None if not threshold else round(threshold / hb["interval_s"]),
                   "startup_grace_s": hb["startup_grace_s"]}}
        if job.attempt == 0:
            return out
        node_of, created_at = self.placement(job.job_id, job.attempt)
        started = attempt_start(job, created_at, now)
        for r in view(self.beats.read(job.job_id, job.attempt, node_of), now=now,
                      started_at=started, threshold_s=threshold,
                      startup_grace_s=hb["startup_grace_s"]):
            out["ranks"].append({
                "rank": r.rank, "node_id": r.node_id,
                "last_heard_at": r.last_heard_at and iso(r.last_heard_at),
                "silence_s": round(r.silence_s, 3), "step": r.step, "stalled": r.stalled,
                "paused": r.paused})
        return out


def attempt_start(job: Job, created_at: datetime | None, now: datetime) -> datetime:
    """When the current attempt began: its STARTED, else its placement (the
    job's ``started_at`` may belong to an earlier attempt)."""
    starts = [t for t in (job.started_at, created_at) if t is not None]
    return max(starts) if starts else now
