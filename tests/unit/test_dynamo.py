"""The one request builder (chalicelib/adapters/dynamo.py): what it sends is
what the model says, stored names included."""
from __future__ import annotations

from unittest import mock

import pytest
from botocore.exceptions import ClientError
from pynamodb.attributes import MapAttribute, NumberAttribute, UnicodeAttribute
from pynamodb.models import Model

from chalicelib.adapters.dynamo import Changes, ConditionFailed, Dynamo, Table


class Renamed(Model):
    class Meta:
        table_name = "renamed"

    pk = UnicodeAttribute(hash_key=True, attr_name="p")
    sk = NumberAttribute(range_key=True)
    state = UnicodeAttribute(attr_name="st")
    count = NumberAttribute(null=True)


TABLE = Table(Renamed)


def test_a_placeholder_stands_for_the_stored_name_of_the_attribute():
    """A model that stores an attribute under another name (attr_name) is
    written under that name: the expression text names the attribute."""
    request = TABLE.update(TABLE.key("a", 1), "SET #state = :s ADD #count :one",
                           condition="attribute_exists(#pk)",
                           values={":s": TABLE.value("state", "X"), ":one": {"N": "1"}})
    assert request["Key"] == {"p": {"S": "a"}, "sk": {"N": "1"}}
    assert request["ExpressionAttributeNames"] == {"#state": "st", "#count": "count", "#pk": "p"}
    assert request["TableName"] == "renamed"


def test_a_placeholder_that_is_no_attribute_is_a_map_key_and_stands_for_itself():
    request = TABLE.update(TABLE.key("a", 1), "SET #state.#inner = :v", values={":v": {"S": "1"}})
    assert request["ExpressionAttributeNames"] == {"#state": "st", "#inner": "inner"}


