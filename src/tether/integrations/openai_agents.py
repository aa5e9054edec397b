"""Any OpenAI Agents SDK agent under tether, in one line (extra ``openai-agents``)::

    h.add_agent("support", OpenAIAgentsAgent(agent, tools={"lookup": ToolPolicy(idempotent=True)}))

The SDK keeps instructions, tool schemas, handoffs, output types, guardrail functions and its
provider's ``Model``; tether replaces the ``Runner`` loop between them, so a crash costs neither
a second completion nor a second side effect:

- **A model call is a committed plan**: the ``get_response`` (or ``stream_response``) call the
  Runner would make, with its arguments, retried in-process like ChatAgent's.
- **A function tool call is a tether call** (``<agent>.<tool>``, flags from
  :class:`tether.ToolPolicy`, a side effect unless named otherwise) run by the tool's own
  ``on_invoke_tool``; the key is in ``ctx.run_config.trace_metadata[KEY]`` or
  :func:`current_call`. A ``@function_tool`` turns its exceptions into a message to the model
  (the call succeeds); give it ``failure_error_function=None`` for tether's retries instead.
- **Reconcile hooks are checked when the agent is made**, not at crash time: a hook takes
  the tool's arguments, ``async def hook(ctx, order, amount)`` (as the PydanticAI
  integration's and tether's own tools' do), or the model's call as tether's tool gets it,
  ``async def hook(ctx, call_id, arguments)`` (the arguments as the model's JSON text);
  which one is read from its signature, and one that fits neither (or is not async) is
  refused, naming the tool. It returns ``None`` (it never happened), the tool's value
  (made into the call's output as a run of the tool would), or a ``function_call_output``
  item for the call; one that cannot be used sends the task to a person, naming the hook.
- **A handoff is a frame on the task stack** (``Spawn``); ``on_handoff`` runs in the plan, so
  again only if the worker dies before the plan is committed. **Input guardrails** are one
  tether call before the first model call; a tripwire fails the task.
- **The conversation lives in the task's** ``model`` and ``tool`` rows, rebuilt by every plan;
  a P0 cuts a streamed answer (its partial text kept), a P1 message reaches the next call.

What tether does not map yet is refused at start-up (:func:`_unmapped`), not silently skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pydantic_core

from tether import dialog
from tether.agent import DialogPosition, TaskView
from tether.agents import prompt
from tether.agents.base import ModelAgent, hook_takes_call
from tether.agents.model_calls import ModelError, RequestOptions, RetryPolicy, check_finish
from tether.errors import ConfigurationError, MissingExtra, NeedsPerson
from tether.model import Action, Fail, Finish, Spawn, ToolCall
from tether.tools import (
    ReconcileFn,
    Tool,
    ToolContext,
    ToolPolicy,
    current_call,
    hook_name,
    running,
)

try:
    import agents
    from agents import Agent as SDKAgent
    from agents import FunctionTool, Handoff, ItemHelpers, ModelResponse, RunConfig
    from agents.run_internal import turn_preparation as prepare
    from agents.tool import invoke_function_tool
    from agents.tool_context import ToolContext as SDKToolContext
    from agents.tracing.model_tracing import get_model_tracing_impl
    from openai.types.responses import ResponseFunctionToolCall
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the OpenAI Agents SDK integration needs openai-agents", "openai-agents") from exc

KEY = "tether_idempotency_key"
"""The ``ToolContext.run_config.trace_metadata`` entry holding a tool call's key."""
HANDOFF = "tether_handoff"
"""The ``Spawn`` input entry naming a handoff (from, to, call_id)."""
AGAIN = 3
"""Model calls one plan may make when an answer only holds calls that cannot be made."""
SKIPPED = "skipped: a person decided this call is not made"
ARGUMENTS_QUOTED = 400
"""How much of a call's unparsable arguments its error quotes back to the model."""
NOT_MADE = "error: this call was not made (its plan was dropped)"
CALL = ("call_id", "arguments")
"""The arguments of tether's tool for an SDK tool: a reconcile hook that takes these gets
the model's call, else it gets the tool's own arguments."""
__all__ = ["KEY", "OpenAIAgentsAgent", "current_call", "items_of"]
HOSTED = (agents.FileSearchTool, agents.WebSearchTool, agents.HostedMCPTool,
          agents.CodeInterpreterTool, agents.ImageGenerationTool, agents.ToolSearchTool)
