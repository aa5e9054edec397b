"""Any hand-built LangGraph graph as a tether task, one super-step at a time (extra
``langchain``)::

    @tether_tool
    async def charge(order: str, amount: int) -> dict: ...        # called from a plain node

    tools = ToolNode([lookup, refund], awrap_tool_call=through_tether)
    graph = builder.compile()                                       # no checkpointer
    h.add_agent("orders", LangGraphAgent(graph, calls=[charge],
                                         tools={"lookup": ToolPolicy(idempotent=True)}))

LangGraph's checkpointer saves a run once per super-step; an interrupted node runs again
from its first line, and a call it made may be made twice. tether runs the graph itself:

- **Each super-step is a committed step.** A plan runs one super-step from the checkpoint
  the task keeps in its scratch (:mod:`tether.integrations.langgraph_saver`) and commits the
  new one. A worker killed in super-step *n* starts again at super-step *n*: nodes that
  finished are not run again (a finished sibling of an interrupted node neither).
- **Each tool call is a tether call**, with a resume point, a key and a
  :class:`tether.ToolPolicy` (a side effect unless named otherwise): a ``ToolNode`` built
  with ``awrap_tool_call=through_tether``, and a function decorated with
  :func:`tether_tool` that a node calls. Under tether the call suspends the node with
  LangGraph's own ``interrupt()``; tether makes the call, and resumes the node with its
  result, which the node gets where it made the call (the node runs again from its first
  line, as on any LangGraph resume, and every call it made before gets its kept result).
  Outside tether both run as written.
- **A person's ``interrupt()``** in a node becomes a tether wait for an ``approval`` event
  (from the console, the CLI, the API or a webhook); its payload is the node's resume
  value. The question is kept in the dialog; the wait survives restarts.
- The task's result is the graph's output when it ends, as JSON.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, cast

import pydantic_core

from tether.agent import Agent, TaskView
from tether.agents.base import ModelAgent, framework_tool
from tether.agents.prompt import clip
from tether.errors import CallNotMade, ConfigurationError, MissingExtra
from tether.integrations.langchain import only_message, reconciler, tool_nodes_of, tools_of
from tether.integrations.langchain_messages import dumped
from tether.integrations.langgraph_saver import TaskSaver
from tether.model import Action, Continue, Finish, Reply, ToolCall, Wait
from tether.tools import (
    ReconcileFn,
    Tool,
    ToolContext,
    ToolPolicy,
    check_hook,
    in_thread,
    is_async,
    running,
)

try:
    from langchain_core.messages import ToolMessage, messages_from_dict
    from langchain_core.runnables import RunnableConfig
    from langgraph.channels.delta import DeltaChannel
    from langgraph.config import get_config
    from langgraph.constants import START
    from langgraph.errors import GraphInterrupt
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime
    from langgraph.types import Command, Interrupt, StreamMode, interrupt
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the LangGraph integration needs langgraph", "langchain") from exc

__all__ = ["LangGraphAgent", "TetherTool", "tether_tool", "through_tether"]

UNDER = "tether_graph"
"""The ``configurable`` entry that says a graph run is tether's (its calls go through it)."""
CALL = "tether_call"
"""The key of an ``interrupt()`` value that asks tether to make a call."""
QUESTION_QUOTED = 2000
SAVERS_KEPT = 64
"""Tasks whose checkpoint a process keeps loaded between plans (the newest ones)."""
_MAKING: ContextVar[bool] = ContextVar("tether_langgraph_making_call", default=False)
"""Set while tether makes a call itself (the ToolNode's wrapper then lets it through)."""


# ---------------------------------------------------------------------------- the calls


def _under_tether(config: Mapping[str, Any] | None) -> bool:
    return not _MAKING.get() and bool(((config or {}).get("configurable") or {}).get(UNDER))


_ASKED: ContextVar[set[str] | None] = ContextVar("tether_langgraph_asked", default=None)
"""The ids of the interrupts tether's own code raised in the super-step running: only those
are calls to make. (An ``interrupt()`` value is data, and data can be made to look like a
call: one a node raises with a user's text must never make a call.)"""
SKIPPED = "tether_not_made"
"""The key of the answer a node gets for a call a person told tether to skip."""


