"""The local gateway answers at the edges as API Gateway does, always in the
problem shape: limits are checked before the body is read or the caller
authenticated, and a lying or slow client holds no thread."""
import http.client
import json
import socket
import threading
import time

import pytest

import app
from devstack import server as gateway


@pytest.fixture
def base(services, monkeypatch):
    monkeypatch.setattr(gateway, "BODY_TIMEOUT_S", 1.0)
    srv = gateway.make_server(app.app, "127.0.0.1", 0)
    t = threading.Thread(target=srv.server.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server.server_address[:2]
    finally:
        srv.server.shutdown()
        srv.server.server_close()
        t.join(5)


def raw(addr, data: bytes, *, then: bytes = b"", pause_s: float = 0.0,
        timeout: float = 10) -> tuple[int, dict, bytes]:
    """Send bytes as they are; the status, headers and body of the answer."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(data)
        if pause_s:
            time.sleep(pause_s)
        if then:
            try:
                s.sendall(then)
            except OSError:
                pass
        f = s.makefile("rb")
        resp = http.client.HTTPResponse(s)
        resp.fp = f
        resp.begin()
        return resp.status, dict(resp.getheaders()), resp.read()


def problem(status_headers_body, status, code):
    s, h, b = status_headers_body
    assert s == status, (s, b)
    assert h["Content-Type"] == "application/problem+json"
    assert json.loads(b)["code"] == code
    return h


def req(method, path, headers=(), body=b""):
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_oversized_content_length_is_413_before_reading_or_authenticating(base):
    # no Authorization, and no body sent at all: the answer cannot wait for one
    problem(raw(base, req("POST", "/v1/jobs", ["Content-Length: 8000000"]), timeout=3),
            413, "payload_too_large")


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", " ", "0x10"])
def test_malformed_content_length_is_400(base, value):
    problem(raw(base, req("POST", "/v1/jobs", [f"Content-Length: {value}"])),
            400, "invalid_argument")


def test_conflicting_content_lengths_are_400(base):
    problem(raw(base, req("POST", "/v1/jobs", ["Content-Length: 2", "Content-Length: 3"],
                          b"{}")), 400, "invalid_argument")


def test_body_shorter_than_content_length_times_out_as_408(base):
    started = time.monotonic()
    problem(raw(base, req("POST", "/v1/jobs", ["Content-Length: 100"], b"{")),
            408, "request_timeout")
    assert time.monotonic() - started < 5, "the gateway's body deadline held the thread"


def test_stalled_upload_times_out_as_408(base):
    problem(raw(base, req("POST", "/v1/jobs", ["Content-Length: 4"], b"{"),
                then=b'"}', pause_s=1.5), 408, "request_timeout")


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "get", "FOO"])
def test_unknown_or_lowercase_method_is_405_with_allow(base, method):
    h = problem(raw(base, req(method, "/v1/jobs")), 405, "method_not_allowed")
    assert set(h["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_options_is_405_with_allow_as_the_openapi_document_lists_no_options(base):
    h = problem(raw(base, req("OPTIONS", "/v1/jobs")), 405, "method_not_allowed")
    assert "GET" in h["Allow"] and "POST" in h["Allow"]


def test_long_path_is_414(base):
    problem(raw(base, req("GET", "/v1/jobs/" + "a" * 9000)), 414, "uri_too_long")


def test_very_long_request_line_is_414(base):
    problem(raw(base, req("GET", "/v1/jobs/" + "a" * 70000)), 414, "uri_too_long")


def test_long_header_is_431(base):
    problem(raw(base, req("GET", "/v1/jobs", ["X-Big: " + "a" * 20000])),
            431, "request_header_fields_too_large")


def test_header_line_over_64k_is_431(base):
    problem(raw(base, req("GET", "/v1/jobs", ["X-Big: " + "a" * 70000])),
            431, "request_header_fields_too_large")


def test_head_sends_no_body(base):
    conn = http.client.HTTPConnection(*base, timeout=30)
    conn.request("HEAD", "/v1/jobs")
    r = conn.getresponse()
    assert r.status == 405 and r.read() == b""
    # the connection still works: no stray body bytes were left on it
    conn.request("GET", "/v1/health")
    assert conn.getresponse().status in (200, 503)
    conn.close()


def test_head_of_the_dashboard_is_its_get_without_the_body(base):
    """HEAD / was 405 (issue 29): over HTTP it is GET's status and headers,
    one Content-Length (the page's), and no body on the connection."""
    conn = http.client.HTTPConnection(*base, timeout=30)
    conn.request("GET", "/")
    get = conn.getresponse()
    page = get.read()
    conn.request("HEAD", "/")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    assert head.headers.get_all("Content-Length") == [str(len(page))]
    assert head.headers["Content-Type"] == get.headers["Content-Type"] == "text/html; charset=utf-8"
    assert head.headers["ETag"] == get.headers["ETag"]
    conn.request("GET", "/v1/health")  # nothing stray was left on the connection
    assert conn.getresponse().status in (200, 503)
    conn.close()
