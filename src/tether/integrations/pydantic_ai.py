"""Any PydanticAI agent under tether, in one line (extra ``pydantic-ai``)::

    h.add_agent("support", PydanticAIAgent(agent, tools={"lookup": ToolPolicy(idempotent=True)}))

PydanticAI keeps doing what it is good at: the model, the prompt, tool schemas and argument
validation, output types. tether takes over what happens between those moments, the way it
does for its own agents:

- **Each model request is a planned step**, committed before any tool runs: a worker killed
  anywhere costs no extra completion. One ``plan`` makes one request (more only when
  PydanticAI asks the model again itself, say for output that failed validation), through
  the same in-process retries of transient errors as :class:`tether.agents.ChatAgent`.
  The requests of a task running in this process go through one PydanticAI run kept open
  between its plans (:mod:`tether.integrations.pydantic_ai_run`), so a tool call costs
  what it costs in a plain ``agent.run``; after a load, a rollback, a fork or a cut the
  run is opened again from the task's rows.
- **Each tool call is a tether tool call**: a resume point before it, an idempotency key,
  side-effect and idempotency flags per tool (:class:`tether.ToolPolicy`; a tool not
  named is taken to have a side effect, so a crash mid-call is never followed by a blind
  repeat), ``reconcile`` hooks, retries and fingerprints. The tool still runs through
  PydanticAI's own machinery (argument validation, ``RunContext``, ``ModelRetry``): in the
  process that planned it, by the tool manager of the plan's step, as a plain run would
  (no second ``agent.iter`` per call; the tool's ``ctx.messages`` is the whole history);
  elsewhere (after a crash, a load, a rollback or a fork) from a history holding just that
  call. Both give the same parts. The key is in ``ctx.metadata["tether_idempotency_key"]``,
  or from :func:`current_call`.
- **Reconcile hooks are checked when the agent is made**, not at crash time. A hook takes
  the tool's arguments, ``async def hook(ctx, order, amount)`` (as the Agents SDK
  integration's and tether's own tools' do), or the model's call as tether's tool gets it,
  ``async def hook(ctx, tool_call_id, args)``; which one is read from its signature, and
  one that fits neither (or is not async) is refused, naming the tool. What it returns is
  checked when it returns: ``None`` (it never happened), PydanticAI's parts for the call,
  or any plain value, which becomes the call's tool return; anything else sends the task
  to a person, naming the hook. So the rebuilt history always answers the call once, and
  the model never asks for it again.
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

- **Deferred tools**: a tool that raises ``CallDeferred`` (its result comes from elsewhere)
  leaves its call waiting, in the store and in no worker's memory (E7), for a ``tool_result``
  event, ``{"tool_call_id": ..., "result": ...}``; the result goes to the model as the
  tool's return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic_core

from tether import dialog
from tether.agent import DialogPosition, TaskView
from tether.agents.base import PENDING, ModelAgent, approval_wait, hook_takes_call
from tether.agents.model_calls import ModelError, RetryPolicy
from tether.errors import ConfigurationError, MissingExtra
from tether.model import Action, Finish, ToolCall, Wait
from tether.tools import (
    KEY_IN_META,
    ReconcileFn,
    Tool,
    ToolContext,
    ToolPolicy,
    check_hook,
    current_call,
    hook_name,
    running,
)

try:
    import pydantic_ai
    from pydantic_ai import (
        DeferredToolRequests,
        DeferredToolResults,
        ModelMessagesTypeAdapter,
        ModelRequestNode,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        ToolCallPart,
        ToolReturn,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_graph import End

    from tether.integrations.pydantic_ai_run import LiveRun, RunGone
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the PydanticAI integration needs pydantic-ai", "pydantic-ai") from exc
try:  # the helpers PydanticAI's graph (its CallToolsNode) makes a settled call's parts with
    from pydantic_ai import _tool_execution as graph
    from pydantic_ai import exceptions as failures
    from pydantic_ai.messages import ToolAvailabilityDeltaPart
    IN_PLACE = all(hasattr(graph, name) for name in (
        "build_tool_return_part", "cancelled_sub_agent_return", "tool_bound_retry_part",
        "_reject_unloaded_capability_reveals"))
    """A call may run through its plan's tool manager (:func:`_run_planned`); False with a
    PydanticAI that lacks those helpers: every call is run from a history."""
except ImportError:  # pragma: no cover - another PydanticAI version
    IN_PLACE = False

KEY = "tether_idempotency_key"
"""The ``RunContext.metadata`` entry holding a tool call's idempotency key."""
AGAIN = 3
"""Model requests one plan may make when PydanticAI itself asks again (invalid output)."""
OTHER = "toolsets"
"""The tether tool (``<agent>.toolsets``) that runs the tools of the agent's other toolsets."""
__all__ = ["KEY", "PydanticAIAgent", "current_call", "messages_of"]
CALL = ("tool_call_id", "args")
"""The arguments of tether's tool for a PydanticAI tool: a reconcile hook that takes these
gets the model's call (the older shape), else it gets the tool's own arguments."""
RETURNS = ("tool-return", "retry-prompt")
"""The parts that answer a tool call (PydanticAI's ``part_kind``)."""
SKIPPED = "skipped: a person decided this call is not made"
DEFERRED = "deferred"
"""What a tool that raised ``CallDeferred`` returns to tether: its call waits for its result."""
DEFERRED_EVENT = "tool_result"
"""The event that answers a deferred call: ``{"tool_call_id": ..., "result": ...}``."""


