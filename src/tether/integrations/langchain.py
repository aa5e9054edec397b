"""Any LangChain v1 ``create_agent`` agent under tether, in one line (extra ``langchain``)::

    agent = create_agent(ChatOpenAI(model="gpt-4.1-mini"), tools=[lookup, refund])
    h.add_agent("support", LangChainAgent(agent, tools={"lookup": ToolPolicy(idempotent=True)}))

LangGraph's checkpointer is called once per super-step, never when a tool call starts, and all
calls of one answer run inside one ``tools`` node: a saver alone cannot put a resume point
before a call, nor tell "never started" from "ran, result lost". So tether drives the agent's
own compiled graph one model turn at a time instead:

- **A model turn is a committed plan**: the graph runs from the conversation up to its tool
  nodes, so the model node, its middleware (``wrap_model_call``, ``before_model``,
  ``after_model``), retries, structured output and streaming are LangChain's own. The answer
  is recorded before any call runs: a worker killed after it never pays for it again. A P0
  cuts a streamed answer (its text so far kept). The run is kept open between turns
  (:mod:`tether.integrations.langchain_run`): it waits at its tool nodes while tether runs
  the calls and goes on with their results, so a task starts its graph once, not once per
  turn, unless something came between the turns (then a new run starts from the rows).
- **Each tool call is a tether call** (``<agent>.<tool>``, flags from
  :class:`tether.ToolPolicy`, a side effect unless named otherwise), run one at a time by the
  agent's own ``ToolNode`` (so ``wrap_tool_call`` middleware and ``ToolRuntime`` injection
  hold). The key is in ``runtime.config["configurable"][KEY]`` and :func:`current_call`.
- **Reconcile hooks are checked when the agent is made**: a hook takes the tool's own
  arguments, ``async def hook(ctx, order, amount)``, or the model's call, ``async def
  hook(ctx, call_id, args)``; it returns ``None`` (it never happened), the tool's value, or a
  ``ToolMessage`` for the call.
- **Human in the loop**: ``HumanInTheLoopMiddleware(interrupt_on=...)`` becomes a tether wait
  before each call it names, answered by an ``approval`` event (approve, edit with
  ``"args"``, reject, or respond in the tool's place with ``"respond"``, as the middleware
  allows) from the console, the CLI, the API or a webhook, and kept across restarts.
- **The conversation lives in the task's rows**, decoded once and fed only new rows while the
  task runs here; a P1 message reaches the next model turn.

A hand-built graph runs the same way when its state is its ``messages`` and its tools run in
``ToolNode``s: tether runs the calls of every tool node. Any other graph runs under
:class:`tether.integrations.langgraph.LangGraphAgent`, one super-step at a time.
What tether cannot keep is refused when the agent is made (:func:`unmapped`), naming it.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import pydantic_core

from tether.agent import TaskView
from tether.agents import prompt
from tether.agents.base import PENDING, ModelAgent, approval_wait, args_reconciler
from tether.agents.model_calls import ModelError, RetryPolicy
from tether.errors import ConfigurationError, MissingExtra, ResultUnusable
from tether.integrations.langchain_messages import Messages, dumped, messages_of, replayable, text
from tether.integrations.langchain_run import (
    LiveGraph,
    Partial,
    RunGone,
    Stop,
    answering_copy,
    callbacks,
)
from tether.model import Action, Finish, ToolCall
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
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        RemoveMessage,
        ToolMessage,
    )
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.prebuilt import ToolNode, ToolRuntime
    from langgraph.types import Command, StreamMode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the LangChain integration needs langchain and langgraph",
                       "langchain") from exc

__all__ = ["KEY", "LangChainAgent", "current_call", "messages_of", "unmapped"]

KEY = "tether_idempotency_key"
"""The ``config["configurable"]`` (and ``metadata``) entry holding a tool call's key."""
AGAIN = 3
"""Model turns one plan may take when an answer only holds calls that cannot be made."""
ARGUMENTS_QUOTED = 400
DENIED = "The tool call was rejected by a person."
CHANNELS = frozenset({"messages", "jump_to", "structured_response", "hitl_edited_tool_calls",
                      "remaining_steps"})
"""The state a ``create_agent`` graph has of its own (and its human-in-the-loop middleware's,
whose node tether stops before; and ``remaining_steps``, the value LangGraph computes for
``create_react_agent`` from the recursion limit of each run, which tether's own loop bounds
stand for); tether keeps ``messages`` (its rows)."""


