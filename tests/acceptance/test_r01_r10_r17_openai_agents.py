"""An OpenAI Agents SDK agent under tether (R1, R3, R8, R9, R10, R17, E1; issue 17).

The SDK's own test double, ``agents.testing.ScriptedModel``, stands in for the model (no
server), and the SDK's ``OpenAIChatCompletionsModel`` streams from
``tether.testing.fake_openai`` for the streamed answers and the P0 cut. The store is a real
SQLite file. Kills with SIGKILL are in tests/chaos.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, wait_until
from agents import (
    Agent,
    GuardrailFunctionOutput,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunContextWrapper,
    Runner,
    function_tool,
    handoff,
    input_guardrail,
    output_guardrail,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext as SDKToolContext
from agents.usage import Usage
from openai import AsyncOpenAI

import tether as tt
from tether import dialog
from tether.errors import ConfigurationError
from tether.integrations.openai_agents import (
    KEY,
    NOT_MADE,
    Items,
    OpenAIAgentsAgent,
    current_call,
    items_of,
)
from tether.testing.fake_openai import FakeOpenAI, call, reply

QUIET = RunConfig(tracing_disabled=True)


class Shop:
    """A refund service that records each refund under the key it was sent."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str | None, str]] = []
        self.lookups = 0


def shop_tools(shop: Shop) -> list[Any]:
    @function_tool
    async def refund(ctx: SDKToolContext[Any], order: str, amount: int) -> str:
        """Refund an order."""
        key = (ctx.run_config.trace_metadata or {}).get(KEY) if ctx.run_config else None
        if key is not None:  # under tether (not when the SDK's Runner runs it)
            assert key == current_call().idempotency_key
        shop.refunds.append((key, order))
        return f"refunded {amount} on {order}"

    @function_tool
    async def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        shop.lookups += 1
        return {"order": order, "paid": 40}

    return [refund, lookup]


def step(*output: Any, tokens: tuple[int, int] = (20, 9)) -> ModelStep:
    return ModelStep(output=list(output), usage=Usage(requests=1, input_tokens=tokens[0],
                                                      output_tokens=tokens[1]))


def script(rounds: int = 1) -> list[ModelStep]:
    """Ask for a lookup and a refund *rounds* times, then answer in words."""
    steps = [step(function_call("lookup", {"order": f"A{n}"}, call_id=f"l{n}"),
                  function_call("refund", {"order": f"A{n}", "amount": 5}, call_id=f"r{n}"))
             for n in range(rounds)]
    return [*steps, step(assistant_message(f"Done after {rounds} rounds."), tokens=(30, 6))]


def harness(tmp_path: Path, agent: Agent[Any], **options: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{tmp_path / 'oa.db'}", settings=fast_settings())
    options.setdefault("tools", {"lookup": tt.ToolPolicy(idempotent=True)})
    options.setdefault("stream", False)
    options.setdefault("run_config", QUIET)
    h.add_agent("support", OpenAIAgentsAgent(agent, **options))
    return h


async def test_r17_an_sdk_agent_runs_as_a_tether_task_in_one_line(tmp_path: Path) -> None:
    shop = Shop()
    agent = Agent(name="support", instructions="Help.", model=ScriptedModel(script()),
                  tools=shop_tools(shop))
    h = harness(tmp_path, agent)
    assert {"support.refund", "support.lookup"} <= set(h.tools)
    assert h.tools["support.refund"].side_effect and not h.tools["support.lookup"].side_effect
    tid = await h.submit("support", "Refund 5 on A0")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Done after 1 rounds."
    assert len(shop.refunds) == 1 and shop.lookups == 1
    keys = {r.key for r in await h.store.list_idempotency(tid)}
    assert shop.refunds[0][0] in keys  # the tool saw tether's key through the SDK's context
    assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 50, "completion_tokens": 15}
    models = [r for r in await h.history(tid) if r.get("role") == "model"]
    assert [r["finish_reason"] for r in models] == ["tool_calls", "stop"]
    calls = [r["tool_call"] for r in await h.history(tid) if "tool_call" in r]
    assert [c["args"]["call_id"] for c in calls] == ["l0", "r0"]  # the model's own call ids
    await h.close()