class PydanticAIAgent(ModelAgent):
    """A ``pydantic_ai.Agent`` as a tether agent (see the module docstring)."""

    input_required = True

    def __init__(self, agent: pydantic_ai.Agent[Any, Any], *,
                 tools: Mapping[str, ToolPolicy] | None = None,
                 other_tools: ToolPolicy | None = None, deps: Any = None,
                 stream: bool | None = None, retry: RetryPolicy | None = None,
                 approval_timeout: float | None = None, version: str = "1") -> None:
        super().__init__(retry=retry, stream=stream, version=version)
        self.agent = agent
        self.deps = deps
        self.approval_timeout = approval_timeout
        """How long a call that needs approval waits for one (None: until it comes); no
        answer in time is a denial."""
        self.policies = dict(tools or {})
        self.other_tools = other_tools or ToolPolicy()
        """How the tools of the agent's other toolsets (MCP servers, say) are treated: one
        tether tool, ``<agent>.toolsets``, carries them all."""
        for toolset in self._other_toolsets():
            if hasattr(toolset, "process_tool_call"):  # an MCPToolset
                _send_key(toolset)
        functions = self._function_tools()
        self.checked_policies(self.policies, functions, "the PydanticAI agent")
        self.reconcilers: dict[str, ReconcileFn] = {
            name: _reconciler(name, functions[name], policy.reconcile)
            for name, policy in self.policies.items() if policy.reconcile is not None}
        """Each hook of ``tools=``, checked now and wrapped so that what it returns is checked
        when it returns (see the module docstring)."""
        if self.other_tools.reconcile is not None:
            self.reconcilers[OTHER] = _toolsets_reconciler(self.other_tools.reconcile)

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per PydanticAI function tool, named ``<agent>.<tool>``, and one,
        ``<agent>.toolsets``, for the tools of its other toolsets (an MCP server's: they are
        only known once the server is asked, while the run goes on)."""
        tools = [self._tool(self.policies.get(name, ToolPolicy()), self._tool_fn(name), name)
                 for name in self._function_tools()]
        if self._other_toolsets():
            tools.append(self._tool(self.other_tools, self._toolsets_fn(), OTHER))
        return tools

    def _tool(self, policy: ToolPolicy, fn: Any, name: str) -> Tool:
        return self.framework_tool(name, fn, policy, self.reconcilers.get(name))

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

    async def plan(self, task: TaskView) -> Action | list[Action]:
        opening = _text(task.input)
        dialog = self.kept(task, lambda: Dialog(opening, f"{self.name}."), opening)
        dialog.planned = None  # only the newest plan's calls may run through its manager
        if dialog.awaiting:  # a tool deferred its call: the model waits for its result
            self.forget(dialog)  # the task parks: a waiting task holds nothing here (E7)
            return Wait(DEFERRED_EVENT, timeout=self.approval_timeout)
        history = dialog.messages()
        prompt = None if history else opening
        if dialog.live is not None and dialog.live.continues(dialog, history) \
                and isinstance(history[-1], ModelRequest):
            dialog.live.continue_with(history[-1])  # the kept run asks with the calls' results
        else:
            self.forget(dialog)
        for _ in range(AGAIN):
            response, new, manager = await self._request(task, dialog, history, prompt)
            runnable = {d.name for d in manager.tool_defs if d.kind in ("function", "unapproved")}
            calls = [part for part in response.parts if isinstance(part, ToolCallPart)
                     and part.tool_name in runnable]
            if calls:
                row = task.completions[-1].get("messages") if task.completions else None
                dialog.planned = None if row is None else Planned(
                    manager, {call.tool_call_id: call for call in calls}, row)
                actions = self._calls(task, calls)
                if any(isinstance(action, Wait) for action in actions):
                    self.forget(dialog)  # it parks for an approval: it holds nothing here (E7)
                return actions
            history, prompt = [*history, *new], None
            done = await self._live(dialog, history, None).settle()
            if isinstance(done, End):
                self.forget(dialog)  # the run is over: leave it
                return Finish(pydantic_core.to_jsonable_python(done.data.output))
            history.append(done)  # PydanticAI asks again (invalid output, unknown tool)
            task.scratch["carried"] = _dump([done])
        raise ModelError(f"agent {self.name}: PydanticAI asked the model again {AGAIN} times in"
                         " one step without getting an answer it accepts")

    def forget(self, decoded: Any) -> None:
        """Leave the run kept for a history that is dropped, done or not continued."""
        live: LiveRun | None = decoded.live
        if live is not None:
            live.close()
            decoded.live = None

    def _calls(self, task: TaskView, calls: list[ToolCallPart]) -> list[Action]:
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
                actions.append(approval_wait(self.approval_timeout))
                args["approval"] = PENDING
            actions.append(ToolCall(f"{self.name}.{call.tool_name}", args))
        return actions  # the engine holds the answer: a newer message may set it aside

    async def _request(self, task: TaskView, dialog: Dialog, history: list[ModelMessage],
                       prompt: str | None) -> tuple[ModelResponse, list[ModelMessage], Any]:
        """One model request from *history*; it and the messages it added are recorded.
        Also returns the run's tool manager, as prepared for the step that made the request."""
        (response, new, manager), seconds = await self.request(
            lambda: self._one_request(dialog, history, prompt), f"agent {self.name}",
            lambda: dialog.live.partial_text() if dialog.live is not None else "")
        carried = task.scratch.pop("carried", None) or []
        usage = response.usage
        task.record_completion(response.model_name or "unknown", finish_reason=response.finish_reason,
                               usage={"prompt_tokens": usage.input_tokens,
                                      "completion_tokens": usage.output_tokens},
                               seconds=seconds, messages=[*carried, *_dump(new)])
        row = task.completions[-1].get("messages") if task.completions else None
        dialog.recorded = (row, list(new)) if row is not None and not carried else None
        return response, new, manager

    async def _one_request(self, dialog: Dialog, history: list[ModelMessage], prompt: str | None
                           ) -> tuple[ModelResponse, list[ModelMessage], Any]:
        """The request through the task's kept run (one is opened from *history* when there
        is none to continue: the first plan here, or after a load, a cut or an error)."""
        for _ in range(2):  # a run left between the plan's look and its request: a new one
            live = self._live(dialog, history, prompt)
            try:
                response, messages, manager = await live.ask(self.streams())
            except RunGone:
                continue
            return response, messages[len(history):], manager
        raise ModelError(f"agent {self.name}: its PydanticAI run ended before it could ask the model")

    def _live(self, dialog: Dialog, history: list[ModelMessage], prompt: str | None) -> LiveRun:
        """The task's kept run, or a new one opened from *history*."""
        if dialog.live is None or dialog.live.gone:
            dialog.live = LiveRun(self.agent, prompt, history, self.deps, dialog)
        return dialog.live

    def can_stream(self) -> bool:
        """A ``FunctionModel`` made without a ``stream_function`` (as PydanticAI's docs write
        them) cannot; it gets plain requests."""
        model = self.agent.model
        return not (isinstance(model, FunctionModel) and model.stream_function is None)

    # ------------------------------------------------------------------ tools

    async def prepare(self, task: TaskView, action: Action) -> Action:
        """The approval, as every model agent's; and a call of this process's newest plan is
        armed to run through that plan's tool manager, but only while the task's rows are the
        ones that plan read, added to (:meth:`tether.agent.HistoryView.since`), its own model
        row among them (the object it recorded): after a load, a rollback or a fork the call
        runs from a history, as in a process that did not plan it."""
        action = await super().prepare(task, action)
        dialog: Dialog | None = self.dialogs.get(task.task_id)
        if dialog is not None and dialog.planned is not None and dialog.position is not None:
            since = task.history.since(dialog.position)
            dialog.planned.arm(action if isinstance(action, ToolCall) else None, since,
                               f"{self.name}.")
        return action

    def _manager_for(self, ctx: ToolContext, call: ToolCallPart) -> Any:
        """The tool manager *call* was armed with by :meth:`prepare` (once), or None."""
        dialog: Dialog | None = self.dialogs.get(ctx.task_id)
        planned = dialog.planned if dialog is not None else None
        if planned is None or planned.armed != call.tool_call_id or not IN_PLACE:
            return None
        planned.armed = None
        known = planned.calls[call.tool_call_id]
        same = known.tool_name == call.tool_name and known.args_as_dict() == call.args_as_dict()
        return planned.manager if same else None

    async def _run_tool(self, ctx: ToolContext, call: ToolCallPart,
                        approved: bool = False) -> list[dict[str, Any]]:
        """Run one call through PydanticAI; returns the parts PydanticAI would send back to
        the model (its return, or a retry). Through the tool manager of the plan that asked
        for it when this process made that plan, else from a history holding only that call."""
        manager = self._manager_for(ctx, call)
        with running(ctx):
            if manager is not None:
                return await _run_planned(manager, call, ctx.idempotency_key, approved)
            return await self._run_from_history(ctx, call, approved)

    async def _run_from_history(self, ctx: ToolContext, call: ToolCallPart,
                                approved: bool) -> list[dict[str, Any]]:
        """The fallback: a run of PydanticAI from a history holding only *call*."""
        history: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart("(a tool call run by tether)")]),
            ModelResponse(parts=[call])]
        decided = DeferredToolResults(approvals={call.tool_call_id: True}) if approved else None
        outputs: Any = [*self._output_types(), DeferredToolRequests]  # a tool may defer its call
        run: Any
        async with self.agent.iter(None, message_history=history, deps=self.deps,
                                   deferred_tool_results=decided, output_type=outputs,
                                   metadata={KEY: ctx.idempotency_key}) as run:
            node = run.next_node
            while not isinstance(node, ModelRequestNode | End):
                node = await run.next(node)
        if isinstance(node, End) and isinstance(node.data.output, DeferredToolRequests):
            deferred = node.data.output
            return _deferred(call, deferred.kind(call.tool_call_id) if callable(
                getattr(deferred, "kind", None)) else "external",
                deferred.metadata.get(call.tool_call_id))
        if isinstance(node, End):
            raise ConfigurationError(f"PydanticAI ended the run instead of running {call.tool_name}")
        return _dump([node.request])[0]["parts"]  # type: ignore[no-any-return]

    def _output_types(self) -> list[Any]:
        declared = self.agent.output_type
        return list(declared) if isinstance(declared, list | tuple) else [declared]