"""Tools the provider runs itself: nothing to make durable on this side."""

@dataclasses.dataclass
class _Turn:
    """What one model call is made with, resolved the way the SDK's Runner resolves it."""

    agent: SDKAgent[Any]
    ctx: agents.RunContextWrapper[Any]
    model: agents.Model
    args: dict[str, Any]
    tools: dict[str, FunctionTool]
    handoffs: dict[str, Handoff[Any, Any]]
    output_schema: agents.AgentOutputSchemaBase | None


class OpenAIAgentsAgent(ModelAgent):
    """An ``agents.Agent`` (and the agents it hands off to) as a tether agent (see the module
    docstring). *context* is the SDK's run context object, given to tools and guardrails."""

    input_required = True

    def __init__(self, agent: SDKAgent[Any], *, tools: Mapping[str, ToolPolicy] | None = None,
                 run_config: RunConfig | None = None, context: Any = None,
                 stream: bool | None = None, retry: RetryPolicy | None = None,
                 version: str = "1") -> None:
        super().__init__(retry=retry, stream=stream, version=version)
        self.agent = agent
        self.run_config = run_config or RunConfig()
        self.context = context
        self.agents = _agents(agent)
        self.tools, self.owners = _function_tools(self.agents.values())
        _check(self.agents.values(), self.run_config)
        self.policies = self.checked_policies(tools, self.tools, "the SDK agent graph")
        self.reconcilers: dict[str, ReconcileFn] = {
            name: _reconciler(name, self.tools[name], policy.reconcile)
            for name, policy in self.policies.items() if policy.reconcile is not None}
        """Each hook of ``tools=``, checked now and wrapped so that what it returns is checked
        when it returns (see the module docstring)."""

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per SDK function tool, named ``<agent>.<tool>``; and the input
        guardrail check, when the starting agent has input guardrails."""
        tools = [self._tool(name) for name in self.tools]
        if self._guardrails():
            tools.append(ToolPolicy(idempotent=True).tool(self._check_input, self._guard_name))
        return tools

    def _tool(self, name: str) -> Tool:
        async def run(ctx: ToolContext, call_id: str, arguments: str) -> dict[str, Any]:
            return await self._run_tool(ctx, name, call_id, arguments)

        run.__doc__ = f"Agents SDK tool {name}, run through tether."
        return self.framework_tool(name, run, self.policies.get(name, ToolPolicy()),
                                   self.reconcilers.get(name))

    @property
    def _guard_name(self) -> str:
        return f"{self.name}:input_guardrails"

    def _guardrails(self) -> list[Any]:
        return [*self.agent.input_guardrails, *(self.run_config.input_guardrails or [])]

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action | list[Action]:
        if _handoff_ended(task):  # the target's frame has ended: its outcome is ours
            return Fail(task.child_error) if task.child_error else Finish(task.child_result)
        checked = self._guard(task)
        if checked is not None:
            return checked
        items = self._items(task)
        used = any(item.get("type") == "function_call_output" for item in items)
        turn = await self._turn(self._active(task), used)
        for _ in range(AGAIN):
            response, seconds = await self._request(turn, items)
            extra: list[dict[str, Any]] = []
            try:
                action = await self._act(task, turn, response, extra)
            finally:
                _record(task, turn.model, response, seconds, extra)
            if action is not None:
                return action
            items = [*items, *_replayable(_plain(response.to_input_items())), *extra]
        raise ModelError(f"agent {self.name}: {AGAIN} answers in a row held only calls of tools"
                         f" that {turn.agent.name!r} does not have")

    def _items(self, task: TaskView) -> list[dict[str, Any]]:
        value = _input(task)
        key = _text(value)
        return self.kept(task, lambda: Items(_opening(value), f"{self.name}.", key), key).result()

    def _active(self, task: TaskView) -> SDKAgent[Any]:
        handoff = _handoff_of(task.input)
        if handoff is None:
            return self.agent
        task.scratch["active_agent"] = handoff["to"]
        return self.agents[handoff["to"]]

    def _guard(self, task: TaskView) -> Action | None:
        """The input guardrail check before the first model call; a tripwire fails the task."""
        if not self._guardrails() or _handoff_of(task.input) or task.scratch.get("guarded"):
            return None
        outcome = task.last_tool_result if task.scratch.get("guarding") else None
        if not isinstance(outcome, dict) or "input_guardrails" not in outcome:
            task.scratch["guarding"] = True
            return ToolCall(self._guard_name, {"input": _input(task)})
        task.scratch["guarded"] = True
        for result in outcome["input_guardrails"]:
            if result["tripwire_triggered"]:
                return Fail(f"input guardrail {result['guardrail']!r} tripped:"
                            f" {_text(result['output_info'])}")
        return None

    async def _check_input(self, ctx: ToolContext, input: Any) -> dict[str, Any]:
        """Run every input guardrail of the starting agent (and the run config) on *input*."""
        wrapper: agents.RunContextWrapper[Any] = agents.RunContextWrapper(context=self.context)
        results = await asyncio.gather(*(g.run(self.agent, input, wrapper)
                                         for g in self._guardrails()))
        return {"input_guardrails": [
            {"guardrail": r.guardrail.get_name(), "tripwire_triggered": r.output.tripwire_triggered,
             "output_info": pydantic_core.to_jsonable_python(r.output.output_info, fallback=str)}
            for r in results]}

    async def _turn(self, agent: SDKAgent[Any], used_tools: bool) -> _Turn:
        """Model, settings, instructions, tools, handoffs and output schema, as the Runner
        assembles them for ``get_response`` (``tool_choice`` dropped once tools were used,
        when the agent asks for that, so a forced choice does not loop)."""
        ctx: agents.RunContextWrapper[Any] = agents.RunContextWrapper(context=self.context)
        tools = await agent.get_all_tools(ctx)
        handoffs = await prepare.get_handoffs(agent, ctx)
        settings = prepare.get_model_settings(agent, self.run_config)
        if settings.include_usage is None:  # as ChatAgent does: a task's cost is known
            settings = dataclasses.replace(settings, include_usage=True)
        if agent.reset_tool_choice and used_tools and settings.tool_choice is not None:
            settings = dataclasses.replace(settings, tool_choice=None)
        schema = prepare.get_output_schema(agent)
        rc = self.run_config
        args = {"system_instructions": await agent.get_system_prompt(ctx),
                "model_settings": settings, "tools": tools, "output_schema": schema,
                "handoffs": handoffs, "previous_response_id": None, "conversation_id": None,
                "tracing": get_model_tracing_impl(rc.tracing_disabled,
                                                  rc.trace_include_sensitive_data),
                "prompt": await agent.get_prompt(ctx)}
        return _Turn(agent, ctx, prepare.get_model(agent, rc), args,
                     {t.name: t for t in tools if isinstance(t, FunctionTool)},
                     {h.tool_name: h for h in handoffs}, schema)

    async def _request(self, turn: _Turn, items: list[dict[str, Any]]
                       ) -> tuple[ModelResponse, float]:
        partial: list[str] = []
        args = {**turn.args, "input": items}

        async def once() -> ModelResponse:
            if not self.streams():
                return await turn.model.get_response(**args)
            partial.clear()
            try:
                return await _streamed(turn.model.stream_response(**args), partial)
            except NotImplementedError as error:  # a model that answers plain requests only
                if not self.learn_cannot_stream(error):
                    raise
                return await turn.model.get_response(**args)

        return await self.request(once, f"agent {self.name}", lambda: "".join(partial))

    async def _act(self, task: TaskView, turn: _Turn, response: ModelResponse,
                   extra: list[dict[str, Any]]) -> Action | list[Action] | None:
        """The actions an answer asks for; None when it only asked for calls that cannot be
        made (each is told why in *extra*, as the SDK's ``return_error_to_model`` does)."""
        calls = [item for item in response.output if isinstance(item, ResponseFunctionToolCall)]
        actions: list[Action] = []
        handoff: Action | None = None
        for call in calls:
            if call.name in turn.tools and prompt.parsed_object(call.arguments) is None:
                extra.append(_output(call.call_id, (
                    f"error: the arguments for {call.name} are not a JSON object, so this call"
                    f" was not made. You sent: {prompt.clip(call.arguments, ARGUMENTS_QUOTED)}")))
            elif call.name in turn.tools:
                actions.append(ToolCall(f"{self.name}.{call.name}",
                                        {"call_id": call.call_id, "arguments": call.arguments}))
            elif call.name in turn.handoffs and handoff is None:
                handoff = await self._handoff(task, turn, call, extra)
            else:
                why = ("Multiple handoffs detected, ignoring this one." if call.name in turn.handoffs
                       else f"Tool {call.name} not found in agent {turn.agent.name}.")
                extra.append(_output(call.call_id, why))
        actions += [handoff] if handoff is not None else []
        if actions:
            return actions  # the engine holds the answer: a newer message may set it aside
        return None if calls else Finish(_final(turn, response))

    async def _handoff(self, task: TaskView, turn: _Turn, call: ResponseFunctionToolCall,
                       extra: list[dict[str, Any]]) -> Action:
        """Hand the conversation to another SDK agent: a frame for it on the task stack."""
        handoff = turn.handoffs[call.name]
        target = await handoff.on_invoke_handoff(turn.ctx, call.arguments)
        if not isinstance(target, SDKAgent) or self.agents.get(target.name) is not target:
            raise ConfigurationError(f"handoff {call.name} of {turn.agent.name!r} went to"
                                     f" {target!r:.80}, which tether did not find among the"
                                     " handoffs when the agent was added")
        extra.append(_output(call.call_id, handoff.get_transfer_message(target)))
        task.scratch["handed_off"] = {"to": target.name, "at": len(task.history)}
        return Spawn(self.name, {HANDOFF: {"from": turn.agent.name, "to": target.name,
                                           "call_id": call.call_id}, "input": _input(task)})

    # ------------------------------------------------------------------ tools

    async def _run_tool(self, ctx: ToolContext, name: str, call_id: str,
                        arguments: str) -> dict[str, Any]:
        """Run one call through the SDK tool's ``on_invoke_tool``; returns the
        ``function_call_output`` item the SDK would send back to the model."""
        tool = self.tools[name]
        call = ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name,
                                        arguments=arguments)
        metadata = {**(self.run_config.trace_metadata or {}), KEY: ctx.idempotency_key}
        sdk_ctx: SDKToolContext[Any] = SDKToolContext(
            self.context, tool_name=name, tool_call_id=call_id, tool_arguments=arguments,
            tool_call=call, agent=self.owners[name],
            run_config=dataclasses.replace(self.run_config, trace_metadata=metadata))
        with running(ctx):
            value = await invoke_function_tool(function_tool=tool, context=sdk_ctx,
                                               arguments=arguments)
        return dict(ItemHelpers.tool_call_output_item(call, value,
                                                      output_json_schema=tool.output_json_schema))


