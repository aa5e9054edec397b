"""One Google ADK agent, plain and under tether (issue 31): what tether costs per tool call,
and what a SIGKILL costs in model requests.

The same shape as ``pydantic_ai_durable.py``, for ADK: the agent is the same ``LlmAgent`` in
every run, and only what makes it durable changes:

* **plain**: ADK's ``InMemoryRunner``, no durability (ADK runs the tools itself): the
  baseline every overhead is taken from;
* **tether**: the agent under :class:`tether.integrations.adk.ADKAgent`, on the embedded
  SQLite store with default settings (the tool marked ``idempotent``).

No durable peer runs here: DBOS's, Restate's and Temporal's ADK integrations are not in
this machine's package index at the versions that ship them, so the table shows tether
against plain ADK only.

The agent: a deterministic ``BaseLlm`` (no server) that asks for the tool until the
conversation holds N function responses, then answers ``done N``; one idempotent tool with
a ~200-byte argument and a ~500-byte result that does no work. The figures, as in the other
agent benchmarks: overhead per tool call over the plain run (wall and CPU clocks, rounds
interleaved), and model requests and tool calls after a SIGKILL inside tool call N/2 and a
restart (tether's recovery; the plain run can only start over).

    .venv/bin/python bench/adk_durable.py [--steps 10,100,300] [--rounds 3]

(the project's own environment with the ``google-adk`` extra) prints markdown tables and
exits 0 (1 if a run failed).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_runs import AgentBench, Go, Killed, Probe, Timed, run_each, tether_sessions, timed_as
from workload import ARG

SYSTEMS = ("plain", "tether")
LABELS = {
    "plain": "ADK InMemoryRunner, no durability",
    "tether": "tether ADKAgent, SQLite (default)",
}
PROMPT = "Work through the list."
PACKAGES = ("google-adk", "tether")
"""Whose versions the tables name."""
LEASE = 1.0
"""tether's lease in the kill figure only: the restarted process waits this out."""


# ---------------------------------------------------------------------------- the child


def build_agent(probe: Probe) -> Any:
    """The agent both systems run."""
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class Worker(BaseLlm):
        """Asks for the next tool call until there are N tool results, then answers."""

        model: str = "bench"

        async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                         ) -> AsyncGenerator[LlmResponse, None]:
            probe.model_called()
            done = sum(p.function_response is not None for c in llm_request.contents
                       for p in c.parts or [])
            part = types.Part(text=f"done {done}") if done >= probe.steps else types.Part(
                function_call=types.FunctionCall(id=f"call_{done}", name="work",
                                                 args={"payload": ARG, "n": done}))
            yield LlmResponse(content=types.Content(role="model", parts=[part]),
                              turn_complete=True)

    async def work(payload: str, n: int) -> str:
        """One step of the agent's work (trivial, idempotent)."""
        return probe.tool_called(n)

    return LlmAgent(name="bench", model=Worker(), tools=[work])


async def run_plain(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    runner = InMemoryRunner(agent=build_agent(probe), app_name="bench")

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        made = await runner.session_service.create_session(app_name="bench", user_id="u")

        async def go() -> str:
            text = ""
            async for event in runner.run_async(
                    user_id="u", session_id=made.id,
                    new_message=types.Content(role="user", parts=[types.Part(text=PROMPT)])):
                if event.is_final_response() and event.content is not None:
                    text = "".join(p.text or "" for p in event.content.parts or [])
            return text

        yield go

    return await run_each(probe, sizes, mode, session)


async def run_tether(probe: Probe, sizes: Sequence[int], mode: str
                     ) -> dict[int, dict[str, Any]]:
    """The agent under tether's ``ADKAgent`` (:func:`agent_runs.tether_sessions`)."""
    import tether as tt
    from tether.integrations.adk import ADKAgent

    framework = build_agent(probe)  # once per process, as the plain run does

    def agent() -> ADKAgent:
        return ADKAgent(framework, tools={"work": tt.ToolPolicy(idempotent=True)})

    async with tether_sessions(mode, LEASE, PROMPT, agent, probe.folder,
                               max(sizes)) as session:
        return await run_each(probe, sizes, mode, session)


RUNNERS = {"plain": run_plain, "tether": run_tether}
BENCH = AgentBench(Path(__file__).resolve(), SYSTEMS, LABELS, LEASE, peer="none",
                   peer_name="no durable peer")


# ---------------------------------------------------------------------------- the parent


def markdown(runs: Timed, found: Killed, sizes: Sequence[int], rounds: int, seconds: float) -> str:
    return "\n".join([
        "### Google ADK agents: tether against plain ADK", "",
        "One ADK `LlmAgent` (a deterministic `BaseLlm` asking for one idempotent, trivial tool"
        " N times, then answering), run plain with ADK's `InMemoryRunner` and under tether's"
        f" `ADKAgent` (SQLite store, default settings). {timed_as(rounds)},"
        " the agent built once per process (`bench/adk_durable.py`).", "",
        *BENCH.tables(runs, found, sizes, "Issue 27's target, for ADK", PACKAGES, seconds),
    ])


def main() -> None:
    parser = BENCH.parser(__doc__.splitlines()[0], "benchmarks-adk.md")
    BENCH.main(parser, parser.parse_args(), RUNNERS, markdown)


if __name__ == "__main__":
    main()
