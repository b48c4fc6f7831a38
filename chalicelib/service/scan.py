"""The stall scan (scheduled): every RUNNING job, judged on the collector's clock.

Reads O(running ranks): the RUNNING jobs from a sparse index, each attempt's
heartbeat shards; nothing about finished jobs or old beats. Writes only when a
job's health changes. An incident is recorded once, by a conditional write on
the incident key read before it; a culprit that beats again turns it into a
counted false alarm, told by a ``recovered`` event (domain/events.py).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from ..domain import deadlines, events as ev, health, straggler
from ..domain.clock import Clock, iso, plus, utcnow
from ..domain.errors import RecordTooLarge
from ..domain.jobs import Job
from ..domain.stall import Verdict, suppression
from ..domain.states import JobState
from .attempts import AttemptsService
from .heartbeats import HeartbeatsService
from .ports import CollectorStore, JobQueue, JobWrites, Telemetry

log = logging.getLogger(__name__)
MAX_JOBS_PER_SCAN = 5000


class ScannerPorts(JobQueue, JobWrites, Protocol):
    """What the scan calls: the running jobs, and their health written."""


class Scanner:
    def __init__(self, store: ScannerPorts, heartbeats: HeartbeatsService,
                 collector: CollectorStore, attempts: AttemptsService, *, period_s: float,
                 telemetry: Telemetry, clock: Clock = utcnow, fanout=None) -> None:
        self.store, self.heartbeats, self.collector = store, heartbeats, collector
        #: scan_fanout.ScanFanout: too many ranks for one invocation go out in shards
        self.fanout = fanout
        self.telemetry = telemetry
        self.attempts, self._period_s, self._clock = attempts, period_s, clock
        #: how long convictions stay held after the collector was blind
        self._hold_s = 2 * period_s + 10.0

    def run(self) -> dict:
        now = self._clock()
        previous, hold_until, hold_reason = self.collector.previous_scan()
        if previous is not None:
            self.telemetry.seconds("ScanLagSeconds",
                                              (now - previous).total_seconds())
        why = suppression(now=now, previous_scan_at=previous, period_s=self._period_s,
                          latest_ingest_at=self.collector.latest_ingest(),
                          window_s=max(3 * self._period_s, 30.0))
        if why:
            # beats that queued up during the blind spell keep arriving for a
            # while: hold convictions until that backlog has drained
            hold_until, hold_reason = plus(now, self._hold_s), why
        elif hold_until is not None and now < hold_until:
            why = f"recovering until {iso(hold_until)} from: {hold_reason}"
        else:
            hold_until = hold_reason = None
        jobs = stalled = 0
        running = self.store.active(JobState.RUNNING, MAX_JOBS_PER_SCAN)
        shards = self.fanout.send(running, now, why) if self.fanout else 0
        if not shards:
            for job in running:
                jobs += 1
                stalled += self.scan_job(job, now, why)
        # stamped when this scan ends: the next one measures the time nobody
        # scanned, so a scan that overran its period on a busy machine is
        # not taken for a paused collector (a scan that fails records nothing,
        # and the next one, later still, holds convictions)
        self.collector.record_scan(self._clock(), hold_until, hold_reason)
        if shards:
            return {"jobs": len(running), "incidents": 0, "suppressed": why, "shards": shards}
        if why and jobs:
            log.warning("stall scan convicts nobody this time: %s", why)
        return {"jobs": jobs, "incidents": stalled, "suppressed": why}

    def scan_job(self, job: Job, now: datetime, why: str | None = None) -> int:
        """Judge one RUNNING job (callable on its own: a per-job fan-out)."""
        if deadlines.past_runtime_backstop(job.spec, job.started_at, now):
            # its agents did not end it (cut off, or not enforcing the limit)
            log.warning("job %s attempt %d: past its max_runtime_s by more than %ss: "
                        "ending it here", job.job_id, job.attempt, deadlines.BACKSTOP_S)
            self.attempts.time_out(job)
            return 0
        verdict = self.heartbeats.verdict(job, now)
        if verdict is None:
            return 0
        judged = health.judged(job.health, verdict, why)
        judged, told = self._stragglers(job, judged, verdict, now, why)
        if judged.get("status") == "STALLED" and self._current(job):
            return self._follow(job, judged, verdict, told)
        if verdict.first is not None and not why:
            return self._convict(job, health.convicted(judged, verdict, now), verdict, told)
        self._save(job, health.watched(judged, verdict), told)
        return 0

    def _stragglers(self, job: Job, judged: dict, verdict: Verdict, now: datetime,
                    why: str | None) -> tuple[dict, list[tuple[str, dict]]]:
        """``judged`` with this scan's straggler rule applied (domain/straggler.py),
        and the ``rank_slow`` events of the episodes it opens: written in
        the same conditional write as the health that opens them."""
        samples = [straggler.Sample(r.rank, r.node_id,
                                    None if r.beat is None else r.beat.step_time_s,
                                    counts=straggler.counts(r.status, r.paused))
                   for r in verdict.ranks]
        slow = straggler.judge(judged.get("slow"), samples, now=now, attempt=job.attempt,
                               threshold=job.spec.heartbeat.slow_score, suppressed=bool(why))
        told = []
        for e in slow.opened:
            log.warning("job %s attempt %d: %s", job.job_id, job.attempt, e.text)
            self.telemetry.count("StragglersDetected")
            told.append((e.key, ev.event("rank_slow", now, attempt=job.attempt, reason=e.text,
                                         rank=e.rank, node_id=e.node_id, score=e.score,
                                         step_time_s=e.step_time_s, fastest_s=e.fastest_s,
                                         episode=e.episode)))
        return {**judged, "slow": slow.state, "slow_ranks": slow.slow_ranks}, told

    def _current(self, job: Job) -> bool:
        return job.incident_key is not None and job.incident_key.startswith(f"{job.attempt}#")

    def _convict(self, job: Job, convicted: dict, verdict: Verdict,
                 told: list[tuple[str, dict]] | None = None) -> int:
        first = verdict.first
        if first is None:  # the caller convicts only a culprit
            return 0
        key = job.incident_key
        n = int(key.split("#")[1]) + 1 if key is not None and self._current(job) else 1
        if not self._record(job, convicted, incident_key=f"{job.attempt}#{n}", told=told):
            return 0  # another scan recorded it, or the job moved on
        self.telemetry.count("StallsDetected")
        log.warning("job %s attempt %d: %s", job.job_id, job.attempt,
                    (convicted.get("verdict") or {}).get("text"))
        if job.spec.on_stall == "restart":
            # the job as just recorded: ending the attempt freezes this health
            self.attempts.abandon(replace(job, health=convicted,
                                          incident_key=f"{job.attempt}#{n}"),
                                  {"reason": "stalled", "exit_code": None,
                                   "rank": (convicted.get("verdict") or {}).get("rank")})
        return 1

    def _follow(self, job: Job, judged: dict, verdict: Verdict,
                told: list[tuple[str, dict]] | None = None) -> int:
        """An open incident: keep its culprit; if the culprit beats again, it
        was a false alarm, counted, and the job is healthy again."""
        if health.culprit_beat_again(judged, verdict):
            log.warning("job %s: rank %s beat again after its stall: a false alarm",
                        job.job_id, judged.get("first_stalled_rank"))
            # the incident is over: its end is an event of the job's story,
            # written with the health that says so (domain/events.recovered)
            self._record(job, health.followed(judged, verdict), recovered=True, told=told)
            return 0
        self._save(job, health.followed(judged, verdict), told)
        return 0

    def _save(self, job: Job, new: dict, told: list[tuple[str, dict]] | None = None) -> None:
        if new != job.health or told:
            self._record(job, new, told=told)

    def _record(self, job: Job, new: dict, incident_key: str | None = None,
                recovered: bool = False, told: list[tuple[str, dict]] | None = None) -> bool:
        """Store ``new``; a record too big for the store is never a silent
        failure: it is said, and the health kept compact (its verdict's
        sentence, counts), still recording the incident (or its recovery)."""
        try:
            return self.store.record_health(job, new, incident_key=incident_key,
                                            recovered=recovered, events=told or ())
        except RecordTooLarge as e:
            log.error("job %s: its health does not fit its record (%s): recording it "
                      "without rank lists and stacks", job.job_id, e)
            self.telemetry.count("HealthCompacted")
        try:
            return self.store.record_health(job, health.compacted(new),
                                            incident_key=incident_key, recovered=recovered,
                                            events=told or ())
        except RecordTooLarge as e:
            log.error("job %s: not even its compact health fits its record (%s)",
                      job.job_id, e)
            return False