# ---------------------------------------------------------------------------- reconcile hooks


def _reconciler(name: str, tool: Any, hook: ReconcileFn) -> ReconcileFn:
    """*hook* of the PydanticAI tool *name*, checked against it now (refused with the
    signatures it may have) and wrapped as tether's tool is called: with the model's call.
    It is given the tool's arguments or the call, as its signature says (see :data:`CALL`)."""
    takes_call, properties = hook_takes_call(
        name, hook, tool.tool_def.parameters_json_schema or {}, CALL,
        "async def hook(ctx, tool_call_id: str, args: dict[str, Any])")

    async def reconcile(ctx: ToolContext, tool_call_id: str, args: dict[str, Any],
                        approval: dict[str, Any] | None = None) -> Any:
        if isinstance(approval, dict) and not approval.get("approved"):
            return None  # a denied call never ran the tool: it is answered again, as denied
        if takes_call:
            found = await hook(ctx, tool_call_id=tool_call_id, args=args)
        else:
            found = await hook(ctx, **{k: v for k, v in args.items() if k in properties})
        return None if found is None else _tool_return(found, name, tool_call_id, hook, ctx.tool)

    reconcile.__doc__ = f"The reconcile hook {hook_name(hook)} of PydanticAI tool {name}."
    return reconcile


