r"""Google ADK agents under tether (issue 31): ``ADKAgent(llm_agent)`` in one line (R1, R3, R10,
R12, R17, E1).

ADK's own ``Runner`` makes every model request, with the agent's model, instructions,
callbacks and request processors as ADK assembles them; tether drives it one model answer at
a time and owns everything around it:

- **One model answer is one committed plan.** A plan runs the ``Runner`` on the task's ADK
  session until the model's answer (its function calls, or its final text) and stops there:
  ADK saves the answer before it hands it over and runs no tool of it. The answer's calls are
  the plan's actions, committed before any runs, so a worker killed after it never pays for it
  again.
- **Each function call is a tether call**, run by tether (resume point, idempotency key, the
  tool's :class:`tether.ToolPolicy`, reconcile, retries), the key reachable from the tool
  through :func:`tether.current_call`. Parallel calls of one answer each get their own key and
  resume point, in order; none is lost on resume (each one is in the committed answer).
- **The next request carries every call's answer**: the results, errors and "not run" answers
  go back as function responses, and a person's message (a P1 ``user_message``) as the user's
  words after them, so ADK asks the model with all of it.
- **A P0 cuts the answer** while it streams (``stream=None``: ADK's server-sent events; a model
  that never sends partial text is asked the same way) and the task goes on.

The task's ADK session is kept in this process between plans and rebuilt from the task's
dialog rows after a load, a rollback or a fork (each model answer is kept in its dialog row as
ADK's own event). A tool made with ``require_confirmation=True`` waits for a person first (a
tether ``approval`` wait, answered from the console, the CLI, the API or a webhook; denied,
the model is told "This tool call is rejected." with the person's reason). Sub-agents
(``LlmAgent``\ s) are reached as ADK reaches them: an answer that only transfers the
conversation (ADK's ``transfer_to_agent``, no side effect) is carried out by ADK inside the
plan, which goes on to the next agent's answer; the two are committed together, so a worker
killed while the second is asked for asks for both again. What is not mapped yet is refused
when the agent is made, by name: workflow sub-agents (sequential, parallel, loop), tools other
than plain functions (toolsets, agent tools, built-in tools, long-running tools), two tools of
one name in different agents, tools that take ADK's ``tool_context``, a
``require_confirmation`` that decides per call, and tool callbacks (tether runs the tools, so
they would never be called).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from typing import Any

from google.adk.agents import LlmAgent, run_config
from google.adk.events import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.long_running_tool import LongRunningFunctionTool
from google.genai import types

from tether import dialog
from tether.agent import DialogPosition, TaskView
from tether.agents.base import PENDING, ModelAgent, approval_wait, args_reconciler
from tether.agents.model_calls import ModelError, RetryPolicy
from tether.errors import ConfigurationError
from tether.model import Action, Finish, ToolCall
from tether.tools import ReconcileFn, Tool, ToolContext, ToolPolicy, running

APP = "tether"
USER = "tether"
AGAIN = 3
"""Answers in a row that held only calls of tools the agent does not have, before the plan
fails (each is answered, as ADK answers a call of an unknown tool)."""
NOT_MADE = "this call was not made (its answer was dropped)"
GO_ON = "Go on."
"""Sent when a request has nothing new to say (the answer before it was cut off)."""
TRANSFERS = 3
"""Transfers one plan carries out before the model answers; more fail the plan (agents that
hand the conversation back and forth are asked again, within the task's bounds)."""
TRANSFER = "transfer_to_agent"
"""ADK's own tool for moving the conversation to a sub-agent (or back to a parent)."""
TOOL_CALLBACKS = ("before_tool_callback", "after_tool_callback", "on_tool_error_callback")
_sessions = itertools.count(1)
_streamed: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "tether_adk_streamed", default=None)
"""The text of the answer streaming in the plan that asked for it (ADK's model call runs in
a task of its own, which copies the plan's context)."""


