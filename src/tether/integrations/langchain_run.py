"""A LangChain agent's graph run kept open across a task's plans, so that a model turn costs
what a super-step of a plain ``agent.ainvoke`` costs (the run half of
:mod:`tether.integrations.langchain`).

Entering a LangGraph run (``astream``: the config, the callbacks, the channels, the loop)
costs about a millisecond, which a plain run pays once and a tether task that started a run
per model turn paid per tool call. A :class:`LiveGraph` is started once for a task in this
process, from its conversation, on a copy of the agent's graph whose tool nodes do not run
tools (:func:`answering_copy`): when the graph reaches them after an answer, the run waits
there, tether runs the calls (each under its key and resume point, through the agent's own
``ToolNode``), and the next plan hands the results to the waiting tool node, so the graph
goes on to its next model turn exactly as a plain run goes on after its tools.

The run is held by an asyncio task of its own. A turn cancelled (a P0, a stop) cancels that
holder and the run is never used again; so is a run that raised or ended, and one whose
conversation is not the task's any more (a load, a rollback, a fork, a message that came
between the calls, a call the engine did not make). The task then starts a new run from its
rows, as every turn did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any, cast

from tether.errors import MissingExtra

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import StreamMode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the LangChain integration needs langchain and langgraph",
                       "langchain") from exc

__all__ = ["LiveGraph", "Partial", "RunGone", "Stop", "answering_copy", "callbacks"]

KEPT_STEPS = 1_000_000_000
"""A kept run's recursion limit: it takes two or more super-steps per model turn for as long
as the task lasts; tether bounds a task's model turns itself (``Settings.max_completions``)."""
LEAVE_WAIT = 5.0
"""Seconds a cancelled turn waits for its run to be left (the model request cut)."""
LIVE: ContextVar[LiveGraph | None] = ContextVar("tether_live_graph", default=None)
"""The kept run a holder task drives; its graph's tool nodes find it here."""


class RunGone(Exception):
    """The kept run was left from outside while a turn waited for it: start a new one
    (internal)."""


Stop = tuple[dict[str, Any], bool]
"""Where a run stood: its state, and whether it stopped before tools tether runs (True)
rather than ended."""


