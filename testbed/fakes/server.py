"""The local JSON-over-HTTP server under each fake Google API: lifecycle, clock and request log.

    class FakeThing(FakeServer):
        def __init__(self, host="127.0.0.1", port=0):
            self._things = {}
            super().__init__(host, port)          # binds a free port; .endpoint is its URL
        def handle(self, verb, raw_path, raw_body):  # -> (HTTP status, JSON payload)
            with self._lock:
                ...

    with FakeThing() as api:                      # serves on a thread until the block ends
        api.advance_clock(60)
        [r.body for r in api.requests("things.insert")]

A subclass holds its state behind `self._lock`, appends what it was asked to `self._log`
(objects with an `rpc` attribute) and reads time from `self._now()`, so that `advance_clock`
moves every timing it keeps. The real clients speak to `endpoint` over REST.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    """A ThreadingHTTPServer bound at construction, served by `start()` or `with`; a subclass
    answers each request in `handle(verb, raw_path, raw_body) -> (status, payload)`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._lock = threading.RLock()
        self._clock_offset = 0.0
        self._log: list = []
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.api = self
        self.host, self.port = self._server.server_address[:2]
        url_host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.endpoint = f"http://{url_host}:{self.port}"
        self._thread: threading.Thread | None = None

    def handle(self, verb: str, raw_path: str, raw_body: bytes) -> tuple[int, dict]:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self):
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve on this thread until interrupted (a fake run as its own process)."""
        try:
            self._server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- clock and log -------------------------------------------------------------------------
    def advance_clock(self, seconds: float) -> None:
        """Move the fake's clock on: every timing it keeps in seconds sees it."""
        with self._lock:
            self._clock_offset += seconds

    def requests(self, rpc: str | None = None) -> list:
        """The requests served so far, oldest first (only those of `rpc` when given)."""
        with self._lock:
            return [r for r in self._log if rpc is None or r.rpc == rpc]

    def _now(self) -> float:
        return time.time() + self._clock_offset


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body go out as two writes

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, payload = self.server.api.handle(self.command, self.path,
                                                 self.rfile.read(length) if length else b"")
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _serve

    def log_message(self, format, *args) -> None:   # tests read api.requests() instead
        pass
