"""A PydanticAI support agent run durably by tether, unchanged but for one line.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=Qwen2.5-7B-Instruct \
        python examples/pydantic_ai_support.py
    python examples/pydantic_ai_support.py --fake

The agent is plain PydanticAI: a model, a system prompt, two tools. ``PydanticAIAgent``
makes each model request a committed step and each tool call a tether call with an
idempotency key: the refund tool hands the key to the payment service, which would
deduplicate a retry. The lookup is declared idempotent; the refund keeps the safe default
(a side effect, never blindly repeated after a crash).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from _chat_example import REFUND_SCRIPT, Model, main, run_task, scripted_model
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import tether as tt
from tether.integrations.pydantic_ai import PydanticAIAgent, current_call

ORDERS = {"A1": {"paid": 40, "state": "arrived broken"}}


def support_agent(model: dict[str, str]) -> Agent[None, str]:
    """The PydanticAI agent, as its authors would write it."""
    provider = OpenAIProvider(base_url=model.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
                              api_key=model.get("api_key") or os.environ.get("OPENAI_API_KEY")
                              or "not-needed")
    name = model.get("model") or os.environ.get("OPENAI_MODEL") or "gpt-4o-mini"
    agent: Agent[None, str] = Agent(OpenAIChatModel(name, provider=provider),
                                    system_prompt="You help customers with their orders.")

    @agent.tool_plain
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up: what was paid and what state it is in."""
        return ORDERS.get(order, {"error": f"no order {order}"})

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        """Refund part of an order."""
        key = current_call().idempotency_key  # pass it to the payment API
        return f"refunded {amount} EUR on {order} (payment key {key})"

    return agent


def fake_model() -> AbstractContextManager[Model]:
    return scripted_model(REFUND_SCRIPT)


async def support(db: str, model: dict[str, str]) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("support", PydanticAIAgent(
        support_agent(model), tools={"lookup": tt.ToolPolicy(idempotent=True)}))
    async with harness:
        await run_task(harness, "support", "Order A1 arrived broken; refund 5 EUR.", "ticket-A1")


if __name__ == "__main__":
    main(__doc__ or "", support, fake_model)
