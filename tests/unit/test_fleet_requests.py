"""The fleet summaries' requests (chalicelib/adapters/fleet.py), as built by
dynamo.Table(FleetModel): what each update says, without DynamoDB."""
from __future__ import annotations

from chalicelib.adapters.fleet import (
    fleet_from_item,
    fleet_update,
    room_update,
    swept_update,
)
from chalicelib.domain.clock import parse_iso
from chalicelib.domain.fleet import ALL_TYPES, Fleet, room_types

AT = "2026-01-02T03:04:05.006Z"


def test_an_update_names_each_section_once_whatever_it_moves():
    """DynamoDB refuses an expression with two SET (or ADD) sections."""
    request = fleet_update("h100", gpus=8, room_at=AT, changed_at=AT)
    expression = request["UpdateExpression"]
    assert expression.count("SET") == 1 and expression.count("ADD") == 1
    assert expression == ("SET #room_at = :room_at, #changed_at = :changed_at "
                          "ADD #gpus :gpus, #room_version :room_version, #generation :generation")
    assert request["Key"] == {"gpu_type": {"S": "h100"}}
    assert request["ExpressionAttributeValues"] == {
        ":gpus": {"N": "8"}, ":room_version": {"N": "1"}, ":generation": {"N": "1"},
        ":room_at": {"S": AT}, ":changed_at": {"S": AT}}
    assert "ConditionExpression" not in request, "the totals move unconditionally"


def test_a_release_only_moves_the_room_version_and_its_time():
    request = room_update("h100", AT)
    assert request["UpdateExpression"] == \
        "SET #room_at = :room_at ADD #room_version :room_version"
    assert set(request["ExpressionAttributeNames"]) == {"#room_at", "#room_version"}


def test_a_largest_node_is_recorded_only_over_a_smaller_one():
    request = fleet_update(ALL_TYPES, largest_node=8, changed_at=AT)
    assert request["ConditionExpression"] == \
        "attribute_not_exists(#largest_node) OR #largest_node < :largest_node"
    assert request["ExpressionAttributeValues"][":largest_node"] == {"N": "8"}
    assert "#largest_node = :largest_node" in request["UpdateExpression"]


def test_a_sweep_is_recorded_on_the_generation_it_read():
    request = swept_update(Fleet("h100", generation=3))
    assert request["UpdateExpression"] == "SET #swept_generation = :generation"
    assert request["ConditionExpression"] == "#generation = :generation"
    assert request["ExpressionAttributeValues"] == {":generation": {"N": "3"}}


def test_a_summary_item_reads_as_the_domain_fleet_and_absent_counts_are_zero():
    assert fleet_from_item({"gpu_type": {"S": "h100"}}) == Fleet("h100")
    item = {"gpu_type": {"S": "h100"}, "gpus": {"N": "12"}, "largest_node": {"N": "8"},
            "generation": {"N": "4"}, "changed_at": {"S": AT},
            "room_version": {"N": "2"}, "room_at": {"S": AT}}
    assert fleet_from_item(item) == Fleet("h100", 12, 8, 4, 0, parse_iso(AT), 2, parse_iso(AT))


def test_room_on_a_node_concerns_its_type_and_every_type():
    assert room_types("h100") == ["h100", ALL_TYPES]
    assert room_types(None) == room_types(ALL_TYPES) == [ALL_TYPES]
