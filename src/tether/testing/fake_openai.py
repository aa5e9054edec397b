"""A scripted OpenAI-compatible server on loopback, for testing agents without a model.

It is a real HTTP server (``/v1/chat/completions``, JSON or server-sent-event streaming,
with ``tool_calls``), so the real ``openai`` client talks to it over a socket: nothing is
patched. Each request takes the next scripted reply; every request body (``requests``) and
its headers (``request_headers``, keys lower-cased) are kept, so a test can count
completions and read the prompts and headers the agent sent.

    with FakeOpenAI([reply(tool_calls=[call("lookup", {"q": "x"})]), reply("done")]) as fake:
        agent = ChatAgent(model="fake", base_url=fake.url, api_key="none")

A ``Reply`` can also script the ways a real model server misbehaves, because those are the
paths an agent's error handling takes and they are rare against a real model:

- ``finish_reason="length"`` / ``"content_filter"``: a truncated or refused answer.
- ``headers={"retry-after": "2"}``: sent with any response, say a ``failure(429, ...)``.
- ``usage={...}``: token counts; streamed only when the request asks with
  ``stream_options={"include_usage": True}``, in a last chunk with no choices, as OpenAI does.
- ``raw_call(name, '{"broken')``: tool-call arguments sent verbatim, malformed JSON included.
  Streamed arguments longer than 8 characters always arrive in several pieces, so the
  client's reassembly is exercised.
- ``hang=seconds``: answer that late (streamed: after the first chunk), for timeouts.
- ``drop=True``: close the connection with no HTTP response at all, for transient errors.

The server itself can be as strict as llama.cpp's ``llama-server`` about what a prompt
replays: ``FakeOpenAI(parse_arguments=True)`` parses the ``arguments`` of every assistant
tool call in a request's ``messages`` and answers a request holding one that is not JSON
with HTTP 500 "Failed to parse tool call arguments as JSON: ...", as llama-server does,
without using up the script (the refusal comes before any answer). Each such message is
kept in ``refused``. Off by default: OpenAI itself does not check them.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
ARGUMENT_PIECE = 8
"""Streamed tool-call arguments longer than this are split, as a real server streams them."""


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
    finish_reason: str | None = None
    """Sent instead of the computed ``tool_calls``/``stop`` (say ``length``)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers, error or not (say ``retry-after`` on a 429)."""
    usage: dict[str, int] | None = None
    """Token usage; ``DEFAULT_USAGE`` when not given."""
    hang: float = 0.0
    """Seconds to stall: before answering, or after the first streamed chunk."""
    drop: bool = False
    """Close the connection without any HTTP response (the client sees a connection error)."""


def reply(text: str | None = None, tool_calls: list[dict[str, Any]] | None = None,
          **kwargs: Any) -> Reply:
    """A successful answer; ``kwargs`` are any other ``Reply`` fields."""
    return Reply(text, tool_calls or [], **kwargs)


def call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A tool call as the model sends it."""
    return raw_call(name, json.dumps(arguments), call_id)


