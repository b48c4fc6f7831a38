"""The delivery's POST (adapters/webhook_delivery.Urllib3Poster) against a
real receiver on 127.0.0.1: it connects to the address that was checked,
never resolving the host again (so DNS rebinding cannot move it), names the
host in ``Host``, follows no redirect, and gives up at its timeout."""
from __future__ import annotations

import time

import pytest
import urllib3

from chalicelib.adapters.webhook_delivery import Urllib3Poster
from chalicelib.domain.webhooks import Target
from tests.support.webhook_receiver import Receiver


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


def target(receiver: Receiver, path: str, host: str = "hooks.example.invalid") -> Target:
    port = int(receiver.url("/").rsplit(":", 1)[1].split("/")[0])
    return Target(f"http://{host}:{port}{path}?a=1", "http", host, port, ("127.0.0.1",))


def test_it_posts_to_the_checked_address_without_resolving_the_host(receiver):
    status = Urllib3Poster().post(target(receiver, "/in"), {"webhook-id": "evt_1"},
                                  b'{"id":"evt_1"}', 10)
    assert status == 204
    [got] = receiver.at("/in?a=1")
    assert got.body == b'{"id":"evt_1"}' and got.headers["webhook-id"] == "evt_1"
    assert got.headers["host"].startswith("hooks.example.invalid:")


def test_a_redirect_is_not_followed_and_counts_as_a_failure(receiver):
    receiver.behaviour["/moved?a=1"] = [302]
    assert Urllib3Poster().post(target(receiver, "/moved"), {}, b"{}", 10) == 302
    assert len(receiver.received) == 1


def test_an_endpoint_that_never_answers_is_given_up_at_the_timeout(receiver):
    receiver.behaviour["/dead?a=1"] = None
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.TimeoutError):
        Urllib3Poster().post(target(receiver, "/dead"), {}, b"{}", 0.5)
    assert time.monotonic() - started < 5


@pytest.fixture
def tls_receiver(tmp_path):
    """An https receiver on 127.0.0.1 whose certificate names hooks.test
    (self-signed, made here), answering 204; stopped after the test."""
    import datetime
    import http.server
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hooks.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("hooks.test")]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            hosts.append(self.headers["host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], str(cert_file), hosts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_https_checks_the_certificate_against_the_host_while_connecting_to_the_address(
        tls_receiver):
    port, ca, hosts = tls_receiver

    def to(host: str) -> Target:
        return Target(f"https://{host}:{port}/in", "https", host, port, ("127.0.0.1",))

    assert Urllib3Poster(ca_certs=ca).post(to("hooks.test"), {}, b"{}", 10) == 204
    assert hosts == [f"hooks.test:{port}"]
    with pytest.raises(urllib3.exceptions.SSLError):  # the certificate names another host
        Urllib3Poster(ca_certs=ca).post(to("other.test"), {}, b"{}", 10)
    with pytest.raises(urllib3.exceptions.SSLError):  # not a CA the poster trusts
        Urllib3Poster().post(to("hooks.test"), {}, b"{}", 10)