async def test_r08_the_conversation_in_the_task_is_what_the_sdk_would_send(
        tmp_path: Path) -> None:
    """Every model call gets the input, instructions and tools the SDK's Runner gives it for
    the same script, and the dialog rows rebuild the Runner's whole conversation."""
    alone, under = ScriptedModel(script(rounds=2)), ScriptedModel(script(rounds=2))
    ran = await Runner.run(Agent(name="support", instructions="Help.", model=alone,
                                 tools=shop_tools(Shop())), "Refund A0 and A1", run_config=QUIET)
    h = harness(tmp_path, Agent(name="support", instructions="Help.", model=under,
                                tools=shop_tools(Shop())))
    tid = await h.submit("support", "Refund A0 and A1")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == ran.final_output
    assert len(under.calls) == len(alone.calls) == 3
    for ours, theirs in zip(under.calls, alone.calls, strict=True):
        assert _json(ours.input) == _json(theirs.input)
        assert ours.system_instructions == theirs.system_instructions == "Help."
        assert [t.name for t in ours.tools] == [t.name for t in theirs.tools]
    rebuilt = items_of(await h.history(tid), [{"role": "user", "content": "Refund A0 and A1"}],
                       "support.")
    assert _json(rebuilt) == _json(ran.to_input_list())
    await h.close()


def _json(value: Any) -> list[Any]:
    return [json.loads(json.dumps(item, sort_keys=True, default=str)) for item in value]


