"""A counting proxy in front of the real model server.

A completion the agent paid for and then lost in a crash never shows up in the task's
dialog; only the server saw it. So the real-model tests count completions on the wire:
this proxy forwards every request to the server as it is (streamed answers are passed on
as they arrive, so a P0 cut is a real client hang-up) and counts the chat completions.
"""

from __future__ import annotations

import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

WORDS = re.compile(rb'"content":"[^"]')
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class CountingProxy:
    """Use as a context manager; ``url`` replaces the server's ``/v1`` base URL."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.completions = 0
        self.statuses: list[int] = []
        """The HTTP status of each chat completion, in order."""
        self.words = 0
        """Streamed pieces carrying text (not only a role) relayed to the client so far."""
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self._forward(b"")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                completion = self.path.endswith("/chat/completions")
                if completion:
                    with proxy.lock:
                        proxy.completions += 1
                self._forward(body, completion)

            def _forward(self, body: bytes, completion: bool = False) -> None:
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                answer = upstream.getresponse()
                if completion:
                    proxy.statuses.append(answer.status)
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.end_headers()
                try:
                    while piece := answer.read1(65536):
                        self.wfile.write(piece)
                        self.wfile.flush()
                        if completion:
                            proxy.words += len(WORDS.findall(piece))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up (a P0 cut): stop reading the answer too
                finally:
                    upstream.close()

        return Handler