def _toolsets_reconciler(hook: ReconcileFn) -> ReconcileFn:
    """The hook of ``other_tools=``: it carries the tools of several toolsets, so it gets the
    call (``tool``, ``tool_call_id``, ``args``); checked now, its value when it returns."""
    names = ("tool", "tool_call_id", "args")
    check_hook(hook, OTHER, "`async def hook(ctx, tool: str, tool_call_id: str,"
                            " args: dict[str, Any])`", names)

    async def reconcile(ctx: ToolContext, tool: str, tool_call_id: str,
                        args: dict[str, Any]) -> Any:
        found = await hook(ctx, tool=tool, tool_call_id=tool_call_id, args=args)
        return None if found is None else _tool_return(found, tool, tool_call_id, hook, ctx.tool)

    return reconcile


def _tool_return(value: Any, tool_name: str, call_id: str, hook: Any, tool: str
                 ) -> list[dict[str, Any]]:
    """What a reconcile hook found, as the parts that answer the call in the history, as a
    run of the tool would: PydanticAI's own parts (each a ``ModelRequest`` part, or its
    JSON; exactly one tool return or retry prompt, for this call), or a plain value, which
    becomes the tool's return. Anything else is refused, naming the hook and the type: a
    history without the call's return would have the model ask for it again."""
    given = type(value).__name__

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"reconcile hook {hook_name(hook)} of tool {tool!r} returned a value of type"
            f" {given}, which cannot be the return of tool call {call_id!r} ({why});"
            " return the tool's value as plain data, PydanticAI's parts for the call, or None"
            " if it never happened")

    if isinstance(value, ToolReturn):  # what a PydanticAI tool may return itself
        parts: list[Any] = [ToolReturnPart(tool_name, value.return_value, tool_call_id=call_id,
                                           metadata=value.metadata)]
        parts += [UserPromptPart(value.content)] if value.content else []
        value = parts
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not any(_is_part(item) for item in items):
        try:
            content = pydantic_core.to_jsonable_python(value)
        except pydantic_core.PydanticSerializationError as error:
            raise refuse(f"it is not plain data: {error}") from None
        wrapped = ToolReturnPart(tool_name, content, tool_call_id=call_id)
        return _dump([ModelRequest(parts=[wrapped])])[0]["parts"]  # type: ignore[no-any-return]
    if not all(_is_part(item) for item in items):
        raise refuse("it mixes PydanticAI parts with other values")
    raw = [dict(pydantic_core.to_jsonable_python(item)) for item in items]
    for part in raw:
        if part.get("part_kind") in RETURNS:
            part.setdefault("tool_call_id", call_id)
            part.setdefault("tool_name", tool_name)
    answers = [part for part in raw if part.get("part_kind") in RETURNS]
    others = sorted({str(p.get("part_kind")) for p in raw} - {*RETURNS, "user-prompt"})
    if others:
        raise refuse(f"parts of kind {', '.join(others)} do not answer a tool call")
    if [part["tool_call_id"] for part in answers] != [call_id]:
        raise refuse(f"it holds {len(answers)} tool returns or retry prompts, for tool calls"
                     f" {[part['tool_call_id'] for part in answers]}; exactly one, for"
                     f" {call_id!r}, answers the call")
    try:
        [request] = ModelMessagesTypeAdapter.validate_python([{"kind": "request", "parts": raw}])
    except pydantic_core.ValidationError as error:
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"][3:]))  # past the request's own place
        raise refuse(f"PydanticAI does not read them as parts: {where} {first['msg']}") from None
    return _dump([request])[0]["parts"]  # type: ignore[no-any-return]


