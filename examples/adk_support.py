"""A Google ADK support agent run durably by tether, unchanged but for one line.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=Qwen2.5-7B-Instruct \\
        python examples/adk_support.py
    python examples/adk_support.py --fake

The agent is plain ADK: an ``LlmAgent`` with an instruction and two function tools. Its model
here is an OpenAI-compatible server (``OpenAIChatLlm``); with Gemini, give ``LlmAgent`` the
model's name instead. ``ADKAgent`` makes each model answer a committed step and each function
call a tether call with an idempotency key: the refund reads the key with
``tt.current_call()`` and hands it to the payment service, which would deduplicate a retry.
The lookup is declared idempotent; the refund keeps the safe default (a side effect, never
blindly repeated after a crash).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from _chat_example import REFUND_SCRIPT, Model, main, run_task, scripted_model
from google.adk.agents import LlmAgent
from openai import AsyncOpenAI

import tether as tt
from tether.integrations.adk import ADKAgent
from tether.integrations.adk_openai import OpenAIChatLlm

ORDERS = {"A1": {"paid": 40, "state": "arrived broken"}}


def lookup(order: str) -> dict[str, Any]:
    """Look an order up: what was paid and what state it is in."""
    return ORDERS.get(order, {"error": f"no order {order}"})


async def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    key = tt.current_call().idempotency_key  # pass it to the payment API
    return f"refunded {amount} EUR on {order} (payment key {key})"


def support_agent(model: dict[str, str]) -> LlmAgent:
    """The ADK agent, as its authors would write it."""
    client = AsyncOpenAI(base_url=model.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
                         api_key=model.get("api_key") or os.environ.get("OPENAI_API_KEY")
                         or "not-needed", max_retries=0)
    chat = OpenAIChatLlm(model=model.get("model") or os.environ.get("OPENAI_MODEL")
                         or "gpt-4o-mini", client=client)
    return LlmAgent(name="support", model=chat, tools=[lookup, refund],
                    instruction="You help customers with their orders.")


def fake_model() -> AbstractContextManager[Model]:
    return scripted_model(REFUND_SCRIPT)


async def support(db: str, model: dict[str, str]) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("support", ADKAgent(
        support_agent(model), tools={"lookup": tt.ToolPolicy(idempotent=True)}))
    async with harness:
        await run_task(harness, "support", "Order A1 arrived broken; refund 5 EUR.", "ticket-A1")


if __name__ == "__main__":
    main(__doc__ or "", support, fake_model)
