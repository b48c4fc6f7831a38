"""Every port of the job's tables as one object over one sender and one clock.

Each concern has its own adapter (jobs, pipelines, attempts, outbox, the
transitions across them), each on OnDynamo alone (adapters/jobs_table.py:
the sender, the clock, the reads they share), none built on another; the
services (service/*: each asks for the parts of the ports it calls) are
handed this one object, which is those adapters side by side, by bootstrap.
"""
from __future__ import annotations

from .attempt_store import DynamoAttempts
from .job_store import DynamoJobs
from .outbox_store import DynamoOutbox
from .pipeline_store import DynamoPipelines
from .transitions import DynamoTransitions


class DynamoStore(DynamoJobs, DynamoPipelines, DynamoAttempts, DynamoOutbox,
                  DynamoTransitions):
    """service.ports.JobTables on DynamoDB: ``DynamoStore(Dynamo(connection),
    clock)``."""