def _is_part(item: Any) -> bool:
    return isinstance(item, ToolReturnPart | RetryPromptPart | UserPromptPart) or (
        isinstance(item, Mapping) and "part_kind" in item)


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


@dataclasses.dataclass
class Planned:
    """A plan's calls and the tool manager PydanticAI prepared for the step that asked for
    them, kept in memory so that each call runs as a plain run's would: no second
    ``agent.iter`` (a run set up from a history) per tool call."""

    manager: Any
    calls: dict[str, ToolCallPart]
    row: object
    """The messages of the plan's model row, the very object: the rows are still these."""
    armed: str | None = None
    """The call :meth:`PydanticAIAgent.prepare` found at the head of the task's agenda, its
    rows unchanged since the plan: the one call that may run through *manager*, once."""

    def arm(self, action: ToolCall | None, since: Sequence[Mapping[str, Any]] | None,
            prefix: str) -> None:
        """Arm *action* if it is one of these calls as planned (same tool, id and arguments;
        a function tool's: another toolset's, an MCP server's, is left when the run ends)
        and *since*, the rows added since the plan read them (None: other rows), holds the
        plan's own model row."""
        self.armed = None
        known = self.calls.get(str(action.args.get("tool_call_id"))) if action else None
        if action is None or known is None or since is None:
            return
        if action.name == f"{prefix}{known.tool_name}" \
                and action.args.get("args") == known.args_as_dict() \
                and any(row.get("messages") is self.row for row in since):
            self.armed = known.tool_call_id