# ---------------------------------------------------------------------------- reconcile hooks


def _reconciler(name: str, tool: FunctionTool, hook: ReconcileFn) -> ReconcileFn:
    """*hook* of the SDK tool *name*, checked against it now (refused with the signatures it
    may have) and wrapped as tether's tool is called: with the model's call. It is given
    the tool's arguments or the call, as its signature says (see :data:`CALL`)."""
    takes_call, properties = hook_takes_call(
        name, hook, tool.params_json_schema or {}, CALL,
        "async def hook(ctx, call_id: str, arguments: str)")

    async def reconcile(ctx: ToolContext, call_id: str, arguments: str) -> Any:
        if takes_call:
            found = await hook(ctx, call_id=call_id, arguments=arguments)
        else:
            args = json.loads(arguments or "{}")
            found = await hook(ctx, **{k: v for k, v in args.items() if k in properties})
        return None if found is None else _found_output(found, call_id, tool, hook, ctx.tool)

    reconcile.__doc__ = f"The reconcile hook {hook_name(hook)} of SDK tool {name}."
    return reconcile


def _found_output(value: Any, call_id: str, tool: FunctionTool, hook: Any,
                  tether_tool: str) -> dict[str, Any]:
    """What a reconcile hook found, as the call's ``function_call_output``: an item for this
    call as it is, else the value made into one as a run of the tool would (its output
    schema too). One that cannot be is refused, naming the hook and the value's type."""
    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"reconcile hook {hook_name(hook)} of tool {tether_tool!r} returned a value of"
            f" type {type(value).__name__}, which cannot be the output of call {call_id!r} ({why});"
            " return the tool's value, a function_call_output item for the call, or None if"
            " it never happened")

    if isinstance(value, Mapping) and value.get("type") == "function_call_output":
        item = {"call_id": call_id, **value}
        if item["call_id"] != call_id or "output" not in item:
            raise refuse(f"it is an output for call {item['call_id']!r}" if "output" in item
                         else "it has no output")
        return dict(pydantic_core.to_jsonable_python(item))
    try:
        return _output(call_id, value, tool.output_json_schema)
    except Exception as error:  # the SDK's own conversion refused it
        raise refuse(f"{type(error).__name__}: {error}") from None


