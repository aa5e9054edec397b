"""A PydanticAI agent under tether (R1, R10, R17, E1; issue 17).

PydanticAI's own ``FunctionModel`` and ``TestModel`` stand in for the model (no server),
and PydanticAI's OpenAI model streams from ``tether.testing.fake_openai`` for the cut. The
store is a real SQLite file. Kills with SIGKILL are in tests/chaos.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, wait_until
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import RequestUsage

import tether as tt
from tether.errors import ConfigurationError
from tether.integrations.pydantic_ai import KEY, PydanticAIAgent, current_call, messages_of
from tether.testing.fake_openai import FakeOpenAI, reply


class Shop:
    """A refund service that records each refund under the key it was sent."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, str]] = []
        self.lookups = 0


def refund_agent(model: Any, shop: Shop) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(model)

    @agent.tool
    async def refund(ctx: RunContext[None], order: str, amount: int) -> str:
        """Refund an order."""
        key = (ctx.metadata or {}).get(KEY)
        assert key == current_call().idempotency_key
        shop.refunds.append((key, order))
        return f"refunded {amount} on {order}"

    @agent.tool_plain
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        shop.lookups += 1
        return {"order": order, "paid": 40}

    return agent


def scripted(calls: int = 1) -> FunctionModel:
    """A model that asks for a lookup and a refund, then answers in words."""
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(returned) >= 2 * calls:
            return ModelResponse(parts=[TextPart(f"Done after {len(returned)} tool results.")],
                                 usage=RequestUsage(input_tokens=30, output_tokens=6))
        n = len(returned) // 2
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": f"A{n}"}, tool_call_id=f"l{n}"),
                                    ToolCallPart("refund", {"order": f"A{n}", "amount": 5},
                                                 tool_call_id=f"r{n}")],
                             usage=RequestUsage(input_tokens=20, output_tokens=9))
    return FunctionModel(answer)


def harness(tmp_path: Path, agent: Agent[Any, Any], **options: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{tmp_path / 'pai.db'}", settings=fast_settings())
    options.setdefault("tools", {"lookup": tt.ToolPolicy(idempotent=True)})
    options.setdefault("stream", not isinstance(agent.model, FunctionModel))
    h.add_agent("support", PydanticAIAgent(agent, **options))
    return h


async def test_r17_a_pydantic_ai_agent_runs_as_a_tether_task_in_one_line(tmp_path: Path) -> None:
    shop = Shop()
    h = harness(tmp_path, refund_agent(scripted(), shop))
    assert {"support.refund", "support.lookup"} <= set(h.tools)
    assert h.tools["support.refund"].side_effect and not h.tools["support.lookup"].side_effect
    tid = await h.submit("support", "Refund 5 on A0")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Done after 2 tool results."
    assert len(shop.refunds) == 1 and shop.lookups == 1
    keys = {r.key for r in await h.store.list_idempotency(tid)}
    assert shop.refunds[0][0] in keys  # the tool saw tether's key, in metadata and current_call
    assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 50, "completion_tokens": 15}
    await h.close()


