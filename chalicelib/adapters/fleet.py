"""The fleet's capacity summaries (one FleetModel item per GPU type, and "*"
for every type), read and written through dynamo.Table(FleetModel): the
requests the node store sends, and the room bump the job store's releases
put in their transactions."""
from __future__ import annotations

from typing import Sequence

from pynamodb.expressions.update import Action

from ..domain.clock import parse_iso
from ..domain.fleet import ALL_TYPES, Fleet, room_types
from .dynamo import Table
from .models import FleetModel

__all__ = ["ALL_TYPES", "FLEET", "fleet_from_item", "fleet_update", "room_bump",
           "room_types", "room_update", "swept_update"]

FLEET = Table(FleetModel)
_ONE = {"N": "1"}


def fleet_from_item(item: dict) -> Fleet:
    """The fleet of a raw summary item (an unwritten one is ``Fleet(key)``)."""
    v = FLEET.values(item)
    return Fleet(v["gpu_type"], int(v["gpus"] or 0), int(v["largest_node"] or 0),
                 int(v["generation"] or 0), int(v["swept_generation"] or 0),
                 parse_iso(v["changed_at"]) if v["changed_at"] else None,
                 int(v["room_version"] or 0), parse_iso(v["room_at"]) if v["room_at"] else None)


def update_expression(sets: Sequence[str], adds: Sequence[str] = (),
                      removes: Sequence[str] = ()) -> str:
    """An UpdateExpression of these clauses (each section once, as DynamoDB asks)."""
    sections = [("SET", sets), ("ADD", adds), ("REMOVE", removes)]
    return " ".join(f"{word} {', '.join(clauses)}" for word, clauses in sections if clauses)


def fleet_update(gpu_type: str, *, gpus: int = 0, room_at: str | None = None,
                 changed_at: str | None = None, largest_node: int | None = None) -> dict:
    """The UpdateItem of ``gpu_type``'s summary: ``gpus`` more GPUs registered;
    with ``room_at``, room may have appeared then (room_version moves on);
    with ``changed_at``, its registered GPUs or largest node changed then
    (generation moves on); with ``largest_node``, that is its largest node,
    on condition that it is larger than the one recorded."""
    sets: list[str] = []
    adds: list[str] = []
    values: dict[str, dict] = {}
    condition = None
    if gpus:
        adds.append("#gpus :gpus")
        values[":gpus"] = FLEET.value("gpus", gpus)
    if room_at is not None:
        adds.append("#room_version :one")
        sets.append("#room_at = :room_at")
        values.update({":one": _ONE, ":room_at": FLEET.value("room_at", room_at)})
    if changed_at is not None:
        adds.append("#generation :one")
        sets.append("#changed_at = :changed_at")
        values.update({":one": _ONE, ":changed_at": FLEET.value("changed_at", changed_at)})
    if largest_node is not None:
        sets.append("#largest_node = :largest")
        values[":largest"] = FLEET.value("largest_node", largest_node)
        condition = "attribute_not_exists(#largest_node) OR #largest_node < :largest"
    return FLEET.update(FLEET.key(gpu_type), update_expression(sets, adds),
                        condition=condition, values=values)


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


def room_bump(now: str) -> list[Action]:
    """``room_update`` as PynamoDB actions, for job_store's release only until
    it sends through dynamo.Dynamo (then this goes)."""
    return [FleetModel.room_version.add(1), FleetModel.room_at.set(now)]
