"""A crew kicked off in a thread of its own and stopped wherever it needs tether (issue 31).

CrewAI runs a crew synchronously, its agents' loops, its parsing, its parallel tool calls, all
inside ``Crew.kickoff``; nothing in it can be paused between a model answer and the tools it
asks for. So :class:`LiveCrew` runs the kickoff of a copy of the crew in a daemon thread whose
every model request and tool call is a question to the plan waiting on the event loop:

- the copy's agents ask their model through :class:`Bridge` (a CrewAI ``BaseLLM``): the
  request is handed over as a :class:`ModelAsk` and the crew's thread waits for the answer
  the plan gives it (the model's, or one recorded in the task's dialog);
- their tools are :class:`Bridged` stand-ins: a call is handed over as a :class:`ToolAsk`
  and its thread waits for the result tether's own call of the tool produced;
- the end of the kickoff is an :class:`Ended` (its output), an error a :class:`Broke`.

A run that is left (its task went elsewhere, was rolled back, or a newer run replaced it)
answers every question still open, and every later one, with :class:`RunGone`, so its
threads unwind instead of waiting for ever; a process ending leaves them all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool
from crewai.utilities.string_utils import sanitize_tool_name
from pydantic import ConfigDict

_runs = itertools.count(1)
_open: weakref.WeakSet[LiveCrew] = weakref.WeakSet()
"""Every run not left yet, so a process ending can leave them (see :func:`_leave_all`)."""


class RunGone(BaseException):
    """The run was left: the question it asked will not be answered. Not an ``Exception``:
    CrewAI's handlers of tool and model errors (which retry, or log the error and go on)
    must not catch it; it ends the kickoff, which no one waits for any more."""


@dataclass
class ModelAsk:
    """An agent of the crew asks its model."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    agent: Any
    llm: BaseLLM
    """The agent's own model (the user's), which the plan asks."""
    stop: list[str]
    answer: Future[Any] = field(default_factory=Future)


@dataclass
class ToolAsk:
    """An agent of the crew calls a tool."""

    name: str
    args: dict[str, Any]
    answer: Future[Any] = field(default_factory=Future)
    call_id: str = ""
    """The model's call it is, once matched (:meth:`LiveCrew.match`)."""


@dataclass
class Ended:
    output: Any


@dataclass
class Broke:
    error: BaseException


Ask = ModelAsk | ToolAsk | Ended | Broke


class Copies:
    """Copies of one crew whose models and tools are bridges, each kicked off by one run at a
    time. A copy whose kickoff ended is kicked off again by a later run, as CrewAI runs one
    crew many times: a new copy builds its agents' executors again, which cost more than the
    rest of a short task. A copy left half-way is never used again."""

    KEPT = 8
    """Idle copies kept; a worker running more tasks of the crew at once makes more."""

    def __init__(self, crew: Any) -> None:
        self.crew = crew
        self.idle: list[Any] = []

    def take(self, live: LiveCrew) -> Any:
        """A copy whose bridges ask *live*."""
        if self.idle:
            copy = self.idle.pop()
            for bridged_one in _bridges(copy):
                bridged_one.live = live
            return copy
        copy = self.crew.copy()
        for agent in copy.agents:
            agent.llm = bridge(agent.llm, live)
            agent.tools = [bridged(tool, live) for tool in agent.tools or []]
        for task in copy.tasks:
            task.tools = [bridged(tool, live) for tool in task.tools or []]
        return copy

    def give_back(self, copy: Any) -> None:
        """A copy whose kickoff ended, for the next run."""
        if len(self.idle) < self.KEPT:
            self.idle.append(copy)


def _bridges(copy: Any) -> list[Any]:
    found: list[Any] = [agent.llm for agent in copy.agents]
    for holder in (*copy.agents, *copy.tasks):
        found += holder.tools or []
    return found