def raw_call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    """A tool call whose ``arguments`` string is sent verbatim: models do send broken JSON."""
    return {"id": call_id or f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def failure(status: int = 500, message: str = "model overloaded", *,
            headers: dict[str, str] | None = None) -> Reply:
    """An HTTP error answer, with optional headers (``retry-after`` on a 429)."""
    return Reply(status=status, error=message, headers=dict(headers or {}))


class FakeOpenAI:
    """The server. Use as a context manager; ``url`` is the ``base_url`` for the client."""

    def __init__(self, script: list[Reply] | None = None,
                 route: Callable[[dict[str, Any]], Reply | None] | None = None, *,
                 parse_arguments: bool = False) -> None:
        self.script: list[Reply] = list(script or [])
        self.route = route
        """Answers a request itself when it returns a Reply (say, every summary request),
        without using up the script."""
        self.parse_arguments = parse_arguments
        """Refuse, as llama-server does (HTTP 500), a request that replays a tool call whose
        arguments are not JSON."""
        self.refused: list[str] = []
        """The error message of each request refused for its tool-call arguments."""
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        """Each request's headers (keys lower-cased), parallel to ``requests``."""
        self.lock = threading.Lock()
        self.stream_cut = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})  # quick shutdown

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

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self.lock:
            self.requests.append(body)
            self.request_headers.append(headers)
            unparsable = unparsable_arguments(body) if self.parse_arguments else None
            if unparsable is not None:
                self.refused.append(unparsable)
                return Reply(status=500, error=unparsable)
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
                headers = {key.lower(): value for key, value in self.headers.items()}
                answer = fake._next(body, headers)
                try:
                    self._answer(body, answer)
                except (BrokenPipeError, ConnectionResetError):
                    fake.stream_cut.set()  # the client hung up (mid-stream, or timed out)

            def _answer(self, body: dict[str, Any], answer: Reply) -> None:
                if answer.drop:
                    self._drop()
                elif body.get("stream") and answer.error is None:
                    self._stream(body, answer)
                else:
                    time.sleep(answer.hang)
                    self._send(answer.status, _payload(body, answer), answer.headers)

            def _drop(self) -> None:
                """Reset the connection (linger 0 makes close send RST), writing nothing."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.close_connection = True

            def _send(self, status: int, payload: dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self._head(status, "application/json", headers or {})
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _head(self, status: int, content_type: str, headers: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                for name, value in headers.items():
                    self.send_header(name, value)

            def _stream(self, body: dict[str, Any], answer: Reply) -> None:
                self._head(200, "text/event-stream", answer.headers)
                self.end_headers()
                for number, chunk in enumerate(_chunks(body, answer)):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(answer.hang if number == 0 else 0.0)
                    time.sleep(answer.chunk_delay)
                self.wfile.write(b"data: [DONE]\n\n")

        return Handler


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def unparsable_arguments(body: dict[str, Any]) -> str | None:
    """llama-server's error for the first assistant tool call in *body*'s messages whose
    ``arguments`` string is not JSON (strictly: no NaN or Infinity), or None when all are."""
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for tool_call in message.get("tool_calls") or []:
            arguments = (tool_call.get("function") or {}).get("arguments")
            if not isinstance(arguments, str):
                continue
            try:
                json.loads(arguments, parse_constant=_no_constant)
            except ValueError as exc:
                return f"Failed to parse tool call arguments as JSON: {exc}"
    return None


def _payload(body: dict[str, Any], answer: Reply) -> dict[str, Any]:
    """The JSON body of a non-streamed answer: the error, or the completion."""
    if answer.error is not None:
        return {"error": {"message": answer.error, "type": "server_error"}}
    return _completion(body, answer)


def _finish_reason(answer: Reply) -> str:
    if answer.finish_reason is not None:
        return answer.finish_reason
    return "tool_calls" if answer.tool_calls else "stop"


def _completion(body: dict[str, Any], answer: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.tool_calls:
        message["tool_calls"] = answer.tool_calls
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": _finish_reason(answer)}],
            "usage": answer.usage or DEFAULT_USAGE}


def _split(text: str, parts: int) -> list[str]:
    """*text* in at most *parts* consecutive, nearly equal pieces (none for empty text)."""
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[start:start + size] for start in range(0, len(text), size)]


def _tool_call_deltas(index: int, tool_call: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One call as a real server streams it: id, type and name first, then the
    arguments piece by piece (several pieces when longer than ``ARGUMENT_PIECE``)."""
    arguments: str = tool_call["function"]["arguments"]
    pieces = _split(arguments, min(4, -(-len(arguments) // ARGUMENT_PIECE))) or [""]
    yield {"index": index, "id": tool_call["id"], "type": tool_call["type"],
           "function": {"name": tool_call["function"]["name"], "arguments": pieces[0]}}
    for piece in pieces[1:]:
        yield {"index": index, "function": {"arguments": piece}}


def _chunks(body: dict[str, Any], answer: Reply) -> Iterator[dict[str, Any]]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": body.get("model", "fake")}

    def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta,
                                     "finish_reason": finish_reason}]}

    for piece in _split(answer.text or "", answer.chunks):
        yield choice({"content": piece})
    for index, tool_call in enumerate(answer.tool_calls):
        for delta in _tool_call_deltas(index, tool_call):
            yield choice({"tool_calls": [delta]})
    yield choice({}, _finish_reason(answer))
    if (body.get("stream_options") or {}).get("include_usage"):
        yield {**base, "choices": [], "usage": answer.usage or DEFAULT_USAGE}
