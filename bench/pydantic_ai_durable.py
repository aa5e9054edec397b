"""One PydanticAI agent made durable two ways: by tether, and by PydanticAI's own DBOS capability.

compare.py weighs tether against peers on a workload written once per system, in each one's
own idiom. Users of PydanticAI choose among durable runners for the agent they already
have, so here the agent is the same object type in every run, and only what makes it
durable changes:

* **plain**: ``agent.run(...)``, no durability: the baseline every overhead is taken from;
* **tether**: the agent under :class:`tether.integrations.pydantic_ai.PydanticAIAgent`,
  on the embedded SQLite store with default settings (``stream=False``, because the
  model below does not stream; the tool marked ``idempotent``);
* **dbos**: PydanticAI's ``DBOSDurability`` capability, ``agent.run`` inside a
  ``@DBOS.workflow``, DBOS's system database on a SQLite file (DBOS's defaults). The
  capability wraps only MCP and dynamic toolsets, never plain function tools, so the tool
  is made a ``@DBOS.step`` here: without that a tool call would not be recorded at all,
  and a recovered run would call every tool again.

The agent: a deterministic ``FunctionModel`` that asks for the tool until it has N tool
results, then answers ``done N``; one idempotent tool with a ~200-byte argument and a
~500-byte result (the sizes of ``workload.py``) that does no work. Any time above the
plain run is therefore the durable runner's own cost.

Two figures, the runs in processes of their own (``--child``), as compare.py does:

1. **Overhead per tool call**: the whole run (after a 2-call warm-up run in the same
   process, so imports and first-call costs are left out), minus the plain run of the same
   round, divided by N. Rounds are interleaved (every system once per round, the order
   rotated), so a noisy moment hits every system alike; the median over rounds is shown.
   The same on the CPU clock too (every thread), which other work on a shared machine
   shakes less.
   Per-run fixed costs (starting the task or workflow, finishing it) are in it, which is
   why it reads higher at small N; setting a system up is not (tether's store file is
   opened and its schema made before the clock, as DBOS is launched before its runs: both
   happen once per process in real use; the runs share it, as DBOS's share its system
   database). A run under 100 tool calls is timed several times (about 100 calls in all) and
   its median kept. Every system builds the PydanticAI agent once per
   process and runs it again in each run, as an application does. Ratios only: the machine
   is shared and noisy.
2. **Completions after a kill**: each system's child SIGKILLs itself inside the k-th tool
   call (k = N/2; a hook in the tool fires while a marker file exists), after the call's
   work but before its result is returned. The parent removes the marker and starts the
   same program again to finish the run (tether's recovery, DBOS's own recovery at launch;
   the plain run can only start over). The model function and the tool append a line to a
   count file in the run's folder on every call, so the counts span both processes. A
   durable runner should ask the model no more often than an uninterrupted run does; the
   killed tool call itself may run twice (it is idempotent).

    .bench-venv/bin/python bench/pydantic_ai_durable.py [--steps 10,100,300] [--rounds 3]

prints markdown tables and exits 0 (1 if a run failed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_runs import AgentBench, Go, Killed, Probe, Timed, run_each, tether_sessions, timed_as
from workload import ARG

SYSTEMS = ("plain", "tether", "dbos")
LABELS = {
    "plain": "PydanticAI, no durability",
    "tether": "tether PydanticAIAgent, SQLite (default)",
    "dbos": "PydanticAI DBOSDurability, DBOS SQLite",
}
PROMPT = "Work through the list."
PACKAGES = ("pydantic-ai-slim", "dbos", "tether")
"""Whose versions the tables name."""
WORKFLOW_ID = "pai-bench"
LEASE = 1.0
"""tether's lease in the kill figure only: the restarted process waits this out (the default,
15 s, would only make the figure slow; the counts do not depend on it)."""


# ---------------------------------------------------------------------------- the child


def build_agent(probe: Probe, system: str) -> Any:
    """The agent every system runs; only *system* ``dbos`` adds DBOS (capability, tool step)."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model_turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Ask for the next tool call until there are N tool results, then answer."""
        probe.model_called()
        done = sum(isinstance(part, ToolReturnPart) for m in messages for part in m.parts)
        if done >= probe.steps:
            return ModelResponse(parts=[TextPart(f"done {done}")])
        return ModelResponse(parts=[ToolCallPart("work", {"payload": ARG, "n": done},
                                                 tool_call_id=f"call_{done}")])

    capabilities: list[Any] = []
    if system == "dbos":
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        capabilities.append(DBOSDurability())
    agent: Any = Agent(FunctionModel(model_turn), name="bench", capabilities=capabilities)

    async def work(payload: str, n: int) -> str:
        """One step of the agent's work (trivial, idempotent)."""
        return probe.tool_called(n)

    if system == "dbos":
        from dbos import DBOS

        work = DBOS.step(name="work")(work)
    agent.tool_plain(work)
    return agent