# ---------------------------------------------------------------------------- the agent graph


def _agents(start: SDKAgent[Any]) -> dict[str, SDKAgent[Any]]:
    """The starting agent and every agent reachable through handoffs, by name (a handoff's
    frame names its target, and a resumed task finds the agent by that name)."""
    found: dict[str, SDKAgent[Any]] = {}
    todo = [start]
    while todo:
        agent = todo.pop()
        if found.setdefault(agent.name, agent) is not agent:
            raise ConfigurationError(f"two different SDK agents are named {agent.name!r}; tether"
                                     " finds a handoff's target by name, so rename one")
        todo += [t for t in map(_target, agent.handoffs) if found.get(t.name) is not t]
    return found


def _target(handoff: SDKAgent[Any] | Handoff[Any, Any]) -> SDKAgent[Any]:
    target = handoff if isinstance(handoff, SDKAgent) else \
        handoff._agent_ref() if handoff._agent_ref is not None else None
    if not isinstance(target, SDKAgent):
        raise ConfigurationError(f"handoff {getattr(handoff, 'tool_name', '')}: tether needs its"
                                 " target up front; build it with agents.handoff(agent)")
    return target


def _function_tools(graph: Any) -> tuple[dict[str, FunctionTool], dict[str, SDKAgent[Any]]]:
    """Every function tool of the graph by name (one tether tool each), and its agent."""
    tools: dict[str, FunctionTool] = {}
    owners: dict[str, SDKAgent[Any]] = {}
    for agent in graph:
        for tool in (t for t in agent.tools if isinstance(t, FunctionTool)):
            if tools.setdefault(tool.name, tool) is not tool:
                raise ConfigurationError(f"agents {owners[tool.name].name!r} and {agent.name!r}"
                                         f" have different tools named {tool.name!r}; tether"
                                         " registers one tool per name, so rename one")
            owners[tool.name] = agent
    return tools, owners