async def test_r08_the_history_in_the_task_is_pydantic_ais_own_and_appended(
        tmp_path: Path) -> None:
    """The dialog rows rebuild exactly the message history PydanticAI had: the opening
    request, each answer, each tool return, in order; a resumed run sends the model that."""
    shop = Shop()
    seen: list[list[ModelMessage]] = []
    model = scripted(calls=2)

    def watching(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return model.function(messages, info)  # type: ignore[misc,return-value]

    h = harness(tmp_path, refund_agent(FunctionModel(watching), shop))
    tid = await h.submit("support", "Refund A0 and A1")
    await h.run_until_idle(timeout=10)
    rows = await h.history(tid)
    rebuilt = messages_of(rows, "Refund A0 and A1", "support.")
    assert [type(m).__name__ for m in rebuilt] == ["ModelRequest", "ModelResponse"] * 3
    assert [_kinds(m) for m in rebuilt[:4]] == [["user-prompt"], ["tool-call", "tool-call"],
                                                 ["tool-return", "tool-return"],
                                                 ["tool-call", "tool-call"]]
    assert [_kinds(m) for m in seen[-1]] == [_kinds(m) for m in rebuilt[:-1]]
    assert len(seen) == 3 and len(shop.refunds) == 2
    await h.close()


def _kinds(message: ModelMessage) -> list[str]:
    return [part.part_kind for part in message.parts]


async def test_r17_test_model_calls_every_tool(tmp_path: Path) -> None:
    shop = Shop()
    h = harness(tmp_path, refund_agent(TestModel(), shop))
    tid = await h.submit("support", "anything")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert len(shop.refunds) == 1 and shop.lookups == 1
    assert "refund" in str(info.snapshot.result) and "lookup" in str(info.snapshot.result)
    await h.close()


async def test_r22_model_retry_from_a_tool_goes_back_to_the_model(tmp_path: Path) -> None:
    agent: Agent[None, str] = Agent(None)
    tries: list[int] = []

    @agent.tool_plain
    async def lookup(order: str) -> str:
        """Look an order up."""
        tries.append(1)
        if not order.startswith("A"):
            raise ModelRetry("order ids start with A")
        return "paid"

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if last and last[-1].content == "paid":
            return ModelResponse(parts=[TextPart("It is paid.")])
        order = "A7" if last else "7"
        return ModelResponse(parts=[ToolCallPart("lookup", {"order": order}, tool_call_id=order)])

    agent.model = FunctionModel(answer)  # type: ignore[assignment]
    h = harness(tmp_path, agent)
    tid = await h.submit("support", "Is 7 paid?")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == "It is paid." and len(tries) == 2
    returns = [r for r in await h.history(tid) if r.get("role") == "tool"]
    assert returns[0]["content"][0]["outcome"] == "retried"
    await h.close()


async def test_r03_a_user_message_reaches_the_next_model_request(tmp_path: Path) -> None:
    """P1: a user message sent while a tool runs is in the next request, as a user prompt."""
    agent: Agent[None, str] = Agent(None)
    release = asyncio.Event()
    prompts: list[str] = []

    @agent.tool_plain
    async def slow_lookup(order: str) -> str:
        """Look an order up, slowly."""
        await release.wait()
        return "paid"

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts.extend(str(p.content) for p in messages[-1].parts if isinstance(p, UserPromptPart))
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("slow_lookup", {"order": "A1"}, tool_call_id="s")])
        return ModelResponse(parts=[TextPart("Noted.")])

    agent.model = FunctionModel(answer)  # type: ignore[assignment]
    h = harness(tmp_path, agent, tools={"slow_lookup": tt.ToolPolicy(idempotent=True)})
    tid = await h.submit("support", "Check A1")
    worker = asyncio.create_task(h.run_until_idle(timeout=10))
    await wait_until(lambda: h.runners.get(tid) is not None, what="the task to run")
    await h.emit(tt.Event("user_message", tid, "also check A2 please"))
    release.set()
    await worker
    assert prompts == ["Check A1", "also check A2 please"]
    assert (await h.get(tid)).snapshot.result == "Noted."
    await h.close()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


async def test_e1_a_p0_cuts_a_streaming_request_and_keeps_the_partial_text(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """PydanticAI's OpenAI model streams from the fake server; a P0 cuts the answer, the
    partial text is in the dialog marked cut off, and the next request carries it."""
    fake.add(reply("Let me think about this very carefully " * 20, chunks=200, chunk_delay=0.02),
             reply("Stopped, as you asked."))
    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=fake.url, api_key="none"))
    h = harness(tmp_path, refund_agent(model, Shop()))
    tid = await h.submit("support", "Think hard")
    worker = asyncio.create_task(h.run_until_idle(timeout=20))
    await wait_until(lambda: fake.completions == 1, what="the request")
    await asyncio.sleep(0.2)  # some text has streamed (the whole answer takes 4 s)
    await h.emit(tt.Event("user_interrupt", tid, "stop"))
    await wait_until(lambda: _status(h, tid, tt.Status.PAUSED), timeout=10, what="the pause")
    await worker
    cut = [r for r in await h.history(tid) if r.get("cut_off")]
    assert len(cut) == 1 and cut[0]["content"].startswith("Let me think")
    await h.resume(tid, "go on")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Stopped, as you asked."
    second = str(fake.requests[1]["messages"])
    assert "Let me think" in second and "[cut off" in second and "go on" in second
    await h.close()


