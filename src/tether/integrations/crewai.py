r"""CrewAI crews under tether (issue 31): ``CrewAIAgent(crew)`` in one line (R1, R3, R10, R12,
R17, E1).

CrewAI runs a crew inside ``Crew.kickoff``: its agents' loops, prompts, parsing and parallel
tool calls are its own, and nothing in it stops between a model answer and the tools the
answer asks for. tether leaves all of that to CrewAI and takes the two things that must be
durable, through the seams CrewAI gives (:mod:`tether.integrations.crewai_run`):

- **One model answer is one committed plan.** The crew is kicked off (a copy of it) in a
  thread of its own; its agents' models are bridges, so each request comes to the plan, which
  asks the agent's own model (the user's CrewAI ``LLM``, as configured) and keeps the answer
  in the task's dialog before the crew sees it. A worker killed after that never pays for it
  again.
- **Each tool call is a tether call** (resume point, idempotency key reachable from the tool
  through :func:`tether.current_call`, the tool's :class:`tether.ToolPolicy`, reconcile,
  retries): the crew's tools are stand-ins that wait for the result of tether's own call of
  the real tool. The parallel calls of one answer each get their own key and resume point.
- **Resumed by replay.** After a load, a rollback or a fork the crew is kicked off again and
  every question it asks that the dialog already answers is answered from it: no model is
  asked and no tool runs again, so a crew killed in its third task resumes in its third task
  with the first two as they were. A crew that asks something else than it asked before (its
  code changed) is not guessed at: the plan fails, naming the difference.
- **A P0 cuts the answer** as it streams (the model streams when its ``LLM`` has
  ``stream=True``; a plain request is cut too, with nothing to keep); the text so far is kept,
  marked cut off, and the next request shows it, then the person's words. A P1 message
  reaches the next model request after the results of the calls it followed (a call it set
  aside is answered "not run"), as a user message.

What cannot be made durable this way is refused when the agent is made, by name: memory,
knowledge, planning and reasoning (their own model requests and stores outside the task),
hierarchical crews (a manager model), delegation (a tool that runs another agent), asynchronous
tasks, human input on tasks (CrewAI reads the terminal), step and task callbacks (they would
run again on replay), a ``function_calling_llm``, structured task output (``output_pydantic``
or ``output_json``), two tools of one name that are not the same tool, and CrewAI's global
``before_tool_call`` hooks (tether makes the calls of a native answer itself, so a call such
a hook would block would still be made).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from crewai import Agent, Crew, Task
from crewai.events import crewai_event_bus
from crewai.events.types.llm_events import LLMStreamChunkEvent
from crewai.hooks import get_before_tool_call_hooks
from crewai.tools import BaseTool
from crewai.utilities.string_utils import sanitize_tool_name

from tether import dialog
from tether.agent import DialogPosition, TaskView
from tether.agents.base import ModelAgent, args_reconciler
from tether.agents.model_calls import ModelError, RetryPolicy
from tether.errors import ConfigurationError
from tether.integrations.crewai_run import (
    Broke,
    Copies,
    Ended,
    LiveCrew,
    ModelAsk,
    ToolAsk,
    arguments,
)
from tether.model import Action, Continue, Finish, ToolCall
from tether.tools import ReconcileFn, Tool, ToolContext, ToolPolicy, running

_streamed: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "tether_crewai_streamed", default=None)
"""The text of the answer streaming in the plan that asked for it."""


@crewai_event_bus.on(LLMStreamChunkEvent)
def _heard(source: Any, event: LLMStreamChunkEvent) -> None:
    """CrewAI hands stream chunks to handlers synchronously, in the request's own context."""
    said = _streamed.get()
    if said is not None and event.chunk and event.tool_call is None:
        said.append(event.chunk)


