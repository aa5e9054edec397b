"""One LangChain agent made durable two ways: by tether, and by LangGraph's own checkpointer.

The same shape as ``pydantic_ai_durable.py``, for LangChain v1: the agent is the same
``create_agent`` graph in every run, and only what makes it durable changes:

* **plain**: ``agent.ainvoke(...)``, no checkpointer: the baseline every overhead is taken
  from;
* **tether**: the agent under :class:`tether.integrations.langchain.LangChainAgent`, on the
  embedded SQLite store with default settings (the tool marked ``idempotent``);
* **langgraph**: the agent compiled with LangGraph's ``AsyncSqliteSaver`` on a SQLite file and
  run with ``durability="sync"`` (each super-step durable before the next starts, as tether's
  resume point is), one thread per run;
* **tethersaver**: the same, with :class:`tether.integrations.tether_saver.TetherSaver` (a
  LangGraph checkpointer on tether's embedded SQLite store, default settings) in place of
  ``AsyncSqliteSaver``: LangGraph's own run, tether's store.

The agent: a deterministic chat model (langchain-core's ``BaseChatModel``, no server) that asks
for the tool until the conversation holds N tool results, then answers ``done N``; one
idempotent tool with a ~200-byte argument and a ~500-byte result that does no work. Any time
above the plain run is the durable runner's own cost. The figures, as in the other agent
benchmarks: overhead per tool call over the plain run (wall and CPU clocks, rounds
interleaved), and model requests and tool calls after a SIGKILL inside tool call N/2 and a
restart (tether's recovery; LangGraph resumed with ``ainvoke(None, config)`` on the same
thread; the plain run can only start over).

    .bench-venv/bin/python bench/langchain_durable.py [--steps 10,100,300] [--rounds 3]

prints markdown tables and exits 0 (1 if a run failed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_runs import AgentBench, Go, Killed, Probe, Timed, run_each, tether_sessions, timed_as
from workload import ARG

SYSTEMS = ("plain", "tether", "langgraph", "tethersaver")
LABELS = {
    "plain": "LangChain create_agent, no durability",
    "tether": "tether LangChainAgent, SQLite (default)",
    "langgraph": "LangGraph AsyncSqliteSaver, durability=sync",
    "tethersaver": "LangGraph TetherSaver (tether SQLite), durability=sync",
}
PROMPT = "Work through the list."
PACKAGES = ("langchain", "langgraph", "langgraph-checkpoint-sqlite", "tether")
"""Whose versions the tables name."""
LEASE = 1.0
"""tether's lease in the kill figure only: the restarted process waits this out."""


# ---------------------------------------------------------------------------- the child


def build_agent(probe: Probe, checkpointer: Any = None) -> Any:
    """The agent every system runs; only ``langgraph`` gives it a checkpointer."""
    from langchain.agents import create_agent
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    class Worker(BaseChatModel):
        """Asks for the next tool call until there are N tool results, then answers."""

        @property
        def _llm_type(self) -> str:
            return "bench"

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any
                      ) -> ChatResult:
            probe.model_called()
            done = sum(isinstance(m, ToolMessage) for m in messages)
            answer = AIMessage(f"done {done}") if done >= probe.steps else AIMessage(
                "", tool_calls=[{"name": "work", "args": {"payload": ARG, "n": done},
                                 "id": f"call_{done}"}])
            return ChatResult(generations=[ChatGeneration(message=answer)])

    @tool
    async def work(payload: str, n: int) -> str:
        """One step of the agent's work (trivial, idempotent)."""
        return probe.tool_called(n)

    return create_agent(Worker(), tools=[work], checkpointer=checkpointer)


def limits() -> dict[str, Any]:
    """LangGraph stops a run at 25 super-steps by default; N=300 needs about 600."""
    return {"recursion_limit": 10_000}


