"""ChatAgent: a tool-calling LLM agent over any OpenAI-compatible server (R1, R8, R18).

Point it at OpenAI, vLLM, Ollama, LM Studio or anything else that speaks
``/v1/chat/completions``: ``model``, ``api_key`` and ``base_url`` come from the arguments
or from ``OPENAI_MODEL`` / ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``. The client's own
retries are off: tether owns retries, back-off and failure fingerprints (R12, R22).

How it stays exactly right under interruption:

- A completion is paid for once. The model's answer is turned into plain actions (R8)
  and committed before any tool runs (``commit_plans``); parallel tool calls in one answer
  wait in the frame's scratch and become separate calls, each with its own resume point
  and idempotency key, without asking the model again.
- A P0 event while the answer streams cancels the request at once. The text received
  so far goes into the dialog marked ``cut_off``, and the next plan sees the interrupt.
- A failing model (HTTP error, timeout, malformed tool arguments) raises, and the
  runner's bounded recovery retries with back-off; the same failure twice goes to a
  person, with the model's error in the bundle (R22, R26).
- Memory (:mod:`tether.agents.memory`) is searched when the prompt is built and sent
  with that one request; it never enters the snapshot or the dialog.
- When the dialog outgrows ``context_tokens``, older turns are summarised by the model
  into ``scratch["summary"]`` (recorded as such, with the rows it covers); the full
  dialog stays in the store.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from tether.agent import Agent, CutOff, TaskView
from tether.agents.memory import Memory
from tether.agents.schemas import tool_schema
from tether.errors import ConfigurationError, TetherError
from tether.model import Action, Finish, Reply, ToolCall, action_from_dict, action_to_dict
from tether.tools import Tool

try:
    from openai import AsyncOpenAI, AsyncStream, OpenAIError
    from openai.types.chat import ChatCompletionChunk
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError("ChatAgent needs the openai client: pip install 'tether[openai]'") from exc

SUMMARY_PROMPT = ("Summarise the conversation so far for your own later use: the task, what was"
                  " decided, what tools returned that still matters, and what is left to do."
                  " Be brief and factual.")


class ModelError(TetherError):
    """The model call failed; the runner retries it with back-off, a repeat goes to a person."""


class ChatAgent(Agent):
    """Plans each step by asking a chat-completions model, with the task's tools offered."""

    commit_plans = True

    def __init__(self, model: str | None = None, *, tools: Sequence[Tool] = (),
                 system: str = "You are a careful assistant. Use the tools when they help.",
                 base_url: str | None = None, api_key: str | None = None,
                 client: AsyncOpenAI | None = None, memory: Memory | None = None,
                 stream: bool = True, timeout: float = 120.0, context_tokens: int = 100_000,
                 keep_recent: int = 12, memory_hits: int = 5) -> None:
        self.model = model or os.environ.get("OPENAI_MODEL") or ""
        if not self.model:
            raise ConfigurationError("ChatAgent needs a model name (model= or OPENAI_MODEL)")
        self.client = client or AsyncOpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            max_retries=0, timeout=timeout)
        self.tools = list(tools)
        self.schemas = [tool_schema(tool) for tool in self.tools]
        self.system = system
        self.memory = memory
        self.stream = stream
        self.timeout = timeout
        self.context_tokens = context_tokens
        self.keep_recent = keep_recent
        self.memory_hits = memory_hits

    async def plan(self, task: TaskView) -> Action:
        queued = task.scratch.get("queued") or []
        if queued:  # the rest of an answer already paid for: no new completion
            task.scratch["queued"] = queued[1:]
            return action_from_dict(queued[0])
        await self._fit_context(task)
        messages = await self._prompt(task)
        text, calls = await self._complete(messages)
        actions: list[Action] = [Reply(text)] if text and calls else []
        actions += [ToolCall(c["name"], c["arguments"]) for c in calls]
        if not actions:
            return Finish(text or "")
        task.scratch["queued"] = [action_to_dict(a) for a in actions[1:]]
        return actions[0]

    # ------------------------------------------------------------------ the prompt

    async def _prompt(self, task: TaskView) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        recalled = await self._recall(task)
        if recalled:
            messages.append({"role": "system", "content": "Things you remember that may help:\n"
                             + "\n".join(f"- {text}" for text in recalled)})
        summary = task.scratch.get("summary")
        if summary:
            messages.append({"role": "system", "content": f"Summary of earlier turns: {summary}"})
        else:
            messages.append({"role": "user", "content": _text(task.input)})
        start = int(task.scratch.get("summary_upto", 0))
        messages += [m for row in list(task.history)[start:] for m in _messages(row)]
        return messages

    async def _recall(self, task: TaskView) -> list[str]:
        if self.memory is None:
            return []
        users = [row.get("content") for row in task.history if row.get("role") == "user"]
        query = _text(users[-1] if users else task.input)
        return [hit.text for hit in await self.memory.search(query, self.memory_hits)]

    async def _fit_context(self, task: TaskView) -> None:
        """Summarise older turns once the dialog outgrows the budget (rough: 4 chars a token)."""
        start = int(task.scratch.get("summary_upto", 0))
        rows = list(task.history)[start:]
        size = sum(len(orjson.dumps(dict(row))) for row in rows) // 4
        if size <= self.context_tokens or len(rows) <= self.keep_recent:
            return
        upto = start + len(rows) - self.keep_recent
        older = [m for row in list(task.history)[start:upto] for m in _messages(row)]
        previous = task.scratch.get("summary")
        prompt = [{"role": "system", "content": SUMMARY_PROMPT},
                  {"role": "user", "content": _text(task.input) if not previous
                   else f"Earlier summary: {previous}"}, *older,
                  {"role": "user", "content": SUMMARY_PROMPT}]
        summary, _ = await self._complete(prompt, offer_tools=False)
        task.scratch["summary"] = summary
        task.scratch["summary_upto"] = upto

    # ------------------------------------------------------------------ the model call

    async def _complete(self, messages: list[dict[str, Any]],
                        offer_tools: bool = True) -> tuple[str, list[dict[str, Any]]]:
        extra: dict[str, Any] = {"tools": self.schemas} if self.schemas and offer_tools else {}
        try:
            async with asyncio.timeout(self.timeout):
                if self.stream:
                    return await self._streamed(messages, extra)
                response = await self.client.chat.completions.create(
                    model=self.model, messages=messages, **extra)  # type: ignore[arg-type]
        except TimeoutError:
            raise ModelError(f"model {self.model} did not answer within {self.timeout}s") from None
        except OpenAIError as exc:
            raise ModelError(f"model {self.model}: {type(exc).__name__}: {exc}") from None
        message = response.choices[0].message
        calls = [_call(c.function.name, c.function.arguments)  # type: ignore[union-attr]
                 for c in message.tool_calls or []]
        return message.content or "", calls

    async def _streamed(self, messages: list[dict[str, Any]],
                        extra: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        stream: AsyncStream[ChatCompletionChunk] = await self.client.chat.completions.create(
            model=self.model, messages=messages, stream=True, **extra)  # type: ignore[arg-type,assignment]
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        try:
            async for chunk in stream:
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                if delta.content:
                    text.append(delta.content)
                for piece in delta.tool_calls or []:
                    slot = calls.setdefault(piece.index, {"name": "", "arguments": ""})
                    if piece.function and piece.function.name:
                        slot["name"] += piece.function.name
                    if piece.function and piece.function.arguments:
                        slot["arguments"] += piece.function.arguments
        except asyncio.CancelledError:
            await stream.close()
            raise CutOff("".join(text)) from None  # a P0: keep what was said so far
        return "".join(text), [_call(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def _call(name: str, arguments: str) -> dict[str, Any]:
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError as exc:
        raise ModelError(f"model sent arguments for {name} that are not JSON ({exc})") from None
    if not isinstance(args, dict):
        raise ModelError(f"model sent arguments for {name} that are not an object: {args!r}")
    return {"name": name, "arguments": args}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dialog row as chat messages (tether's rows are richer than the chat format)."""
    role = row.get("role")
    if "tool_call" in row:
        call = row["tool_call"]
        return [{"role": "assistant", "content": None, "tool_calls": [{
            "id": call["key"], "type": "function",
            "function": {"name": call["name"], "arguments": orjson.dumps(call["args"]).decode()}}]}]
    if role == "tool":
        content = row.get("content") if "error" not in row else f"error: {row['error']}"
        return [{"role": "tool", "tool_call_id": row["key"], "content": _text(content)}]
    if role == "assistant":
        cut = " [cut off: interrupted before the answer was finished]" if row.get("cut_off") else ""
        return [{"role": "assistant", "content": _text(row.get("content")) + cut}]
    if role == "user":
        return [{"role": "user", "content": _text(row.get("content"))}]
    if role == "event":
        return [{"role": "user", "content": f"[{row.get('type')} event] {_text(row.get('content'))}"}]
    return []