def _check(graph: Any, run_config: RunConfig) -> None:
    """Refuse what tether does not map yet, rather than silently run without it."""
    problems = [p for agent in graph for p in _unmapped(agent)]
    problems += ["RunConfig: output guardrails"] if run_config.output_guardrails else []
    problems += ["RunConfig: a handoff input filter"] if run_config.handoff_input_filter else []
    if problems:
        raise ConfigurationError("tether does not map these yet: " + "; ".join(problems))


def _unmapped(agent: SDKAgent[Any]) -> Iterator[str]:
    name = repr(agent.name)
    if agent.mcp_servers:
        yield f"{name}: MCP servers (register them with tether.integrations.mcp)"
    if agent.output_guardrails:
        yield f"{name}: output guardrails"
    if agent.tool_use_behavior != "run_llm_again":
        yield f"{name}: tool_use_behavior={agent.tool_use_behavior!r}"
    for tool in agent.tools:
        if not isinstance(tool, (FunctionTool, *HOSTED)):
            yield f"{name}: {type(tool).__name__} runs here but is not a function tool"
        elif isinstance(tool, FunctionTool) and tool.needs_approval is not False:
            yield f"{name}: tool {tool.name} needs approval"
        elif isinstance(tool, FunctionTool) and (tool.tool_input_guardrails
                                                 or tool.tool_output_guardrails):
            yield f"{name}: tool {tool.name} has tool guardrails"
    yield from (f"{name}: handoff {h.tool_name} has an input filter" for h in agent.handoffs
                if isinstance(h, Handoff) and h.input_filter is not None)


