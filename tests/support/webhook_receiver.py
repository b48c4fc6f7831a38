"""A real HTTP receiver for webhook deliveries: a threading http.server on
127.0.0.1 (a port from the OS) whose paths behave as a test asks, recording
every POST. Started and stopped by the ``with`` block, also when a test fails;
a path that never answers is released when the receiver stops."""
from __future__ import annotations

import http.server
import threading
from dataclasses import dataclass, field


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    #: path -> the statuses it answers, in order (the last repeats);
    #: None: never answers
    behaviour: dict[str, list[int] | None] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def __enter__(self) -> "Receiver":
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.received.append(Received(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    statuses = receiver.behaviour.get(self.path, [204])
                    status = None if statuses is None else (
                        statuses.pop(0) if len(statuses) > 1 else statuses[0])
                if status is None:
                    receiver._stopping.wait(60)  # never answers (until stopped)
                    return
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="webhook-receiver", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