async def test_r09_a_handoff_is_a_frame_on_the_task_stack(tmp_path: Path) -> None:
    """Triage hands off to refunds: a frame for it on the stack, the transfer in the dialog,
    and refunds' model sees what the SDK would show it; its answer is the task's result."""
    def agents(shop: Shop, handed: list[str]) -> tuple[Agent[Any], ScriptedModel, ScriptedModel]:
        second = ScriptedModel([step(function_call("refund", {"order": "A1", "amount": 5},
                                                   call_id="r1")),
                                step(assistant_message("Refunded A1."))])
        refunds = Agent(name="refunds", instructions="You refund.", model=second,
                        tools=shop_tools(shop))
        first = ScriptedModel([step(function_call("transfer_to_refunds", {}, call_id="h1"))])
        triage = Agent(name="triage", instructions="You triage.", model=first,
                       handoffs=[handoff(refunds, on_handoff=lambda ctx: handed.append("x"))])
        return triage, first, second

    shop, handed = Shop(), list[str]()
    triage, _, alone = agents(Shop(), [])
    await Runner.run(triage, "Refund A1", run_config=QUIET)
    triage, first, second = agents(shop, handed)
    h = harness(tmp_path, triage)
    tid = await h.submit("support", "Refund A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "Refunded A1."
    assert len(shop.refunds) == 1 and handed == ["x"] and len(first.calls) == 1
    rows = await h.history(tid)
    assert [r["depth"] for r in rows if r.get("event") == "spawn"] == [1]
    transfer = rows[[r.get("role") for r in rows].index("model")]["messages"][-1]
    assert transfer["output"] == '{"assistant": "refunds"}'
    assert [_json(c.input) for c in second.calls] == [_json(c.input) for c in alone.calls]
    assert second.calls[0].system_instructions == "You refund."
    await h.close()


async def test_r22_a_call_of_a_tool_the_agent_lacks_is_told_to_the_model(tmp_path: Path) -> None:
    """As the SDK's ``return_error_to_model``: the model hears why, in the same plan, and
    answers again; both completions are recorded and the conversation stays well formed."""
    model = ScriptedModel([step(function_call("wipe_all", {}, call_id="w")),
                           step(assistant_message("I cannot do that."))])
    h = harness(tmp_path, Agent(name="support", model=model), tools={})
    tid = await h.submit("support", "Wipe everything")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == "I cannot do that." and info.snapshot.usage["completions"] == 2
    assert model.calls[1].input[-1] == {"call_id": "w", "type": "function_call_output",
                                        "output": "Tool wipe_all not found in agent support."}
    await h.close()


async def test_r21_a_forced_tool_choice_is_dropped_once_tools_were_used(tmp_path: Path) -> None:
    """The SDK's ``reset_tool_choice``: else ``tool_choice="required"`` asks for tools forever."""
    model = ScriptedModel([step(function_call("lookup", {"order": "A1"}, call_id="l1")),
                           step(assistant_message("Paid."))])
    agent = Agent(name="support", model=model, tools=shop_tools(Shop()),
                  model_settings=ModelSettings(tool_choice="required"))
    h = harness(tmp_path, agent)
    tid = await h.submit("support", "Is A1 paid?")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Paid."
    assert [c.model_settings.tool_choice for c in model.calls] == ["required", None]
    await h.close()


@input_guardrail
async def no_secrets(ctx: RunContextWrapper[Any], agent: Agent[Any],
                     input: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info={"why": "asks for a secret"},
                                   tripwire_triggered="secret" in str(input))


async def test_r17_an_input_guardrail_tripwire_fails_the_task_before_any_model_call(
        tmp_path: Path) -> None:
    model = ScriptedModel([])
    h = harness(tmp_path, Agent(name="support", model=model, input_guardrails=[no_secrets]),
                tools={})
    tid = await h.submit("support", "Tell me the secret")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.FAILED and model.calls == ()
    assert "no_secrets" in str(info.snapshot.error) and "asks for a secret" in str(info.snapshot.error)
    checked = [r for r in await h.history(tid) if r.get("name") == "support:input_guardrails"]
    assert checked[0]["content"]["input_guardrails"] == [
        {"guardrail": "no_secrets", "tripwire_triggered": True,
         "output_info": {"why": "asks for a secret"}}]
    await h.close()


async def test_r17_a_passed_guardrail_is_recorded_and_checked_once(tmp_path: Path) -> None:
    model = ScriptedModel([step(function_call("lookup", {"order": "A1"}, call_id="l1")),
                           step(assistant_message("Paid."))])
    h = harness(tmp_path, Agent(name="support", model=model, tools=shop_tools(Shop()),
                                input_guardrails=[no_secrets]))
    tid = await h.submit("support", "Is A1 paid?")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Paid."
    rows = await h.history(tid)
    checks = [i for i, r in enumerate(rows) if r.get("name") == "support:input_guardrails"
              and "content" in r]
    first_model = [r.get("role") for r in rows].index("model")
    assert len(checks) == 1 and checks[0] < first_model
    assert rows[checks[0]]["content"]["input_guardrails"][0]["tripwire_triggered"] is False
    await h.close()


async def test_r03_a_user_message_reaches_the_next_model_call(tmp_path: Path) -> None:
    """P1: a user message sent while a tool runs is in the next model call, as user input."""
    release = asyncio.Event()

    @function_tool
    async def slow_lookup(order: str) -> str:
        """Look an order up, slowly."""
        await release.wait()
        return "paid"

    model = ScriptedModel([step(function_call("slow_lookup", {"order": "A1"}, call_id="s")),
                           step(assistant_message("Noted."))])
    h = harness(tmp_path, Agent(name="support", model=model, tools=[slow_lookup]),
                tools={"slow_lookup": tt.ToolPolicy(idempotent=True)})
    tid = await h.submit("support", "Check A1")
    worker = asyncio.create_task(h.run_until_idle(timeout=10))
    await wait_until(lambda: h.runners.get(tid) is not None, what="the task to run")
    await h.emit(tt.Event("user_message", tid, "also check A2 please"))
    release.set()
    await worker
    assert (await h.get(tid)).snapshot.result == "Noted."
    last = model.calls[-1].input
    assert last[-2]["type"] == "function_call_output"
    assert last[-1] == {"role": "user", "content": "also check A2 please"}
    await h.close()


def test_r08_a_message_between_two_calls_waits_for_both_outputs() -> None:
    """Providers want every call of an answer answered before the conversation goes on."""
    calls = [{"type": "function_call", "call_id": c, "name": "lookup", "arguments": "{}"}
             for c in ("c1", "c2")]
    asked = [{"role": "assistant", "tool_call": {"name": "s.lookup", "key": k,
                                                 "args": {"call_id": c}}}
             for k, c in (("k1", "c1"), ("k2", "c2"))]
    rows: list[dict[str, Any]] = [
        {"role": "model", "messages": calls}, *asked,
        {"role": "tool", "name": "s.lookup", "key": "k1",
         "content": {"type": "function_call_output", "call_id": "c1", "output": "a"}},
        {"role": "user", "type": "user_message", "content": "hurry"},
        {"role": "tool", "name": "s.lookup", "key": "k2", "error": "TimeoutError"}]
    items = items_of(rows, [{"role": "user", "content": "go"}], "s.")
    assert [i.get("type") or i["content"] for i in items] == [
        "go", "function_call", "function_call", "function_call_output", "function_call_output",
        "hurry"]
    assert items[4] == {"call_id": "c2", "output": "error: TimeoutError",
                        "type": "function_call_output"}


def test_r08_a_call_whose_plan_was_dropped_is_answered_as_not_made() -> None:
    """A person's resume with a message drops a held call: the model hears it was not made."""
    rows: list[dict[str, Any]] = [
        {"role": "model", "messages": [{"type": "function_call", "call_id": "c1",
                                        "name": "refund", "arguments": "{}"}]},
        {"role": "user", "type": "resume", "content": "do not refund"},
        {"role": "model", "messages": [{"type": "message", "role": "assistant",
                                        "content": "Understood."}]}]
    items = items_of(rows, [], "s.")
    assert [i.get("type") for i in items] == [
        "function_call", "function_call_output", None, "message"]
    assert items[1]["output"] == NOT_MADE and items[2]["content"] == "[resume] do not refund"
    assert items_of(rows[:2], [], "s.")[1:] == items[1:3]  # and when it is the last thing


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


class Watched(OpenAIChatCompletionsModel):
    """The SDK's chat-completions model, telling the test when the first text has streamed."""

    def __init__(self, url: str) -> None:
        super().__init__("fake", AsyncOpenAI(base_url=url, api_key="none", max_retries=0))
        self.first_text = asyncio.Event()

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for event in super().stream_response(*args, **kwargs):
            if event.type == "response.output_text.delta":
                self.first_text.set()
            yield event


async def test_r17_a_streamed_answer_calls_tools_and_records_usage(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    fake.add(reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})],
                   usage={"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}),
             reply("Refunded.", chunks=3))
    shop = Shop()
    h = harness(tmp_path, Agent(name="support", model=Watched(fake.url), tools=shop_tools(shop)),
                stream=True)
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.snapshot.result == "Refunded." and len(shop.refunds) == 1
    assert all(r.get("stream") for r in fake.requests)
    assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 13, "completion_tokens": 5}
    second = fake.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": second[-2]["tool_calls"][0]["id"],
                          "content": "refunded 5 on A1"}
    await h.close()