class CrewAIAgent(ModelAgent):
    """A CrewAI ``Crew`` as a tether agent (see the module docstring); a single ``Agent`` is
    a crew of one task, the task's input its description. The task's input is the kickoff's
    ``inputs``: a mapping as it is, anything else as ``{"input": text}`` (so task
    descriptions name it ``{input}``). *tools* gives the crew's tools their policies by name
    (a tool without one is an ordinary call: retried on error, never assumed to have a side
    effect)."""

    input_required = True

    def __init__(self, crew: Crew | Agent, *, tools: Mapping[str, ToolPolicy] | None = None,
                 stream: bool | None = None, retry: RetryPolicy | None = None,
                 version: str = "1") -> None:
        super().__init__(retry=retry, stream=stream, version=version)
        crew = _alone(crew) if isinstance(crew, Agent) else crew
        self.crew = crew
        self.tools = _crew_tools(crew)
        self.policies = self.checked_policies(tools, self.tools, "the crew")
        self.reconcilers = {name: _reconciler(name, self.tools[name], policy.reconcile)
                            for name, policy in self.policies.items()
                            if policy.reconcile is not None}
        self.copies = Copies(crew)
        self.names = {sanitize_tool_name(name): name for name in self.tools}
        """The name a model calls each tool by (CrewAI's sanitised form), to the tool's."""

    # ------------------------------------------------------------------ registration

    def own_tools(self) -> Sequence[Tool]:
        """One tether tool per crew tool, named ``<agent>.<tool>``."""
        return [self._tool(name) for name in self.tools]

    def _tool(self, name: str) -> Tool:
        async def run(ctx: ToolContext, call_id: str, args: dict[str, Any]) -> Any:
            return await self._run_tool(ctx, name, args)

        run.__doc__ = f"CrewAI tool {name}, run through tether."
        return self.framework_tool(name, run, self.policies.get(name, ToolPolicy()),
                                   self.reconcilers.get(name))

    async def _run_tool(self, ctx: ToolContext, name: str, args: dict[str, Any]) -> Any:
        """The real tool on the model's arguments, as CrewAI runs it (validated, counted
        against its usage limit); an async function awaited here, a plain one in a thread."""
        tool = self.tools[name]
        with running(ctx):
            if asyncio.iscoroutinefunction(getattr(tool, "func", None)):
                value = await tool.arun(**args)
            else:
                value = await asyncio.to_thread(tool.run, **args)
        return _plain(value)

    # ------------------------------------------------------------------ planning

    async def plan(self, task: TaskView) -> Action | list[Action]:
        opening = _text(task.input)
        talk = self.kept(task, lambda: Conversation(f"{self.name}.", opening), opening)
        if talk.live is not None and talk.live.models_answered > len(talk.answers):
            self.forget(talk)  # it was given an answer the dialog does not hold
        if talk.live is None:
            talk.live = LiveCrew(self.copies, _inputs(task.input))
        live = talk.live
        for waiting in live.waiting_tools():  # calls the last plan handed to tether
            if self._tool_asked(live, talk, waiting) is not None:
                raise ModelError(f"agent {self.name}: call {waiting.call_id} of"
                                 f" {waiting.name} has no answer in the dialog")
        asked_model = False
        while True:
            asked = live.waiting_model() or await live.next()
            if isinstance(asked, ToolAsk):
                action = self._tool_asked(live, talk, asked)
                if action is not None:
                    return action
            elif isinstance(asked, ModelAsk):
                if live.models_answered < len(talk.answers):  # replayed from the dialog
                    self._replay(live, talk, asked)
                    continue
                if asked_model:
                    return Continue()  # one model answer a plan: commit it, then ask
                asked_model = True
                answer = await self._ask(task, talk, live, asked)
                calls = self._calls(asked, answer)
                if calls:
                    return calls
            else:
                self.forget(talk)
                if isinstance(asked, Broke):
                    raise ModelError(f"agent {self.name}: the crew failed: {asked.error!r}"
                                     ) from asked.error
                assert isinstance(asked, Ended)
                return Finish(_text(getattr(asked.output, "raw", asked.output)))

    def _replay(self, live: LiveCrew, talk: Conversation, asked: ModelAsk) -> None:
        """Give the crew the answer the dialog holds for this request, if the same agent
        asks it; a crew that asks in another order than before is not guessed at."""
        answer, role = talk.answers[live.models_answered]
        if role != _role(asked):
            self.forget(talk)
            raise ModelError(f"agent {self.name}: replaying the crew, answer"
                             f" {live.models_answered + 1} was asked by agent {_role(asked)!r}"
                             f" where the dialog has it from {role!r}; the crew was changed"
                             " under a running task (run it to the end with the code it began"
                             " with, or roll it back)")
        _give(live, asked, answer)

    def _tool_asked(self, live: LiveCrew, talk: Conversation, asked: ToolAsk) -> Action | None:
        """A tool call of the crew: answered from the dialog when tether made it already,
        else tether's call to make now (the crew's answer was text that CrewAI parsed)."""
        call_id = live.match(asked)
        if call_id in talk.results:
            live.answer(asked, talk.results[call_id])
            return None
        if call_id in talk.made:
            raise ModelError(f"agent {self.name}: the crew called {asked.name} again under"
                             f" call {call_id}, which has no answer in the dialog")
        return ToolCall(f"{self.name}.{asked.name}", {"call_id": call_id, "args": asked.args})

    def _calls(self, asked: ModelAsk, answer: Any) -> list[Action]:
        """The tool calls of a native answer, of tools the request offered the model (its
        agent's and its task's), as tether calls; a call of any other tool is CrewAI's to
        answer, and never reaches a tool."""
        if not isinstance(answer, list):
            return []
        offered = {str(t.get("function", {}).get("name")) for t in asked.tools or ()
                   if isinstance(t, Mapping)}
        actions: list[Action] = []
        for call in answer:
            called = str(call["function"]["name"])
            if called in offered and called in self.names:
                actions.append(ToolCall(f"{self.name}.{self.names[called]}", {
                    "call_id": call["id"], "args": arguments(call)}))
        return actions

    async def _ask(self, task: TaskView, talk: Conversation, live: LiveCrew,
                   asked: ModelAsk) -> Any:
        """The model's answer to the crew's request, with what people said since (and any
        answer a P0 cut) where it belongs; kept in the dialog, then given to the crew."""
        messages = talk.shown(asked.messages, live.models_answered)
        partial: list[str] = []
        used: dict[str, int] = {}

        async def once() -> Any:
            partial.clear()
            model = asked.llm.model_copy(update={"stop": asked.stop} | (
                {"stream": self.stream} if self.stream is not None else {}))
            model._token_usage = {key: 0 for key in asked.llm._token_usage}
            _streamed.set(partial)
            answer = await model.acall(cast("list[Any]", messages), tools=asked.tools,
                                       from_agent=asked.agent)
            used.update(model.get_token_usage_summary().model_dump())
            return answer

        answer, seconds = await self.request(once, f"agent {self.name}",
                                             lambda: "".join(partial))
        plain = _answer(answer)
        task.record_completion(str(asked.llm.model), usage={
            "prompt_tokens": int(used.get("prompt_tokens", 0)),
            "completion_tokens": int(used.get("completion_tokens", 0))},
            finish_reason="tool_calls" if isinstance(plain, list) else "stop",
            seconds=round(seconds, 3), messages=[{"crewai": plain, "agent": _role(asked)}])
        _give(live, asked, plain)
        return plain

    def forget(self, decoded: Any) -> None:
        """A conversation dropped (decoded again, done, or the oldest kept): its run goes."""
        if isinstance(decoded, Conversation) and decoded.live is not None:
            decoded.live.leave()
            decoded.live = None