class LangChainAgent(ModelAgent):
    """A compiled LangGraph agent as a tether agent (see the module docstring): one made by
    ``create_agent``, or a hand-built graph whose state is its ``messages`` and whose tools
    run in ``ToolNode``s (the ReAct shape). Each model turn enters the graph at ``START``
    with the whole conversation, so ``START`` must lead to the model.
    *context* is the run's ``context`` (the agent's ``context_schema``), given to middleware
    and to tools through ``ToolRuntime``; *config* is merged into every run's config (tags,
    callbacks, ``configurable``); *approval_timeout* bounds a wait for a person (None: none)."""

    input_required = True
    person_may = frozenset({"args", "respond"})  # as the middleware's allowed_decisions say

    def __init__(self, agent: CompiledStateGraph[Any, Any, Any, Any], *,
                 tools: Mapping[str, ToolPolicy] | None = None, context: Any = None,
                 config: Mapping[str, Any] | None = None, stream: bool | None = None,
                 retry: RetryPolicy | None = None, approval_timeout: float | None = None,
                 version: str = "1") -> None:
        super().__init__(retry=retry, stream=stream, version=version)
        problems = list(unmapped(agent))
        if problems:
            raise ConfigurationError("tether cannot run this LangChain agent durably: "
                                     + "; ".join(problems))
        self.graph = agent
        self.tool_nodes = tool_nodes_of(agent)
        self.tools, self.owners = tools_of(self.tool_nodes)
        self.answering = answering_copy(agent, self.tool_nodes)
        self.approvals, self.stops = _approvals(agent)
        self.context = context
        self.config = dict(config or {})
        self.approval_timeout = approval_timeout
        self.policies = self.checked_policies(tools, self.tools, "the agent")
        self.reconcilers: dict[str, ReconcileFn] = {
            name: reconciler(name, self.tools[name], policy.reconcile)
            for name, policy in self.policies.items() if policy.reconcile is not None}

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per LangChain tool of the agent, named ``<agent>.<tool>``."""
        return [self._tool(name) for name in self.tools]

    def _tool(self, name: str) -> Tool:
        async def run(ctx: ToolContext, call_id: str, args: dict[str, Any],
                      approval: dict[str, Any] | None = None) -> dict[str, Any]:
            if approval is not None:
                refused = self._refused(name, approval)
                if refused is not None:
                    return _tool_message(call_id, name, refused, status="error")
                if "respond" in approval:  # the person's answer stands for the tool's
                    return _tool_message(call_id, name, approval["respond"])
                args = approval.get("args", args)
            return await self._run_tool(ctx, name, call_id, args)

        run.__doc__ = f"LangChain tool {name}, run through tether."
        return self.framework_tool(name, run, self.policies.get(name, ToolPolicy()),
                                   self.reconcilers.get(name))

    def _refused(self, name: str, approval: Mapping[str, Any]) -> str | None:
        """Why a person's answer does not let the call run (None: it runs, with the edited
        arguments if they edited it, and the middleware allows edits of this tool)."""
        allowed = self.approvals.get(name, frozenset())
        if "respond" in approval:
            return None if "respond" in allowed and isinstance(approval["respond"], str) else \
                f"The call was not run: answering {name} calls in the tool's place is not" \
                " allowed, or the answer was not text."
        if not approval.get("approved"):
            return str(approval.get("reason") or DENIED)
        if "args" not in approval:
            return None if "approve" in allowed else \
                f"The call was not run: {name} calls may not be approved as they are."
        if "edit" not in allowed:
            return f"The call was not run: editing {name} calls is not allowed."
        if not isinstance(approval["args"], dict):
            return "The call was not run: the edited arguments were not a JSON object."
        return None

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action | list[Action]:
        opening = text(task.input)
        decoded = self.kept(task, lambda: Messages(task.input, f"{self.name}.", opening),
                            opening)
        history = decoded.result()
        live: LiveGraph | None = decoded.live
        results = history[len(live.known):] if live is not None and len(history) == len(
            decoded.messages) and live.continues(decoded, history) else None
        if results is None:
            self.forget(decoded)
        for _ in range(AGAIN):
            state, stopped, seconds, before = await self._turn(decoded, history, results)
            results = None
            final: list[BaseMessage] = list(state.get("messages") or [])
            new = _added(before, final)
            answer = next((m for m in reversed(new) if isinstance(m, AIMessage)), None)
            structured = state.get("structured_response")
            if answer is None and structured is None:
                self.forget(decoded)
                raise ModelError(f"agent {self.name}: a run of its graph added no model answer"
                                 f" (it added {len(new)} other messages); tether runs graphs"
                                 " in which a node asks the model")
            ended = answer is not None and bool(answer.tool_calls) and not stopped
            extra = [] if ended else _unusable_calls(answer, self.tools, new)
            recorded = _recorded(before, final, new)
            _record(task, decoded, answer, [*recorded, *extra], seconds)
            calls = [c for c in (answer.tool_calls if answer is not None and stopped else [])
                     if c["name"] in self.tools and c.get("id")]
            if calls and structured is None and recorded is new and decoded.live is not None:
                assert answer is not None
                decoded.live.hold(final, answer)  # the run waits at its tools for the results
            else:
                self.forget(decoded)
            if structured is not None:  # the model node ended the run, with or without calls
                done = Finish(pydantic_core.to_jsonable_python(structured, fallback=str))
                return [*self._calls(calls), done] if calls else done
            if calls:
                return self._calls(calls)  # the engine holds the answer
            assert answer is not None
            if ended or not (answer.tool_calls or answer.invalid_tool_calls):
                return Finish(answer.text)  # ended with calls: a guard ended it, none is made
            history = [*map(replayable, final), *extra]
        raise ModelError(f"agent {self.name}: {AGAIN} answers in a row held only calls that"
                         " cannot be made")

    def forget(self, decoded: Any) -> None:
        """Leave the graph run kept for a conversation that is dropped, done or not
        continued (after the model request a plan may be waiting for)."""
        live: LiveGraph | None = decoded.live
        if live is not None:
            live.leave()
            decoded.live = None

    def _calls(self, calls: Sequence[Mapping[str, Any]]) -> list[Action]:
        """The calls as tether actions; one the agent's human-in-the-loop middleware names
        waits for an ``approval`` event first."""
        actions: list[Action] = []
        for call in calls:
            args: dict[str, Any] = {"call_id": call["id"], "args": dict(call["args"])}
            if call["name"] in self.approvals:
                actions.append(approval_wait(self.approval_timeout))
                args["approval"] = PENDING
            actions.append(ToolCall(f"{self.name}.{call['name']}", args))
        return actions

    async def _turn(self, decoded: Messages, history: list[BaseMessage],
                    results: list[BaseMessage] | None
                    ) -> tuple[dict[str, Any], bool, float, list[BaseMessage]]:
        """One model turn of the agent's graph: the kept run given *results* (the calls'
        results it waits for), else a new run from *history*. Returns the graph's state when
        it reached tools tether runs (True) or ended (False), the seconds the turn took, and
        the conversation as the run held it before the turn."""
        asked: list[LiveGraph] = []  # the run the newest attempt asked (it may be dropped meanwhile)

        async def once() -> tuple[Stop, list[BaseMessage], bool]:
            nonlocal results
            for _ in range(3):
                live = decoded.live
                if results is not None and live is not None and not live.gone:
                    live.partial.clear()
                    live.resume(results)  # only now: the model is asked once limits allow
                else:
                    live = self._live(decoded, history)
                continued, results = results is not None, None
                asked[:] = [live]
                before = live.known
                try:
                    stop = await live.next_stop()
                except RunGone:
                    continue
                if continued and not stop[1] and not _answered(before, stop[0]):
                    self.forget(decoded)  # the graph ended at its tools: ask from the rows
                    continue
                return stop, before, live.streamed and not live.partial.heard
            raise ModelError(f"agent {self.name}: its graph run ended before it asked the model")

        def partial() -> str:
            return asked[0].partial.text() if asked else ""

        ((state, stopped), before, silent), seconds = await self.request(
            once, f"agent {self.name}", partial)
        if silent:
            self.learn_streams_nothing()  # LangChain asked the model plainly: it cannot stream
        return state, stopped, seconds, before

    def _live(self, decoded: Messages, history: list[BaseMessage]) -> LiveGraph:
        """A new kept run of the agent's graph from *history*, for *decoded*."""
        self.forget(decoded)
        partial = Partial()
        config = self._config(None)
        modes: list[StreamMode] = ["values", "updates"]
        if self.streams():  # the model's tokens, as it hands them over, before any queue
            modes.append("messages")
            config["callbacks"] = [*callbacks(config), partial]
        live = decoded.live = LiveGraph(self.answering, history, config, self.context,
                                        self.stops, modes, decoded, partial)
        return live

    def _config(self, key: str | None) -> RunnableConfig:
        config = cast(RunnableConfig, dict(self.config))
        if key is not None:
            config["configurable"] = {**config.get("configurable", {}), KEY: key}
            config["metadata"] = {**config.get("metadata", {}), KEY: key}
        return config

    # ------------------------------------------------------------------ tools

    async def _run_tool(self, ctx: ToolContext, name: str, call_id: str,
                        args: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call as the agent's ``ToolNode`` runs each of its calls (its
        ``wrap_tool_call`` middleware, ``ToolRuntime`` injection, its error handling), without
        the node's own run around it; returns the ``ToolMessage`` as plain data."""
        call: Any = {"name": name, "args": dict(args), "id": call_id, "type": "tool_call"}
        node = self.tool_nodes[self.owners[name]]
        runtime: ToolRuntime[Any, Any] = ToolRuntime(
            state={"messages": []}, tool_call_id=call_id, config=self._config(ctx.idempotency_key),
            context=self.context, store=self.graph.store, stream_writer=_unstreamed,
            tools=list(node.tools_by_name.values()))
        with running(ctx):
            output = await node._arun_one(call, "dict", runtime)
        message = only_message(output, name, call_id)
        decoded: Messages | None = self.dialogs.get(ctx.task_id)
        if decoded is None:
            return dumped(message)
        return decoded.recorded([message])[0]  # the result's row, fed to the next plan


