"""Every port of the job's tables as one object over one sender and one clock.

Each concern has its own adapter (jobs, attempts, outbox, the transitions
across them); the services that need several (service/*: each asks for the
narrowest union of ports it calls) are handed this one object, which is
those adapters together, by bootstrap.
"""
from __future__ import annotations

from .attempt_store import DynamoAttempts
from .outbox_store import DynamoOutbox
from .pipeline_store import DynamoPipelines
from .transitions import DynamoTransitions


class DynamoStore(DynamoPipelines, DynamoAttempts, DynamoOutbox, DynamoTransitions):
    """service.ports.JobTables on DynamoDB: ``DynamoStore(Dynamo(connection),
    clock)``."""
