"""Any PydanticAI agent under tether, in one line (extra ``pydantic-ai``)::

    h.add_agent("support", PydanticAIAgent(agent, tools={"lookup": ToolPolicy(idempotent=True)}))

PydanticAI keeps doing what it is good at: the model, the prompt, tool schemas and argument
validation, output types. tether takes over what happens between those moments, the way it
does for its own agents:

- **Each model request is a planned step**, committed before any tool runs: a worker killed
  anywhere costs no extra completion. One ``plan`` makes one request (more only when
  PydanticAI asks the model again itself, say for output that failed validation), through
  the same in-process retries of transient errors as :class:`tether.agents.ChatAgent`.
- **Each tool call is a tether tool call**: a resume point before it, an idempotency key,
  side-effect and idempotency flags per tool (:class:`tether.ToolPolicy`; a tool not
  named is taken to have a side effect, so a crash mid-call is never followed by a blind
  repeat), ``reconcile`` hooks, retries and fingerprints. The tool still runs through
  PydanticAI's own machinery (argument validation, ``RunContext``, ``ModelRetry``): tether
  hands PydanticAI a history holding just that call and takes the result it produces.
  The key is in ``ctx.metadata["tether_idempotency_key"]``, or from :func:`current_call`.
- **The PydanticAI message history lives in the task**, serialised with PydanticAI's own
  ``ModelMessagesTypeAdapter``: each completion's new messages in its ``model`` dialog row,
  each tool's result parts in its ``tool`` row. Rows are appended, never rewritten; a
  resumed task rebuilds the history from them and never asks the model again for what it
  already answered.
- **Interruptions**: a P0 cancels a streaming request at once and keeps the partial text
  (marked cut off); a P1 user message reaches the next model request as a user prompt.

- **Approval**: a call to a tool marked ``requires_approval`` waits (a ``tt.Wait`` for an
  ``approval`` event, sent from the console, the CLI or a webhook); approved, it runs
  through PydanticAI as approved; denied or timed out, the model is told it was denied.

- **Other toolsets** (an ``MCPToolset`` attached to the agent): their tools are only known
  once the server is asked, so one tether tool, ``<agent>.toolsets``, carries all their
  calls, each under its own key, with one policy (``other_tools=``; by default a side
  effect, so a call cut by a crash is never repeated blindly).

Not yet covered: tools PydanticAI defers to run elsewhere (``CallDeferred``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic_core

from tether.agent import Agent, CutOff, TaskView
from tether.agents.model_calls import ModelError, RetryPolicy, with_retries
from tether.errors import ConfigurationError, MissingExtra
from tether.model import Action, Finish, ToolCall, Wait, action_from_dict, action_to_dict
from tether.tools import KEY_IN_META, Tool, ToolContext, ToolPolicy, current_call, running

try:
    import pydantic_ai
    from pydantic_ai import (
        CallToolsNode,
        DeferredToolResults,
        ModelMessagesTypeAdapter,
        ModelRequestNode,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        UserPromptPart,
    )
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_graph import End
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the PydanticAI integration needs pydantic-ai", "pydantic-ai") from exc

KEY = "tether_idempotency_key"
"""The ``RunContext.metadata`` entry holding a tool call's idempotency key."""
AGAIN = 3
"""Model requests one plan may make when PydanticAI itself asks again (invalid output)."""
CUT = " [cut off: interrupted before the answer was finished]"
OTHER = "toolsets"
"""The tether tool (``<agent>.toolsets``) that runs the tools of the agent's other toolsets."""
__all__ = ["KEY", "PydanticAIAgent", "current_call", "messages_of"]
PENDING = "pending"
"""A queued call's approval before the ``approval`` event came."""

