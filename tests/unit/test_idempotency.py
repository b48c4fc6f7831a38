"""Idempotency keys: canonical comparison, tenant scope, stored-timestamp expiry."""
from datetime import datetime, timedelta, timezone

import pytest

from chalicelib.domain import idempotency
from chalicelib.domain.errors import InvalidArgument

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_key_order_does_not_change_the_body_hash():
    assert idempotency.body_hash({"a": 1, "b": [1, 2]}) == \
        idempotency.body_hash({"b": [1, 2], "a": 1})


def test_a_different_value_changes_the_body_hash():
    assert idempotency.body_hash({"ranks": 2}) != idempotency.body_hash({"ranks": 3})


def test_keys_are_scoped_per_tenant():
    assert idempotency.record_id("acme", "k") != idempotency.record_id("other", "k")


def test_a_record_without_expiry_never_expires():
    assert not idempotency.is_expired(None, T0 + timedelta(days=3650))


def test_a_key_is_kept_24_hours_after_the_job_finished():
    until = idempotency.expires_at(T0)
    assert not idempotency.is_expired(until, T0 + timedelta(hours=23, minutes=59))
    assert idempotency.is_expired(until, T0 + timedelta(hours=24))


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there", "é", "new\nline"])
def test_keys_outside_1_to_255_printable_ascii_are_refused(key):
    with pytest.raises(InvalidArgument) as e:
        idempotency.check_key(key)
    assert e.value.field == "Idempotency-Key"


@pytest.mark.parametrize("key", ["a", "x" * 255, "order 42 / retry ~!"])
def test_printable_ascii_keys_are_accepted(key):
    assert idempotency.check_key(key) == key