async def test_e1_a_p0_cuts_a_streamed_answer_and_keeps_the_partial_text(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    """The SDK's OpenAI model streams from the fake server; a P0 cuts the answer, the
    partial text is in the dialog marked cut off, and the next model call carries it."""
    full = "Let me think about this very carefully " * 20
    fake.add(reply(full, chunks=200, chunk_delay=0.02),
             reply("Stopped, as you asked."))
    model = Watched(fake.url)
    h = harness(tmp_path, Agent(name="support", model=model), stream=True, tools={})
    tid = await h.submit("support", "Think hard")
    worker = asyncio.create_task(h.run_until_idle(timeout=20))
    await wait_until(model.first_text.is_set, what="the first streamed text")
    await h.emit(tt.Event("user_interrupt", tid, "stop"))
    await wait_until(lambda: _status(h, tid, tt.Status.PAUSED), timeout=10, what="the pause")
    await worker
    cut = [r for r in await h.history(tid) if r.get("cut_off")]
    partial = cut[0]["content"]
    assert len(cut) == 1 and partial and full.startswith(partial) and len(partial) < len(full)
    await h.resume(tid, "go on")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).snapshot.result == "Stopped, as you asked."
    second = fake.requests[1]["messages"]
    assert second[-3:] == [{"role": "assistant", "content": partial + dialog.CUT_OFF},
                           {"role": "user", "content": "[user_interrupt] stop"},
                           {"role": "user", "content": "[resume] go on"}]
    await h.close()