class ADKAgent(ModelAgent):
    """An ADK ``LlmAgent`` as a tether agent (see the module docstring). *tools* gives ADK
    tools their policies by name (a tool without one is an ordinary call: retried on error,
    never assumed to have a side effect)."""

    input_required = True

    def __init__(self, agent: LlmAgent, *, tools: Mapping[str, ToolPolicy] | None = None,
                 stream: bool | None = None, retry: RetryPolicy | None = None,
                 approval_timeout: float | None = None, version: str = "1") -> None:
        super().__init__(retry=retry, stream=stream, version=version)
        self.approval_timeout = approval_timeout
        """How long a call of a ``require_confirmation`` tool waits for a person (None: until
        one answers); no answer in time is a denial."""
        self.tools, self.owned = _function_tools(agent)
        self.agent = _watched(agent)
        self.policies = self.checked_policies(tools, self.tools, f"ADK agent {agent.name!r}")
        self.reconcilers = {name: _reconciler(name, self.tools[name], policy.reconcile)
                            for name, policy in self.policies.items()
                            if policy.reconcile is not None}
        self.sessions = KeptSessions()
        self.runner = Runner(app_name=APP, agent=self.agent, session_service=self.sessions)

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per ADK function tool, named ``<agent>.<tool>``."""
        return [self._tool(name) for name in self.tools]

    def _tool(self, name: str) -> Tool:
        async def run(ctx: ToolContext, call_id: str, args: dict[str, Any],
                      approval: dict[str, Any] | None = None) -> dict[str, Any]:
            if approval is not None and not approval.get("approved"):
                return {"error": "This tool call is rejected."
                        + (f" {approval['reason']}" if approval.get("reason") else "")}
            return await self._run_tool(ctx, name, args)

        run.__doc__ = f"ADK tool {name}, run through tether."
        return self.framework_tool(name, run, self.policies.get(name, ToolPolicy()),
                                   self.reconcilers.get(name))

    async def _run_tool(self, ctx: ToolContext, name: str, args: dict[str, Any]
                        ) -> dict[str, Any]:
        """The tool's function on the model's arguments, as ADK's ``FunctionTool`` calls it
        (arguments converted and checked, a missing one told to the model and nothing run);
        its value as ADK answers the model with it."""
        tool = self.tools[name]
        given, wrong = tool._preprocess_args_with_validation(args)
        if wrong:
            return tool._build_validation_error_response(wrong)
        given = _accepted(tool.func, given)
        missing = [n for n in tool._get_mandatory_args() if n not in given]
        if missing:
            return {"error": f"Invoking `{name}()` failed as the following mandatory input"
                             f" parameters are not present: {', '.join(missing)}"}
        with running(ctx):
            if inspect.iscoroutinefunction(tool.func):
                value = await tool.func(**given)
            else:  # a plain function runs in a thread, never cut (a sync tool in tether)
                value = await asyncio.to_thread(tool.func, **given)
        return _response(value)

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action | list[Action]:
        opening = _text(task.input)
        talk = self.kept(task, lambda: Conversation(self.name, self.agent.name, opening), opening)
        for _ in range(AGAIN):
            answer, seconds = await self._ask(task, talk)
            actions, unknown = self._actions(answer)
            reply = _user_event(unknown) if unknown else None
            _record(task, self.agent, answer, seconds, reply)
            if actions:
                return actions
            if reply is None:
                return Finish(_final_text(answer))
            talk.answered(reply)
        raise ModelError(f"agent {self.name}: {AGAIN} answers in a row held only calls of tools"
                         f" that {self.agent.name!r} does not have")

    async def _ask(self, task: TaskView, talk: Conversation) -> tuple[list[Event], float]:
        """One model answer, through ADK's Runner on the task's session (made again from the
        dialog when an earlier attempt may have left part of a turn in it)."""
        partial: list[str] = []

        async def once() -> list[Event]:
            partial.clear()
            session = await talk.session(self.sessions, task.task_id)
            message = await talk.message(self.sessions, session)
            talk.dirty = True  # until the answer is in: a failed attempt leaves half a turn
            answer = await self._run(session, message, partial)
            talk.took(message, answer)
            return answer

        return await self.request(once, f"agent {self.name}", lambda: "".join(partial))

    async def _run(self, session: Session, message: types.Content,
                   partial: list[str]) -> list[Event]:
        modes = run_config.StreamingMode  # type: ignore[attr-defined]
        mode = modes.SSE if self.streams() else modes.NONE
        answer: list[Event] = []
        _streamed.set(partial)
        events = self.runner.run_async(user_id=USER, session_id=session.id,
                                       new_message=message,
                                       run_config=run_config.RunConfig(streaming_mode=mode))
        async with contextlib.aclosing(events):
            async for event in events:
                if event.error_code:
                    raise ModelError(f"agent {self.name}: the model failed: {event.error_code}"
                                     f" {event.error_message or ''}".strip())
                if event.partial:
                    continue
                if event.author == "user":
                    continue
                answer.append(event)
                if _ours(event) or event.is_final_response():
                    break  # saved, and no tool of it started: tether runs them
                if sum(map(_turn, answer)) > TRANSFERS:
                    raise ModelError(f"agent {self.name}: the conversation was transferred"
                                     f" {TRANSFERS} times in one plan without an answer")
        if not answer or not (_ours(answer[-1]) or answer[-1].is_final_response()):
            raise ModelError(f"agent {self.name}: ADK ended the turn without a model answer")
        return answer

    def _actions(self, answer: list[Event]) -> tuple[list[Action], list[types.Part]]:
        """The calls of the answer as tether calls, and the answers to calls of tools the
        agent does not have."""
        actions: list[Action] = []
        unknown: list[types.Part] = []
        author = answer[-1].author
        for call in answer[-1].get_function_calls():
            tool = self.tools.get(str(call.name)) if call.name in self.owned.get(author, ()) \
                else None
            if tool is not None:
                args: dict[str, Any] = {"call_id": call.id, "args": dict(call.args or {})}
                if _confirmed(tool):  # a person approves it first (ADK's confirmation)
                    actions.append(approval_wait(self.approval_timeout))
                    args["approval"] = PENDING
                actions.append(ToolCall(f"{self.name}.{call.name}", args))
            else:
                unknown.append(_function_response(call.id, str(call.name), {
                    "error": f"Tool {call.name} not found in agent {author}."}))
        return actions, unknown

    def forget(self, decoded: Any) -> None:
        """A conversation dropped (decoded again, or the oldest kept): its session goes."""
        if isinstance(decoded, Conversation) and decoded.live is not None:
            self.sessions.drop(decoded.live.id)
            decoded.live = None


class Watched(BaseLlm):
    """The agent's model, watched: the text of an answer is kept as it streams in, so a P0
    that cuts the answer keeps what the model had said (ADK hands its events over later)."""

    inner: BaseLlm

    @property
    def capabilities(self) -> Any:
        return self.inner.capabilities

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        said = _streamed.get()
        answers = self.inner.generate_content_async(llm_request, stream)
        async with contextlib.aclosing(answers):
            async for answer in answers:
                if said is not None and answer.partial and answer.content is not None:
                    said.extend(p.text for p in answer.content.parts or []
                                if p.text and not p.thought)
                yield answer


class KeptSessions(BaseSessionService):
    """The sessions of an agent's running tasks, in this process, handed to ADK as they are.

    ADK's in-memory service copies the whole session each time the Runner asks for it, so
    each answer of a long conversation cost a copy of all of it; a task's session here has
    one reader, the plan that runs it, and is handed over without a copy. Rows, not this,
    are what lasts: a session is made again from the task's dialog after a load."""

    def __init__(self) -> None:
        self.kept: dict[str, Session] = {}

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        session_id = session_id or f"{APP}:{next(_sessions)}"
        made = Session(id=session_id, app_name=app_name, user_id=user_id,
                       state=dict(state or {}), last_update_time=0.0)
        self.kept[session_id] = made
        return made

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        return self.kept.get(session_id)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None
                            ) -> ListSessionsResponse:
        return ListSessionsResponse(sessions=list(self.kept.values()))

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        self.drop(session_id)

    def drop(self, session_id: str) -> None:
        self.kept.pop(session_id, None)