# ---------------------------------------------------------------------------- the graph


def unmapped(agent: Any) -> Iterator[str]:
    """What tether cannot keep of *agent*, each named (an empty iterator: it runs as is)."""
    if not isinstance(agent, CompiledStateGraph):
        yield (f"{type(agent).__name__} is not a compiled LangGraph graph (make it with"
               " langchain.agents.create_agent, or compile a StateGraph)")
        return
    if "messages" not in agent.channels:
        yield "its state has no messages: tether runs graphs whose state is a conversation"
    if agent.checkpointer not in (None, False):
        yield ("it has a checkpointer: tether keeps the conversation and the resume points;"
               " build it with create_agent(...) without checkpointer=")
    extra = sorted(c for c in agent.channels if c not in CHANNELS and not c.startswith(
        ("__", "branch:")))
    if extra:
        yield (f"its state has {', '.join(extra)} beside messages, which tether does not keep"
               " between model turns")
    for tool_node in tool_nodes_of(agent).values():
        yield from (f"tool {name} returns a Command (graph state tether does not keep)"
                    for name, tool in tool_node.tools_by_name.items() if _returns_command(tool))
    for node in agent.nodes:
        if node.endswith((".before_agent", ".after_agent")):
            yield (f"middleware hook {node} runs once per run, but tether runs the graph once"
                   " per model turn")
    yield from _unmapped_approvals(agent)


