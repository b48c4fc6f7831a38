"""Every port of the job's tables as one object over one sender and one clock.

Each concern has its own adapter (jobs, attempts, outbox, the transitions
across them); the services that need several (service/*: each asks for the
narrowest union of ports it calls) are handed this one object, which is
those adapters together, by bootstrap.
"""
from __future__ import annotations

from .attempt_store import DynamoAttempts
from .job_store import DynamoJobs
from .outbox_store import DynamoOutbox
from .transitions import DynamoTransitions


class DynamoStore(DynamoJobs, DynamoAttempts, DynamoOutbox, DynamoTransitions):
    """service.ports.JobTables on DynamoDB: ``DynamoStore(Dynamo(connection),
    clock)``."""