# ---------------------------------------------------------------------------- the conversation


class Conversation:
    """A task's ADK conversation as its dialog rows hold it: the events every request so far
    was made from, and what the next request sends (the answers to the last answer's calls,
    then what was said since). The live session mirrors the events; one that may not (a
    failed or cut attempt, an answer this process did not make) is made again from them."""

    def __init__(self, agent: str, author: str, opening: str) -> None:
        self.prefix = f"{agent}."
        self.author = author
        """The ADK agent's name: the model's own turns are its (another author's are quoted
        to the model as someone else's)."""
        self.position: DialogPosition | None = None
        self.opening = opening
        self.events: list[Event] = []
        self.responses: list[types.Part] = []
        self.said: list[types.Part] = [types.Part(text=opening)]
        self.open: dict[str, str] = {}
        """The last answer's calls not answered yet: the model's call id, the tool's name."""
        self.calls: dict[str, str] = {}
        """Each tether call key of an ADK tool: the model's call id."""
        self.known: set[str] = set()
        """Ids of the events already in the conversation (answers made in this process)."""
        self.live: Session | None = None
        self.dirty = False
        self.reply: Event | None = None
        """The answers to calls of tools the agent lacks, sent as they were recorded."""

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self._take(dialog.read(row))

    def _take(self, row: dialog.DialogRow) -> None:
        if isinstance(row, dialog.UserRow | dialog.EventRow):
            self.said.append(types.Part(text=dialog.spoken(row, _text(row.content))))
        elif isinstance(row, dialog.Decision):
            self.said.append(types.Part(text=f"[decide] {_text(row.content)}"))
        elif isinstance(row, dialog.Completion):
            for message in row.messages:
                event = Event.model_validate(message)
                if event.id not in self.known:
                    self._add(event)
        elif isinstance(row, dialog.ReplyRow) and row.cut_off:
            self._add(Event(author=self._speaking(), invocation_id="", content=types.Content(
                role="model", parts=[types.Part(text=_text(row.text) + dialog.CUT_OFF)])))
        elif isinstance(row, dialog.CallRow) and row.name.startswith(self.prefix):
            args = row.args if isinstance(row.args, Mapping) else {}
            self.calls[row.key] = str(args.get("call_id"))
        elif isinstance(row, dialog.ResultRow) and row.key in self.calls:
            call_id = self.calls[row.key]
            name = self.open.pop(call_id, row.name[len(self.prefix):])
            self.responses.append(_function_response(call_id, name, _answer(row)))

    def _add(self, event: Event) -> None:
        """An event this process did not send or receive: after what was sent for it (a
        model's turn; the answer ADK gave to a transfer closes that call first)."""
        self._closed(event)
        if event.author != "user" and not event.get_function_responses():
            self._flush()
        self.events.append(event)
        self.known.add(event.id)
        self._opened(event)
        self.dirty = True

    def _speaking(self) -> str:
        """The agent the conversation is with now (a transfer moves it), whose turn a cut-off
        answer was."""
        return next((e.author for e in reversed(self.events) if e.author != "user"),
                    self.author)

    def _opened(self, event: Event) -> None:
        """The calls *event* makes are open; those it answers (ADK's transfer) are not."""
        for call in event.get_function_calls():
            self.open[str(call.id)] = str(call.name)
        self._closed(event)

    def _closed(self, event: Event) -> None:
        for response in event.get_function_responses():
            self.open.pop(str(response.id), None)

    def _pending(self) -> list[types.Part]:
        """The answers to send: every call of the last answer answered, one never made (its
        answer was dropped) as such, so the provider's protocol holds."""
        unmade = [_function_response(call_id, name, {"error": NOT_MADE})
                  for call_id, name in self.open.items()]
        self.open = {}
        return [*self.responses, *unmade]

    def _flush(self) -> None:
        parts = [*self._pending(), *self.said]
        if parts:
            self.events.append(_user_event(parts))
        self.responses, self.said = [], []

    async def session(self, sessions: KeptSessions, task_id: str) -> Session:
        """The live session, made again from the events when it may not mirror them."""
        if self.live is not None and not self.dirty:
            return self.live
        if self.live is not None:
            await sessions.delete_session(app_name=APP, user_id=USER, session_id=self.live.id)
        session = await sessions.create_session(app_name=APP, user_id=USER,
                                                session_id=f"{task_id}:{next(_sessions)}")
        for event in self.events:
            await sessions.append_event(session, event.model_copy())
        self.live, self.dirty = session, False
        return session

    async def message(self, sessions: KeptSessions, session: Session
                      ) -> types.Content:
        """What the next request sends. ADK takes answers to calls or words as a new
        message, not both: answers followed by words go into the session first."""
        if self.reply is not None and self.reply.content is not None:
            return self.reply.content
        responses = self._pending()
        if responses and self.said:
            event = _user_event(responses)
            await sessions.append_event(session, event)
            self.events.append(event)
            responses = []
        self.responses = responses
        parts = responses or self.said or [types.Part(text=GO_ON)]
        return types.Content(role="user", parts=list(parts))

    def took(self, message: types.Content, answer: Sequence[Event]) -> None:
        """The request went through: what it sent and what the model answered are in the
        session, and the answer's row, fed next time, is known."""
        sent, self.reply = self.reply or _user_event(list(message.parts or [])), None
        self.events.append(sent)
        self.known.add(sent.id)
        self.responses, self.said = [], []
        for event in answer:
            self.events.append(event)
            self.known.add(event.id)
            self._opened(event)
        self.dirty = False

    def answered(self, reply: Event) -> None:
        """Calls of tools the agent lacks, answered (*reply*, as recorded): the next request
        sends it."""
        self._closed(reply)
        self.reply = reply


