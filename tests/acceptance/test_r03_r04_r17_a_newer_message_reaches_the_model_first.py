"""R3, R4, R17 (issue 27): a user's "stop" reaches the model before the rest of an older
answer runs, under every model agent tether ships.

The model answers with two calls, ``lookup`` then ``refund``. While ``lookup`` runs, the user
sends a P1 ``user_message``: "STOP: do NOT refund A1". The refund must not be paid: the
engine holds the answer, sets the refund aside (answered "not run: a newer message arrived
before it", so the provider's protocol holds), and asks the model again, whose next request
holds the message. The same scenario runs for ``ChatAgent``, ``PydanticAIAgent``,
``OpenAIAgentsAgent`` and ``LangChainAgent``, each talking to ``tether.testing.fake_openai``
over HTTP with its own client; the refunds go to a list outside tether.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, run_alongside

import tether as tt
from tether.agents.chat import ChatAgent
from tether.engine.answers import NOT_RUN
from tether.testing.fake_openai import FakeOpenAI, call, reply

STOP = "STOP: do NOT refund A1"


class Shop:
    """The lookup blocks until the test let it go; refunds are counted here."""

    def __init__(self) -> None:
        self.refunds: list[str] = []
        self.looking = asyncio.Event()
        self.go_on = asyncio.Event()

    async def lookup(self, order: str) -> dict[str, Any]:
        self.looking.set()
        await self.go_on.wait()
        return {"order": order, "paid": 40}

    def refund(self, order: str, amount: int) -> str:
        self.refunds.append(order)
        return f"refunded {amount} on {order}"


def chat_agent(h: tt.Harness, shop: Shop, url: str) -> None:
    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(order)

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> str:
        """Refund an order."""
        return shop.refund(order, amount)

    h.add_agent("support", ChatAgent("fake", base_url=url, api_key="none",
                                     tools=[lookup, refund]))


def pydantic_ai_agent(h: tt.Harness, shop: Shop, url: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from tether.integrations.pydantic_ai import PydanticAIAgent

    agent = Agent(OpenAIChatModel("fake", provider=OpenAIProvider(base_url=url, api_key="none")),
                  name="support")

    @agent.tool_plain
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(order)

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return shop.refund(order, amount)

    h.add_agent("support", PydanticAIAgent(agent, tools={
        "lookup": tt.ToolPolicy(idempotent=True), "refund": tt.ToolPolicy(side_effect=True)}))


def openai_agents_agent(h: tt.Harness, shop: Shop, url: str) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, function_tool
    from openai import AsyncOpenAI

    from tether.integrations.openai_agents import OpenAIAgentsAgent

    @function_tool
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(order)

    @function_tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return shop.refund(order, amount)

    model = OpenAIChatCompletionsModel("fake", AsyncOpenAI(base_url=url, api_key="none",
                                                          max_retries=0))
    agent = Agent(name="support", model=model, tools=[lookup, refund])
    h.add_agent("support", OpenAIAgentsAgent(
        agent, run_config=RunConfig(tracing_disabled=True),
        tools={"lookup": tt.ToolPolicy(idempotent=True), "refund": tt.ToolPolicy(side_effect=True)}))


def langchain_agent(h: tt.Harness, shop: Shop, url: str) -> None:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from tether.integrations.langchain import LangChainAgent

    @tool
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        return await shop.lookup(order)

    @tool
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        return shop.refund(order, amount)

    model = ChatOpenAI(model="fake", base_url=url, api_key="none", max_retries=0)  # type: ignore[arg-type]
    h.add_agent("support", LangChainAgent(create_agent(model, tools=[lookup, refund]), tools={
        "lookup": tt.ToolPolicy(idempotent=True), "refund": tt.ToolPolicy(side_effect=True)}))


ADAPTERS: dict[str, Callable[[tt.Harness, Shop, str], None]] = {
    "chat": chat_agent, "pydantic_ai": pydantic_ai_agent, "openai_agents": openai_agents_agent,
    "langchain": langchain_agent}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI([reply(tool_calls=[call("lookup", {"order": "A1"}, "c_lookup"),
                                       call("refund", {"order": "A1", "amount": 5}, "c_refund")]),
                     reply("ok, I will not refund A1")]) as server:
        yield server


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_r03_r04_a_stop_between_the_calls_of_one_answer_reaches_the_model_first(
        adapter: str, tmp_path: Path, fake: FakeOpenAI) -> None:
    h = tt.Harness(f"sqlite:///{tmp_path / 'tether.db'}", settings=fast_settings())
    shop = Shop()
    ADAPTERS[adapter](h, shop, fake.url)
    task_id = await h.submit("support", "Refund 5 on order A1, after looking it up.")

    async def user() -> None:
        await asyncio.wait_for(shop.looking.wait(), 10)
        await h.emit(tt.Event("user_message", task_id, STOP))
        shop.go_on.set()

    await run_alongside(h, user(), timeout=20)

    info = await h.get(task_id)
    assert shop.refunds == [], "the refund of the older answer was paid after the stop"
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert fake.completions == 2
    asked_again = fake.requests[1]["messages"]
    said = [i for i, m in enumerate(asked_again) if m.get("role") == "user" and STOP in text_of(m)]
    not_run = [i for i, m in enumerate(asked_again)
               if m.get("role") == "tool" and NOT_RUN in text_of(m)]
    assert said, f"the model was not told: {asked_again}"
    assert len(not_run) == 1 and not_run[0] < said[0], asked_again  # answered, then the stop
    rows = await h.history(task_id)
    assert [r["tool_call"]["args"] for r in rows if "tool_call" in r and r.get("not_run")] \
        and not [r for r in rows if r.get("role") == "tool" and r.get("name", "").endswith("refund")
                 and not r.get("not_run")]
    assert "answer_set_aside" in [r["resume_strategy"]
                                  for r in await h.store.list_recovery_log(task_id)]
    await h.close()


@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_r04_a_message_that_comes_after_the_answer_ran_changes_nothing_it_did(
        adapter: str, tmp_path: Path, fake: FakeOpenAI) -> None:
    """The control: with no message, the same answer pays the refund once."""
    h = tt.Harness(f"sqlite:///{tmp_path / 'tether.db'}", settings=fast_settings())
    shop = Shop()
    shop.go_on.set()
    ADAPTERS[adapter](h, shop, fake.url)
    task_id = await h.submit("support", "Refund 5 on order A1, after looking it up.")
    await h.run_until_idle(timeout=20)
    assert shop.refunds == ["A1"]
    assert (await h.get(task_id)).record.status is tt.Status.COMPLETED
    await h.close()