def _ask(call: dict[str, Any]) -> Any:
    """Suspend the node until tether has made *call*; its result (the node re-runs). A call
    a person skipped raises :class:`tether.CallNotMade` here, in the node."""
    try:
        answer = interrupt({CALL: call})
    except GraphInterrupt as asked:
        seen = _ASKED.get()
        if seen is not None:
            seen.update(i.id for i in asked.args[0] if isinstance(i, Interrupt))
        raise
    if isinstance(answer, Mapping) and set(answer) == {SKIPPED}:
        raise CallNotMade(f"{call.get('function') or call.get('tool')} was not made:"
                          f" {answer[SKIPPED]}")
    return answer


async def through_tether(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
    """``ToolNode(tools, awrap_tool_call=through_tether)``: under :class:`LangGraphAgent`
    each call of the node is a tether call, made once, behind a resume point; elsewhere the
    call runs as written."""
    config = getattr(request.runtime, "config", None)
    call = request.tool_call
    if request.tool is None or not _under_tether(config):
        return await execute(request)  # an unknown tool: the node's own error message
    try:
        answer = _ask({"tool": call["name"], "call_id": call.get("id") or "",
                       "args": dict(call["args"])})
    except CallNotMade as skipped:
        return ToolMessage(str(skipped), tool_call_id=call.get("id") or "", name=call["name"],
                           status="error")
    return _tool_message(answer, call)


def _tool_message(answer: Any, call: Mapping[str, Any]) -> Any:
    """The node's tool message for *answer*: the one the tool returned, or a person's result
    (``decide``) as its content."""
    if isinstance(answer, Mapping) and answer.get("type") == "tool" and "data" in answer:
        return messages_from_dict([dict(answer)])[0]
    content = answer if isinstance(answer, str) else pydantic_core.to_json(
        answer, fallback=str).decode()
    return ToolMessage(content, tool_call_id=call.get("id") or "", name=call["name"])


class TetherTool:
    """A function a graph's node calls, made a tether call when the graph runs under
    :class:`LangGraphAgent` (see :func:`tether_tool`); called directly elsewhere."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        if not callable(fn):
            raise ConfigurationError(f"tether_tool needs a function, not {type(fn).__name__}")
        self.fn = fn
        self.name = name
        self.signature = inspect.signature(fn)
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in self.signature.parameters.values()):
            raise ConfigurationError(f"tether_tool {name!r} takes *args or **kwargs; tether"
                                     " records a call by its named arguments, so name them")
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            config: Mapping[str, Any] | None = get_config()
        except RuntimeError:  # not inside a graph run
            config = None
        if not _under_tether(config):
            return self.fn(*args, **kwargs)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        call = {"function": self.name, "args": dict(bound.arguments)}
        if inspect.iscoroutinefunction(self.fn):
            async def asked() -> Any:
                return _ask(call)
            return asked()
        return _ask(call)


def tether_tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Make a function that a graph's nodes call a tether call under :class:`LangGraphAgent`
    (list it in ``calls=``; name its :class:`tether.ToolPolicy` in ``tools=``). Its
    arguments and result are JSON data; ``async def`` and ``def`` both work."""
    def made(function: Callable[..., Any]) -> TetherTool:
        return TetherTool(function, name or function.__name__)
    return made if fn is None else made(fn)


# ---------------------------------------------------------------------------- the agent


class LangGraphAgent(Agent):
    """A compiled LangGraph graph as a tether agent (see the module docstring). The task's
    input is the graph's input; *context* is each run's ``context``; *config* is merged into
    each run's config; *approval_timeout* bounds a wait for a person (None: none)."""

    commit_plans = True
    input_required = True

    def __init__(self, graph: CompiledStateGraph[Any, Any, Any, Any], *,
                 tools: Mapping[str, ToolPolicy] | None = None,
                 calls: Sequence[TetherTool] = (), context: Any = None,
                 config: Mapping[str, Any] | None = None,
                 approval_timeout: float | None = None, version: str = "1") -> None:
        problems = list(unmapped(graph))
        if problems:
            raise ConfigurationError("tether cannot run this LangGraph graph durably: "
                                     + "; ".join(problems))
        self.graph = graph
        self.version = version
        self.context = context
        self.config = dict(config or {})
        self.approval_timeout = approval_timeout
        self.tool_nodes = tool_nodes_of(graph)
        self.node_tools, self.owners = tools_of(self.tool_nodes)
        self.functions = _functions(calls, self.node_tools)
        self.policies = ModelAgent.checked_policies(
            tools, [*self.node_tools, *self.functions], "the graph")
        self.nodes = [n for n in graph.nodes if n != START]
        self._savers: dict[str, tuple[dict[str, Any], TaskSaver]] = {}

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per tool of the graph's tool nodes and per :func:`tether_tool`
        function, named ``<agent>.<tool>``."""
        return [self._tool(name) for name in [*self.node_tools, *self.functions]]

    def _tool(self, name: str) -> Tool:
        policy = self.policies.get(name, ToolPolicy())
        if name in self.functions:
            run, hook = self._function_call(name), _function_reconciler(
                self.functions[name], policy.reconcile)
        else:
            run, hook = self._node_call(name), _node_reconciler(
                name, self.node_tools[name], policy.reconcile)
        return framework_tool(f"{self.name}.{name}", run, policy, hook)

    def _function_call(self, name: str) -> Callable[..., Any]:
        function = self.functions[name].fn
        call = function if is_async(function) else in_thread(function, f"tool {name}")

        async def run(ctx: ToolContext, interrupt_id: str, args: dict[str, Any]) -> Any:
            with running(ctx):
                value = await call(**args)
            return {"interrupt_id": interrupt_id, "value": value}

        run.__doc__ = f"Function {name} of a LangGraph graph, run through tether."
        return run

    def _node_call(self, name: str) -> Callable[..., Any]:
        async def run(ctx: ToolContext, interrupt_id: str, call_id: str,
                      args: dict[str, Any]) -> Any:
            call = {"name": name, "args": dict(args), "id": call_id, "type": "tool_call"}
            config = cast(RunnableConfig, {**self.config, "configurable": {
                **self.config.get("configurable", {}), "tether_idempotency_key":
                    ctx.idempotency_key}})
            token = _MAKING.set(True)
            try:
                with running(ctx):
                    output = await self.tool_nodes[self.owners[name]].ainvoke(
                        {"__type": "tool_call_with_context", "tool_call": call, "state": {}},
                        config, runtime=Runtime(context=self.context, store=self.graph.store))
            finally:
                _MAKING.reset(token)
            return {"interrupt_id": interrupt_id,
                    "value": dumped(only_message(output, name, call_id))}

        run.__doc__ = f"LangGraph tool {name}, run through tether."
        return run

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action | list[Action]:
        awaiting = task.scratch.pop("awaiting", None)
        answer = _answer(task, awaiting) if awaiting is not None else None
        if answer is _NONE:  # set aside (a newer message), or ended otherwise: ask again
            assert awaiting is not None
            return self._asked(task, awaiting["id"], awaiting["value"], awaiting["kind"] == "call")
        saver = self._saver(task)
        graph = self.graph.copy(update={"checkpointer": saver})
        given = task.input if not saver.started() else \
            Command(resume={awaiting["id"]: answer}) if awaiting is not None else None
        ours: set[str] = set()
        token = _ASKED.set(ours)
        try:
            values, ran, asked, stopped = await self._step(graph, task.task_id, given)
        finally:
            _ASKED.reset(token)
        task.scratch["graph"] = plain = saver.plain()
        self._keep(task.task_id, plain, saver)
        if asked:
            return self._asked(task, asked[0].id, asked[0].value, asked[0].id in ours)
        if not stopped:
            return Finish(_jsonable(values))
        return Continue(note=f"ran {', '.join(ran)}" if ran else "")

    async def check_wait(self, task: TaskView, wait: Mapping[str, Any]) -> Any | None:
        """An approval that arrived after the graph asked, before the wait began (R16): it is
        in the dialog, after the question."""
        awaiting = task.scratch.get("awaiting")
        if not isinstance(awaiting, Mapping) or awaiting.get("kind") != "person":
            return None
        for row in task.history[int(awaiting.get("rows", len(task.history))):]:
            if row.get("role") == "event" and row.get("type") == wait.get("event_type"):
                return row.get("content")
        return None

    def _saver(self, task: TaskView) -> TaskSaver:
        """The task's checkpoint: the saver this process kept from the task's last plan if
        the scratch holds exactly what that plan wrote, else read from the scratch (a load,
        a rollback, a fork, a patch, a plan that failed, another worker's step). Taken out of
        the cache, so a plan that fails leaves nothing stale behind."""
        kept = self._savers.pop(task.task_id, None)
        written = task.scratch.get("graph")
        if kept is not None and written is not None and kept[0] == written:
            return kept[1]
        return TaskSaver.from_plain(written)

    def _keep(self, task_id: str, plain: dict[str, Any], saver: TaskSaver) -> None:
        self._savers[task_id] = (plain, saver)
        while len(self._savers) > SAVERS_KEPT:
            self._savers.pop(next(iter(self._savers)))

    def _config(self, task_id: str) -> RunnableConfig:
        config = cast(RunnableConfig, dict(self.config))
        config["configurable"] = {**config.get("configurable", {}), "thread_id": task_id,
                                  UNDER: True}
        return config

    async def _step(self, graph: CompiledStateGraph[Any, Any, Any, Any], task_id: str,
                    given: Any) -> tuple[Any, list[str], list[Interrupt], bool]:
        """Run one super-step: the graph's output after it, the nodes that finished, the
        interrupts it raised, and whether it stopped (rather than ended)."""
        values: Any = None
        ran: list[str] = []
        asked: list[Interrupt] = []
        stopped = False
        modes: list[StreamMode] = ["values", "updates"]
        async for mode, chunk in graph.astream(given, self._config(task_id),
                                               context=self.context,
                                               interrupt_before=self.nodes, stream_mode=modes,
                                               durability="sync"):
            if mode == "values":
                values = chunk
            elif "__interrupt__" in (updates := cast(dict[str, Any], chunk)):
                stopped = True
                asked += updates["__interrupt__"]
            else:
                ran += [n for n in updates if not n.startswith("__")]
        return values, ran, asked, stopped

    def _asked(self, task: TaskView, interrupt_id: str, value: Any, ours: bool
               ) -> Action | list[Action]:
        """What the graph waits for: a call tether makes (*ours*: tether's own code asked),
        or a person's answer."""
        call = value.get(CALL) if ours and isinstance(value, Mapping) else None
        if isinstance(call, Mapping):
            task.scratch["awaiting"] = {"id": interrupt_id, "kind": "call", "value": value,
                                        "step": task.step}
            if "function" in call:
                return ToolCall(f"{self.name}.{call['function']}",
                                {"interrupt_id": interrupt_id, "args": dict(call["args"])})
            return ToolCall(f"{self.name}.{call['tool']}", {
                "interrupt_id": interrupt_id, "call_id": call["call_id"],
                "args": dict(call["args"])})
        value = _jsonable(value)
        task.scratch["awaiting"] = {"id": interrupt_id, "kind": "person", "value": value,
                                    "seen": _jsonable(task.last_event),
                                    "rows": len(task.history)}
        question = value if isinstance(value, str) else pydantic_core.to_json(value).decode()
        return [Reply(clip(question, QUESTION_QUOTED)),
                Wait("approval", timeout=self.approval_timeout)]


def _jsonable(value: Any) -> Any:
    """*value* as JSON data (bytes as base64, anything else unknown as its text)."""
    return pydantic_core.to_jsonable_python(value, fallback=str, bytes_mode="base64")


_NONE = object()
"""No answer yet: the call or the wait a plan asked for was set aside before it ran."""


def _answer(task: TaskView, awaiting: Mapping[str, Any]) -> Any:
    """The answer to what the last plan asked for, or :data:`_NONE` if it never came.

    A call: once the task's step has moved past it, it was made or settled (the tool ran, a
    reconcile hook or a person said what happened, or a person skipped it); the node gets
    its result, a person's result as given, or :data:`SKIPPED`. Before that, a newer
    message set it aside. A person: only an ``approval`` event (or the wait's timeout, a
    denial: ``False``) answers; a wait ended by anything else asks again."""
    if awaiting["kind"] == "call":
        if task.step <= int(awaiting.get("step", task.step)):
            return _NONE
        error = task.last_tool_error
        if error is not None:
            return {SKIPPED: str(error.get("error") or "a person skipped it")}
        result = task.last_tool_result
        if isinstance(result, Mapping) and set(result) == {"interrupt_id", "value"}:
            return result["value"]
        return result
    event = _jsonable(task.last_event)
    if not isinstance(event, Mapping) or event == awaiting.get("seen") \
            or event.get("type") != "approval":
        return _NONE
    return False if event.get("timeout") else event.get("payload")


# ---------------------------------------------------------------------------- checks


def unmapped(graph: Any) -> Iterator[str]:
    """What tether cannot keep of *graph*, each named (an empty iterator: it runs as is)."""
    if not isinstance(graph, CompiledStateGraph):
        yield f"{type(graph).__name__} is not a compiled LangGraph graph (compile a StateGraph)"
        return
    if graph.checkpointer not in (None, False):
        yield ("it has a checkpointer: tether keeps the graph's checkpoint in the task;"
               " compile it without checkpointer=")
    delta = sorted(n for n, c in graph.channels.items() if isinstance(c, DeltaChannel))
    if delta:
        yield (f"its channels {', '.join(delta)} are DeltaChannels, rebuilt from every"
               " checkpoint before; tether keeps only the newest")
    for name, node in tool_nodes_of(graph).items():
        if getattr(node, "_awrap_tool_call", None) is not through_tether:
            yield (f"tool node {name!r} makes its calls inside the super-step, with no resume"
                   " point before each: build it with ToolNode(tools,"
                   " awrap_tool_call=through_tether) (an agent made by create_agent runs"
                   " under LangChainAgent)")


def _functions(calls: Sequence[Any], node_tools: Mapping[str, Any]) -> dict[str, TetherTool]:
    made: dict[str, TetherTool] = {}
    for call in calls:
        if not isinstance(call, TetherTool):
            raise ConfigurationError(f"calls= takes functions decorated with @tether_tool, not"
                                     f" {type(call).__name__} {call!r:.60}")
        if call.name in made or call.name in node_tools:
            raise ConfigurationError(f"two tools of the graph are named {call.name!r}; tether"
                                     " registers one tool per name, so rename one")
        made[call.name] = call
    return made


def _function_reconciler(function: TetherTool, hook: ReconcileFn | None) -> ReconcileFn | None:
    """*hook*, checked now against the function's own arguments (``hook(ctx, **args)``)."""
    if hook is None:
        return None
    params = function.signature.parameters.values()
    required = [p.name for p in params if p.default is p.empty]
    optional = [p.name for p in params if p.default is not p.empty]
    check_hook(hook, function.name, f"`async def hook(ctx, {', '.join(required + optional)})`",
               required, optional)

    async def reconcile(ctx: ToolContext, interrupt_id: str, args: dict[str, Any]) -> Any:
        found = await hook(ctx, **args)
        return None if found is None else {"interrupt_id": interrupt_id, "value": found}

    return reconcile


def _node_reconciler(name: str, tool: Any, hook: ReconcileFn | None) -> ReconcileFn | None:
    """*hook* of a tool node's tool, as the LangChain adapter checks and shapes it."""
    if hook is None:
        return None
    inner = reconciler(name, tool, hook)

    async def reconcile(ctx: ToolContext, interrupt_id: str, call_id: str,
                        args: dict[str, Any]) -> Any:
        found = await inner(ctx, call_id=call_id, args=args)
        return None if found is None else {"interrupt_id": interrupt_id, "value": found}

    return reconcile