# ---------------------------------------------------------------------------- one answer


async def _streamed(events: AsyncIterator[Any], partial: list[str]) -> ModelResponse:
    """Consume a stream into the response it ends with, keeping its text in *partial*."""
    done: list[Any] = []
    try:
        async for event in events:
            kind = getattr(event, "type", None)
            if kind == "response.output_text.delta":
                partial.append(event.delta)
            elif kind == "response.output_item.done":
                done.append(event.item)
            elif kind == "response.completed":
                final, usage = event.response, event.response.usage
                return ModelResponse(output=list(final.output or done), response_id=final.id,
                                     usage=agents.Usage(requests=1, input_tokens=usage.input_tokens,
                                                        output_tokens=usage.output_tokens)
                                     if usage else agents.Usage(requests=1))
            elif kind in ("response.incomplete", "response.failed", "error", "response.error"):
                raise _stream_failed(event)
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    raise ModelError("the model's stream ended without a final response")


def _stream_failed(event: Any) -> Exception:
    """An unfinished stream as ChatAgent reports an unfinished answer (AnswerCut for the token
    limit, NeedsPerson for a content filter), else a ModelError."""
    reason = getattr(getattr(getattr(event, "response", None), "incomplete_details", None),
                     "reason", None)
    finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(reason or "")
    check_finish(finish, "the model", RequestOptions())
    return ModelError(f"the model's stream ended with {event.type} ({reason or 'no reason'})")


def _final(turn: _Turn, response: ModelResponse) -> Any:
    """The answer's final output, as the SDK makes it: the last message's text, validated
    against the agent's output type when it has one."""
    messages = [item for item in response.output if getattr(item, "type", None) == "message"]
    refusal = ItemHelpers.extract_refusal(messages[-1]) if messages else None
    if refusal:
        raise NeedsPerson(f"agent {turn.agent.name!r}: the model refused ({refusal})")
    text = ItemHelpers.extract_text(messages[-1]) if messages else None
    if turn.output_schema is None or turn.output_schema.is_plain_text():
        return text or ""
    return pydantic_core.to_jsonable_python(turn.output_schema.validate_json(text or ""))


def _record(task: TaskView, model: agents.Model, response: ModelResponse, seconds: float,
            extra: list[dict[str, Any]]) -> None:
    calls = any(isinstance(item, ResponseFunctionToolCall) for item in response.output)
    task.record_completion(str(getattr(model, "model", None) or type(model).__name__),
                           usage={"prompt_tokens": response.usage.input_tokens,
                                  "completion_tokens": response.usage.output_tokens},
                           finish_reason="tool_calls" if calls else "stop", seconds=seconds,
                           messages=[*_plain(response.to_input_items()), *extra])


# ---------------------------------------------------------------------------- history


def items_of(rows: Sequence[Mapping[str, Any]], opening: Sequence[Mapping[str, Any]],
             prefix: str = "") -> list[dict[str, Any]]:
    """The SDK input items a task's dialog rows hold, after *opening* (the task's input): each
    completion's items, each tool's output, and the user's messages and cut-off answers in
    between (see :class:`Items`)."""
    decoded = Items(opening, prefix, "")
    decoded.feed(rows)
    return decoded.result()