async def _run_planned(manager: Any, call: ToolCallPart, key: str,
                       approved: bool) -> list[dict[str, Any]]:
    """*call* run by its plan's tool manager, as PydanticAI's graph runs it (the manager
    validates the arguments, runs the hooks and the tool, and makes a ``ModelRetry`` or a
    validation error the retry part), the key in ``ctx.metadata``; the parts are made by
    the graph's own helpers. Returns what :meth:`PydanticAIAgent._run_tool` returns."""
    metadata = {**(manager.ctx.metadata or {}), KEY: key}
    manager = dataclasses.replace(manager, ctx=dataclasses.replace(manager.ctx, metadata=metadata))
    parts: list[Any]
    try:
        value = await manager.handle_call(call, approved=approved)
    except failures.ToolRetryError as retry:
        parts = [graph.tool_bound_retry_part(retry)]
    except failures.ToolFailedError as failed:
        parts = [failed.tool_failed]
    except failures.RunCancelled as cancelled:  # a sub-agent run cancelled itself, not this one
        parts = [graph.cancelled_sub_agent_return(call, cancelled)]
    except (failures.CallDeferred, failures.ApprovalRequired) as deferral:
        kind = "approval" if isinstance(deferral, failures.ApprovalRequired) else \
            ("question" if deferral.kind == "question" else "external")
        return _deferred(call, kind, deferral.metadata)
    else:
        tool_def = manager.get_tool_def(call.tool_name)
        part, content, reveals = graph.build_tool_return_part(
            value, call=call, tool_kind=tool_def.tool_kind if tool_def else None)
        parts = [part]
        if reveals:
            graph._reject_unloaded_capability_reveals(reveals, manager)
            parts.append(ToolAvailabilityDeltaPart(tools_added=list(dict.fromkeys(reveals)),
                                                   tool_call_id=call.tool_call_id))
        parts += [UserPromptPart(content)] if content else []
    return _dump([ModelRequest(parts=parts)])[0]["parts"]  # type: ignore[no-any-return]


def _deferred(call: ToolCallPart, kind: str, metadata: Any) -> list[dict[str, Any]]:
    """What a call whose tool deferred it returns to tether: it waits for its result."""
    return [{DEFERRED: {"tool_call_id": call.tool_call_id, "tool": call.tool_name,
                        "kind": kind, "metadata": metadata}}]


# ---------------------------------------------------------------------------- history


def messages_of(rows: Sequence[Mapping[str, Any]], prompt: Any, prefix: str = ""
                ) -> list[ModelMessage]:
    """The PydanticAI message history a task's dialog rows hold: the messages each
    completion added, the parts each tool returned, and the user's messages and cut-off
    answers in between. *prompt* (the task's input) opens it when no completion recorded
    the opening request (the first answer was cut off)."""
    dialog = Dialog(prompt, prefix)
    dialog.feed(rows)
    return dialog.messages()


