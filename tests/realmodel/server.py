"""A running ``llama-server`` with the 135M SmolLM2 model, set up so it makes tool calls.

SmolLM2-135M's own chat template knows nothing of tools, so the server is given the
Qwen2.5 template bundled with llama.cpp (``models/templates/Qwen-Qwen2.5-7B-Instruct.jinja``,
copied below verbatim and written next to the model): with ``--jinja`` llama.cpp reads the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format from it, parses such
blocks into OpenAI ``tool_calls`` (``finish_reason`` ``"tool_calls"``) and constrains the
arguments to the tool's JSON schema once a block starts.

A model this small only calls a tool, once, and then answers in words, when shown how:
:data:`SYSTEM_PROMPT` is a few-shot dialog written in the template's own ChatML (the
``<|im_start|>``/``<|im_end|>`` text becomes the special tokens). The ``<|im_end|>`` right
after the example call is what makes it stop after one call (llama.cpp does not enforce
``parallel_tool_calls=false`` for this format, and without it the model repeats the call);
the first example's tool response and answer are what make it answer the tool result with
a sentence instead of echoing ``<tool_response>``. Found by experiment, for
:data:`USER_PROMPT`-shaped requests ("Refund N dollars for order X-N."): other phrasings
("Please refund ...") may get text instead of a call.

Determinism: with temperature 0 and ``--no-cache-prompt`` the same request gives the same
answer, byte for byte. With prompt caching on, a request whose prefix is cached is computed
in different batches and can answer differently from the first, uncached one.

Nothing here is pytest-specific. Like the other helpers beside the tests, it imports its
sibling by module name (pytest puts this directory on ``sys.path``; a script must too).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_server

MODEL = "smollm2"
"""The name the server answers to (``--alias``); pass it as ``model=``."""

READY_TIMEOUT = 120.0
"""Seconds to wait for ``GET /health`` to say 200 (it takes about half a second)."""

THREADS = 2
"""Fixed, not "all cores": the same thread count on every machine keeps answers the same."""

REFUND_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "refund",
        "description": "Refund an order.",
        "parameters": {
            "properties": {"order": {"title": "Order", "type": "string"},
                           "amount": {"title": "Amount", "type": "integer"}},
            "required": ["order", "amount"],
            "type": "object",
        },
    },
}
"""The schema :func:`tether.agents.schemas.tool_schema` makes for
``async def refund(ctx, order: str, amount: int)`` with the docstring "Refund an order.",
so a ChatAgent with that tool sends exactly the request that was tried here."""

USER_PROMPT = "Refund 42 dollars for order B-7."
"""A request the model answers with ``refund({"order": "B-7", "amount": 42})``."""

SYSTEM_PROMPT = """\
You are a refund bot. You call the refund tool once, then stop.

Example 1:
<|im_start|>user
Refund 20 dollars for order A-100.<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "refund", "arguments": {"order": "A-100", "amount": 20}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"refunded": 20}
</tool_response><|im_end|>
<|im_start|>assistant
Done: order A-100 got 20 dollars back.<|im_end|>

Example 2:
<|im_start|>user
Refund 5 dollars for order C-3.<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "refund", "arguments": {"order": "C-3", "amount": 5}}
</tool_call><|im_end|>"""
"""With :data:`REFUND_TOOL` and :data:`USER_PROMPT`, temperature 0: a single ``refund``
call (``finish_reason`` ``"tool_calls"``, empty content), and after its tool result a
sentence such as "Done: order B-7 got 42 dollars back." (``finish_reason`` ``"stop"``)."""

# The template is kept verbatim, long lines and all:
# ruff: noqa: E501
QWEN25_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
"""llama.cpp's ``models/templates/Qwen-Qwen2.5-7B-Instruct.jinja`` from the
llama-cpp-python sdist the server is built from, kept here because the build deletes the
sdist: the server needs it as a file (``--chat-template-file``)."""

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class ServerFailed(RuntimeError):
    """llama-server exited, or did not become ready in time; the message ends with its log."""


@dataclass(frozen=True)
class RealServer:
    """A ready server: point an OpenAI client at ``base_url`` and send ``model``."""

    base_url: str
    """``http://127.0.0.1:PORT/v1``."""
    model: str
    port: int
    ctx_size: int
    started_in: float
    """Seconds from launch to ``/health`` answering 200."""
    log: Path
    """The server's stdout and stderr (deleted when the server stops)."""


def template_path() -> Path:
    """The Qwen2.5 template as a file in the cache, written once (atomically, so two test
    runs starting together never read half a file)."""
    path = llama_server.cache_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"
    if not path.exists() or path.read_text() != QWEN25_TEMPLATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=".template-")
        with os.fdopen(fd, "w") as out:
            out.write(QWEN25_TEMPLATE)
        os.replace(partial, path)
    return path


def command(ctx_size: int) -> list[str]:
    """The llama-server command line. ``--port 0``: the server picks a free port itself and
    logs it, so there is no window in which another process can take a port chosen here."""
    return [str(llama_server.server_binary()), "-m", str(llama_server.model_path()),
            "--host", "127.0.0.1", "--port", "0", "--alias", MODEL,
            "--ctx-size", str(ctx_size), "--parallel", "1", "--threads", str(THREADS),
            "--jinja", "--chat-template-file", str(template_path()),
            "--temp", "0", "--no-cache-prompt", "--no-webui"]


@contextlib.contextmanager
def running_server(ctx_size: int = 4096) -> Iterator[RealServer]:
    """Start llama-server, wait until it is ready, and stop it on exit.

    ``ctx_size`` is the context of its one slot: a prompt larger than that is refused with
    HTTP 400 ``exceed_context_size_error``. Needs the binary and model already built
    (``llama_server.ensure_built()``); raises :class:`ServerFailed` if the server exits or is
    not ready within :data:`READY_TIMEOUT` seconds.
    """
    for needed in (llama_server.server_binary(), llama_server.model_path()):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} is missing; build it first with"
                                    " python tests/realmodel/llama_server.py")
    # LLAMA_ARG_* variables would silently change the flags (and the answers)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    log = Path(name)
    started = time.monotonic()
    with os.fdopen(fd, "wb") as out:  # a file, not a pipe: nobody has to drain it
        process = subprocess.Popen(command(ctx_size), stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
    try:
        port = _wait_ready(process, log, started)
        yield RealServer(base_url=f"http://127.0.0.1:{port}/v1", model=MODEL, port=port,
                         ctx_size=ctx_size, started_in=time.monotonic() - started, log=log)
    finally:
        _stop(process)
        log.unlink(missing_ok=True)


def _wait_ready(process: subprocess.Popen[bytes], log: Path, started: float) -> int:
    """The port, once ``/health`` says 200 (it answers 503 while the model loads)."""
    port: int | None = None
    while time.monotonic() - started < READY_TIMEOUT:
        if process.poll() is not None:
            raise ServerFailed(f"llama-server exited with status {process.returncode} before"
                               f" it was ready:\n{_tail(log)}")
        if port is None:
            found = _LISTENING.search(log.read_text(errors="replace"))
            port = int(found.group(1)) if found else None
        if port is not None and _healthy(port):
            return port
        time.sleep(0.1)
    raise ServerFailed(f"llama-server was not ready within {READY_TIMEOUT:.0f} s:\n{_tail(log)}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):  # refused, 503 while loading, reset
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server exits cleanly within a second or two), then SIGKILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
