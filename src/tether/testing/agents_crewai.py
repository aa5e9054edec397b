"""The conformance case of the CrewAI adapter (issue 31), apart from the others: CrewAI pins
what other extras need otherwise, so it is installed, type-checked and tested in an
environment of its own (``.ci/crewai-venv``). ``build_crewai`` imports CrewAI when called.
"""

from __future__ import annotations

from typing import Any

import tether as tt
from tether.testing.agents_world import AGENT, AdapterCase, Endpoint, Shop

__all__ = ["CREWAI"]


def build_crewai(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """A crew of one agent and one task (``{input}``: the task's input) with two CrewAI
    tools, its ``LLM`` CrewAI's own OpenAI provider on the fake (streaming when the model
    can), its async client wired through the watched wire."""
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool

    from tether.integrations.crewai import CrewAIAgent

    @tool("lookup")
    async def lookup(order: str) -> Any:
        """Look an order up."""
        return await shop.lookup(tt.current_call(), order)

    @tool("refund")
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(tt.current_call(), order, amount)

    llm = LLM(model="openai/fake-model", base_url=endpoint.url, api_key="none",
              max_retries=0, stream=endpoint.can_stream)
    llm._async_client = endpoint.openai_client()
    clerk = Agent(role="clerk", goal="Help the customer.", backstory="You work in a shop.",
                  tools=[lookup, refund], llm=llm)
    crew = Crew(agents=[clerk], tasks=[Task(description="{input}", agent=clerk,
                                            expected_output="The answer to the customer.")])
    h.add_agent(AGENT, CrewAIAgent(crew, tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "refund": tt.ToolPolicy(side_effect=True,
                                reconcile=shop.find_refund if shop.reconcile else None)}))


CREWAI = AdapterCase(
    "crewai", build_crewai, preload=("tether.integrations.crewai", "crewai"),
    not_applicable={"approvals": "CrewAI has no tool approval of its own to map (its hooks"
                                 " ask a person at the terminal)"})
"""Not in :data:`tether.testing.agents_cases.TETHER_CASES`: CrewAI's pins need an environment
of their own (``.ci/crewai-venv``)."""