class Dialog:
    """A task's PydanticAI history, decoded as its rows come: a running task feeds it only
    the rows added since its last plan, so each plan validates what is new, not the whole
    conversation again (rebuilt from all rows only after a load, a rollback or a fork)."""

    def __init__(self, prompt: Any, prefix: str) -> None:
        self.opening = _text(prompt)
        self.prefix = prefix
        self.done: list[ModelMessage] = []
        self.pending: list[dict[str, Any]] = []
        self.calls: dict[str, tuple[str, str, bool]] = {}
        self.awaiting: dict[str, str] = {}
        """Deferred calls not answered yet: tool call id -> tool name."""
        self.position: DialogPosition | None = None
        self.planned: Planned | None = None
        """The calls of the newest plan made in this process, with its tool manager."""
        self.live: LiveRun | None = None
        """The PydanticAI run kept open for this history (:mod:`.pydantic_ai_run`)."""
        self.recorded: tuple[object, list[ModelMessage]] | None = None
        """The messages of the newest completion this process recorded, with the row list
        it recorded them as: fed that very row, the history takes the messages as they
        are, instead of validating what they were dumped to again."""

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in map(dialog.read, rows):
            if isinstance(row, dialog.CallRow):
                tool = row.name.removeprefix(self.prefix)
                self.calls[row.key] = (str(row.args.get("tool", tool)) if tool == OTHER else tool,
                                       str(row.args.get("tool_call_id", "")),
                                       row.name.startswith(self.prefix))
            elif isinstance(row, dialog.Completion) and row.messages:
                self._add(row.messages, row.record.get("messages"))
            elif isinstance(row, dialog.ReplyRow) and row.cut_off:
                self._add([{"kind": "response", "parts": [
                    {"part_kind": "text", "content": _text(row.text) + dialog.CUT_OFF}]}])
            elif not self._deferral(row):
                self.pending += _parts(row, self.calls, self.prefix)

    def _deferral(self, row: dialog.DialogRow) -> bool:
        """A deferred call's row (its tool said it waits) or the event answering it; True
        when *row* was one of those and is taken care of."""
        content = getattr(row, "content", None)
        if isinstance(row, dialog.ResultRow) and isinstance(content, list) and len(content) == 1 \
                and isinstance(content[0], Mapping) and DEFERRED in content[0]:
            deferred = content[0][DEFERRED]
            self.awaiting[str(deferred["tool_call_id"])] = str(deferred["tool"])
            return True
        if isinstance(row, dialog.EventRow) and row.kind == DEFERRED_EVENT \
                and isinstance(content, Mapping) and str(content.get("tool_call_id")) in self.awaiting:
            call_id = str(content["tool_call_id"])
            self.pending.append({"part_kind": "tool-return", "tool_call_id": call_id,
                                 "tool_name": self.awaiting.pop(call_id),
                                 "content": content.get("result")})
            return True
        return False

    def messages(self) -> list[ModelMessage]:
        """The history so far (a new list: the caller may extend it)."""
        if not self.pending:
            return list(self.done)
        request = [{"kind": "request", "parts": self.pending}]
        return [*self.done, *ModelMessagesTypeAdapter.validate_python(request)]

    def _add(self, raw: list[dict[str, Any]], source: object = None) -> None:
        lead: list[dict[str, Any]] = []
        if self.pending:
            lead.append({"kind": "request", "parts": self.pending})
            self.pending = []
        elif not self.done and raw and raw[0].get("kind") != "request":
            lead.append({"kind": "request", "parts": [
                {"part_kind": "user-prompt", "content": self.opening}]})
        recorded, self.recorded = self.recorded, None
        if recorded is None or source is None or source is not recorded[0]:
            self.done += ModelMessagesTypeAdapter.validate_python([*lead, *raw])
            return
        if lead:
            self.done += ModelMessagesTypeAdapter.validate_python(lead)
        self.done += recorded[1]


def _parts(row: dialog.DialogRow, calls: Mapping[str, tuple[str, str, bool]],
           prefix: str) -> list[dict[str, Any]]:
    """What one other dialog row adds to the next request. A call of this agent's tools is
    always answered: by the parts it returned, or, when its result is not PydanticAI's parts
    (a person's decision that it happened, a skip, a row from before reconcile results were
    checked), by a tool return holding it, so the model is not asked the call again."""
    if isinstance(row, dialog.ResultRow):
        name, call_id, ours = calls.get(row.key, (row.name.removeprefix(prefix), "", False))
        if row.error is not None:
            return [{"part_kind": "tool-return", "tool_name": name, "tool_call_id": call_id,
                     "content": f"error: {row.error}", "outcome": "failed"}]
        content = row.content
        if isinstance(content, list) and content and all(
                isinstance(part, Mapping) and "part_kind" in part for part in content):
            return list(content)
        if not (ours and call_id):
            return []
        if row.skipped:
            return [{"part_kind": "tool-return", "tool_name": name, "tool_call_id": call_id,
                     "content": SKIPPED, "outcome": "denied"}]
        return [{"part_kind": "tool-return", "tool_name": name, "tool_call_id": call_id,
                 "content": content}]
    if isinstance(row, dialog.UserRow | dialog.EventRow):
        return [{"part_kind": "user-prompt", "content": dialog.spoken(row, _text(row.content))}]
    if isinstance(row, dialog.Decision):
        return [{"part_kind": "user-prompt", "content": f"[decide] {_text(row.content)}"}]
    return []


def _dump(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")  # type: ignore[no-any-return]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else pydantic_core.to_json(value).decode()
