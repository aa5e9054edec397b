"""A PydanticAI agent with a scripted model, as a tether app: ``tether torture`` runs it like a
native agent (issue 17), and it needs no model server.

    tether torture tether.examples.pydantic_ai_refunds:harness refunds --input '"Refund A1 and B2"'

The model (PydanticAI's ``FunctionModel``) looks each order up, refunds it, then answers.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import tether as tt
from tether.integrations.pydantic_ai import PydanticAIAgent

ORDERS = ("A1", "B2")


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Look up and refund each order in turn, then say so (decided from the history alone)."""
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if len(returned) >= 2 * len(ORDERS):
        return ModelResponse(parts=[TextPart(f"Refunded {', '.join(ORDERS)}.")])
    order = ORDERS[len(returned) // 2]
    if len(returned) % 2 == 0:
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": order},
                                                 tool_call_id=f"look-{order}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": order, "amount": 5},
                                             tool_call_id=f"pay-{order}")])


agent: Agent[None, str] = Agent(FunctionModel(scripted))


@agent.tool_plain
async def lookup(order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "paid": 40}


@agent.tool_plain
async def refund(order: str, amount: int) -> str:
    """Refund part of an order."""
    return f"refunded {amount} on {order}"


harness = tt.Harness()
harness.add_agent("refunds", PydanticAIAgent(agent, stream=False,
                                             tools={"lookup": tt.ToolPolicy(idempotent=True)}))