def _unmapped_approvals(agent: CompiledStateGraph[Any, Any, Any, Any]) -> Iterator[str]:
    """What of the human-in-the-loop middleware tether cannot stand in for: asking per call
    inside the tool node, and other ``after_model`` hooks that would run after it (tether
    stops the graph before it, so they would never run). ``after_model`` hooks run in the
    reverse of the middleware list: the middleware must come first among those that have
    one."""
    after_model = [n.removesuffix(".after_model") for n in agent.nodes
                   if n.endswith(".after_model")]
    for middleware in _middleware(agent):
        if not isinstance(middleware, HumanInTheLoopMiddleware):
            continue
        if getattr(middleware, "interrupt_mode", None) == "per_call":
            yield (f"{middleware.name} asks per call (interrupt_mode="
                   f"{middleware.interrupt_mode!r}) inside the tool node; use the default")
        ahead = after_model[:after_model.index(middleware.name)] \
            if middleware.name in after_model else []
        if ahead:
            yield (f"middleware {', '.join(ahead)} has an after_model hook that runs after"
                   f" {middleware.name}'s, before which tether stops the graph; list"
                   f" {middleware.name} before it")


def tool_nodes_of(agent: CompiledStateGraph[Any, Any, Any, Any]) -> dict[str, ToolNode]:
    """The graph's ``ToolNode``s by node name: tether stops the graph before them and runs
    their calls itself, one tether call each."""
    bound = {name: getattr(node, "bound", None) for name, node in agent.nodes.items()}
    return {name: node for name, node in bound.items() if isinstance(node, ToolNode)}