class LiveCrew:
    """One kickoff of a copy of a crew (from *copies*), its questions queued for the plan
    (see the module docstring)."""

    def __init__(self, copies: Copies, inputs: Mapping[str, Any]) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Ask] = asyncio.Queue()
        self.gone = False
        self.open: list[ModelAsk | ToolAsk] = []
        """Questions asked and not answered yet (answered ones leave it)."""
        self.models_answered = 0
        """How many model requests of this run were answered: the dialog's next answer."""
        self.expected: list[tuple[str, str, dict[str, Any]]] = []
        """The calls of the last answer not matched to a tool call of the crew yet."""
        self.parsed = 0
        self.copies = copies
        self.copy = copies.take(self)
        self.thread = threading.Thread(target=self._kickoff, args=(self.copy, dict(inputs)),
                                       name=f"tether-crew-{next(_runs)}", daemon=True)
        _open.add(self)
        self.thread.start()

    def _kickoff(self, crew: Any, inputs: dict[str, Any]) -> None:
        try:
            ended: Ask = Ended(crew.kickoff(inputs=inputs))
        except BaseException as error:
            ended = Broke(error)
        if not self.gone:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ended)

    # ------------------------------------------------------------------ the crew's side

    def ask(self, question: ModelAsk | ToolAsk) -> Any:
        """From a thread of the crew: hand *question* over and wait for its answer."""
        if self.gone:
            raise RunGone("the task's run of its crew was left")
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, question)
        except RuntimeError as closed:  # the loop is gone: so is the run
            raise RunGone("the event loop of the task's run has closed") from closed
        return question.answer.result()

    # ------------------------------------------------------------------ the plan's side

    async def next(self) -> Ask:
        """The crew's next question (or its end: its copy is then free for another run)."""
        asked = await self.queue.get()
        if isinstance(asked, ModelAsk | ToolAsk):
            self.open.append(asked)
        elif isinstance(asked, Ended) and not self.gone:
            self.gone = True
            _open.discard(self)
            self.copies.give_back(self.copy)
        return asked

    def answer(self, question: ModelAsk | ToolAsk, value: Any) -> None:
        if question in self.open:
            self.open.remove(question)
        if isinstance(question, ModelAsk):
            self.models_answered += 1
        if not question.answer.done():
            question.answer.set_result(value)

    def expect(self, calls: list[dict[str, Any]] | None) -> None:
        """The answer just given asks for *calls* (None: it is text, whose one call, if
        any, CrewAI parses from it)."""
        self.expected = [(str(c["id"]), str(c["function"]["name"]), arguments(c))
                         for c in calls or ()]
        self.parsed = 0

    def match(self, asked: ToolAsk) -> str:
        """The model's call id of a tool call of the crew: the last answer's call of that
        tool with those arguments (else the first of that tool; parallel calls come in any
        order). A call parsed from text has none, so it gets one from where it is in the
        run, the same each time the run is replayed."""
        if not asked.call_id:
            asked.call_id = self._expected(sanitize_tool_name(asked.name), asked.args)
        return asked.call_id

    def _expected(self, name: str, args: dict[str, Any]) -> str:
        for exact in (True, False):
            for n, (call_id, called, given) in enumerate(self.expected):
                if called == name and (given == args or not exact):
                    del self.expected[n]
                    return call_id
        self.parsed += 1
        return f"crewai_{self.models_answered}_{self.parsed}"

    def waiting_tools(self) -> list[ToolAsk]:
        return [q for q in self.open if isinstance(q, ToolAsk)]

    def waiting_model(self) -> ModelAsk | None:
        return next((q for q in self.open if isinstance(q, ModelAsk)), None)

    def leave(self) -> None:
        """No question of this run will be answered: its threads get :class:`RunGone`."""
        self.gone = True
        _open.discard(self)
        pending = list(self.open)
        while not self.queue.empty():
            asked = self.queue.get_nowait()
            if isinstance(asked, ModelAsk | ToolAsk):
                pending.append(asked)
        self.open = []
        for question in pending:
            if not question.answer.done():
                question.answer.set_exception(RunGone("the task's run of its crew was left"))


def _leave_all() -> None:
    """At interpreter exit, before the thread pools CrewAI runs tools in are joined: a tool
    call waiting for tether would keep the process alive for ever."""
    for run in list(_open):
        run.leave()


threading._register_atexit(_leave_all)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- the bridges


class Bridge(BaseLLM):
    """An agent's model in the crew's copy: each request is a question to the plan."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: Any
    live: Any

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None,
             available_functions: Any = None, from_task: Any = None, from_agent: Any = None,
             response_model: Any = None) -> Any:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.live.ask(ModelAsk(list(messages), tools, from_agent, self.inner,
                                      list(self.stop or [])))

    async def acall(self, messages: Any, tools: Any = None, callbacks: Any = None,
                    available_functions: Any = None, from_task: Any = None,
                    from_agent: Any = None, response_model: Any = None) -> Any:
        return await asyncio.to_thread(self.call, messages, tools)

    def supports_function_calling(self) -> bool:
        return bool(self.inner.supports_function_calling())

    def supports_stop_words(self) -> bool:
        return bool(self.inner.supports_stop_words())

    def get_context_window_size(self) -> int:
        return int(self.inner.get_context_window_size())


def bridge(llm: BaseLLM, live: LiveCrew) -> Bridge:
    return Bridge(model=llm.model, inner=llm, live=live, stop=list(llm.stop or []))


class Bridged(BaseTool):
    """A tool in the crew's copy: each call is a question to the plan, answered with what
    tether's own call of the real tool returned."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    live: Any

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self.live.ask(ToolAsk(self.name, dict(kwargs)))


def bridged(tool: BaseTool, live: LiveCrew) -> Bridged:
    """*tool*'s stand-in: the same name, description and arguments, never cached by CrewAI
    (a cached answer would skip a call tether has made)."""
    return Bridged(name=tool.name, description=tool.description, args_schema=tool.args_schema,
                   result_as_answer=tool.result_as_answer, live=live,
                   cache_function=_never_cached)


def arguments(call: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments as the tool gets them (JSON text in the answer)."""
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except (TypeError, ValueError):
        return {}
    return args if isinstance(args, dict) else {}


def _never_cached(args: Any = None, result: Any = None) -> bool:
    return False