class PydanticAIAgent(Agent):
    """A ``pydantic_ai.Agent`` as a tether agent (see the module docstring)."""

    commit_plans = True
    input_required = True

    def __init__(self, agent: pydantic_ai.Agent[Any, Any], *,
                 tools: Mapping[str, ToolPolicy] | None = None,
                 other_tools: ToolPolicy | None = None, deps: Any = None,
                 stream: bool = True, retry: RetryPolicy | None = None,
                 approval_timeout: float | None = None, version: str = "1") -> None:
        self.agent = agent
        self.deps = deps
        self.stream = stream
        self.retry = retry or RetryPolicy()
        self.approval_timeout = approval_timeout
        """How long a call that needs approval waits for one (None: until it comes); no
        answer in time is a denial."""
        self.version = version
        self.policies = dict(tools or {})
        self.other_tools = other_tools or ToolPolicy()
        """How the tools of the agent's other toolsets (MCP servers, say) are treated: one
        tether tool, ``<agent>.toolsets``, carries them all."""
        for toolset in self._other_toolsets():
            if hasattr(toolset, "process_tool_call"):  # an MCPToolset
                _send_key(toolset)
        names = set(self._function_tools())
        unknown = sorted(set(self.policies) - names)
        if unknown:
            raise ConfigurationError(f"tools= names {', '.join(unknown)}, which the PydanticAI"
                                     f" agent does not have (it has: {', '.join(sorted(names))})")

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per PydanticAI function tool, named ``<agent>.<tool>``, and one,
        ``<agent>.toolsets``, for the tools of its other toolsets (an MCP server's: they are
        only known once the server is asked, while the run goes on)."""
        tools = [self.policies.get(name, ToolPolicy()).tool(self._tool_fn(name),
                                                            f"{self.name}.{name}")
                 for name in self._function_tools()]
        if self._other_toolsets():
            tools.append(self.other_tools.tool(self._toolsets_fn(), f"{self.name}.{OTHER}"))
        return tools

    def _other_toolsets(self) -> list[Any]:
        return [t for t in self.agent.toolsets if not isinstance(t, FunctionToolset)]

    def _toolsets_fn(self) -> Any:
        async def run(ctx: ToolContext, tool: str, tool_call_id: str, args: dict[str, Any]) -> Any:
            return await self._run_tool(ctx, ToolCallPart(tool, args, tool_call_id=tool_call_id))

        run.__doc__ = "A tool of the PydanticAI agent's other toolsets, run through tether."
        return run

    def _function_tools(self) -> dict[str, Any]:
        tools: dict[str, Any] = {}
        for toolset in self.agent.toolsets:
            if isinstance(toolset, FunctionToolset):
                tools.update(toolset.tools)
        return tools

    def _tool_fn(self, name: str) -> Any:
        async def run(ctx: ToolContext, tool_call_id: str, args: dict[str, Any],
                      approval: dict[str, Any] | None = None) -> Any:
            call = ToolCallPart(name, args, tool_call_id=tool_call_id)
            if approval is not None and not approval.get("approved"):
                return [{"part_kind": "tool-return", "tool_name": name,
                         "tool_call_id": tool_call_id, "outcome": "denied",
                         "content": approval.get("reason") or "The tool call was denied."}]
            return await self._run_tool(ctx, call, approved=approval is not None)

        run.__doc__ = f"PydanticAI tool {name}, run through tether."
        return run

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action:
        queued = task.scratch.get("queued") or []
        if queued:  # the rest of an answer already paid for: no new completion
            task.scratch["queued"] = queued[1:]
            return _with_decision(action_from_dict(queued[0]), task)
        history = messages_of(task.history, task.input, f"{self.name}.")
        prompt = None if history else _text(task.input)
        for _ in range(AGAIN):
            response, new, runnable = await self._request(task, history, prompt)
            calls = [part for part in response.parts if isinstance(part, ToolCallPart)
                     and part.tool_name in runnable]
            if calls:
                return self._calls(task, calls)
            history, prompt = [*history, *new], None
            done = await self._settle(history)
            if not isinstance(done, ModelRequest):
                return Finish(pydantic_core.to_jsonable_python(done))
            history.append(done)  # PydanticAI asks again (invalid output, unknown tool)
            task.scratch["carried"] = _dump([done])
        raise ModelError(f"agent {self.name}: PydanticAI asked the model again {AGAIN} times in"
                         " one step without getting an answer it accepts")

    def _calls(self, task: TaskView, calls: list[ToolCallPart]) -> Action:
        """The calls as tether actions; one that needs approval waits for an ``approval``
        event first (a person answers from the console, the CLI or a webhook)."""
        tools = self._function_tools()
        actions: list[Action] = []
        for call in calls:
            args: dict[str, Any] = {"tool_call_id": call.tool_call_id, "args": call.args_as_dict()}
            if call.tool_name not in tools:  # another toolset's (an MCP server's)
                actions.append(ToolCall(f"{self.name}.{OTHER}", {**args, "tool": call.tool_name}))
                continue
            if tools[call.tool_name].requires_approval:
                actions.append(Wait("approval", timeout=self.approval_timeout))
                args["approval"] = PENDING
            actions.append(ToolCall(f"{self.name}.{call.tool_name}", args))
        task.scratch["queued"] = [action_to_dict(a) for a in actions[1:]]
        return actions[0]

    async def _request(self, task: TaskView, history: list[ModelMessage], prompt: str | None
                       ) -> tuple[ModelResponse, list[ModelMessage], set[str]]:
        """One model request from *history*; it and the messages it added are recorded.
        Also returns the names of the tools tether runs (not output tools)."""
        started = time.monotonic()
        response, new, runnable = await with_retries(lambda: self._one_request(history, prompt),
                                                     self.retry, f"agent {self.name}",
                                                     shared=bool(self.limits))
        carried = task.scratch.pop("carried", None) or []
        usage = response.usage
        task.record_completion(response.model_name or "unknown", finish_reason=response.finish_reason,
                               usage={"prompt_tokens": usage.input_tokens,
                                      "completion_tokens": usage.output_tokens},
                               seconds=time.monotonic() - started,
                               messages=[*carried, *_dump(new)])
        return response, new, runnable

    async def _one_request(self, history: list[ModelMessage], prompt: str | None
                           ) -> tuple[ModelResponse, list[ModelMessage], set[str]]:
        streams: list[Any] = []
        try:
            async with self.agent.iter(prompt, message_history=history, deps=self.deps) as run:
                node = run.next_node
                while not isinstance(node, CallToolsNode):
                    if isinstance(node, End):
                        raise ConfigurationError("PydanticAI ended the run before asking the model")
                    if isinstance(node, ModelRequestNode) and self.stream:
                        async with node.stream(run.ctx) as streamed:
                            streams.append(streamed)
                            async for _ in streamed:
                                pass
                    node = await run.next(node)
                tools = run.ctx.deps.tool_manager
                runnable = {d.name for d in tools.tool_defs if d.kind in ("function", "unapproved")}
                return node.model_response, run.all_messages()[len(history):], runnable
        except asyncio.CancelledError:  # a P0 (or a stop), once PydanticAI has unwound
            raise CutOff(_text_of(streams[-1].response) if streams else "") from None

    async def _settle(self, history: list[ModelMessage]) -> Any:
        """Let PydanticAI handle an answer with no function-tool calls: the output (validated,
        through output tools), or the request it makes to ask the model again."""
        async with self.agent.iter(None, message_history=history, deps=self.deps) as run:
            node = run.next_node
            while not isinstance(node, End):
                if isinstance(node, ModelRequestNode):
                    return node.request
                node = await run.next(node)
            return node.data.output

    # ------------------------------------------------------------------ tools

    async def _run_tool(self, ctx: ToolContext, call: ToolCallPart,
                        approved: bool = False) -> list[dict[str, Any]]:
        """Run one call through PydanticAI, from a history holding only that call; returns
        the parts PydanticAI would send back to the model (its return, or a retry)."""
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart("(a tool call run by tether)")]),
            ModelResponse(parts=[call])]
        decided = DeferredToolResults(approvals={call.tool_call_id: True}) if approved else None
        with running(ctx):
            async with self.agent.iter(None, message_history=history, deps=self.deps,
                                       deferred_tool_results=decided,
                                       metadata={KEY: ctx.idempotency_key}) as run:
                node = run.next_node
                while not isinstance(node, ModelRequestNode | End):
                    node = await run.next(node)
        if isinstance(node, End):
            raise ConfigurationError(f"PydanticAI ended the run instead of running {call.tool_name}")
        return _dump([node.request])[0]["parts"]  # type: ignore[no-any-return]


def _send_key(toolset: Any) -> None:
    """Every call an MCP toolset makes carries tether's idempotency key in the request's
    ``_meta`` (:data:`tether.tools.KEY_IN_META`), so a server that deduplicates by it does;
    a ``process_tool_call`` hook the user set still runs, around it."""
    theirs = toolset.process_tool_call

    async def with_key(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        key = (ctx.metadata or {}).get(KEY)

        async def call(name: str, args: dict[str, Any], *,
                       metadata: dict[str, Any] | None = None) -> Any:
            sent = {**(metadata or {}), KEY_IN_META: key} if key else metadata
            return await call_tool(name, args, metadata=sent)

        return await (theirs(ctx, call, name, args) if theirs else call(name, args))

    toolset.process_tool_call = with_key


def _with_decision(action: Action, task: TaskView) -> Action:
    """A call that waited for approval carries the answer: the payload of the ``approval``
    event that ended the wait (``true``/``false``, or ``{"approved": ..., "reason": ...}``);
    a wait that timed out is a denial."""
    if not isinstance(action, ToolCall) or action.args.get("approval") != PENDING:
        return action
    event = dict(task.last_event or {})
    payload = event.get("payload")
    if event.get("timeout"):
        decision = {"approved": False, "reason": "No one approved the call in time."}
    elif isinstance(payload, dict):
        decision = {"approved": bool(payload.get("approved")), "reason": payload.get("reason")}
    else:
        decision = {"approved": payload is True, "reason": None}
    return ToolCall(action.name, {**action.args, "approval": decision})


def _text_of(response: ModelResponse) -> str:
    return "".join(part.content for part in response.parts if isinstance(part, TextPart))


# ---------------------------------------------------------------------------- history


def messages_of(rows: Sequence[Mapping[str, Any]], prompt: Any, prefix: str = ""
                ) -> list[ModelMessage]:
    """The PydanticAI message history a task's dialog rows hold: the messages each
    completion added, the parts each tool returned, and the user's messages and cut-off
    answers in between. *prompt* (the task's input) opens it when no completion recorded
    the opening request (the first answer was cut off)."""
    raw: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, str]] = {}
    for row in rows:
        if "tool_call" in row:
            call = row["tool_call"]
            calls[call["key"]] = (str(call["name"]).removeprefix(prefix),
                                  str((call.get("args") or {}).get("tool_call_id", "")))
            continue
        if (row.get("role") == "model" and row.get("messages")) or row.get("cut_off"):
            if pending:
                raw.append({"kind": "request", "parts": pending})
                pending = []
            raw.extend(row["messages"] if row.get("role") == "model" else [
                {"kind": "response", "parts": [
                    {"part_kind": "text", "content": _text(row.get("content")) + CUT}]}])
            continue
        pending += _parts(row, calls, prefix)
    if pending:
        raw.append({"kind": "request", "parts": pending})
    if raw and raw[0].get("kind") != "request":
        raw.insert(0, {"kind": "request", "parts": [
            {"part_kind": "user-prompt", "content": _text(prompt)}]})
    return ModelMessagesTypeAdapter.validate_python(raw)


def _parts(row: Mapping[str, Any], calls: Mapping[str, tuple[str, str]],
           prefix: str) -> list[dict[str, Any]]:
    """What one other dialog row adds to the next request."""
    role = row.get("role")
    if role == "tool" and "error" in row:
        name, call_id = calls.get(str(row.get("key")),
                                  (str(row.get("name")).removeprefix(prefix), ""))
        return [{"part_kind": "tool-return", "tool_name": name, "tool_call_id": call_id,
                 "content": f"error: {row['error']}", "outcome": "failed"}]
    if role == "tool" and isinstance(row.get("content"), list):
        return list(row["content"])
    if role in ("user", "event"):
        label = "" if row.get("type") in (None, "user_message") else f"[{row.get('type')}] "
        return [{"part_kind": "user-prompt", "content": label + _text(row.get("content"))}]
    return []


def _dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else pydantic_core.to_json(value).decode()
