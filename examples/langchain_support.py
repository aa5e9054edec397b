"""A LangChain support agent run durably by tether, unchanged but for one line.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=Qwen2.5-7B-Instruct \
        python examples/langchain_support.py
    python examples/langchain_support.py --fake

The agent is plain LangChain v1: ``create_agent`` with a chat model, a system prompt and two
tools. ``LangChainAgent`` makes each model turn a committed step and each tool call a tether
call with an idempotency key: the refund tool reads the key from its ``ToolRuntime`` and
hands it to the payment service, which would deduplicate a retry. The lookup is declared
idempotent; the refund keeps the safe default (a side effect, never blindly repeated after a
crash).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any

from _chat_example import REFUND_SCRIPT, Model, main, run_task, scripted_model
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import tether as tt
from tether.integrations.langchain import KEY, LangChainAgent

ORDERS = {"A1": {"paid": 40, "state": "arrived broken"}}


@tool
def lookup(order: str) -> dict[str, Any]:
    """Look an order up: what was paid and what state it is in."""
    return ORDERS.get(order, {"error": f"no order {order}"})


@tool
async def refund(order: str, amount: int, runtime: ToolRuntime) -> str:
    """Refund part of an order."""
    key = runtime.config["configurable"][KEY]  # pass it to the payment API
    return f"refunded {amount} EUR on {order} (payment key {key})"


def support_agent(model: dict[str, str]) -> Any:
    """The LangChain agent, as its authors would write it."""
    chat = ChatOpenAI(model=model.get("model") or os.environ.get("OPENAI_MODEL") or "gpt-4o-mini",
                      base_url=model.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
                      api_key=model.get("api_key") or os.environ.get("OPENAI_API_KEY")  # type: ignore[arg-type]
                      or "not-needed")
    return create_agent(chat, tools=[lookup, refund],
                        system_prompt="You help customers with their orders.")


def fake_model() -> AbstractContextManager[Model]:
    return scripted_model(REFUND_SCRIPT)


async def support(db: str, model: dict[str, str]) -> None:
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("support", LangChainAgent(
        support_agent(model), tools={"lookup": tt.ToolPolicy(idempotent=True)}))
    async with harness:
        await run_task(harness, "support", "Order A1 arrived broken; refund 5 EUR.", "ticket-A1")


if __name__ == "__main__":
    main(__doc__ or "", support, fake_model)
