"""One CrewAI crew, plain and under tether (issue 31): what tether costs per tool call, and
what a SIGKILL costs in model requests.

The same shape as ``adk_durable.py``, for CrewAI: the crew is the same in every run, and only
what makes it durable changes:

* **plain**: ``Crew.kickoff``, no durability (CrewAI runs the tools itself): the baseline
  every overhead is taken from;
* **tether**: the crew under :class:`tether.integrations.crewai.CrewAIAgent`, on the embedded
  SQLite store with default settings (the tool marked ``idempotent``).

No durable peer runs here: CrewAI has no durable runner of its own, and the one DBOS began
is not released.

The crew: one agent with one task, its model a deterministic ``BaseLLM`` (no server) that
asks for the tool until the conversation holds N tool results, then answers ``done N``; one
idempotent tool with a ~200-byte argument and a ~500-byte result that does no work. The
figures, as in the other agent benchmarks: overhead per tool call over the plain run (wall
and CPU clocks, rounds interleaved), and model requests and tool calls after a SIGKILL inside
tool call N/2 and a restart (tether's recovery; the plain run can only start over).

    .crewai-venv/bin/python bench/crewai_durable.py [--steps 10,100,300] [--rounds 3]

(CrewAI's own environment, ``bash .ci/crewai-venv``) prints markdown tables and exits 0 (1 if
a run failed).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_runs import AgentBench, Go, Killed, Probe, Timed, run_each, tether_sessions, timed_as
from workload import ARG

for _name, _value in (("CREWAI_DISABLE_TELEMETRY", "true"), ("CREWAI_TRACING_ENABLED", "false")):
    os.environ.setdefault(_name, _value)  # nothing leaves the machine

SYSTEMS = ("plain", "tether")
LABELS = {
    "plain": "CrewAI Crew.kickoff, no durability",
    "tether": "tether CrewAIAgent, SQLite (default)",
}
PROMPT = "Work through the list."
PACKAGES = ("crewai", "tether")
"""Whose versions the tables name."""
LEASE = 1.0
"""tether's lease in the kill figure only: the restarted process waits this out."""


# ---------------------------------------------------------------------------- the child


def build_crew(probe: Probe) -> Any:
    """The crew both systems run."""
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

    class Worker(BaseLLM):
        """Asks for the next tool call until there are N tool results, then answers."""

        def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
            return self.answer(messages)

        async def acall(self, messages: Any, tools: Any = None, *args: Any,
                        **kwargs: Any) -> Any:
            return self.answer(messages)

        def supports_function_calling(self) -> bool:
            return True

        def get_context_window_size(self) -> int:
            return 10_000_000  # CrewAI would summarise a long run's messages away


        def answer(self, messages: list[dict[str, Any]]) -> Any:
            probe.model_called()
            done = sum(m.get("role") == "tool" for m in messages)
            if done >= probe.steps:
                return f"done {done}"
            return [{"id": f"call_{done}", "type": "function", "function": {
                "name": "work", "arguments": json.dumps({"payload": ARG, "n": done})}}]

    @tool("work")
    def work(payload: str, n: int) -> str:
        """One step of the agent's work (trivial, idempotent)."""
        return probe.tool_called(n)

    worker = Agent(role="worker", goal="Work through the list.", backstory="You work.",
                   tools=[work], llm=Worker(model="bench"), max_iter=100_000)
    return Crew(agents=[worker], tasks=[Task(description="{input}", agent=worker,
                                             expected_output="done")])


async def run_plain(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    crew = build_crew(probe)

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        async def go() -> str:
            output = await asyncio.to_thread(crew.kickoff, inputs={"input": PROMPT})
            return str(output.raw)

        yield go

    return await run_each(probe, sizes, mode, session)


async def run_tether(probe: Probe, sizes: Sequence[int], mode: str
                     ) -> dict[int, dict[str, Any]]:
    """The crew under tether's ``CrewAIAgent`` (:func:`agent_runs.tether_sessions`)."""
    import tether as tt
    from tether.integrations.crewai import CrewAIAgent

    framework = build_crew(probe)  # once per process, as the plain run does

    def agent() -> CrewAIAgent:
        return CrewAIAgent(framework, tools={"work": tt.ToolPolicy(idempotent=True)})

    async with tether_sessions(mode, LEASE, PROMPT, agent, probe.folder,
                               max(sizes)) as session:
        return await run_each(probe, sizes, mode, session)


RUNNERS = {"plain": run_plain, "tether": run_tether}
BENCH = AgentBench(Path(__file__).resolve(), SYSTEMS, LABELS, LEASE, peer="none",
                   peer_name="no durable peer")


# ---------------------------------------------------------------------------- the parent


def markdown(runs: Timed, found: Killed, sizes: Sequence[int], rounds: int, seconds: float) -> str:
    return "\n".join([
        "### CrewAI crews: tether against plain CrewAI", "",
        "One CrewAI crew of one agent and one task (a deterministic `BaseLLM` asking for one"
        " idempotent, trivial tool N times, then answering), run plain with `Crew.kickoff`"
        f" and under tether's `CrewAIAgent` (SQLite store, default settings). {timed_as(rounds)},"
        " the crew built once per process (`bench/crewai_durable.py`).", "",
        *BENCH.tables(runs, found, sizes, "Issue 27's target, for CrewAI", PACKAGES, seconds),
    ])


def main() -> None:
    parser = BENCH.parser(__doc__.splitlines()[0], "benchmarks-crewai.md")
    BENCH.main(parser, parser.parse_args(), RUNNERS, markdown)


if __name__ == "__main__":
    main()