def _give(live: LiveCrew, asked: ModelAsk, answer: Any) -> None:
    """Hand the crew a model answer (a copy: CrewAI may change what it is given)."""
    live.expect(answer if isinstance(answer, list) else None)
    live.answer(asked, json.loads(json.dumps(answer)))


# ---------------------------------------------------------------------------- the conversation


class Conversation:
    """What a task's dialog says of its crew: the model answers in order, each call's answer
    by call id, and what people said (or a P0 cut) after how many answers. The live run is
    kept beside it between plans and goes when it is decoded again."""

    def __init__(self, prefix: str, opening: str) -> None:
        self.prefix = prefix
        self.position: DialogPosition | None = None
        self.opening = opening
        self.answers: list[tuple[Any, str | None]] = []
        """Each model answer, with the role of the agent that asked for it."""
        self.calls: dict[str, str] = {}
        """Each tether call key of a crew tool: the model's call id."""
        self.made: set[str] = set()
        """Call ids tether made (or set aside): the values of :attr:`calls`, kept as a set
        since every tool call of the crew looks one up."""
        self.results: dict[str, str] = {}
        """Each call id's answer, as the crew's tool returns it."""
        self.said: list[tuple[int, dict[str, Any]]] = []
        self.live: LiveCrew | None = None

    def feed(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self._take(dialog.read(row))

    def _take(self, row: dialog.DialogRow) -> None:
        if isinstance(row, dialog.Completion):
            self.answers += [(m["crewai"], m.get("agent")) for m in row.messages
                             if isinstance(m, Mapping) and "crewai" in m]
        elif isinstance(row, dialog.UserRow | dialog.EventRow):
            self._said("user", dialog.spoken(row, _text(row.content)))
        elif isinstance(row, dialog.Decision):
            self._said("user", f"[decide] {_text(row.content)}")
        elif isinstance(row, dialog.ReplyRow) and row.cut_off:
            self._said("assistant", _text(row.text) + dialog.CUT_OFF)
        elif isinstance(row, dialog.CallRow) and row.name.startswith(self.prefix):
            args = row.args if isinstance(row.args, Mapping) else {}
            self.calls[row.key] = str(args.get("call_id"))
            self.made.add(self.calls[row.key])
        elif isinstance(row, dialog.ResultRow) and row.key in self.calls:
            self.results[self.calls[row.key]] = _result(row)

    def _said(self, role: str, text: str) -> None:
        self.said.append((len(self.answers), {"role": role, "content": text}))

    def shown(self, messages: Sequence[dict[str, Any]], answered: int) -> list[dict[str, Any]]:
        """The crew's request as the model is asked: what was said after the answers of this
        request's conversation goes after the answer it followed and its calls' results (said
        before this agent's conversation began, it went to the conversation it was said in)."""
        own = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        first = answered - len(own)
        shown = list(messages)
        for after, said in reversed(self.said):  # the latest first: earlier places hold
            n = after - first
            if n < 0:
                continue
            if n >= len(own):
                at = len(messages)
            elif n == 0:
                at = own[0]
            else:
                at = _after_results(messages, own[n - 1])
            shown.insert(at, said)
        return shown


def _after_results(messages: Sequence[Mapping[str, Any]], answer: int) -> int:
    """Where the messages that answer the assistant message at *answer* end."""
    at = answer + 1
    while at < len(messages) and messages[at].get("role") == "tool":
        at += 1
    return at


# ---------------------------------------------------------------------------- the crew


REFUSED_CREW = {"memory": "memory", "knowledge_sources": "knowledge", "planning": "planning",
                "manager_llm": "a manager model (hierarchical process)",
                "manager_agent": "a manager agent (hierarchical process)",
                "step_callback": "a step_callback", "task_callback": "a task_callback",
                "function_calling_llm": "a function_calling_llm"}
REFUSED_AGENT = {"allow_delegation": "delegation", "reasoning": "reasoning",
                 "planning_config": "planning", "memory": "memory",
                 "knowledge_sources": "knowledge", "step_callback": "a step_callback",
                 "function_calling_llm": "a function_calling_llm",
                 "allow_code_execution": "code execution"}
REFUSED_TASK = {"async_execution": "asynchronous execution", "human_input": "human input",
                "callback": "a callback", "output_pydantic": "structured output",
                "output_json": "structured output"}


def _crew_tools(crew: Crew) -> dict[str, BaseTool]:
    """The crew's tools by name; what tether cannot make durable is refused by name."""
    if not isinstance(crew, Crew):
        raise ConfigurationError(f"CrewAIAgent takes a CrewAI Crew or Agent, not"
                                 f" {type(crew).__name__}")
    refusals = [f"the crew's {what}" for name, what in REFUSED_CREW.items()
                if getattr(crew, name, None)]
    if str(getattr(crew.process, "value", crew.process)) != "sequential":
        refusals.append("a hierarchical process (a manager model)")
    tools: dict[str, BaseTool] = {}
    for agent in crew.agents:
        refusals += [f"{what} of agent {agent.role!r}" for name, what in REFUSED_AGENT.items()
                     if getattr(agent, name, None)]
        refusals += _add_tools(tools, agent.tools or [])
    for task in crew.tasks:
        refusals += [f"{what} of task {task.name or task.description[:40]!r}"
                     for name, what in REFUSED_TASK.items() if getattr(task, name, None)]
        refusals += _add_tools(tools, task.tools or [])
    refusals += [f"the before_tool_call hook {getattr(hook, '__name__', repr(hook))} (tether"
                 " makes the calls of a native answer itself: one the hook would block would"
                 " still be made)" for hook in get_before_tool_call_hooks()]
    if refusals:
        raise ConfigurationError("the crew uses what tether cannot make durable yet: "
                                 + "; ".join(dict.fromkeys(refusals)))
    return tools


ALONE = "The answer to the request above."
"""What a single agent's one task expects (CrewAI asks every task for it)."""


def _alone(agent: Agent) -> Crew:
    """A single agent as CrewAI runs one: a crew of one task whose description is the input."""
    return Crew(agents=[agent], tasks=[Task(description="{input}", expected_output=ALONE,
                                            agent=agent)])


def _add_tools(tools: dict[str, BaseTool], found: Iterable[BaseTool]) -> list[str]:
    clashes = []
    for tool in found:
        known = tools.setdefault(tool.name, tool)
        if known is not tool and getattr(known, "func", known) is not getattr(tool, "func", tool):
            clashes.append(f"two tools named {tool.name!r} (tether names calls by tool)")
    return clashes


def _role(asked: ModelAsk) -> str | None:
    role = getattr(asked.agent, "role", None)
    return None if role is None else str(role)


def _inputs(given: Any) -> dict[str, Any]:
    return dict(given) if isinstance(given, Mapping) else {"input": _text(given)}


# ---------------------------------------------------------------------------- values


def _answer(answer: Any) -> Any:
    """A model answer as plain data: its text, or its calls in the OpenAI shape CrewAI
    reads (every call with an id, arguments as JSON text)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, list):
        calls = []
        for n, call in enumerate(answer):
            made = call.model_dump() if hasattr(call, "model_dump") else dict(call)
            function = dict(made.get("function") or {})
            given = function.get("arguments")
            calls.append({"id": str(made.get("id") or f"call_{n}"), "type": "function",
                          "function": {"name": str(function.get("name")), "arguments":
                                       given if isinstance(given, str)
                                       else json.dumps(given or {})}})
        return calls
    return _text(answer)


def _result(row: dialog.ResultRow) -> str:
    """A call's answer in the dialog as the crew's tool returns it: text."""
    if row.error is not None:
        return f"Error: {row.error}"
    if row.not_run or row.skipped:
        return _text(row.content) or ("not run" if row.not_run else "skipped")
    return _text(row.content)


def _plain(value: Any) -> Any:
    """A tool's value as tether keeps it: JSON data as it is, anything else as its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _reconciler(name: str, tool: BaseTool, hook: ReconcileFn) -> ReconcileFn:
    """*hook* of the crew tool *name*, checked against its arguments now; what it found is
    the call's answer."""
    schema = tool.args_schema.model_json_schema() if tool.args_schema else {}
    return args_reconciler("CrewAI", name, hook, schema,
                           lambda found, call_id, ctx: _plain(found))


__all__ = ["CrewAIAgent"]
