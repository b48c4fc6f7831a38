"""The webhooks' domain rules (chalicelib/domain/webhooks.py): signing as
Standard Webhooks 1.0 says (checked against the spec's reference library),
the URL rule, the retry schedule and disabling, on injected time, randomness
and name resolution."""
from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime, timedelta, timezone

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from chalicelib.domain import webhooks as wh
from chalicelib.domain.errors import InvalidArgument

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


# -- signing ---------------------------------------------------------------------
def test_a_secret_is_whsec_and_the_base64_of_24_random_bytes():
    secret = wh.new_secret(lambda n: bytes(range(n)))
    assert secret == "whsec_" + base64.b64encode(bytes(range(24))).decode()
    assert wh.secret_key(secret) == bytes(range(24))
    assert wh.new_secret() != wh.new_secret()


def test_the_signature_is_hmac_sha256_over_id_timestamp_and_body():
    secret = wh.new_secret()
    body = '{"id":"evt_1","type":"job.created"}'
    expected = base64.b64encode(hmac.new(wh.secret_key(secret), f"evt_1.1700000000.{body}".encode(),
                                         hashlib.sha256).digest()).decode()
    assert wh.signature(secret, "evt_1", 1700000000, body) == "v1," + expected


def test_the_reference_library_verifies_the_signed_headers():
    secret = wh.new_secret()
    body = '{"id":"evt_2","data":{"text":"caf\\u00e9 \u00e9"}}'
    now = datetime.now(timezone.utc)
    headers = wh.signed_headers(secret, "evt_2", now, body)
    assert headers["webhook-id"] == "evt_2"
    assert headers["webhook-timestamp"] == str(int(now.timestamp()))
    assert Webhook(secret).verify(body, headers)["id"] == "evt_2"
    with pytest.raises(WebhookVerificationError):
        Webhook(wh.new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body + " ", headers)


# -- the URL rule ------------------------------------------------------------------
def resolver(*addresses: str):
    return lambda host, port: list(addresses)


PUBLIC = resolver("93.184.216.34")


def test_a_public_https_url_is_taken_with_the_addresses_checked():
    target = wh.check_url("https://hooks.example.com/in?x=1", resolver=PUBLIC)
    assert (target.host, target.port, target.addresses) == ("hooks.example.com", 443,
                                                            ("93.184.216.34",))
    assert wh.check_url("https://93.184.216.34:8443/h").port == 8443


@pytest.mark.parametrize("url", ["http://hooks.example.com/", "ftp://hooks.example.com/",
                                 "hooks.example.com", "", "https://", "https://u:p@example.com/",
                                 "https://example.com:99999/", "x" * 3000])
def test_a_url_that_is_no_https_url_is_refused_naming_url(url):
    with pytest.raises(InvalidArgument) as e:
        wh.check_url(url, resolver=PUBLIC)
    assert e.value.field == "url"


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "169.254.1.1",
    "0.0.0.0", "224.0.0.1", "240.0.0.1", "100.64.0.1", "::1", "::", "fe80::1", "fc00::1",
    "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1",
])
def test_a_host_that_is_or_resolves_to_a_non_public_address_is_refused(address):
    literal = f"[{address}]" if ":" in address else address
    for url, res in ((f"https://{literal}/", PUBLIC), ("https://h.example.com/",
                                                       resolver(address))):
        with pytest.raises(InvalidArgument) as e:
            wh.check_url(url, resolver=res)
        assert e.value.field == "url" and address.split(":")[-1] in e.value.detail


def test_every_resolved_address_is_checked_not_only_the_first():
    with pytest.raises(InvalidArgument, match="10.0.0.7"):
        wh.check_url("https://h.example.com/", resolver=resolver("93.184.216.34", "10.0.0.7"))


def test_a_host_that_does_not_resolve_is_refused():
    def fails(host, port):
        raise OSError("no such host")
    with pytest.raises(InvalidArgument, match="does not resolve"):
        wh.check_url("https://nowhere.invalid/", resolver=fails)


def test_the_local_stack_also_takes_http_and_loopback_but_not_metadata_or_private():
    target = wh.check_url("http://127.0.0.1:8080/h", allow_local=True)
    assert (target.scheme, target.port, target.addresses) == ("http", 8080, ("127.0.0.1",))
    assert wh.check_url("http://[::1]:9/", allow_local=True).addresses == ("::1",)
    for bad in ("http://169.254.169.254/", "http://10.0.0.1/", "http://[fd00:ec2::254]/"):
        with pytest.raises(InvalidArgument):
            wh.check_url(bad, allow_local=True)


def test_types_default_to_all_and_an_unknown_type_names_types():
    assert wh.check_types(None) == wh.TYPES
    assert wh.check_types(["job.created", "job.created"]) == ("job.created",)
    for bad in (["job.nope"], [], ["webhook.test"]):
        with pytest.raises(InvalidArgument) as e:
            wh.check_types(bad)
        assert e.value.field == "types"


# -- retries and disabling ---------------------------------------------------------
def test_the_schedule_retries_for_more_than_24_hours_then_gives_up():
    delays = []
    attempt = 1
    while (d := wh.retry_delay(attempt, rand=lambda: 0.5)) is not None:
        delays.append(d)
        attempt += 1
    assert delays == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert sum(delays) > 24 * 3600 and attempt == len(wh.RETRY_SCHEDULE_S)


def test_the_jitter_is_within_20_percent_either_way():
    assert wh.retry_delay(2, rand=lambda: 0.0) == pytest.approx(300 * 0.8)
    assert wh.retry_delay(2, rand=lambda: 0.9999999) == pytest.approx(300 * 1.2)
    assert wh.retry_delay(1, schedule=(0, 0), rand=lambda: 1.0) == 0
    assert wh.retry_delay(2, schedule=(0, 0)) is None


def test_a_long_wait_goes_in_hops_of_at_most_900_seconds():
    assert wh.queue_delay(T0, T0 + timedelta(hours=10)) == 900
    assert wh.queue_delay(T0, T0 + timedelta(seconds=4.2)) == 5
    assert wh.queue_delay(T0, T0 - timedelta(seconds=3)) == 0


def test_an_endpoint_failing_for_5_days_with_no_success_is_disabled():
    assert not wh.should_disable(None, T0)
    assert not wh.should_disable(T0, T0 + timedelta(days=4, hours=23))
    assert wh.should_disable(T0, T0 + timedelta(days=5))


def test_only_a_2xx_is_delivered():
    assert [wh.delivered(s) for s in (200, 204, 299, 300, 404, 500, None)] == \
        [True, True, True, False, False, False, False]
