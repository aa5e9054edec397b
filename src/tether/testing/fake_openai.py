"""A scripted OpenAI-compatible server on loopback, for testing agents without a model.

It is a real HTTP server (``/v1/chat/completions``, JSON or server-sent-event streaming,
with ``tool_calls``), so the real ``openai`` client talks to it over a socket: nothing is
patched. Each request takes the next scripted reply; every request body is kept, so a
test can count completions and read the prompts the agent sent.

    with FakeOpenAI([reply(tool_calls=[call("lookup", {"q": "x"})]), reply("done")]) as fake:
        agent = ChatAgent(model="fake", base_url=fake.url, api_key="none")
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: text and/or tool calls, or an HTTP error."""

    text: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error: str | None = None
    chunk_delay: float = 0.0
    """Seconds between streamed chunks (a slow model, to be cut off)."""
    chunks: int = 1
    """How many pieces the text is streamed in."""


def reply(text: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
          **kwargs: Any) -> Reply:
    return Reply(text, tool_calls or [], **kwargs)


def call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A tool call as the model sends it."""
    return {"id": call_id or f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def failure(status: int = 500, message: str = "model overloaded") -> Reply:
    return Reply(status=status, error=message)


class FakeOpenAI:
    """The server. Use as a context manager; ``url`` is the ``base_url`` for the client."""

    def __init__(self, script: list[Reply] | None = None,
                 route: Callable[[dict[str, Any]], Reply | None] | None = None) -> None:
        self.script: list[Reply] = list(script or [])
        self.route = route
        """Answers a request itself when it returns a Reply (say, every summary request),
        without using up the script."""
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stream_cut = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, *replies: Reply) -> None:
        with self.lock:
            self.script.extend(replies)

    @property
    def completions(self) -> int:
        return len(self.requests)

    def _next(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.requests.append(body)
            routed = self.route(body) if self.route else None
            if routed is not None:
                return routed
            if not self.script:
                return Reply(status=500, error="the fake server's script ran out")
            return self.script.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                answer = fake._next(body)
                if answer.error is not None:
                    self._send(answer.status, {"error": {"message": answer.error,
                                                         "type": "server_error"}})
                elif body.get("stream"):
                    self._stream(body, answer)
                else:
                    self._send(200, _completion(body, answer))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any], answer: Reply) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                try:
                    for chunk in _chunks(body, answer):
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                        if answer.chunk_delay:
                            time.sleep(answer.chunk_delay)
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    fake.stream_cut.set()  # the client hung up mid-stream

        return Handler


def _completion(body: dict[str, Any], answer: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if answer.tool_calls else "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def _chunks(body: dict[str, Any], answer: Reply) -> Iterator[dict[str, Any]]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model", "fake")}
    text = answer.text or ""
    size = max(1, -(-len(text) // max(1, answer.chunks)))
    for start in range(0, len(text), size):
        yield {**base, "choices": [{"index": 0, "delta": {"content": text[start:start + size]},
                                    "finish_reason": None}]}
    for index, tool_call in enumerate(answer.tool_calls):
        yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [{**tool_call,
                                                                          "index": index}]},
                                    "finish_reason": None}]}
    yield {**base, "choices": [{"index": 0, "delta": {},
                                "finish_reason": "tool_calls" if answer.tool_calls else "stop"}]}