async def run_plain(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    agent = build_agent(probe)

    async def go() -> str:
        state = await agent.ainvoke({"messages": [("user", PROMPT)]}, limits())
        return str(state["messages"][-1].text)

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        yield go

    return await run_each(probe, sizes, mode, session)


async def run_tether(probe: Probe, sizes: Sequence[int], mode: str
                     ) -> dict[int, dict[str, Any]]:
    """The agent under tether's ``LangChainAgent`` (:func:`agent_runs.tether_sessions`)."""
    import tether as tt
    from tether.integrations.langchain import LangChainAgent

    framework = build_agent(probe)  # once per process, as the plain run does

    def agent() -> LangChainAgent:
        return LangChainAgent(framework, tools={"work": tt.ToolPolicy(idempotent=True)})

    async with tether_sessions(mode, LEASE, PROMPT, agent, probe.folder,
                               max(sizes)) as session:
        return await run_each(probe, sizes, mode, session)


async def run_langgraph(probe: Probe, sizes: Sequence[int], mode: str
                        ) -> dict[int, dict[str, Any]]:
    """LangGraph's ``AsyncSqliteSaver`` (see :func:`checkpointed`)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    @asynccontextmanager
    async def saver(folder: Path) -> AsyncIterator[Any]:
        async with AsyncSqliteSaver.from_conn_string(str(folder / "langgraph.sqlite")) as made:
            await made.setup()
            yield made

    return await checkpointed(probe, sizes, mode, saver)


async def run_tethersaver(probe: Probe, sizes: Sequence[int], mode: str
                          ) -> dict[int, dict[str, Any]]:
    """tether's ``TetherSaver`` on tether's SQLite store (see :func:`checkpointed`)."""
    from tether.integrations.tether_saver import TetherSaver
    from tether.store import open_store

    @asynccontextmanager
    async def saver(folder: Path) -> AsyncIterator[Any]:
        store = open_store(f"sqlite:///{folder / 'tether.db'}")
        await store.migrate()
        try:
            yield TetherSaver(store)
        finally:
            await store.close()

    return await checkpointed(probe, sizes, mode, saver)


async def checkpointed(probe: Probe, sizes: Sequence[int], mode: str,
                       saver: Any) -> dict[int, dict[str, Any]]:
    """The agent compiled with the checkpointer *saver* makes in a run's folder, a saver of
    its own per run (its file and tables made outside the clock), run with
    ``durability="sync"``; *mode* ``resume`` continues the thread the killed process left."""

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        async with saver(folder) as made:
            agent = build_agent(probe, made)
            config = {"configurable": {"thread_id": "bench"}, **limits()}

            async def go() -> str:
                given = None if mode == "resume" else {"messages": [("user", PROMPT)]}
                state = await agent.ainvoke(given, config, durability="sync")
                return str(state["messages"][-1].text)

            yield go

    return await run_each(probe, sizes, mode, session)


RUNNERS = {"plain": run_plain, "tether": run_tether, "langgraph": run_langgraph,
           "tethersaver": run_tethersaver}
BENCH = AgentBench(Path(__file__).resolve(), SYSTEMS, LABELS, LEASE, peer="langgraph",
                   peer_name="LangGraph SqliteSaver")


# ---------------------------------------------------------------------------- the parent


def markdown(runs: Timed, found: Killed, sizes: Sequence[int], rounds: int, seconds: float) -> str:
    return "\n".join([
        "### LangChain agents: tether against LangGraph's SqliteSaver", "",
        "One LangChain `create_agent` agent (a deterministic chat model asking for one"
        " idempotent, trivial tool N times, then answering), run plain, under tether's"
        " `LangChainAgent` (SQLite store, default settings) and compiled with LangGraph's"
        " `AsyncSqliteSaver` (`durability=\"sync\"`), and compiled with tether's `TetherSaver`"
        f" (LangGraph's run, tether's SQLite store). {timed_as(rounds)}, the savers a fresh one"
        " per run;"
        " plain and tether build the agent once per process (a checkpointer is"
        " compiled into its graph, so the savers' runs build theirs per store)"
        " (`bench/langchain_durable.py`).", "",
        *BENCH.tables(runs, found, sizes, "Issue 28's target (as issue 27's)", PACKAGES, seconds),
    ])


def main() -> None:
    parser = BENCH.parser(__doc__.splitlines()[0], "benchmarks-langchain.md")
    BENCH.main(parser, parser.parse_args(), RUNNERS, markdown)


if __name__ == "__main__":
    main()
