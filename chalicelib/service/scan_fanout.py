"""The stall scan, fanned out when one invocation would judge too many ranks.

Judging costs ``RANK_COST_S`` per running rank (client CPU measured by
bench/scan_rank_cost.py, plus the heartbeat reads' latency).
When the running ranks would take more than ``SHARD_FRACTION`` of the scan
period, the scheduled scan judges nothing itself: it packs the RUNNING jobs
into shards of at most ``shard_ranks`` ranks (30,769 at a 60-s period; a
larger job alone) and sends one message per shard to the scan queue;
``app.scan_shard`` judges each shard in an invocation of its own (batch size
1), with the same per-job judgement ``Scanner.scan_job``. So 100,000 ranks
are judged by 4 parallel invocations of at most ~2 s of per-rank work each,
and a slow job delays only the few jobs of its shard. The per-job part (an
attempt read, its CPU, the reads' round trips) is not in the sizing;
``MAX_JOBS_PER_SHARD`` bounds it. A shard that fails is retried by
SQS (``batchItemFailures``); one older than a period is dropped, as the next
scan has judged those jobs again.

Thin on purpose: what to judge and how stays in scan.py and domain/stall.py.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Callable, Protocol

from ..domain.clock import Clock, iso, parse_iso, utcnow
from ..domain.jobs import Job
from ..domain.states import JobState
from .ports import JobReads

log = logging.getLogger(__name__)

#: seconds to judge one running rank in a scan function: the client CPU that
#: bench/scan_rank_cost.py measures (the slope of Scanner.scan_job between a
#: 64- and a 1,024-rank job, moto's CPU taken out), rounded up, on one full
#: vCPU, which the scan functions get at 1,769 MB (.chalice/config.json;
#: Lambda's CPU share grows with memory); plus the rank's share of the
#: DynamoDB latency of one strongly consistent Query per 512 ranks (~128 KB
#: of heartbeat items), an estimate until CloudWatch measures it. The figures
#: and their runs are in docs/benchmarks.md, "Stall scan: client CPU per
#: judged rank". The heartbeat read has since got cheaper (no model
#: instances); the value is kept until re-measured, as an overestimate only
#: ever makes more shards, not fewer.
RANK_COST_S = 65e-6
#: of the scan period, what one invocation may spend judging (2 s of 60 s)
SHARD_FRACTION = 1 / 30
#: job ids per message, well inside SQS's 256 KiB
MAX_JOBS_PER_SHARD = 1000


class ScanQueue(Protocol):
    def send(self, bodies: list[str]) -> None: ...


def ranks_of(job: Job) -> int:
    return job.spec.ranks


def pack(jobs: list[Job], shard_ranks: int) -> list[list[Job]]:
    """Jobs in shards of at most ``shard_ranks`` ranks (a larger job alone),
    largest first so the big ones start first."""
    shards: list[list[Job]] = []
    current: list[Job] = []
    size = 0
    for job in sorted(jobs, key=ranks_of, reverse=True):
        n = ranks_of(job)
        if current and (size + n > shard_ranks or len(current) >= MAX_JOBS_PER_SHARD):
            shards.append(current)
            current, size = [], 0
        current.append(job)
        size += n
    if current:
        shards.append(current)
    return shards


class ScanFanout:
    def __init__(self, queue: ScanQueue, store: JobReads, *, period_s: float,
                 rank_cost_s: float = RANK_COST_S, fraction: float = SHARD_FRACTION,
                 clock: Clock = utcnow) -> None:
        self.queue, self.store, self._period_s, self._clock = queue, store, period_s, clock
        self.shard_ranks = max(1, int(fraction * period_s / rank_cost_s))

    def send(self, jobs: list[Job], now: datetime, why: str | None) -> int:
        """Fan the jobs out if judging them here would take too long; returns
        the number of shards sent (0: judge them here)."""
        if sum(ranks_of(j) for j in jobs) <= self.shard_ranks:
            return 0
        shards = pack(jobs, self.shard_ranks)
        self.queue.send([json.dumps({"type": "SCAN", "scan_at": iso(now), "suppressed": why,
                                     "jobs": [[j.job_id, j.attempt] for j in shard]})
                         for shard in shards])
        return len(shards)

    def judge(self, body: str, scan_job: Callable[[Job, datetime, str | None], int]) -> int:
        """Judge one shard message's jobs; raises on a malformed message or a
        failed judgement (the message is then retried, then dead-lettered)."""
        message = json.loads(body)
        if message.get("type") != "SCAN" or not isinstance(message.get("jobs"), list):
            raise ValueError("not a scan shard")
        now = self._clock()
        if (now - parse_iso(message["scan_at"])).total_seconds() > self._period_s:
            log.info("scan shard of %s dropped: a later scan judges its jobs",
                     message["scan_at"])
            return 0
        stalled = 0
        for job_id, attempt in message["jobs"]:
            job = self.store.get(job_id)
            if job is None or job.state is not JobState.RUNNING or job.attempt != attempt:
                continue  # finished or moved on since the scan listed it
            stalled += scan_job(job, now, message.get("suppressed"))
        return stalled
