"""An HTTP target for tests and chaos runs: records every call it receives.

Runs a ThreadingHTTPServer on 127.0.0.1 in a background thread, so it answers
while the test thread blocks. `status_for(call)` and `body_for(call)` let a
test choose the answer; `delay_s` (or `delay_for(call)`) makes it slow.

close() also closes the connections callers keep alive to it. Otherwise their
handler threads would go on answering, as this sink, on a port a later sink
may bind again (the server reuses addresses): a node's pooled connection to
that port would carry a call meant for the new sink to the old one.
"""

from __future__ import annotations

import datetime as dt
import http.server
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Call:
    received_s: float           # time.time() when the request arrived
    path: str
    method: str
    headers: dict[str, str]
    body: bytes

    @property
    def job_id(self) -> str:
        return self.headers.get("X-Raftsched-Job-Id", "")

    @property
    def scheduled_s(self) -> float:
        text = self.headers["X-Raftsched-Scheduled-For"].replace("Z", "+00:00")
        return dt.datetime.fromisoformat(text).timestamp()

    @property
    def lateness_s(self) -> float:
        return self.received_s - self.scheduled_s


@dataclass
class Sink:
    status_for: Callable[["Call"], int] = lambda call: 200
    delay_s: float = 0.0
    # Per-call delay (seconds); overrides delay_s when set.
    delay_for: Callable[["Call"], float] | None = None
    # The response body for a call (default: none).
    body_for: Callable[["Call"], bytes] | None = None
    # Extra response headers for a call, such as a redirect's Location.
    headers_for: Callable[["Call"], dict[str, str]] | None = None
    calls: list[Call] = field(default_factory=list)
    # Per job: calls being answered now, and the most there ever were at once.
    inflight: dict[str, int] = field(default_factory=dict)
    inflight_max: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()   # kept alive by callers
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with sink._lock:
                    sink._connections.add(self.connection)

            def finish(self) -> None:
                with sink._lock:
                    sink._connections.discard(self.connection)
                super().finish()

            def _handle(self) -> None:
                received = time.time()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                call = Call(received, self.path, self.command, dict(self.headers), body)
                job = call.job_id
                with sink._lock:
                    sink.calls.append(call)
                    sink.inflight[job] = sink.inflight.get(job, 0) + 1
                    sink.inflight_max[job] = max(sink.inflight_max.get(job, 0),
                                                 sink.inflight[job])
                try:
                    delay_s = sink.delay_for(call) if sink.delay_for else sink.delay_s
                    if delay_s:
                        time.sleep(delay_s)
                    status = sink.status_for(call)
                    answer = sink.body_for(call) if sink.body_for else b""
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    for name, value in (sink.headers_for(call) if sink.headers_for
                                        else {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(answer)
                finally:
                    with sink._lock:
                        sink.inflight[job] -= 1

            do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: object) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            # The stdlib default backlog of 5 drops SYNs under a burst, which
            # shows up as 1 s of lateness (the TCP retransmit), not ours.
            request_queue_size = 1024

            def handle_error(self, request: object, client_address: object) -> None:
                pass   # a caller that gave up (a cancelled run) is not the sink's error

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def snapshot(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    def by_job(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = {}
        for call in self.snapshot():
            out.setdefault(call.job_id, []).append(call)
        return out

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass   # closed by its caller already
        self._thread.join(5)

    def __enter__(self) -> "Sink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
