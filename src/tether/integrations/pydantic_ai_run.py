"""One PydanticAI run kept open across a task's plans, so that a plan costs what a step of a
plain ``agent.run`` costs (issue 27: incremental history).

Setting a PydanticAI run up (``agent.iter``: capabilities, toolsets, the history cleaned and
checked, the graph entered) costs milliseconds and grows with the history; a plain run pays
it once, and a tether task that opened a run per model request paid it per tool call. A
:class:`LiveRun` is opened once for a task in this process and then driven one request at a
time: after each answer it stops where PydanticAI would run the tools, tether runs them
(each under its key and resume point), and the next request is handed to the same run as the
``ModelRequestNode`` the tools' results make, exactly the one PydanticAI's own graph builds.

The run is held by an asyncio task of its own, which enters and leaves ``agent.iter``
(PydanticAI's run holds anyio scopes that must be left in the task that entered them, and a
task's plans are made in whichever task runs the task at the moment). A request cancelled
(a P0, a stop) cancels that holder: the run is left and never used again. So is a run that
raised, one whose history is not the task's any more (a load, a rollback, a fork) and one
whose next request would not answer every call of its last answer: the task then opens a new
run from its history, as every plan did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_ai
from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.usage import UsageLimits
from pydantic_graph import End

from tether.errors import ConfigurationError

log = logging.getLogger("tether")
UNLIMITED = UsageLimits(request_limit=None)
"""A kept run makes one request per plan for as long as the task lasts; tether bounds the
requests of a task itself (``Settings.max_completions``), so PydanticAI's default of 50
requests per run must not end a long task."""
LEAVE_WAIT = 5.0
"""Seconds a cancelled request waits for its run to be left (the model request cut)."""


class RunGone(Exception):
    """The kept run was left (cancelled, failed or closed): open a new one (internal)."""


Job = tuple[Callable[[Any], Awaitable[Any]], "asyncio.Future[Any]"]


class LiveRun:
    """One open ``agent.iter`` (see the module docstring); *owner* is the decoded history it
    mirrors, so a history decoded again is never continued by a run made for another."""

    def __init__(self, agent: pydantic_ai.Agent[Any, Any], prompt: str | None,
                 history: list[ModelMessage], deps: Any, owner: object) -> None:
        self.owner = owner
        self.node: Any = None
        """Where the run stands: the ``CallToolsNode`` of its last answer, the request it
        makes next, or ``End``."""
        self.count = 0
        """Messages in the run after its last answer."""
        self.streams: list[Any] = []
        self.gone = False
        self._jobs: asyncio.Queue[Job | None] = asyncio.Queue()
        self._holder = asyncio.create_task(self._hold(agent, prompt, history, deps),
                                           name="tether: a kept PydanticAI run")

    async def _hold(self, agent: pydantic_ai.Agent[Any, Any], prompt: str | None,
                    history: list[ModelMessage], deps: Any) -> None:
        try:
            async with agent.iter(prompt, message_history=history, deps=deps,
                                  usage_limits=UNLIMITED) as run:
                self.node = run.next_node
                while (job := await self._jobs.get()) is not None:
                    work, done = job
                    try:
                        result = await work(run)
                    except Exception as error:  # a run that raised is not trusted again
                        self.gone = True
                        if not done.done():
                            done.set_exception(error)
                        break
                    if not done.done():
                        done.set_result(result)
        except Exception:  # leaving a run that failed may raise again: it is gone either way
            log.debug("a kept PydanticAI run ended with an error", exc_info=True)
        finally:
            self.gone = True
            self._refuse_waiting()

    def _refuse_waiting(self) -> None:
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            if job is not None and not job[1].done():
                job[1].set_exception(RunGone())

    async def _do(self, work: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run *work* on the run, in its holder; cancelled, the run is left for good."""
        if self.gone:
            raise RunGone()
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.put_nowait((work, done))
        try:
            return await done
        except asyncio.CancelledError:
            self.gone = True
            self._holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({self._holder}, timeout=LEAVE_WAIT)
            raise

    async def ask(self, stream: bool) -> tuple[ModelResponse, list[ModelMessage], Any]:
        """Make the run's next request (streamed if *stream*) and stop at its answer: the
        answer, every message the run holds, and the tool manager PydanticAI prepared for
        the step."""
        async def work(run: Any) -> tuple[ModelResponse, list[ModelMessage], Any]:
            node = self.node
            while not isinstance(node, CallToolsNode):
                if isinstance(node, End):
                    raise ConfigurationError("PydanticAI ended the run before asking the model")
                if isinstance(node, ModelRequestNode) and stream:
                    async with node.stream(run.ctx) as streamed:
                        self.streams.append(streamed)
                        async for _ in streamed:
                            pass
                node = await run.next(node)
            self.node, messages = node, run.all_messages()
            self.count = len(messages)
            return node.model_response, messages, run.ctx.deps.tool_manager

        return await self._do(work)  # type: ignore[no-any-return]

    async def settle(self) -> ModelRequest | End[Any]:
        """Let PydanticAI handle an answer with no calls for tether to run: ``End`` with the
        output (validated, through output tools), or the request it makes to ask again."""
        async def work(run: Any) -> ModelRequest | End[Any]:
            node = await run.next(self.node)
            while not isinstance(node, End | ModelRequestNode):
                node = await run.next(node)
            self.node = node
            return node if isinstance(node, End) else node.request

        return await self._do(work)  # type: ignore[no-any-return]

    def continue_with(self, request: ModelRequest) -> None:
        """The next request is *request*: the results of the last answer's calls (and
        whatever else the task's rows add to it)."""
        self.node = ModelRequestNode(request=request)

    def continues(self, owner: object, history: list[ModelMessage]) -> bool:
        """Whether *history* is this run's messages and one new request answering every call
        of its last answer, in the history this run was made for."""
        if self.gone or owner is not self.owner or not isinstance(self.node, CallToolsNode) \
                or len(history) != self.count + 1 or not isinstance(history[-1], ModelRequest):
            return False
        asked = {p.tool_call_id for p in self.node.model_response.parts if isinstance(p, ToolCallPart)}
        answered = {getattr(p, "tool_call_id", None) for p in history[-1].parts}
        return asked <= answered

    def partial_text(self) -> str:
        """The text the last streamed answer had when it was cut."""
        if not self.streams:
            return ""
        response = self.streams[-1].response
        return "".join(part.content for part in response.parts if isinstance(part, TextPart))

    def close(self) -> None:
        """Leave the run (in its holder) once the work handed to it is done."""
        self.gone = True
        self._jobs.put_nowait(None)