# ---------------------------------------------------------------------------- reconcile hooks


def _reconciler(name: str, tool: FunctionTool, hook: ReconcileFn) -> ReconcileFn:
    """*hook* of the ADK tool *name*, checked against its function now; what it found is the
    call's answer as the tool's value would be."""
    return args_reconciler("ADK", name, hook, _schema(tool.func),
                           lambda found, call_id, ctx: _response(found))


def _schema(func: Callable[..., Any]) -> dict[str, Any]:
    """A function's named parameters as the JSON-schema shape hooks are checked against."""
    params = {n: p for n, p in inspect.signature(func).parameters.items()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return {"properties": {n: {} for n in params},
            "required": [n for n, p in params.items() if p.default is inspect.Parameter.empty]}


def _accepted(func: Callable[..., Any], args: dict[str, Any]) -> dict[str, Any]:
    """The arguments *func* takes (all of them when it takes ``**kwargs``), as ADK filters."""
    params = inspect.signature(func).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return dict(args)
    return {k: v for k, v in args.items() if k in params}


# ---------------------------------------------------------------------------- the agent


def _function_tools(agent: LlmAgent) -> tuple[dict[str, FunctionTool], dict[str, set[str]]]:
    """The function tools of the agent and of its sub-agents, by name, and which names each
    agent has (a model may call only its own agent's tools, as in ADK); what tether cannot
    run yet is refused by name."""
    if not isinstance(agent, LlmAgent):
        raise ConfigurationError(f"ADKAgent takes an ADK LlmAgent, not {type(agent).__name__}")
    refusals: list[str] = []
    tools: dict[str, FunctionTool] = {}
    owned: dict[str, set[str]] = {}
    for one in _tree(agent, refusals):
        refusals += [f"the {name} of agent {one.name!r} (tether runs the tools, so it would"
                     " never be called)" for name in TOOL_CALLBACKS if getattr(one, name, None)]
        owned[one.name] = set()
        for item in one.tools:
            tool = FunctionTool(item) if callable(item) and not isinstance(item, FunctionTool) \
                else item
            why = _unmapped(tool) or _clash(tool, tools)
            if why:
                refusals.append(why)
            elif isinstance(tool, FunctionTool):
                tools[tool.name] = tool
                owned[one.name].add(tool.name)
    if refusals:
        raise ConfigurationError(f"ADK agent {agent.name!r} uses what tether does not run yet: "
                                 + "; ".join(refusals))
    return tools, owned


def _watched(agent: LlmAgent) -> LlmAgent:
    """A copy of the agent tree whose every model is :class:`Watched` (the user's agents are
    left as they are)."""
    model = agent.canonical_model
    subs = [_watched(sub) for sub in agent.sub_agents if isinstance(sub, LlmAgent)]
    return agent.clone(update={"model": Watched(model=model.model, inner=model),
                               "sub_agents": subs})


def _tree(agent: LlmAgent, refusals: list[str]) -> list[LlmAgent]:
    """The agent and the LlmAgents it can transfer to; any other kind is refused."""
    found = [agent]
    for sub in agent.sub_agents:
        if isinstance(sub, LlmAgent):
            found += _tree(sub, refusals)
        else:
            refusals.append(f"sub-agent {sub.name!r} ({type(sub).__name__}: only LlmAgents)")
    return found


def _clash(tool: Any, tools: Mapping[str, FunctionTool]) -> str | None:
    known = tools.get(tool.name)
    if known is None or known.func is tool.func:
        return None
    return f"two tools named {tool.name!r} (in different agents: tether names calls by tool)"


def _unmapped(tool: Any) -> str | None:
    name = getattr(tool, "name", type(tool).__name__)
    if not isinstance(tool, FunctionTool) or isinstance(tool, LongRunningFunctionTool) \
            or (type(tool) is not FunctionTool and not _plain_subclass(tool)):
        return f"tool {name!r} ({type(tool).__name__}: only plain function tools are run)"
    if callable(getattr(tool, "_require_confirmation", False)):
        return f"tool {name!r} (a require_confirmation that decides per call is not mapped yet)"
    if "tool_context" in inspect.signature(tool.func).parameters:
        return f"tool {name!r} (it takes ADK's tool_context, which tether does not make)"
    return None


def _ours(event: Event) -> bool:
    """Whether *event* is a model answer whose calls tether runs: ADK carries out an answer
    that only transfers the conversation to another agent (no side effect), and the plan
    goes on to that agent's answer."""
    return any(call.name != TRANSFER for call in event.get_function_calls())


def _confirmed(tool: FunctionTool) -> bool:
    """Whether ADK asks a person before each call of *tool* (``require_confirmation=True``)."""
    return getattr(tool, "_require_confirmation", False) is True


def _plain_subclass(tool: Any) -> bool:
    return type(tool).run_async is FunctionTool.run_async


# ---------------------------------------------------------------------------- rows and events


def _record(task: TaskView, agent: LlmAgent, answer: Sequence[Event], seconds: float,
            reply: Event | None) -> None:
    """One completion row per model turn of the answer (a transfer's turn, then the next
    agent's), each with ADK's events; *reply* (the answers to calls of tools the agent
    lacks) goes with the last."""
    turns: list[list[Event]] = []
    for event in answer:
        if _turn(event) or not turns:
            turns.append([])
        turns[-1].append(event)
    model = agent.model if isinstance(agent.model, str) else getattr(agent.model, "model", "")
    for n, events in enumerate(turns, 1):
        meta = events[0].usage_metadata
        usage = {"prompt_tokens": (meta.prompt_token_count or 0) if meta else 0,
                 "completion_tokens": (meta.candidates_token_count or 0) if meta else 0}
        messages = [event.model_dump(mode="json", exclude_none=True) for event in events]
        if reply is not None and n == len(turns):
            messages.append(reply.model_dump(mode="json", exclude_none=True))
        calls = any(event.get_function_calls() for event in events)
        task.record_completion(str(model or type(agent.model).__name__), usage=usage,
                               finish_reason="tool_calls" if calls else "stop",
                               seconds=round(seconds / len(turns), 3), messages=messages)


def _turn(event: Event) -> bool:
    """Whether *event* is a model's turn (not ADK's answer to a transfer)."""
    return event.author != "user" and not event.get_function_responses()


def _user_event(parts: list[types.Part]) -> Event:
    return Event(author="user", invocation_id="", content=types.Content(role="user",
                                                                         parts=parts))


def _function_response(call_id: str | None, name: str, response: dict[str, Any]) -> types.Part:
    return types.Part(function_response=types.FunctionResponse(id=call_id, name=name,
                                                               response=response))


def _answer(row: dialog.ResultRow) -> dict[str, Any]:
    """A call's answer in the dialog as the function response the model reads."""
    if row.error is not None:
        return {"error": row.error}
    if row.not_run:
        return {"error": _text(row.content) or "not run"}
    if row.skipped:
        return {"error": _text(row.content) or "skipped: a person decided this call is not made"}
    return _response(row.content)


def _response(value: Any) -> dict[str, Any]:
    """A tool's value as ADK answers the model with it."""
    return dict(value) if isinstance(value, Mapping) else {"result": value}


def _parts(event: Event) -> list[types.Part]:
    return list(event.content.parts or []) if event.content is not None else []


def _final_text(answer: Sequence[Event]) -> str:
    return "".join(p.text for p in _parts(answer[-1]) if p.text and not p.thought)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)
