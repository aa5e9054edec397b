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
from pydantic_ai import Agent, CallDeferred, ModelRetry, RunContext
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
from tether.agent import HistoryView
from tether.errors import ConfigurationError
from tether.integrations import pydantic_ai as integration
from tether.integrations.pydantic_ai import (
    KEY,
    Dialog,
    PydanticAIAgent,
    current_call,
    messages_of,
)
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


def harness(tmp_path: Path, agent: Agent[Any, Any], settings: tt.Settings | None = None,
            **options: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{tmp_path / 'pai.db'}", settings=settings or fast_settings())
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


async def test_r17_a_running_task_decodes_only_the_rows_added_since_its_last_plan(
        tmp_path: Path) -> None:
    """Issue 27: the history is kept between plans and fed only new rows; fed in any two
    pieces it is the history decoded from all rows at once, and what the model was sent at
    each plan is that. After a rollback (other row objects) it is decoded again."""
    shop = Shop()
    seen: list[list[ModelMessage]] = []
    model = scripted(calls=3)

    def watching(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return model.function(messages, info)  # type: ignore[misc,return-value]

    h = harness(tmp_path, refund_agent(FunctionModel(watching), shop))
    adapter = h.agents["support"]
    assert isinstance(adapter, PydanticAIAgent)
    tid = await h.submit("support", "Refund A0, A1 and A2")
    await h.run_until_idle(timeout=10)
    rows = await h.history(tid)
    whole = messages_of(rows, "Refund A0, A1 and A2", "support.")
    assert [_kinds(m) for m in seen[-1]] == [_kinds(m) for m in whole[:-1]]
    for cut in range(len(rows) + 1):
        dialog = Dialog("Refund A0, A1 and A2", "support.")
        dialog.feed(rows[:cut])
        dialog.feed(rows[cut:])
        assert dialog.messages() == whole, cut
    kept = adapter.dialogs[tid]
    assert kept.position is not None and kept.position.length < len(rows)  # the last plan's

    view = HistoryView(rows)
    here = view.position()
    rows.append({"role": "user", "content": "more"})
    assert [dict(r) for r in view.since(here) or []] == [{"role": "user", "content": "more"}]
    assert HistoryView([dict(r) for r in rows]).since(here) is None  # other objects
    assert view.since(HistoryView(rows[:1]).position()) is not None
    await h.close()


async def test_r17_a_completion_recorded_here_is_not_validated_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27: the messages of a model answer this process recorded are fed back to the
    kept history as the objects the run made, not dumped and validated again; only what
    came from other rows (the tools' results) is validated. The history so kept is the
    one decoded from every row."""
    validated: list[str] = []
    adapter_type = integration.ModelMessagesTypeAdapter

    class Counting:
        def validate_python(self, raw: Any, **kw: Any) -> Any:
            validated.extend(str(message.get("kind")) for message in raw)
            return adapter_type.validate_python(raw, **kw)

        def dump_python(self, *args: Any, **kw: Any) -> Any:
            return adapter_type.dump_python(*args, **kw)

    monkeypatch.setattr(integration, "ModelMessagesTypeAdapter", Counting())
    shop = Shop()
    h = harness(tmp_path, refund_agent(scripted(calls=3), shop))
    tid = await h.submit("support", "Refund A0, A1 and A2")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    assert "response" not in validated and "request" in validated
    kept = h.agents["support"].dialogs.get(tid)  # type: ignore[attr-defined]
    rows = await h.history(tid)
    monkeypatch.setattr(integration, "ModelMessagesTypeAdapter", adapter_type)
    whole = messages_of(rows, "Refund A0, A1 and A2", "support.")
    assert kept is not None and len(kept.done) >= 6  # three answers and their results
    assert kept.done == whole[:len(kept.done)]
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
    full = "Let me think about this very carefully " * 20
    fake.add(reply(full, chunks=200, chunk_delay=0.02), reply("Stopped, as you asked."))
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
    assert len(cut) == 1 and full.startswith(cut[0]["content"]) and cut[0]["content"] != full
    await h.resume(tid, "go on")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Stopped, as you asked."
    second = str(fake.requests[1]["messages"])  # what had streamed, however much it was
    assert cut[0]["content"] in second and "[cut off" in second and "go on" in second
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
    call id is not part of what the call does, so with three identical refunds allowed the
    fourth is held for a person. (The default holds the second: see
    test_r10_r12_repeated_side_effects_need_a_person.py.)"""
    def again(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 5},
                                                 tool_call_id=f"r{len(messages)}")])

    shop = Shop()
    h = harness(tmp_path, refund_agent(FunctionModel(again), shop),
                settings=fast_settings(max_identical_side_effects=3))
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


