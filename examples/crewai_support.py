"""A CrewAI support crew run durably by tether, unchanged but for one line.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=Qwen2.5-7B-Instruct \\
        .crewai-venv/bin/python examples/crewai_support.py
    .crewai-venv/bin/python examples/crewai_support.py --fake

(CrewAI's own environment: ``bash .ci/crewai-venv``, or ``pip install -e '.[crewai]'`` in a
virtualenv of its own.) The crew is plain CrewAI: one agent with two tools and one task whose
description is the ticket (``{input}``). ``CrewAIAgent`` makes each model answer a committed
step and each tool call a tether call with an idempotency key: the refund reads the key with
``tt.current_call()`` and hands it to the payment service, which would deduplicate a retry.
The lookup is declared idempotent; the refund keeps the safe default (a side effect, never
blindly repeated after a crash).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from _chat_example import REFUND_SCRIPT, Model, main, run_task, scripted_model
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

import tether as tt
from tether.integrations.crewai import CrewAIAgent

ORDERS = {"A1": {"paid": 40, "state": "arrived broken"}}


@tool("lookup")
def lookup(order: str) -> dict[str, Any]:
    """Look an order up: what was paid and what state it is in."""
    return ORDERS.get(order, {"error": f"no order {order}"})


@tool("refund")
def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    key = tt.current_call().idempotency_key  # pass it to the payment API
    return f"refunded {amount} EUR on {order} (payment key {key})"


def support_crew(model: dict[str, str]) -> Crew:
    """The crew, as its authors would write it."""
    llm = LLM(model="openai/" + (model.get("model") or os.environ.get("OPENAI_MODEL")
                                 or "gpt-4o-mini"),
              base_url=model.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
              api_key=model.get("api_key") or os.environ.get("OPENAI_API_KEY") or "not-needed")
    clerk = Agent(role="support", goal="Help customers with their orders.",
                  backstory="You work at the shop's help desk.", tools=[lookup, refund],
                  llm=llm)
    ticket = Task(description="{input}", expected_output="What was done, for the customer.",
                  agent=clerk)
    return Crew(agents=[clerk], tasks=[ticket])


def fake_model() -> AbstractContextManager[Model]:
    return scripted_model(REFUND_SCRIPT)


async def support(db: str, model: dict[str, str]) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("support", CrewAIAgent(
        support_crew(model), tools={"lookup": tt.ToolPolicy(idempotent=True)}))
    async with harness:
        await run_task(harness, "support", "Order A1 arrived broken; refund 5 EUR.", "ticket-A1")


if __name__ == "__main__":
    main(__doc__ or "", support, fake_model)
