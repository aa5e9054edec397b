"""R1, R10, R13, R17, R21, R26: the kill half of the model-agent conformance suite over every
model adapter tether ships (ChatAgent, PydanticAIAgent, OpenAIAgentsAgent): worker processes
SIGKILLed at each failpoint and mid-stream, the fake model in this process counting every
completion, a ledger file outside tether counting every refund. The suite is
``tether.testing.agents``; it replaces the three adapters' own kill tests
(test_r01_r10_{chat_agent,pydantic_ai,openai_agents}_killed.py).

One thing those tests checked is not the suite's, because it is PydanticAI's own: a refund's
reconcile hook in the model's-call form ``(ctx, tool_call_id, args)`` returning PydanticAI's
parts, asked after a real kill. :data:`PARTS_HOOK` is that variant of the PydanticAI case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.testing.agents import (
    AGENT,
    KILL_POINTS,
    PYDANTIC_AI,
    TETHER_CASES,
    AdapterCase,
    AgentKillConformance,
    Endpoint,
    KillPoint,
    Shop,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=TETHER_CASES, ids=str)
def case(request: pytest.FixtureRequest) -> AdapterCase:
    param: AdapterCase = request.param
    return param


class TestTetherAdaptersKilled(AgentKillConformance):
    """Every kill property of the suite, for each of tether's model adapters."""


def build_pydantic_ai_parts_hook(h: tt.Harness, shop: Shop, endpoint: Endpoint) -> None:
    """The PydanticAI case, its refund's hook in the older form: the model's call in, the
    parts that answer it out (what test_r01_r10_pydantic_ai_killed.py used)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from tether.integrations.pydantic_ai import PydanticAIAgent, current_call

    agent: Agent[None, str] = Agent(OpenAIChatModel(
        "fake-model", provider=OpenAIProvider(openai_client=endpoint.openai_client())))

    @agent.tool_plain
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(current_call(), order)

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return await shop.refund(current_call(), order, amount)

    async def reconcile(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
        value = await shop.find_refund(ctx, **args)
        return None if value is None else [{"part_kind": "tool-return", "tool_name": "refund",
                                            "tool_call_id": tool_call_id, "content": value}]

    h.add_agent(AGENT, PydanticAIAgent(agent, tools={
        "lookup": tt.ToolPolicy(idempotent=True),
        "refund": tt.ToolPolicy(side_effect=True, reconcile=reconcile)}))


PARTS_HOOK = AdapterCase("pydantic_ai_parts_hook", build_pydantic_ai_parts_hook,
                         preload=PYDANTIC_AI.preload)


@pytest.mark.parametrize("point", [p for p in KILL_POINTS
                                   if p.spec in ("after_resume_point@2", "inside_tool@1")], ids=str)
async def test_r10_r17_a_pydantic_ai_hook_returning_parts_settles_a_killed_refund(
        tmp_path: Path, point: KillPoint) -> None:
    """R10, R17: the suite's failpoint property for :data:`PARTS_HOOK`: killed before the
    refund ran (the hook says None: it runs once) and after the provider took it (the hook's
    parts are the call's return): no extra completion, the refund paid once."""
    await AgentKillConformance().test_r01_r10_a_kill_at_each_failpoint_costs_no_extra_completion(
        PARTS_HOOK, tmp_path, point)
