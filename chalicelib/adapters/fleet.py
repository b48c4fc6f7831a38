"""The fleet's capacity summaries (one FleetModel item per GPU type, and "*"
for every type): what the node store and the job store's releases both bump."""
from __future__ import annotations

from pynamodb.expressions.update import Action

from .models import FleetModel

ALL_TYPES = "*"


def room_types(gpu_type: str | None) -> list[str]:
    """The summaries that room on a node of ``gpu_type`` concerns."""
    return [gpu_type, ALL_TYPES] if gpu_type and gpu_type != ALL_TYPES else [ALL_TYPES]


def room_bump(now: str) -> list[Action]:
    """Update actions recording that room may have appeared (a release, a node)."""
    return [FleetModel.room_version.add(1), FleetModel.room_at.set(now)]