async def _status(h: tt.Harness, tid: str, status: tt.Status) -> bool:
    return (await h.store.get_task(tid)).status is status


def test_r17_tool_policies_must_name_the_agents_tools() -> None:
    with pytest.raises(ConfigurationError, match="nope"):
        PydanticAIAgent(refund_agent(TestModel(), Shop()), tools={"nope": tt.ToolPolicy()})


def approval_agent(wiped: list[str]) -> Agent[None, str]:
    """A model that asks to wipe a disk (a tool that needs approval), then reports."""
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"{returned[0].outcome}: {returned[0].content}")])
        return ModelResponse(parts=[ToolCallPart("wipe", {"disk": "d1"}, tool_call_id="w1")])

    agent: Agent[None, str] = Agent(FunctionModel(answer))

    @agent.tool_plain(requires_approval=True)
    async def wipe(disk: str) -> str:
        """Wipe a disk."""
        wiped.append(disk)
        return f"wiped {disk}"

    return agent


@pytest.mark.parametrize(("answer", "result", "ran"), [
    (True, "success: wiped d1", ["d1"]),
    ({"approved": False, "reason": "not that disk"}, "denied: not that disk", []),
])
async def test_r26_a_tool_that_needs_approval_waits_for_a_person(
        tmp_path: Path, answer: Any, result: str, ran: list[str]) -> None:
    """PydanticAI's tool approval is a tether Wait: the task waits (no worker held) until an
    ``approval`` event comes; approved, the tool runs as approved; denied, the model is told."""
    wiped: list[str] = []
    h = harness(tmp_path, approval_agent(wiped), tools={})
    tid = await h.submit("support", "Wipe d1")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.WAITING and wiped == []
    await h.emit(tt.Event("approval", tid, answer))
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == result and wiped == ran
    await h.close()


async def test_r26_no_approval_in_time_is_a_denial(tmp_path: Path) -> None:
    wiped: list[str] = []
    h = harness(tmp_path, approval_agent(wiped), tools={}, approval_timeout=0.05)
    tid = await h.submit("support", "Wipe d1")
    await h.run_until_idle(timeout=10)
    await asyncio.sleep(0.1)  # past the wait's due time: the next worker fires its timer
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == "denied: No one approved the call in time." and wiped == []
    await h.close()


def test_r08_a_cut_first_answer_still_opens_with_the_prompt() -> None:
    rows = [{"role": "assistant", "content": "Let me", "cut_off": True},
            {"role": "user", "type": "user_interrupt", "content": "stop"}]
    rebuilt = messages_of(rows, "Think hard")
    assert isinstance(rebuilt[0], ModelRequest) and rebuilt[0].parts[0].content == "Think hard"
    assert isinstance(rebuilt[1], ModelResponse) and "cut off" in str(rebuilt[1].parts[0])
    assert "[user_interrupt] stop" in str(rebuilt[2].parts[0])


async def test_r12_the_same_refund_asked_again_and_again_stops_at_the_limit(
        tmp_path: Path) -> None:
    """The model asks for the same refund every turn, each time under a new call id: the
    call id is not part of what the call does, so the fourth is held for a person."""
    def again(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 5},
                                                 tool_call_id=f"r{len(messages)}")])

    shop = Shop()
    h = harness(tmp_path, refund_agent(FunctionModel(again), shop))
    tid = await h.submit("support", "Refund A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN and len(shop.refunds) == 3
    assert "support.refund with the same arguments a 4th time" in (info.record.reason or "")
    await h.close()


async def test_r03_a_task_without_a_prompt_is_refused_at_once(tmp_path: Path) -> None:
    h = harness(tmp_path, refund_agent(TestModel(), Shop()))
    with pytest.raises(tt.InvalidInput, match="needs an input"):
        await h.submit("support")
    assert await h.store.list_tasks() == []  # nothing was stored
    await h.close()