class Items:
    """A task's SDK input items, decoded as its rows come: a running task feeds only the rows
    added since its last plan (:meth:`tether.agents.base.ModelAgent.kept`). Providers want
    every call answered before the conversation goes on, so a message that came while calls
    were open follows their outputs, and a call never made (its plan was dropped by a
    person's resume) is answered as such."""

    def __init__(self, opening: Sequence[Mapping[str, Any]], prefix: str, key: str) -> None:
        self.items = [dict(item) for item in opening]
        self.held: list[dict[str, Any]] = []
        self.open_calls: dict[str, None] = {}  # call ids, in order
        self.call_ids: dict[str, str] = {}
        self.prefix = prefix
        self.opening = key
        self.position: DialogPosition | None = None

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in map(dialog.read, rows):
            if isinstance(row, dialog.CallRow):
                if row.name.startswith(self.prefix):
                    self.call_ids[row.key] = str(row.args.get("call_id", ""))
                continue
            if isinstance(row, dialog.Completion) and self.open_calls:  # a dropped plan's calls
                self.items += [*(_output(c, NOT_MADE) for c in self.open_calls), *self.held]
                self.held = []
                self.open_calls.clear()
            self._take(row)

    def _take(self, row: dialog.DialogRow) -> None:
        for item in _items(row, self.call_ids, self.prefix):
            if not isinstance(row, dialog.Completion) and "role" in item and self.open_calls:
                self.held.append(item)
                continue
            self.items.append(item)
            if item.get("type") == "function_call":
                self.open_calls[str(item.get("call_id"))] = None
            elif item.get("type") == "function_call_output":
                self.open_calls.pop(str(item.get("call_id")), None)
        if self.held and not self.open_calls:
            self.items += self.held
            self.held = []

    def result(self) -> list[dict[str, Any]]:
        """The items so far (copies: the SDK may change what it is given)."""
        return [dict(item) for item in (*self.items, *(_output(c, NOT_MADE) for c in
                                                       self.open_calls), *self.held)]


def _items(row: dialog.DialogRow, call_ids: Mapping[str, str],
           prefix: str) -> list[dict[str, Any]]:
    """What one dialog row adds to the conversation."""
    if isinstance(row, dialog.Completion):
        return _replayable(row.messages)
    if isinstance(row, dialog.ReplyRow):
        return [{"role": "assistant", "content": _text(row.text) + dialog.CUT_OFF}] \
            if row.cut_off else []
    if isinstance(row, dialog.ResultRow):
        content = row.content
        if isinstance(content, Mapping) and content.get("type") == "function_call_output":
            return [dict(content)]
        call_id = call_ids.get(row.key)
        if call_id is None or not row.name.startswith(prefix):
            return []  # not a function tool's (the guardrail check, say)
        if row.error is not None:
            return [_output(call_id, f"error: {row.error}")]
        return [_output(call_id, SKIPPED if row.skipped else _text(content))]
    if isinstance(row, dialog.UserRow | dialog.EventRow):
        return [{"role": "user", "content": dialog.spoken(row, _text(row.content))}]
    if isinstance(row, dialog.Decision):
        return [{"role": "user", "content": f"[decide] {_text(row.content)}"}]
    return []


def _opening(value: Any) -> list[dict[str, Any]]:
    """The task's input as SDK input items: a list of items as it is, else a user message."""
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return [dict(item) for item in value]
    return _plain(ItemHelpers.input_to_new_input_list(_text(value)))


def _input(task: TaskView) -> Any:
    """The run's input: the task's, also in a handoff's frame (which carries it along)."""
    value = task.input
    return value["input"] if _handoff_of(value) is not None else value


def _handoff_of(value: Any) -> dict[str, Any] | None:
    return value.get(HANDOFF) if isinstance(value, dict) else None


def _output(call_id: str, value: Any, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``function_call_output`` item, the way the SDK turns a tool's value into one."""
    call = ResponseFunctionToolCall(type="function_call", call_id=call_id, name="", arguments="")
    return dict(ItemHelpers.tool_call_output_item(call, value, output_json_schema=schema))


def _plain(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [dict(item) for item in pydantic_core.to_jsonable_python(list(items))]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else pydantic_core.to_json(value).decode()


def _handoff_ended(task: TaskView) -> bool:
    """Whether a handoff this frame's answer made has run and its frame ended since (a
    ``finish``/``fail`` row after the answer). A newer message may have set the handoff
    aside with the rest of the answer: then the agent plans again."""
    handed = task.scratch.pop("handed_off", None)
    if not isinstance(handed, dict):
        return handed is not None  # format 9: handed off when planned, and run in order
    return any(row.get("role") == "system" and row.get("event") in ("finish", "fail")
               for row in task.history[int(handed.get("at", 0)):])


def _replayable(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Items as a model is sent them again: a function call whose arguments are not a JSON
    object is replayed with ``{}`` (a strict server, llama.cpp's, answers HTTP 500 to every
    request holding one); its output says what the model sent. The row keeps them as sent."""
    out = [dict(item) for item in items]
    for item in out:
        if item.get("type") == "function_call" and \
                prompt.parsed_object(item.get("arguments", "")) is None:
            item["arguments"] = "{}"
    return out