def _returns_command(tool: BaseTool) -> bool:
    """Whether *tool*'s function says it returns LangGraph's ``Command``."""
    func = getattr(tool, "coroutine", None) or getattr(tool, "func", None)
    try:
        returned = typing.get_type_hints(func).get("return") if func is not None else None
    except Exception:  # hints that do not resolve say nothing either way
        return False
    return returned is Command or typing.get_origin(returned) is Command


def tools_of(nodes: Mapping[str, ToolNode]) -> tuple[dict[str, BaseTool], dict[str, str]]:
    """Every tool of the graph's tool nodes by name, and the node that runs it."""
    tools: dict[str, BaseTool] = {}
    owners: dict[str, str] = {}
    for node, tool_node in nodes.items():
        for name, tool in tool_node.tools_by_name.items():
            if tools.setdefault(name, tool) is not tool:
                raise ConfigurationError(f"tool nodes {owners[name]!r} and {node!r} have"
                                         f" different tools named {name!r}; tether registers"
                                         " one tool per name, so rename one")
            owners[name] = node
    return tools, owners


def _approvals(agent: CompiledStateGraph[Any, Any, Any, Any]
               ) -> tuple[dict[str, frozenset[str]], list[str]]:
    """The tools the agent's human-in-the-loop middleware names (each call waits for a
    person) with the decisions it allows, and that middleware's nodes, which the graph is
    stopped before (tether waits instead of LangGraph's ``interrupt``)."""
    allowed: dict[str, frozenset[str]] = {}
    stops: list[str] = []
    for middleware in _middleware(agent):
        if isinstance(middleware, HumanInTheLoopMiddleware):
            for name, on in middleware.interrupt_on.items():
                if on:
                    decisions = on.get("allowed_decisions") if isinstance(on, Mapping) else None
                    allowed[name] = frozenset(decisions or ("approve", "edit", "reject",
                                                            "respond"))
            stops += [n for n in agent.nodes if n.startswith(f"{middleware.name}.")]
    return allowed, stops


def _middleware(agent: CompiledStateGraph[Any, Any, Any, Any]) -> Iterator[Any]:
    """The middleware instances behind the graph's middleware nodes."""
    seen: set[int] = set()
    for name, node in agent.nodes.items():
        if "." not in name:
            continue
        func = getattr(getattr(node, "bound", None), "func", None) or \
            getattr(getattr(node, "bound", None), "afunc", None)
        owner = getattr(func, "__self__", None)
        if owner is not None and id(owner) not in seen:
            seen.add(id(owner))
            yield owner


def _answered(before: Sequence[BaseMessage], state: Mapping[str, Any]) -> bool:
    """Whether a run's *state* holds a model answer after the conversation *before*."""
    return any(isinstance(m, AIMessage) for m in _added(before, state.get("messages") or []))


def _added(history: Sequence[BaseMessage], messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages a turn added to *history* (every message of a history has an id): in a
    kept run, those after the very objects of its history, without a pass over their ids."""
    if _same(history, messages):
        return list(messages[len(history):])
    seen = {m.id for m in history}
    return [m for m in messages if m.id not in seen]


def _same(history: Sequence[BaseMessage], messages: Sequence[BaseMessage]) -> bool:
    """Whether *messages* begins with the very objects of *history* (at C speed)."""
    return len(messages) >= len(history) and all(map(operator.is_, history, messages))


def _recorded(history: Sequence[BaseMessage], final: Sequence[BaseMessage],
              new: list[BaseMessage]) -> list[BaseMessage]:
    """What a turn's row records: the messages it added, or, when middleware rewrote the
    history (a summary replacing old messages, a redaction), the whole conversation after
    it, behind ``RemoveMessage(REMOVE_ALL_MESSAGES)`` as LangGraph's reducer writes it."""
    kept = _same(history, final) or (len(final) >= len(history) and all(
        a is b or a == b for a, b in zip(history, final, strict=False)))
    if kept:
        return new
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES), *final]