def no_request_limit() -> Any:
    """PydanticAI stops a run at 50 requests by default (tether drives one request per
    ``agent.iter`` and never meets it); N=100 needs 101."""
    from pydantic_ai.usage import UsageLimits

    return UsageLimits(request_limit=None)


async def run_plain(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    """``agent.run`` and nothing else; a killed run can only start over."""
    agent = build_agent(probe, "plain")

    async def go() -> str:
        return str((await agent.run(PROMPT, usage_limits=no_request_limit())).output)

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        yield go

    return await run_each(probe, sizes, mode, session)


async def run_tether(probe: Probe, sizes: Sequence[int], mode: str
                     ) -> dict[int, dict[str, Any]]:
    """The agent under tether's ``PydanticAIAgent`` (:func:`agent_runs.tether_sessions`)."""
    import tether as tt
    from tether.integrations.pydantic_ai import PydanticAIAgent

    framework = build_agent(probe, "tether")  # once per process, as plain and DBOS do

    def agent() -> PydanticAIAgent:
        return PydanticAIAgent(framework, stream=False,
                               tools={"work": tt.ToolPolicy(idempotent=True)})

    async with tether_sessions(mode, LEASE, PROMPT, agent, probe.folder,
                               max(sizes)) as session:
        return await run_each(probe, sizes, mode, session)


async def run_dbos(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    """One DBOS system database for the process, a workflow per run. With *mode*
    ``resume``, DBOS's own recovery at launch re-runs the workflow the killed process left
    pending (its recorded steps answer from the step table) and the clock waits for it."""
    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "pai-bench", "log_level": "WARNING",
                 "system_database_url": f"sqlite:///{probe.folder / 'dbos.sqlite'}"})
    agent = build_agent(probe, "dbos")

    @DBOS.workflow(name="pai_bench_run")
    async def run_workflow(prompt: str) -> str:
        return str((await agent.run(prompt, usage_limits=no_request_limit())).output)

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        workflow_id = f"{WORKFLOW_ID}-{folder.name}"

        async def go() -> str:
            if mode == "resume":
                handle = await DBOS.retrieve_workflow_async(workflow_id)
                return str(await handle.get_result(polling_interval_sec=0.01))
            with SetWorkflowID(workflow_id):
                return str(await run_workflow(PROMPT))

        yield go

    DBOS.launch()
    try:
        return await run_each(probe, sizes, mode, session)
    finally:
        DBOS.destroy()


RUNNERS = {"plain": run_plain, "tether": run_tether, "dbos": run_dbos}
BENCH = AgentBench(Path(__file__).resolve(), SYSTEMS, LABELS, LEASE)


# ---------------------------------------------------------------------------- the parent


def markdown(runs: Timed, found: Killed, sizes: Sequence[int], rounds: int, seconds: float) -> str:
    return "\n".join([
        "### PydanticAI agents: tether against PydanticAI's DBOS integration", "",
        "One PydanticAI agent (a deterministic `FunctionModel` asking for one idempotent, trivial"
        " tool N times, then answering), run plain, under tether's `PydanticAIAgent` (SQLite"
        " store, default settings) and with PydanticAI's `DBOSDurability` inside a DBOS workflow"
        f" (DBOS SQLite; the tool a `@DBOS.step`). {timed_as(rounds)} and DBOS one system"
        " database,"
        " the agent built once per process (`bench/pydantic_ai_durable.py`).", "",
        *BENCH.tables(runs, found, sizes, "Issue 27's target", PACKAGES, seconds),
    ])


def main() -> None:
    parser = BENCH.parser(__doc__.splitlines()[0], "benchmarks-pydantic-ai.md")
    BENCH.main(parser, parser.parse_args(), RUNNERS, markdown)


if __name__ == "__main__":
    main()
