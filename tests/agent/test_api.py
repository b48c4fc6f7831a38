"""The HTTP client's classification of answers: what is retried, what stops reports."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.api import ApiClient, ApiError, AttemptGone, call_in_body, classify


@pytest.mark.parametrize("status,code,retryable", [
    (500, "internal", True), (502, None, True), (503, None, True), (429, "throttled", True),
    (409, "request_in_progress", True),
    (400, "invalid_argument", False), (401, "unauthenticated", False),
    (403, "forbidden", False), (404, "not_found", False), (409, "conflict", False),
])
def test_classify(status, code, retryable):
    error = classify(status, {"code": code} if code else {}, None)
    assert not isinstance(error, AttemptGone)
    assert error.retryable is retryable and error.status == status and error.code == code


@pytest.mark.parametrize("code", ["stale_attempt", "already_finished"])
def test_conflicts_that_end_an_attempts_reports(code):
    error = classify(409, {"code": code}, None)
    assert isinstance(error, AttemptGone) and not error.retryable


class _Handler(BaseHTTPRequestHandler):
    answers: list = []
    seen: list = []

    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, self.headers.get("Authorization"),
                          json.loads(body)))
        status, headers, payload = self.answers.pop(0)
        data = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_PUT = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.answers, _Handler.seen = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd, _Handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_requests_carry_the_token_and_the_agreed_paths(server):
    httpd, handler = server
    handler.answers = [(200, {}, {"node_id": "n/1", "inbox_queue_url": "http://q"}),
                       (200, {}, {"id": "job_1"})]
    api = ApiClient(f"http://127.0.0.1:{httpd.server_address[1]}/", "tok")
    assert api.call_in(call_in_body("n/1", 8, "h100", {"zone": "a"}))["inbox_queue_url"] == "http://q"
    api.post_event("job_1", 2, {"type": "STARTED", "ranks": [0], "node_id": "n/1"})
    assert handler.seen == [
        ("PUT", "/v1/nodes/n%2F1", "Bearer tok", {"gpus": 8, "gpu_type": "h100",
                                                  "labels": {"zone": "a"}}),
        ("POST", "/v1/jobs/job_1/attempts/2/events", "Bearer tok",
         {"type": "STARTED", "ranks": [0], "node_id": "n/1"})]


def test_problem_answers_are_classified_with_retry_after(server):
    httpd, handler = server
    handler.answers = [(503, {"Retry-After": "4"}, {"code": "unavailable"}),
                       (409, {}, {"code": "stale_attempt", "status": 409})]
    api = ApiClient(f"http://127.0.0.1:{httpd.server_address[1]}", "tok")
    with pytest.raises(ApiError) as e:
        api.post_event("job_1", 1, {"type": "STARTED", "ranks": [0]})
    assert e.value.retryable and e.value.retry_after == 4.0 and e.value.code == "unavailable"
    with pytest.raises(AttemptGone):
        api.post_event("job_1", 1, {"type": "STARTED", "ranks": [0]})


def test_no_answer_at_all_is_retryable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ApiError) as e:
        ApiClient(f"http://127.0.0.1:{port}", "tok", timeout_s=2).call_in(
            call_in_body("n", 1, "h100", {}))
    assert e.value.retryable and e.value.status is None


def test_a_registration_says_which_attempts_run_here(server):
    httpd, handler = server
    handler.answers = [(200, {}, {"node_id": "n", "attempts": []})]
    api = ApiClient(f"http://127.0.0.1:{httpd.server_address[1]}", "tok")
    running = [{"job_id": "job_1", "attempt": 2}]
    assert api.call_in(call_in_body("n", 8, "h100", {}, running=running))["attempts"] == []
    assert handler.seen[0][3] == {"gpus": 8, "gpu_type": "h100", "labels": {},
                                  "running": running}


def test_timed_out_is_posted_as_the_other_events_and_a_409_ends_its_reports(server):
    httpd, handler = server
    handler.answers = [(202, {}, {"id": "job_1", "state": "RUNNING"}),
                       (409, {}, {"code": "already_finished", "status": 409})]
    api = ApiClient(f"http://127.0.0.1:{httpd.server_address[1]}", "tok")
    event = {"type": "TIMED_OUT", "ranks": [0, 1], "node_id": "n"}
    assert api.post_event("job_1", 3, event) == {"id": "job_1", "state": "RUNNING"}
    assert handler.seen[0] == ("POST", "/v1/jobs/job_1/attempts/3/events", "Bearer tok", event)
    with pytest.raises(AttemptGone):
        api.post_event("job_1", 3, event)


def test_a_registration_says_when_the_inbox_is_missing(server):
    httpd, handler = server
    handler.answers = [(200, {}, {"node_id": "n"}), (200, {}, {"node_id": "n"})]
    api = ApiClient(f"http://127.0.0.1:{httpd.server_address[1]}", "tok")
    api.call_in(call_in_body("n", 8, "h100", {}, inbox_missing=True))
    api.call_in(call_in_body("n", 8, "h100", {}))
    assert [seen[3].get("inbox_missing") for seen in handler.seen] == [True, None], \
        "sent only when missing: an ordinary call-in is as before"
