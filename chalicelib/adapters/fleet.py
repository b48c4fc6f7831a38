"""The fleet's capacity summaries (one FleetModel item per GPU type, and "*"
for every type), read and written through dynamo.Table(FleetModel): the
requests the node store sends, and the room update the attempt store's
releases put in their transactions."""
from __future__ import annotations

from ..domain.clock import parse_iso
from ..domain.fleet import ALL_TYPES, Fleet, room_types
from .dynamo import Changes, Table
from .models import FleetModel

__all__ = ["ALL_TYPES", "FLEET", "fleet_from_item", "fleet_update", "room_types",
           "room_update", "swept_update"]

FLEET = Table(FleetModel)


def fleet_from_item(item: dict) -> Fleet:
    """The fleet of a raw summary item (an unwritten one is ``Fleet(key)``)."""
    v = FLEET.values(item)
    return Fleet(v["gpu_type"], int(v["gpus"] or 0), int(v["largest_node"] or 0),
                 int(v["generation"] or 0), int(v["swept_generation"] or 0),
                 parse_iso(v["changed_at"]) if v["changed_at"] else None,
                 int(v["room_version"] or 0), parse_iso(v["room_at"]) if v["room_at"] else None)


def fleet_update(gpu_type: str, *, gpus: int = 0, room_at: str | None = None,
                 changed_at: str | None = None, largest_node: int | None = None) -> dict:
    """The UpdateItem of ``gpu_type``'s summary: ``gpus`` more GPUs registered;
    with ``room_at``, room may have appeared then (room_version moves on);
    with ``changed_at``, its registered GPUs or largest node changed then
    (generation moves on); with ``largest_node``, that is its largest node,
    on condition that it is larger than the one recorded."""
    changes = Changes(FLEET)
    if gpus:
        changes.add("gpus", gpus)
    if room_at is not None:
        changes.add("room_version", 1).set("room_at", room_at)
    if changed_at is not None:
        changes.add("generation", 1).set("changed_at", changed_at)
    condition = None
    if largest_node is not None:
        changes.set("largest_node", largest_node)
        condition = "attribute_not_exists(#largest_node) OR #largest_node < :largest_node"
    return changes.update(FLEET.key(gpu_type), condition=condition)


def room_update(gpu_type: str, now: str) -> dict:
    """The update recording that room may have appeared for ``gpu_type`` at
    ``now`` (a release, a node): one per ``room_types`` of the node's type."""
    return fleet_update(gpu_type, room_at=now)


def swept_update(fleet: Fleet) -> dict:
    """Record ``fleet``'s generation as swept, on condition it is still that
    generation (an unwritten summary has none: nothing is written)."""
    return FLEET.update(FLEET.key(fleet.key), "SET #swept_generation = :generation",
                        condition="#generation = :generation",
                        values={":generation": FLEET.value("generation", fleet.generation)})