async def _status(h: tt.Harness, tid: str, status: tt.Status) -> bool:
    return (await h.store.get_task(tid)).status is status


def test_r17_tool_policies_must_name_the_agents_tools() -> None:
    agent = Agent(name="support", model=ScriptedModel([]), tools=shop_tools(Shop()))
    with pytest.raises(ConfigurationError, match="nope"):
        OpenAIAgentsAgent(agent, tools={"nope": tt.ToolPolicy()})


def test_r17_what_tether_does_not_map_yet_is_refused_clearly() -> None:
    @function_tool(needs_approval=True)
    async def wipe() -> str:
        """Wipe everything."""
        return "wiped"

    with pytest.raises(ConfigurationError, match="tool wipe needs approval"):
        OpenAIAgentsAgent(Agent(name="support", tools=[wipe]))
    with pytest.raises(ConfigurationError, match="output guardrails"):
        OpenAIAgentsAgent(Agent(name="support"), run_config=RunConfig(output_guardrails=[
            output_guardrail(lambda ctx, agent, out: GuardrailFunctionOutput(None, False))]))
    with pytest.raises(ConfigurationError, match="two different SDK agents are named 'support'"):
        OpenAIAgentsAgent(Agent(name="support", handoffs=[Agent(name="support")]))


def test_r17_current_call_is_only_known_inside_a_tool() -> None:
    with pytest.raises(ConfigurationError, match="inside a tool"):
        current_call()


# ---------------------------------------------------------------------- reconcile hooks (issue 26)


class Ledger:
    """A payment provider outside tether: it pays each refund, and can be asked afterwards
    whether the refund under a key was paid."""

    def __init__(self) -> None:
        self.paid: list[str] = []


def answer_lost_refund(ledger: Ledger) -> Any:
    """A refund that is paid and then loses its answer (``tt.OutcomeUnknown``, passed on to
    tether by ``failure_error_function=None``): the call is in doubt, its hook is asked."""
    @function_tool(failure_error_function=None)
    async def refund(order: str, amount: int) -> str:
        """Refund an order."""
        call = current_call()
        ledger.paid.append(call.idempotency_key)
        if call.attempt == 1:
            raise tt.OutcomeUnknown("the provider took the refund; its answer was lost")
        return f"refunded {amount} on {order}"

    return refund