def answering_copy(graph: CompiledStateGraph[Any, Any, Any, Any],
                   tool_nodes: Mapping[str, ToolNode]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A copy of *graph* whose tool nodes answer each call with the result the task's
    tether call gave, instead of running the tool (the agent's own graph is left as it is)."""
    nodes = dict(graph.nodes)
    for name, tool_node in tool_nodes.items():
        answering = copy.copy(tool_node)
        answering.func, answering.afunc = answering._func, answering._afunc  # bound to the copy
        answering._wrap_tool_call, answering._awrap_tool_call = None, _answer
        nodes[name] = graph.nodes[name].copy({"bound": answering})
    return graph.copy({"nodes": nodes})


async def _answer(request: ToolCallRequest, execute: Any) -> ToolMessage:
    live = LIVE.get()
    if live is None:
        raise RuntimeError("a tether answering tool node ran outside a kept run")
    return await live.answer(request)


class LiveGraph:
    """One open graph run (see the module docstring). *owner* is the decoded conversation it
    mirrors, so a conversation decoded again is never continued by a run made for another;
    *partial* keeps what its model streams."""

    def __init__(self, graph: CompiledStateGraph[Any, Any, Any, Any],
                 history: list[BaseMessage], config: Mapping[str, Any], context: Any,
                 stops: Sequence[str], modes: list[StreamMode], owner: object,
                 partial: Partial) -> None:
        self.owner = owner
        self.partial = partial
        self.known: list[BaseMessage] = list(history)
        """The conversation as the run holds it, up to the turn it makes next."""
        self.asked: list[str] = []
        """The calls of the answer the run waits at (their tool node waits for results)."""
        self.streamed = "messages" in modes
        self.gone = False
        self._turning = False
        self._leaving = False
        self._answer_id: str | None = None
        self._results: dict[tuple[str | None, str], asyncio.Future[ToolMessage]] = {}
        self._stop: asyncio.Future[Stop] = asyncio.get_running_loop().create_future()
        self._holder = asyncio.create_task(
            self._hold(graph, history, {**config, "recursion_limit": KEPT_STEPS}, context,
                       list(stops), modes), name="tether: a kept LangGraph run")

    async def _hold(self, graph: CompiledStateGraph[Any, Any, Any, Any],
                    history: list[BaseMessage], config: Any, context: Any, stops: list[str],
                    modes: list[StreamMode]) -> None:
        LIVE.set(self)
        state: dict[str, Any] = {}
        stopped = False
        try:
            async for mode, chunk in graph.astream({"messages": history}, config,
                                                   context=context, interrupt_before=stops,
                                                   stream_mode=modes):
                if mode == "values":
                    state = cast(dict[str, Any], chunk)
                elif mode == "updates" and "__interrupt__" in chunk:
                    stopped = True
        except BaseException as error:  # cancelled too: the run is gone either way
            self._end(error)
            if not isinstance(error, Exception):
                raise
        else:
            self._end((state, stopped))

    def _end(self, outcome: Stop | BaseException) -> None:
        self.gone = True
        if not self._stop.done():
            if isinstance(outcome, tuple):
                self._stop.set_result(outcome)
            else:  # a run left from outside is not a cut of the turn that waits for it
                self._stop.set_exception(outcome if isinstance(outcome, Exception)
                                         else RunGone())
                self._stop.exception()  # a turn may never wait for it: nothing to report then
        for waiting in self._results.values():
            waiting.cancel()

    async def answer(self, request: ToolCallRequest) -> ToolMessage:
        """In the graph's tool node: the result tether's call gave for this call of the
        answer the run waits at; the first call asked tells the task's plan to go on."""
        state = request.state if isinstance(request.state, Mapping) else {}
        messages = state.get("messages") or []
        answer_id = next((m.id for m in reversed(messages) if isinstance(m, AIMessage)), None)
        key = (answer_id, str(request.tool_call["id"]))
        waiting = self._results.get(key)
        if waiting is None:
            waiting = self._results[key] = asyncio.get_running_loop().create_future()
            if not self._stop.done():
                self._stop.set_result((dict(state), True))
        return await waiting

    async def next_stop(self) -> Stop:
        """Wait for the run's next stop; cancelled, the run is left for good. A run closed
        meanwhile by :meth:`leave` is left once its answer is in (never asked again)."""
        self._turning = True
        try:
            return await self._stop
        except asyncio.CancelledError:
            self.close()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({self._holder}, timeout=LEAVE_WAIT)
            raise
        finally:
            self._turning = False
            if self._leaving:
                self.close()

    def hold(self, final: list[BaseMessage], answer: AIMessage) -> None:
        """The run waits at *answer* (the last message of *final*) for tether to run its
        calls."""
        self.known = final
        self.asked = [str(call["id"]) for call in answer.tool_calls]
        self._answer_id = answer.id

    def continues(self, owner: object, history: list[BaseMessage]) -> bool:
        """Whether *history*, of the conversation this run was made for, is the run's and a
        result for every call its tool node waits for, and nothing else. An answer that gave
        two calls one id is not continued: the tool node would get one result for both."""
        count = len(self.known)
        tail = history[count:]
        return not self.gone and owner is self.owner and bool(self.asked) \
            and len(set(self.asked)) == len(self.asked) and len(tail) == len(self.asked) \
            and history[count - 1].id == self.known[-1].id \
            and sorted(_answers(tail)) == sorted(self.asked)

    def resume(self, results: list[BaseMessage]) -> None:
        """Hand *results* (what :meth:`continues` checked) to the waiting tool node; the
        graph goes on to its next model turn."""
        self._stop = asyncio.get_running_loop().create_future()
        answered = self._answer_id
        self._results = {key: waiting for key, waiting in self._results.items()
                         if key[0] == answered}
        for message in results:
            assert isinstance(message, ToolMessage)
            key = (answered, str(message.tool_call_id))
            waiting = self._results.setdefault(key, asyncio.get_running_loop().create_future())
            if not waiting.done():
                waiting.set_result(message)
        self.known = [*self.known, *results]
        self.asked = []

    def close(self) -> None:
        """Leave the run: its holder is cancelled wherever it waits."""
        self.gone = True
        self._holder.cancel()

    def leave(self) -> None:
        """Leave the run, but not in the middle of a model request a turn waits for (its
        conversation was dropped from outside, say evicted by other tasks' plans): that
        request is paid for, so its answer is let through first."""
        if self._turning:
            self._leaving = True
        else:
            self.close()


def _answers(messages: Sequence[BaseMessage]) -> list[str]:
    """The call ids *messages* answer (one that is not a tool message answers none)."""
    return [str(m.tool_call_id) if isinstance(m, ToolMessage) else "" for m in messages]


class Partial(BaseCallbackHandler):
    """Keeps the text a model streams, token by token as the model hands it over (inline, not
    through LangGraph's stream queue), so a P0 that cuts the answer keeps all of it. Only the
    newest model run's text is kept: a middleware's own model call (a summary) comes first."""

    run_inline = True

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.run: Any = None
        self.heard = False
        """Whether any model of the run streamed a piece (a token, or a chunk of a call)."""

    def clear(self) -> None:
        self.pieces, self.run, self.heard = [], None, False

    def text(self) -> str:
        return "".join(self.pieces)

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]],
                            **kwargs: Any) -> None:
        """Nothing to do; defined because a handler without it is sent ``on_llm_start``
        instead, with the whole conversation written out as text on every model turn (a
        cost that grows with the conversation)."""

    def on_llm_new_token(self, token: str | list[str | dict[str, Any]], *, chunk: Any = None,
                         run_id: Any = None, **kwargs: Any) -> None:
        self.heard = True
        if run_id != self.run:
            self.pieces, self.run = [], run_id
        message = getattr(chunk, "message", None)
        if isinstance(message, BaseMessage):  # content blocks too (Anthropic, Responses API)
            self.pieces.append(message.text)
        elif isinstance(token, str):
            self.pieces.append(token)


def callbacks(config: Mapping[str, Any]) -> list[Any]:
    """The callback handlers a user's config gives (a list, or a manager's handlers)."""
    given = config.get("callbacks")
    if given is None:
        return []
    return list(given) if isinstance(given, list) else list(getattr(given, "handlers", []))
