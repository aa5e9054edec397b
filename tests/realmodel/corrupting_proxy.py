"""A proxy in front of the real model server that breaks one tool call's arguments.

A 135M model constrained by llama-server's grammar never sends broken JSON by itself, so
the fault is injected on the wire, into the first completion that carries a tool call:

- ``keep_valid=True`` (the case seen in the field, one broken call among others): a second
  call is added beside the model's own, the same call with its arguments cut short;
- ``keep_valid=False``: the model's only call has its arguments cut short.

Cut short means the last ``}`` dropped, as an answer cut at the token limit leaves them.
Streamed answers are read whole, changed, and passed on chunk by chunk. The proxy keeps the
status and, for errors, the body of every completion, so a test can say that the server
refused nothing, and quote what it said when it did.
"""

from __future__ import annotations

import copy
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def cut_short(arguments: str) -> str:
    """*arguments* without their closing brace: ``{"a": 1`` is not JSON."""
    text = arguments.rstrip()
    return text[:-1] if text.endswith("}") else text + ","


class CorruptingProxy:
    """Use as a context manager; ``url`` replaces the server's ``/v1`` base URL."""

    def __init__(self, upstream: str, keep_valid: bool = True) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.keep_valid = keep_valid
        self.statuses: list[int] = []
        """The HTTP status of each chat completion, in order."""
        self.errors: list[str] = []
        """The body of each completion that was not a 200."""
        self.corrupted: list[dict[str, str]] = []
        """The call broken (``id``, ``name``, ``sent`` by the server, ``broken`` as the
        client got it): at most one."""
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> CorruptingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def completions(self) -> int:
        return len(self.statuses)

    def _note(self, call_id: str, name: str, sent: str) -> dict[str, str]:
        broken = {"id": f"{call_id}_broken" if self.keep_valid else call_id, "name": name,
                  "sent": sent, "broken": cut_short(sent)}
        self.corrupted.append(broken)
        return broken

    def _corrupt_json(self, body: bytes) -> bytes:
        """A non-streamed completion with one call broken."""
        answer = json.loads(body)
        calls = answer["choices"][0]["message"].get("tool_calls") or []
        if calls and self._take():
            function = calls[0]["function"]
            broken = self._note(calls[0]["id"], function["name"], function["arguments"])
            if self.keep_valid:
                calls.append({"id": broken["id"], "type": "function",
                              "function": {"name": broken["name"],
                                           "arguments": broken["broken"]}})
            else:
                function["arguments"] = broken["broken"]
        return json.dumps(answer).encode()

    def _corrupt_stream(self, body: bytes) -> bytes:
        """A streamed completion with one call broken: the last arguments piece of the
        model's first call cut short, or a chunk with the broken copy added after it."""
        events: list[Any] = []
        last: tuple[int, dict[str, Any]] | None = None
        call_id, name, whole = "", "", ""
        for line in body.decode().split("\n"):
            if not line.startswith("data: ") or line == "data: [DONE]":
                events.append(line)
                continue
            chunk = json.loads(line[len("data: "):])
            for piece in (chunk.get("choices") or [{}])[0].get("delta", {}).get("tool_calls") or []:
                if piece.get("index", 0) != 0:
                    continue
                call_id = piece.get("id") or call_id
                function = piece.get("function") or {}
                name += function.get("name") or ""
                if function.get("arguments"):
                    last = (len(events), chunk)
                    whole += function["arguments"]
            events.append(chunk)
        if last is not None and self._take():
            broken = self._note(call_id, name, whole)
            at, chunk = last
            if self.keep_valid:
                added = copy.deepcopy(chunk)
                added["choices"][0]["delta"] = {"tool_calls": [{
                    "index": 1, "id": broken["id"], "type": "function",
                    "function": {"name": name, "arguments": broken["broken"]}}]}
                events.insert(at + 1, "")  # an SSE event ends with a blank line
                events.insert(at + 2, added)
            else:
                piece = next(p for p in chunk["choices"][0]["delta"]["tool_calls"]
                             if p.get("index", 0) == 0)
                piece["function"]["arguments"] = cut_short(piece["function"]["arguments"])
        return "\n".join(e if isinstance(e, str) else "data: " + json.dumps(e)
                         for e in events).encode()

    def _take(self) -> bool:
        """True the first time: only one call is ever broken."""
        with self.lock:
            return not self.corrupted

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                request = self.rfile.read(int(self.headers.get("content-length", 0)))
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                try:
                    upstream.request("POST", self.path, body=request, headers=headers)
                    answer = upstream.getresponse()
                    body = answer.read()
                finally:
                    upstream.close()
                completion = self.path.endswith("/chat/completions")
                streamed = "text/event-stream" in (answer.getheader("content-type") or "")
                if completion:
                    with proxy.lock:
                        proxy.statuses.append(answer.status)
                        if answer.status != 200:
                            proxy.errors.append(body.decode(errors="replace"))
                    if answer.status == 200:
                        body = (proxy._corrupt_stream(body) if streamed
                                else proxy._corrupt_json(body))
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