def sdk_hooks(ledger: Ledger) -> dict[str, Any]:
    """Reconcile hooks that find the refund in the ledger, in each shape tether accepts."""
    async def by_arguments(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        return "refunded (found)" if ctx.idempotency_key in ledger.paid else None

    async def by_call(ctx: tt.ToolContext, call_id: str, arguments: str) -> Any:
        assert json.loads(arguments) == {"order": "A1", "amount": 5}
        return "refunded (found)" if ctx.idempotency_key in ledger.paid else None

    async def with_item(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        return {"type": "function_call_output", "call_id": "r1",
                "output": "refunded (found)"} if ctx.idempotency_key in ledger.paid else None

    return {"by_arguments": by_arguments, "by_call": by_call, "with_item": with_item}


@pytest.mark.parametrize("shape", ["by_arguments", "by_call", "with_item"])
async def test_r10_r17_a_reconcile_hook_finds_the_refund_and_it_is_paid_once(
        tmp_path: Path, shape: str) -> None:
    """R10, R17 (issue 26, defect 7): the refund was paid but its answer lost; the hook finds
    it and its value is the call's output, once. The hook may take the tool's arguments
    ``(ctx, order, amount)`` or the model's call ``(ctx, call_id, arguments)``, as the
    PydanticAI integration's do, and may return the value or the output item itself."""
    ledger = Ledger()
    model = ScriptedModel([step(function_call("refund", {"order": "A1", "amount": 5},
                                              call_id="r1")),
                           step(assistant_message("Refunded."))])
    h = harness(tmp_path, Agent(name="support", model=model, tools=[answer_lost_refund(ledger)]),
                tools={"refund": tt.ToolPolicy(reconcile=sdk_hooks(ledger)[shape])})
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert len(ledger.paid) == 1 and len(model.calls) == 2
    outputs = [item for item in model.calls[-1].input
               if item.get("type") == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [("r1", "refunded (found)")]
    await h.close()


async def test_r10_r26_an_output_for_another_call_goes_to_a_person(tmp_path: Path) -> None:
    """R10, R26: an output item a hook returns for another call cannot answer this one: it
    is refused by name (the hook, the value's type), the task goes to a person, and the
    refund is not paid again."""
    ledger = Ledger()

    async def finds_it(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        return {"type": "function_call_output", "call_id": "elsewhere", "output": "refunded"}

    model = ScriptedModel([step(function_call("refund", {"order": "A1", "amount": 5},
                                              call_id="r1"))])
    h = harness(tmp_path, Agent(name="support", model=model, tools=[answer_lost_refund(ledger)]),
                tools={"refund": tt.ToolPolicy(reconcile=finds_it)})
    tid = await h.submit("support", "Refund 5 on A1")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    reason = info.record.reason or ""
    assert "'finds_it'" in reason and "type dict" in reason and "'elsewhere'" in reason
    assert len(ledger.paid) == 1 and len(model.calls) == 1
    await h.close()


async def _missing_amount(ctx: tt.ToolContext, order: str) -> Any:
    return None


async def _pydantic_ai_call(ctx: tt.ToolContext, tool_call_id: str, args: dict[str, Any]) -> Any:
    return None


def _sync(ctx: tt.ToolContext, order: str, amount: int) -> Any:
    return None


@pytest.mark.parametrize(("hook", "said"), [
    (_missing_amount, "unexpected keyword argument 'amount'"),
    (_pydantic_ai_call, "missing a required argument: 'tool_call_id'"),
    (_sync, "a sync function was given"),
])
def test_r10_r17_a_reconcile_hook_with_a_wrong_signature_is_refused_when_the_agent_is_made(
        hook: Any, said: str) -> None:
    """R10, R17: a hook tether could not call (an argument of the tool missing, PydanticAI's
    call shape, a sync function) is refused when the agent is made, naming the tool, the
    signatures tether calls and the one given; not found at crash time."""
    agent = Agent(name="support", model=ScriptedModel([]), tools=shop_tools(Shop()))
    with pytest.raises(ConfigurationError) as refused:
        OpenAIAgentsAgent(agent, tools={"refund": tt.ToolPolicy(reconcile=hook)})
    text = str(refused.value)
    assert "tool 'refund'" in text and said in text
    assert "async def hook(ctx, order: str, amount: int)" in text  # the tool's arguments
    assert "async def hook(ctx, call_id: str, arguments: str)" in text  # the call
    assert f"def {hook.__name__}(ctx" in text  # what was given


async def test_r17_the_items_fed_in_two_pieces_are_the_items_of_every_row(tmp_path: Path) -> None:
    """Issue 27: a running task's items are kept between plans and fed only the rows added
    since; fed in any two pieces they are what all rows decode to at once, and the adapter
    keeps them for the task (decoded again only after a load, a rollback or a fork)."""
    under = ScriptedModel(script(rounds=3))
    h = harness(tmp_path, Agent(name="support", instructions="Help.", model=under,
                                tools=shop_tools(Shop())))
    tid = await h.submit("support", "Refund A0, A1 and A2")
    await h.run_until_idle(timeout=10)
    rows = await h.history(tid)
    opening = [{"role": "user", "content": "Refund A0, A1 and A2"}]
    whole = items_of(rows, opening, "support.")
    for cut in range(len(rows) + 1):
        decoded = Items(opening, "support.", "")
        decoded.feed(rows[:cut])
        decoded.feed(rows[cut:])
        assert decoded.result() == whole, cut
    adapter = h.agents["support"]
    assert isinstance(adapter, OpenAIAgentsAgent) and tid in adapter.dialogs
    assert _json(under.calls[-1].input) == _json(items_of(rows[:-2], opening, "support."))
    await h.close()