def test_a_new_item_is_put_on_its_hash_key_being_absent_under_its_stored_name():
    request = TABLE.put_new(TABLE.item({"pk": "a", "sk": 2, "state": "S"}), return_old=True)
    assert request["Item"] == {"p": {"S": "a"}, "sk": {"N": "2"}, "st": {"S": "S"}}
    assert request["ConditionExpression"] == "attribute_not_exists(#pk)"
    assert request["ExpressionAttributeNames"] == {"#pk": "p"}
    assert request["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"


def test_a_query_projects_and_pages_by_stored_names():
    request = TABLE.query(None, "#pk = :k", {":k": {"S": "a"}}, attributes=["state"],
                          limit=5, forward=False, consistent=True, start={"p": {"S": "a"}})
    assert request["ProjectionExpression"] == "#state"
    assert request["ExpressionAttributeNames"] == {"#pk": "p", "#state": "st"}
    assert (request["Limit"], request["ScanIndexForward"], request["ConsistentRead"]) == \
        (5, False, True)


def _failed(code: str, item: dict | None = None) -> ClientError:
    response: dict = {"Error": {"Code": code, "Message": "no"}}
    if item is not None:
        response["Item"] = item
    return ClientError(response, "PutItem")


def test_a_false_condition_is_ConditionFailed_with_the_item_there_and_asks_no_capacity():
    connection = mock.Mock()
    connection.dispatch.side_effect = _failed("ConditionalCheckFailedException", {"p": {"S": "a"}})
    with pytest.raises(ConditionFailed) as caught:
        Dynamo(connection).put(TABLE.put_new({"p": {"S": "a"}}, return_old=True))
    assert caught.value.item == {"p": {"S": "a"}}
    (_, request), _ = connection.dispatch.call_args
    assert request["ReturnConsumedCapacity"] == "NONE"


def test_any_other_failure_is_raised_as_it_came():
    connection = mock.Mock()
    connection.dispatch.side_effect = _failed("ProvisionedThroughputExceededException")
    with pytest.raises(ClientError):
        Dynamo(connection).update(TABLE.update(TABLE.key("a", 1), "REMOVE #count"))


def test_a_transaction_is_sent_once_in_dynamodbs_order_only_when_its_block_succeeds():
    connection = mock.Mock()
    connection.transact_write_items.return_value = {}  # DynamoDB's answer to a write
    with Dynamo(connection).transaction() as tx:
        tx.update({"u": 1})
        tx.put({"p": 1})
        tx.check({"c": 1})
        tx.delete({"d": 1})
    kwargs = connection.transact_write_items.call_args.kwargs
    assert (kwargs["condition_check_items"], kwargs["delete_items"], kwargs["put_items"],
            kwargs["update_items"]) == ([{"c": 1}], [{"d": 1}], [{"p": 1}], [{"u": 1}])
    assert len(kwargs["client_request_token"]) == 32
    assert kwargs["return_consumed_capacity"] == "NONE"
    connection.reset_mock()
    with pytest.raises(RuntimeError):
        with Dynamo(connection).transaction() as tx:
            tx.put({"p": 1})
            raise RuntimeError("the caller failed")
    connection.transact_write_items.assert_not_called()


class Storied(Model):
    class Meta:
        table_name = "storied"

    pk = UnicodeAttribute(hash_key=True)
    state = UnicodeAttribute(attr_name="st")
    note = UnicodeAttribute(null=True)
    count = NumberAttribute(null=True)
    events = MapAttribute(default=dict)


STORIED = Table(Storied)


def test_changes_write_each_clause_once_under_stored_names_and_an_event_under_its_own_key():
    """An event's key holds ``#`` (``placed#2``), which no placeholder may: it
    gets a placeholder of its own, and a repeat keeps the first event."""
    changes = Changes(STORIED).set("state", "RUNNING").set("note", None).add("count", 1) \
        .event("placed#2", {"type": "placed"})
    request = changes.update(STORIED.key("a"), condition="#state = :was",
                             values={":was": {"S": "PENDING"}}, return_new=True)
    assert request["UpdateExpression"] == (
        "SET #state = :state, #events.#k0 = if_not_exists(#events.#k0, :k0) "
        "REMOVE #note ADD #count :count")
    assert request["ExpressionAttributeNames"] == {
        "#state": "st", "#events": "events", "#k0": "placed#2", "#note": "note",
        "#count": "count"}
    assert request["ExpressionAttributeValues"] == {
        ":state": {"S": "RUNNING"}, ":count": {"N": "1"},
        ":k0": {"M": {"type": {"S": "placed"}}}, ":was": {"S": "PENDING"}}
    assert request["ReturnValues"] == "ALL_NEW"


def test_a_transactions_items_as_dynamodb_lists_them_go_where_their_kind_says():
    connection = mock.Mock()
    connection.transact_write_items.return_value = {}  # DynamoDB's answer to a write
    with Dynamo(connection).transaction() as tx:
        tx.add([{"Update": {"u": 1}}, {"Put": {"p": 1}}, {"ConditionCheck": {"c": 1}}])
    kwargs = connection.transact_write_items.call_args.kwargs
    assert (kwargs["condition_check_items"], kwargs["put_items"], kwargs["update_items"]) == \
        ([{"c": 1}], [{"p": 1}], [{"u": 1}])


def test_a_lost_condition_reads_the_same_from_the_sender_and_from_botocore():
    from chalicelib.adapters.dynamo_errors import dependency_failure, lost_condition

    assert lost_condition(ConditionFailed())
    assert lost_condition(_failed("ConditionalCheckFailedException"))
    assert not lost_condition(_failed("ProvisionedThroughputExceededException"))
    assert not dependency_failure(ConditionFailed()), "a lost race is an answer, not an outage"


def test_an_empty_answer_is_a_dependency_failure_never_no_item():
    """Invariant: a request PynamoDB answers with nothing (not even {}) raises
    EmptyAnswer, which the edge answers 503: a GetItem's None is not "not
    found", and a transaction's is "applied or not: unknown"."""
    from chalicelib.adapters.dynamo import EmptyAnswer
    from chalicelib.adapters.dynamo_errors import dependency_failure
    connection = mock.Mock()
    connection.dispatch.return_value = None
    with pytest.raises(EmptyAnswer) as raised:
        Dynamo(connection).get({"TableName": "t", "Key": {}})
    assert dependency_failure(raised.value)
    connection.dispatch.return_value = {}
    assert Dynamo(connection).get({"TableName": "t", "Key": {}}) is None  # no item
    connection.transact_write_items.return_value = None
    with pytest.raises(EmptyAnswer), Dynamo(connection).transaction() as tx:
        tx.put({"p": 1})


def test_a_timed_out_transaction_reads_no_code_and_is_a_dependency_failure():
    """Invariant: response_code reads a timeout's cause (whose ``response``
    botocore sets to None) as no code, where PynamoDB's own
    ``cause_response_code`` raises AttributeError; a cancellation with no
    reason, or only None ones, is a dependency failure too."""
    from botocore.exceptions import ReadTimeoutError
    from pynamodb.exceptions import TransactWriteError, VerboseClientError

    from chalicelib.adapters.dynamo_errors import dependency_failure, response_code
    timed_out = TransactWriteError("Failed to write transaction items",
                                   ReadTimeoutError(endpoint_url="http://x"))
    with pytest.raises(AttributeError):
        timed_out.cause_response_code  # noqa: B018 - PynamoDB's reader, the bug
    assert response_code(timed_out) is None and dependency_failure(timed_out)
    for reasons in ([], [None, None]):
        cancelled = VerboseClientError({"Error": {"Code": "TransactionCanceledException"}},
                                       "TransactWriteItems", cancellation_reasons=reasons)
        e = TransactWriteError("cancelled", cancelled)
        assert response_code(e) == "TransactionCanceledException"
        assert dependency_failure(e)
