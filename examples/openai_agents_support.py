"""A customer-support desk written with the OpenAI Agents SDK, run as a durable tether task.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=qwen2.5 python examples/openai_agents_support.py
    python examples/openai_agents_support.py --fake     # the same flow against the scripted server

A triage agent hands the customer off to a refunds agent, which looks the order up (a read,
safe to repeat) and refunds it (a side effect, keyed: a crash never pays twice). An input
guardrail refuses messages holding a card number before any model is asked. The agents are
plain Agents SDK code; one line (``add_agent``) puts them under tether: every model call a
committed step, every tool call behind a resume point, the handoff a frame on the task stack.
Kill the process at any moment and run it again with the same --db: it carries on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from contextlib import AbstractContextManager
from typing import Any

from _chat_example import Model, main, run_task, scripted_model
from agents import (
    Agent,
    GuardrailFunctionOutput,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunContextWrapper,
    function_tool,
    input_guardrail,
)
from openai import AsyncOpenAI

import tether as tt
from tether.integrations.openai_agents import OpenAIAgentsAgent, current_call
from tether.testing.fake_openai import call, reply

ORDERS = {"A1": {"item": "kettle", "paid": 40, "state": "arrived broken"}}
refunds: dict[str, int] = {}  # idempotency key -> cents: what a payment provider would keep


@function_tool
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: the item, what was paid (EUR) and its delivery state."""
    return ORDERS[order_id]


@function_tool
async def refund(order_id: str, amount: int) -> str:
    """Refund part of an order, in EUR."""
    refunds.setdefault(current_call().idempotency_key, amount)  # the provider dedupes by key
    return f"refunded {amount} EUR on {order_id}"


@input_guardrail
async def no_card_numbers(ctx: RunContextWrapper[Any], agent: Agent[Any],
                          input: Any) -> GuardrailFunctionOutput:
    card = re.search(r"\b(?:\d[ -]?){13,16}\b", str(input))
    return GuardrailFunctionOutput(output_info={"card_number": bool(card)},
                                   tripwire_triggered=bool(card))


def desk(model: OpenAIChatCompletionsModel) -> Agent[Any]:
    refunds_agent = Agent(name="refunds", model=model, tools=[lookup_order, refund],
                          instructions="Look the order up, refund what is fair, then say what"
                                       " you did in one sentence.")
    return Agent(name="triage", model=model, handoffs=[refunds_agent],
                 input_guardrails=[no_card_numbers],
                 instructions="Hand refund requests to the refunds agent.")


def build(db: str, **model: str) -> tt.Harness:
    client = AsyncOpenAI(base_url=model.get("base_url") or os.environ.get("OPENAI_BASE_URL"),
                         api_key=model.get("api_key") or os.environ.get("OPENAI_API_KEY") or "none",
                         max_retries=0)  # tether owns retries
    name = model.get("model") or os.environ.get("OPENAI_MODEL") or "gpt-4o-mini"
    harness = tt.Harness(f"sqlite:///{db}")
    harness.add_agent("support", OpenAIAgentsAgent(
        desk(OpenAIChatCompletionsModel(name, openai_client=client)),
        tools={"lookup_order": tt.ToolPolicy(idempotent=True)},  # refund: a side effect
        run_config=RunConfig(tracing_disabled=True)))  # no trace export to OpenAI
    return harness


def fake_model() -> AbstractContextManager[Model]:
    return scripted_model([reply(tool_calls=[call("transfer_to_refunds", {})]),
                           reply(tool_calls=[call("lookup_order", {"order_id": "A1"})]),
                           reply(tool_calls=[call("refund", {"order_id": "A1", "amount": 5})]),
                           reply("Order A1 arrived broken: I refunded 5 EUR.")])


async def support(db: str, model: dict[str, str]) -> None:
    async with build(db, **model) as harness:
        info = await run_task(harness, "support", "My kettle (order A1) arrived broken.",
                              "ticket-A1")
        print(f"agents: {' -> '.join(_agents_seen(await harness.history('ticket-A1')))}"
              f"; refunds paid: {len(refunds)}; tokens: {dict(info.snapshot.usage)}")
        with contextlib.suppress(tt.TaskExists):
            await harness.submit("support", "Refund A1 to my card 4111 1111 1111 1111",
                                 task_id="ticket-card")
        await harness.run_until_idle(timeout=60)
        print(f"ticket-card: {(await harness.get('ticket-card')).snapshot.error}")


def _agents_seen(rows: list[dict[str, Any]]) -> list[str]:
    """Who held the conversation: the starting agent, then each handoff's target (the SDK's
    transfer message sits beside the handoff call in the ``model`` row)."""
    seen = ["triage"]
    for row in rows:
        for item in row.get("messages", []) if row.get("role") == "model" else []:
            if item.get("type") == "function_call_output" and '"assistant"' in item["output"]:
                seen.append(json.loads(item["output"])["assistant"])
    return seen


if __name__ == "__main__":
    main(__doc__ or "", support, fake_model)
