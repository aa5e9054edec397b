"""ChatAgent: a tool-calling LLM agent over any OpenAI-compatible server (R1, R8, R18, R22).

Point it at OpenAI, vLLM, Ollama, LM Studio, llama.cpp's server or anything else that speaks
``/v1/chat/completions``: ``model``, ``api_key`` and ``base_url`` come from the arguments
or from ``OPENAI_MODEL`` / ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``. The client's own
retries are off: tether owns retries (:mod:`tether.agents.model_calls`).

How it stays exactly right under interruption:

- A completion is paid for once. The model's answer is turned into plain actions (R8)
  and committed before any tool runs (``commit_plans``); parallel tool calls in one answer
  wait in the frame's scratch and become separate calls, each with its own resume point
  and idempotency key, without asking the model again. Each completion is recorded in the
  dialog with its token usage and finish reason (a ``model`` row).
- A P0 event while the answer streams cancels the request at once. The text received
  so far goes into the dialog marked ``cut_off``, and the next plan sees the interrupt.
  A timeout is not a cut: it is a :class:`ModelTimeout`, retried like other transient
  errors.
- Transient model errors are retried in-process (:class:`RetryPolicy`, honouring
  ``Retry-After``); what still fails raises, and the runner's bounded recovery retries
  with back-off; the same failure twice goes to a person (R22, R26).
- Tool calls the model gets wrong (arguments that are not JSON, missing or unknown ones, a
  tool that does not exist) are told back to it as those calls' results, while the valid
  calls of the same answer run; ``corrections`` answers in a row with such calls go to a
  person.
- The tools offered are those in ``tools=`` when a plan starts: a sequence filled later
  (:attr:`tether.integrations.mcp.MCPTools.registered`, filled when an app lifespan enters
  the MCP session) is read again by every plan, and one plan offers and checks one list.
- Memory (:mod:`tether.agents.memory`) is searched when the prompt is built and sent
  with that one request; it never enters the snapshot or the dialog.
- The prompt fits the context (:mod:`tether.agents.prompt`): oversized rows are clipped
  for the prompt, older turns are summarised into ``scratch["summary"]`` in chunks, and a
  server's "prompt too long" lowers the budget and tries again. The dialog stays whole in
  the store.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tether.agent import CutOff, TaskView
from tether.agents import prompt
from tether.agents.base import ModelAgent
from tether.agents.memory import Memory
from tether.agents.model_calls import (
    ContextOverflow,
    ModelTimeout,
    RequestOptions,
    RetryPolicy,
    check_finish,
)
from tether.agents.schemas import tool_schema
from tether.errors import ConfigurationError, MissingExtra, NeedsPerson
from tether.model import Action, Finish, Reply, ToolCall
from tether.tools import Tool

try:
    from openai import AsyncOpenAI, AsyncStream, BadRequestError
    from openai.types.chat import ChatCompletionChunk
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("ChatAgent needs the openai client", "openai") from exc

SHRINKS = 2
"""Times one plan lowers its context budget after a server says the prompt is too long."""
SUMMARY_ROUNDS = 8
"""Chunks of older turns one plan may summarise before asking its question."""


@dataclass
class Answer:
    """One completion, as received: the text, the tool calls it asked for (arguments as the
    raw strings the model sent), why it ended, and what it cost."""

    text: str = ""
    calls: list[dict[str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    seconds: float = 0.0
    """How long it took, retries included (for its ``model`` row)."""


@dataclass(frozen=True)
class Offer:
    """The tools one plan offers the model: what ``tools=`` held when the plan started, and
    how each is described to the model."""

    given: tuple[Tool, ...]
    tools: dict[str, Tool]
    schemas: list[dict[str, Any]]

    @classmethod
    def of(cls, given: Iterable[Tool]) -> Offer:
        tools = tuple(given)
        return cls(tools, {tool.name: tool for tool in tools}, [tool_schema(t) for t in tools])

    def holds(self, tools: Sequence[Tool]) -> bool:
        """Whether *tools* are the very tools this offer was made of (not equal ones)."""
        return len(tools) == len(self.given) and all(
            a is b for a, b in zip(tools, self.given, strict=True))


class ChatAgent(ModelAgent):
    """Plans each step by asking a chat-completions model, with the task's tools offered.

    *tools* is read when each plan starts, so a list filled after the agent is made (an
    :class:`~tether.integrations.mcp.MCPTools`'s ``registered``, entered from an app
    lifespan) is offered as it is then; a tool that cannot be described to a model is
    refused when the agent is made if it is in the list by then, else by the plan.
    """

    input_required = True

    def __init__(self, model: str | None = None, *, tools: Sequence[Tool] = (),
                 system: str = "You are a careful assistant. Use the tools when they help.",
                 base_url: str | None = None, api_key: str | None = None,
                 client: AsyncOpenAI | None = None, memory: Memory | None = None,
                 stream: bool | None = None, timeout: float = 120.0, context_tokens: int = 100_000,
                 keep_recent: int = 12, memory_hits: int = 5,
                 options: RequestOptions | None = None, retry: RetryPolicy | None = None,
                 corrections: int = 2, limits: Sequence[str] = ()) -> None:
        super().__init__(retry=retry, stream=stream, version=self.version)
        self.model = model or os.environ.get("OPENAI_MODEL") or ""
        self.limits = tuple(limits)
        if not self.model:
            raise ConfigurationError("ChatAgent needs a model name (model= or OPENAI_MODEL)")
        if corrections < 0 or timeout <= 0 or keep_recent < 0:
            raise ConfigurationError("ChatAgent: corrections and keep_recent cannot be negative,"
                                     " and timeout must be positive")
        self.client = client or AsyncOpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            max_retries=0, timeout=timeout + 5)  # ours fires first, and says which it was
        self._given: Sequence[Tool] = tools if isinstance(tools, Sequence) else tuple(tools)
        self._offer = Offer.of(self._given)  # described now: a bad tool is refused at once
        self.system = system
        self.memory = memory
        self.timeout = timeout
        self.options = options or RequestOptions()
        self.budget = prompt.ContextBudget(context_tokens, self.options.max_tokens or 0)
        self.keep_recent = keep_recent
        self.memory_hits = memory_hits
        self.corrections = corrections

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools offered now, by name (the ``tools=`` sequence as it is now)."""
        return self.offer().tools

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """How the tools offered now are described to the model (``tools=[...]`` entries)."""
        return self.offer().schemas

    def offer(self) -> Offer:
        """The tools ``tools=`` holds now, described; made again only when they changed."""
        offer = self._offer
        if not offer.holds(self._given):
            offer = self._offer = Offer.of(self._given)
        return offer

    async def plan(self, task: TaskView) -> Action | list[Action]:
        answer, calls = await self._usable_answer(task, self.offer())
        actions: list[Action] = [Reply(answer.text)] if answer.text and calls else []
        actions += [ToolCall(c["name"], c["arguments"]) for c in calls]
        if not actions:
            return Finish(answer.text)
        return actions  # the engine holds the answer: a newer message may set it aside

    async def _usable_answer(self, task: TaskView,
                             offer: Offer) -> tuple[Answer, list[dict[str, Any]]]:
        """An answer and its valid calls (judged by the tools *offer* offered). Calls that
        cannot be made are told back to the model (the ``model`` row's ``rejected``); with
        no valid call left it is asked again at once, up to ``corrections`` times in a row."""
        while True:
            answer = await self._answer(task, offer)
            calls, rejected = self._sort_calls(answer.calls, offer)
            task.record_completion(self.model, usage=answer.usage,
                                   finish_reason=answer.finish_reason,
                                   seconds=answer.seconds, rejected=rejected,
                                   text=answer.text if rejected and not calls else None)
            check_finish(answer.finish_reason, self.model, self.options)
            if not rejected:
                task.scratch.pop("corrections", None)
                return answer, calls
            told = int(task.scratch.get("corrections", 0)) + 1
            task.scratch["corrections"] = told
            if told > self.corrections:
                raise NeedsPerson(f"model {self.model} sent tool calls that cannot be made in"
                                  f" {told} answers in a row; the last: {rejected[0]['error']}")
            if calls:
                return answer, calls  # the valid calls run; the rejected ones were told

    # ------------------------------------------------------------------ tool calls

    def _sort_calls(self, raw: list[dict[str, str]],
                    offer: Offer) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """The calls that can be made, and the others with what is wrong with each."""
        valid, rejected = [], []
        for index, call in enumerate(raw):
            arguments, problem = self._check_call(call["name"], call["arguments"], offer)
            if problem is None:
                valid.append({"name": call["name"], "arguments": arguments})
            else:
                rejected.append({"id": call.get("id") or f"rejected_{index}",
                                 "name": call["name"], "arguments": call["arguments"][:4000],
                                 "error": problem})
        return valid, rejected

    def _check_call(self, name: str, arguments: str,
                    offer: Offer) -> tuple[dict[str, Any], str | None]:
        tool = offer.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(offer.tools)) or "none"
            return {}, f"there is no tool named {name[:100]!r}; the tools are: {known}."
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as exc:
            return {}, f"the arguments for {name} are not valid JSON ({exc})."
        if not isinstance(args, dict):
            return {}, f"the arguments for {name} must be a JSON object, not {type(args).__name__}."
        params = next(s for s in offer.schemas if s["function"]["name"] == name)["function"]
        known_args = params["parameters"].get("properties", {})
        missing = [a for a in params["parameters"].get("required", []) if a not in args]
        unknown = [a for a in args if a not in known_args]
        if missing or unknown:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(a[:50] for a in unknown)}"] if unknown else [])
            return {}, (f"the arguments for {name} do not fit its parameters"
                        f" ({'; '.join(parts)}); it takes: {', '.join(known_args) or 'nothing'}.")
        return args, None

    # ------------------------------------------------------------------ the prompt

    async def _answer(self, task: TaskView, offer: Offer) -> Answer:
        """A completion for the task as it stands, with *offer*'s tools, shrinking the
        prompt if the server says it does not fit."""
        for shrink in range(SHRINKS + 1):
            await self._fit_context(task)
            messages = await self._prompt(task)
            try:
                return await self._complete(messages, offer.schemas)
            except ContextOverflow as overflow:
                if shrink == SHRINKS:
                    raise
                self.budget.learn(overflow, messages)
        raise AssertionError("unreachable: the last shrink returns or raises")

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
            messages.append({"role": "user", "content": prompt.clip(prompt.text(task.input),
                                                                    self.budget.clip_chars)})
        rows = [*list(task.history)[int(task.scratch.get("summary_upto", 0)):],
                *({"role": "model", **record} for record in task.completions)]
        messages += [m for row in rows for m in prompt.messages(row, self.budget.clip_chars)]
        return messages

    async def _recall(self, task: TaskView) -> list[str]:
        if self.memory is None:
            return []
        users = [row.get("content") for row in task.history if row.get("role") == "user"]
        query = prompt.text(users[-1] if users else task.input)
        return [hit.text for hit in await self.memory.search(query, self.memory_hits)]

    async def _fit_context(self, task: TaskView) -> None:
        """Summarise the oldest turns, a chunk at a time, while the dialog outgrows the budget."""
        limit, budget = self.budget.clip_chars, self.budget.prompt_tokens
        for _ in range(SUMMARY_ROUNDS):
            start = int(task.scratch.get("summary_upto", 0))
            rows = list(task.history)[start:]
            size = sum(prompt.tokens(prompt.messages(row, limit)) for row in rows)
            chunk = prompt.oldest_chunk(rows, self.keep_recent, budget, limit)
            if size <= budget or chunk == 0:
                return
            older = [m for row in rows[:chunk] for m in prompt.messages(row, limit)]
            request = prompt.summary_request(task.scratch.get("summary"), task.input, older)
            answer = await self._complete(request, [])
            task.record_completion(self.model, usage=answer.usage, seconds=answer.seconds,
                                   finish_reason=answer.finish_reason)
            task.scratch["summary"] = answer.text
            task.scratch["summary_upto"] = start + chunk

    # ------------------------------------------------------------------ the model call

    async def _complete(self, messages: list[dict[str, Any]],
                        schemas: list[dict[str, Any]]) -> Answer:
        """One completion, offering the tools *schemas* describe (none: a summary)."""
        fields = self.options.fields(schemas, self.streams())
        answer, seconds = await self.request(lambda: self._attempt(messages, fields),
                                             f"model {self.model}")
        answer.seconds = seconds
        return answer

    async def _attempt(self, messages: list[dict[str, Any]], fields: dict[str, Any]) -> Answer:
        """One request, within the timeout."""
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                if self.streams():
                    try:
                        return await self._streamed(messages, fields, deadline)
                    except BadRequestError as error:  # "'stream' is not supported"
                        if "stream" not in str(error).lower() \
                                or not self.learn_cannot_stream(error):
                            raise
                        fields = {k: v for k, v in fields.items()
                                  if k not in ("stream", "stream_options")}
                response = await self.client.chat.completions.create(
                    model=self.model, messages=messages, **fields)  # type: ignore[arg-type]
        except TimeoutError:
            raise ModelTimeout(f"model {self.model} did not answer within {self.timeout}s"
                               ) from None
        choice = response.choices[0]
        calls = [{"id": c.id, "name": c.function.name,  # type: ignore[union-attr]
                  "arguments": c.function.arguments or ""}  # type: ignore[union-attr]
                 for c in choice.message.tool_calls or []]
        usage = response.usage.model_dump(include=USAGE_FIELDS) if response.usage else None
        return Answer(choice.message.content or "", calls, choice.finish_reason, usage)

    async def _streamed(self, messages: list[dict[str, Any]], fields: dict[str, Any],
                        deadline: asyncio.Timeout) -> Answer:
        stream: AsyncStream[ChatCompletionChunk] = await self.client.chat.completions.create(
            model=self.model, messages=messages, **fields)  # type: ignore[arg-type,assignment]
        answer = Answer()
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        try:
            async for chunk in stream:
                _take_chunk(chunk, answer, text, calls)
        except asyncio.CancelledError:
            await stream.close()
            if deadline.expired():  # our timeout, not a P0: say so, without the partial text
                raise ModelTimeout(f"model {self.model} did not finish its answer within"
                                   f" {self.timeout}s ({len(''.join(text))} characters"
                                   " received)") from None
            raise CutOff("".join(text)) from None  # a P0: keep what was said so far
        answer.text = "".join(text)
        answer.calls = [calls[index] for index in sorted(calls)]
        return answer


USAGE_FIELDS = {"prompt_tokens", "completion_tokens", "total_tokens"}


def _take_chunk(chunk: ChatCompletionChunk, answer: Answer, text: list[str],
                calls: dict[int, dict[str, str]]) -> None:
    """Add one streamed chunk to the answer being assembled."""
    if chunk.usage is not None:
        answer.usage = chunk.usage.model_dump(include=USAGE_FIELDS)
    if not chunk.choices:
        return
    choice = chunk.choices[0]
    if choice.finish_reason:
        answer.finish_reason = choice.finish_reason
    if choice.delta.content:
        text.append(choice.delta.content)
    for piece in choice.delta.tool_calls or []:
        slot = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
        slot["id"] = slot["id"] or piece.id or ""
        if piece.function and piece.function.name:
            slot["name"] += piece.function.name
        if piece.function and piece.function.arguments:
            slot["arguments"] += piece.function.arguments