def _unusable_calls(answer: AIMessage | None, tools: Mapping[str, BaseTool],
                    new: Sequence[BaseMessage]) -> list[BaseMessage]:
    """A tool message for each call of *answer* that cannot be made and that the turn did
    not answer itself (as a structured response's call is): arguments that are not a JSON
    object, or a tool the agent does not have (as LangChain's ToolNode says)."""
    if answer is None:
        return []
    answered = {m.tool_call_id for m in new if isinstance(m, ToolMessage)}
    out: list[BaseMessage] = []
    for bad in (b for b in answer.invalid_tool_calls if b.get("id") not in answered):
        out.append(ToolMessage(
            f"error: the arguments for {bad.get('name')} are not a JSON object, so this call"
            f" was not made. You sent: {prompt.clip(str(bad.get('args')), ARGUMENTS_QUOTED)}",
            tool_call_id=bad.get("id") or "", name=bad.get("name") or "", status="error"))
    for call in answer.tool_calls:
        if call["name"] not in tools and call["id"] not in answered:
            out.append(ToolMessage(f"Error: {call['name']} is not a valid tool, try one of"
                                   f" [{', '.join(sorted(tools))}].", tool_call_id=call["id"] or "",
                                   name=call["name"], status="error"))
    return out


def _record(task: TaskView, decoded: Messages, answer: AIMessage | None,
            messages: list[BaseMessage], seconds: float) -> None:
    plain = decoded.recorded(messages)
    usage: Mapping[str, Any] = (answer.usage_metadata if answer is not None else None) or {}
    meta = answer.response_metadata if answer is not None else {}
    task.record_completion(str(meta.get("model_name") or meta.get("model") or "unknown"),
                           usage={"prompt_tokens": usage.get("input_tokens", 0),
                                  "completion_tokens": usage.get("output_tokens", 0)},
                           finish_reason="tool_calls" if answer is not None and answer.tool_calls
                           else "stop", seconds=seconds, messages=plain)


def _unstreamed(chunk: Any) -> None:
    """A tool's custom stream writes go nowhere: tether runs the call outside a graph run."""


def only_message(output: Any, name: str, call_id: str) -> ToolMessage:
    """The one tool message a ToolNode run of one call gave."""
    messages = output.get("messages") if isinstance(output, Mapping) else output
    if isinstance(messages, ToolMessage):
        messages = [messages]
    if isinstance(messages, list) and len(messages) == 1 and isinstance(messages[0], ToolMessage):
        return messages[0]
    kind = "a Command" if isinstance(output, Command) or (
        isinstance(messages, list) and any(isinstance(m, Command) for m in messages)) \
        else type(output).__name__
    raise ResultUnusable(f"LangChain tool {name} (call {call_id}) ran and returned {kind},"
                         " not one tool message; tether keeps the conversation, not graph"
                         " state a tool updates", output)


# ---------------------------------------------------------------------------- reconcile hooks


def reconciler(name: str, tool: BaseTool, hook: ReconcileFn) -> ReconcileFn:
    """*hook* of the LangChain tool *name*, checked against it now and wrapped as tether's
    tool is called: with the model's call (see :data:`tether.agents.base.ARGS_CALL`)."""
    params = convert_to_openai_tool(tool)["function"].get("parameters") or {}  # the model's
    return args_reconciler("LangChain", name, hook, params, lambda found, call_id, ctx:
                           _found_message(found, name, call_id, hook, ctx.tool))


def _found_message(value: Any, name: str, call_id: str, hook: Any,
                   tether_tool: str) -> dict[str, Any]:
    """What a reconcile hook found, as the call's tool message: a ``ToolMessage`` for this
    call, else the value as the tool's content."""
    if isinstance(value, ToolMessage):
        if value.tool_call_id != call_id:
            raise ConfigurationError(
                f"reconcile hook {hook_name(hook)} of tool {tether_tool!r} returned a"
                f" ToolMessage for call {value.tool_call_id!r}, not for call {call_id!r};"
                " return the tool's value, a ToolMessage for the call, or None if it never"
                " happened")
        return dumped(value)
    return _tool_message(call_id, name, value)


def _tool_message(call_id: str, name: str, content: Any, status: str = "success"
                  ) -> dict[str, Any]:
    said = content if isinstance(content, str) else text(content)
    return dumped(ToolMessage(said, tool_call_id=call_id, name=name, status=status))