# ---------------------------------------------------------------------- reconcile hooks (issue 26)


class Ledger:
    """A payment provider outside tether: it pays each refund, and can be asked afterwards
    whether the refund under a key was paid."""

    def __init__(self) -> None:
        self.paid: list[tuple[str, str]] = []

    def has(self, key: str) -> bool:
        return any(paid_key == key for paid_key, _ in self.paid)


def answer_lost_agent(ledger: Ledger, seen: list[list[ModelMessage]]) -> Agent[None, str]:
    """A refund that is paid and then loses its answer (``tt.OutcomeUnknown``): the call is
    in doubt, and its reconcile hook is asked. The model asks for the refund until it sees
    a tool return for it; *seen* keeps what each request was sent."""
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("Refunded.")])
        return ModelResponse(parts=[ToolCallPart("refund", {"order": "A1", "amount": 5},
                                                 tool_call_id=f"r{len(messages)}")])

    agent: Agent[None, str] = Agent(FunctionModel(answer))

    @agent.tool_plain
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        call = current_call()
        ledger.paid.append((call.idempotency_key, order))
        if call.attempt == 1:
            raise tt.OutcomeUnknown("the provider took the refund; its answer was lost")
        return f"refunded {amount} on {order}"

    return agent


def _returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def plain_hooks(ledger: Ledger) -> dict[str, Any]:
    """Reconcile hooks that find the refund in the ledger, in each shape tether accepts."""
    async def by_call(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
        return "refunded" if ledger.has(ctx.idempotency_key) else None

    async def by_arguments(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        return "refunded" if ledger.has(ctx.idempotency_key) else None

    async def with_parts(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
        return [{"part_kind": "tool-return", "tool_name": "refund", "tool_call_id": tool_call_id,
                 "content": "refunded"}] if ledger.has(ctx.idempotency_key) else None

    return {"by_call": by_call, "by_arguments": by_arguments, "with_parts": with_parts}


@pytest.mark.parametrize("shape", ["by_call", "by_arguments", "with_parts"])
async def test_r10_r17_a_reconcile_hook_returning_a_plain_value_pays_once(
        tmp_path: Path, shape: str) -> None:
    """R10, R17 (issue 26, defect 7): a hook that finds the refund and returns a plain value
    ("refunded", not PydanticAI's parts) is the call's tool return: the model sees exactly
    one return for its call, does not ask again, and the ledger shows ONE refund. The hook
    may take the model's call ``(ctx, tool_call_id, args)`` or the tool's own arguments
    ``(ctx, order, amount)``, as the Agents SDK's hooks do; parts still work."""
    ledger, seen = Ledger(), list[list[ModelMessage]]()
    hook = plain_hooks(ledger)[shape]
    h = harness(tmp_path, answer_lost_agent(ledger, seen),
                tools={"refund": tt.ToolPolicy(reconcile=hook)})
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded."
    assert len(ledger.paid) == 1  # paid once, found by the hook, never repeated
    assert len(seen) == 2  # the refund asked for once, then the answer
    [returned] = _returns(seen[-1])
    assert (returned.tool_call_id, returned.content) == ("r1", "refunded")
    strategies = [r["resume_strategy"] for r in await h.reads.recovery_log(tid)]
    assert strategies == ["outcome_unknown", "reconcile"]
    await h.close()


@pytest.mark.parametrize(("found", "kind"), [
    (object(), "object"),
    ([{"part_kind": "tool-return", "tool_name": "refund", "tool_call_id": "another-call",
       "content": "refunded"}], "list"),
    ([{"part_kind": "text", "content": "refunded"}], "list"),
])
async def test_r10_r26_a_reconcile_value_that_cannot_be_the_return_goes_to_a_person(
        tmp_path: Path, found: Any, kind: str) -> None:
    """R10, R26: what a hook returns that cannot answer the call (not plain data, a return
    for another call, parts that answer no call) is refused by name, never dropped: the task
    goes to a person with a reason naming the hook and the value's type, and the refund is
    not paid again."""
    ledger, seen = Ledger(), list[list[ModelMessage]]()

    async def finds_it(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
        return found if ledger.has(ctx.idempotency_key) else None

    h = harness(tmp_path, answer_lost_agent(ledger, seen),
                tools={"refund": tt.ToolPolicy(reconcile=finds_it)})
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    reason = info.record.reason or ""
    assert "'finds_it'" in reason and f"type {kind}" in reason and "support.refund" in reason
    assert len(ledger.paid) == 1 and len(seen) == 1
    await h.close()


async def _in_order(ctx: tt.ToolContext, order: str) -> Any:
    return None


async def _wrong_call(ctx: tt.ToolContext, call_id: str, arguments: str) -> Any:
    return None


def _sync(ctx: tt.ToolContext, order: str, amount: int) -> Any:
    return None


@pytest.mark.parametrize(("hook", "said"), [
    (_in_order, "unexpected keyword argument 'amount'"),
    (_wrong_call, "missing a required argument: 'call_id'"),
    (_sync, "a sync function was given"),
])
def test_r10_r17_a_reconcile_hook_with_a_wrong_signature_is_refused_when_the_agent_is_made(
        hook: Any, said: str) -> None:
    """R10, R17: a hook tether could not call (an argument of the tool missing, the Agents
    SDK's call shape, a sync function) is refused when the agent is made, naming the tool,
    the signatures tether calls and the one given; not found at crash time."""
    with pytest.raises(ConfigurationError) as refused:
        PydanticAIAgent(refund_agent(TestModel(), Shop()),
                        tools={"refund": tt.ToolPolicy(reconcile=hook)})
    text = str(refused.value)
    assert "tool 'refund'" in text and said in text
    assert "async def hook(ctx, order: str, amount: int)" in text  # the tool's arguments
    assert "async def hook(ctx, tool_call_id: str, args: dict[str, Any])" in text  # the call
    assert f"def {hook.__name__}(ctx" in text  # what was given


def test_r10_other_toolsets_hooks_are_checked_too() -> None:
    """R10: the hook for the tools of other toolsets (MCP servers) gets the call; one that
    takes anything else is refused when the agent is made."""
    from pydantic_ai.toolsets import FunctionToolset
    from pydantic_ai.toolsets.wrapper import WrapperToolset

    agent: Agent[None, str] = Agent(TestModel(), toolsets=[WrapperToolset(FunctionToolset())])
    with pytest.raises(ConfigurationError, match=r"tool 'toolsets'.*tool: str, tool_call_id"):
        PydanticAIAgent(agent, other_tools=tt.ToolPolicy(reconcile=_in_order))


def test_r08_r10_a_call_whose_result_is_not_parts_is_still_answered_once() -> None:
    """R8, R10: a call's result that is not PydanticAI's parts (a person's ``decide happened
    --result``, a skip, a row stored before hooks' results were checked) still answers the
    call in the rebuilt history, once, so the model does not ask for it again."""
    def call(key: str, call_id: str) -> dict[str, Any]:
        return {"role": "assistant", "tool_call": {"name": "support.refund", "key": key,
                "args": {"tool_call_id": call_id, "args": {"order": "A1", "amount": 5}}}}

    def asked(call_id: str) -> dict[str, Any]:
        return {"role": "model", "messages": [
            {"kind": "response", "parts": [{"part_kind": "tool-call", "tool_name": "refund",
                                            "args": {"order": "A1"}, "tool_call_id": call_id}]}]}

    rows = [asked("r1"), call("k1", "r1"),
            {"role": "tool", "name": "support.refund", "key": "k1", "content": "refunded"},
            asked("r2"), call("k2", "r2"),
            {"role": "tool", "name": "support.refund", "key": "k2", "content": None,
             "skipped": True}]
    rebuilt = messages_of(rows, "Refund 5 on A1", "support.")
    returns = _returns(rebuilt)
    assert [(r.tool_call_id, r.tool_name, r.content, r.outcome) for r in returns] == [
        ("r1", "refund", "refunded", "success"),
        ("r2", "refund", "skipped: a person decided this call is not made", "denied")]


async def test_r17_a_function_model_without_a_stream_function_works_without_options(
        tmp_path: Path) -> None:
    """Issue 27: ``Agent(FunctionModel(fn))`` as PydanticAI's docs write it (no
    ``stream_function``) runs under ``PydanticAIAgent`` with no ``stream=`` option: plain
    requests, no needs_human, no wasted recovery; a ``FunctionModel`` that can stream and
    ``TestModel`` stream."""
    answers = iter(["", "done"])

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        text = next(answers)
        if not text:
            return ModelResponse(parts=[ToolCallPart("lookup", {"order": "A1"})])
        return ModelResponse(parts=[TextPart(text)])

    agent = Agent(FunctionModel(model), name="support")

    @agent.tool_plain
    async def lookup(order: str) -> str:
        return f"{order} paid"

    h = tt.Harness(f"sqlite:///{tmp_path / 'pai.db'}", settings=fast_settings())
    adapter = PydanticAIAgent(agent, tools={"lookup": tt.ToolPolicy(idempotent=True)})
    assert adapter.stream is None and not adapter.streams()
    h.add_agent("support", adapter)
    task_id = await h.submit("support", "look A1 up")
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "done"
    assert [r["resume_strategy"] for r in await h.store.list_recovery_log(task_id)] == []
    assert PydanticAIAgent(Agent(TestModel())).streams()
    assert PydanticAIAgent(Agent(FunctionModel(model, stream_function=_no_stream))).streams()
    await h.close()


async def _no_stream(messages: list[Any], info: AgentInfo) -> Any:
    yield "unused"


async def test_r16_r17_a_call_a_tool_defers_waits_for_its_result_as_a_tether_wait(
        tmp_path: Path) -> None:
    """Issue 27: a tool that raises PydanticAI's ``CallDeferred`` (its work runs elsewhere)
    leaves the task waiting for a ``tool_result`` event, not asking the model with the call
    unanswered; a message meanwhile keeps it waiting; the result, once sent, reaches the
    model as that call's return, and the tool is not run again."""
    shipped: list[str] = []
    seen: list[list[ModelMessage]] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"shipped: {returned[0].content}")])
        return ModelResponse(parts=[ToolCallPart("ship", {"order": "A1"}, tool_call_id="s1")])

    agent: Agent[None, str] = Agent(FunctionModel(answer), name="support")

    @agent.tool_plain
    async def ship(order: str) -> str:
        shipped.append(order)
        raise CallDeferred(metadata={"ticket": 7})

    h = tt.Harness(f"sqlite:///{tmp_path / 'pai.db'}", settings=fast_settings())
    h.add_agent("support", PydanticAIAgent(agent))
    tid = await h.submit("support", "ship A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.WAITING, info.record.reason
    assert info.snapshot.frame.wait is not None
    assert info.snapshot.frame.wait["event_type"] == "tool_result"
    await h.emit(tt.Event("user_message", tid, "any news?"))
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.WAITING and len(seen) == 1
    await h.emit(tt.Event("tool_result", tid, {"tool_call_id": "s1", "result": "tracking 42"}))
    await h.run_until_idle(timeout=10)
    done = await h.get(tid)
    assert done.record.status is tt.Status.COMPLETED, done.record.reason
    assert done.snapshot.result == "shipped: tracking 42"
    assert shipped == ["A1"] and len(seen) == 2
    returns = [p for m in seen[-1] for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [(p.tool_call_id, p.content) for p in returns] == [("s1", "tracking 42")]
    await h.close()
