"""ADKAgent (issue 31): what tether cannot run yet is refused when the agent is made, by name
(R17: nothing silently skipped), and a model that calls a tool its agent lacks is told so and
asked again, as ADK tells it. The rest of the contract is the model-agent conformance suite's
(``tests/acceptance/..._agent_conformance.py``, ``tests/chaos/..._agent_conformance.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

pytest.importorskip("google.adk")

from google.adk.agents import LlmAgent, SequentialAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools import ToolContext
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

import tether as tt
from tether.errors import ConfigurationError
from tether.integrations.adk import ADKAgent


class Scripted(BaseLlm):
    """Answers from a script, one answer per request; keeps what each request sent."""

    model: str = "scripted"
    script: list[list[types.Part]] = []
    asked: list[LlmRequest] = []

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        self.asked.append(llm_request)
        yield LlmResponse(content=types.Content(role="model",
                                                parts=self.script[len(self.asked) - 1]),
                          turn_complete=True)


def lookup(order: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order": order, "paid": 40}


def other_lookup(order: str) -> str:
    """Another agent's tool of the same name."""
    return order


other_lookup.__name__ = "lookup"


def with_context(order: str, tool_context: ToolContext) -> str:
    """Uses ADK's context."""
    return order


def made(**agent: Any) -> ADKAgent:
    return ADKAgent(LlmAgent(name="shop", model=Scripted(), **agent))


@pytest.mark.filterwarnings("ignore:SequentialAgent is deprecated:DeprecationWarning")
@pytest.mark.parametrize(("agent", "named"), [
    ({"sub_agents": "a workflow agent"}, "sub-agent 'steps' (SequentialAgent"),
    ({"tools": [lookup], "sub_agents": [LlmAgent(name="helper", model=Scripted(),
                                                 tools=[FunctionTool(other_lookup)])]},
     "two tools named 'lookup'"),
    ({"tools": [with_context]}, "tool 'with_context' (it takes ADK's tool_context"),
    ({"tools": [FunctionTool(lookup, require_confirmation=lambda order: order == "A1")]},
     "tool 'lookup' (a require_confirmation that decides per call"),
    ({"tools": [lookup], "before_tool_callback": lambda **kw: None},
     "the before_tool_callback of agent 'shop'"),
], ids=["workflow_agent", "clash", "tool_context", "confirmation", "tool_callback"])
def test_r17_what_is_not_mapped_yet_is_refused_by_name(agent: dict[str, Any],
                                                       named: str) -> None:
    if agent.get("sub_agents") == "a workflow agent":  # made here: ADK warns it is deprecated
        agent = {"sub_agents": [SequentialAgent(name="steps")]}
    with pytest.raises(ConfigurationError, match="does not run yet") as refused:
        made(**agent)
    assert named in str(refused.value)


def test_r17_a_policy_for_a_tool_the_agent_lacks_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="refund"):
        ADKAgent(LlmAgent(name="shop", model=Scripted(), tools=[lookup]),
                 tools={"refund": tt.ToolPolicy(side_effect=True)})


async def test_r22_a_call_of_a_tool_the_agent_lacks_is_answered_and_the_model_asked_again(
        tmp_path: Path) -> None:
    model = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="c1", name="refund", args={}))],
        [types.Part(function_call=types.FunctionCall(id="c2", name="lookup",
                                                     args={"order": "A1"}))],
        [types.Part(text="A1 was paid 40.")]])
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(name="shop", model=model, tools=[lookup])))
    async with h:
        task = await h.submit("support", "What was paid on A1?")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "A1 was paid 40."
    told = [p.function_response for c in model.asked[1].contents for p in c.parts or []
            if p.function_response is not None]
    assert [(r.id, r.response) for r in told] == [
        ("c1", {"error": "Tool refund not found in agent shop."})]
    answered = [p.function_response for c in model.asked[2].contents for p in c.parts or []
                if p.function_response is not None]
    assert answered[-1].id == "c2" and answered[-1].response == {"order": "A1", "paid": 40}
    assert info.snapshot.usage["completions"] == 3


def transfer(to: str) -> types.Part:
    return types.Part(function_call=types.FunctionCall(id="t1", name="transfer_to_agent",
                                                       args={"agent_name": to}))


def support(db: Path, root: Scripted, billing: Scripted, paid: list[str]) -> tt.Harness:
    """A root agent that hands refunds to its sub-agent ``billing``, whose refund needs a
    person's confirmation (ADK's ``require_confirmation``)."""
    async def refund(order: str) -> str:
        """Refund an order."""
        paid.append(order)
        return f"refunded {order}"

    sub = LlmAgent(name="billing", model=billing, description="Refunds orders.",
                   tools=[FunctionTool(refund, require_confirmation=True)])
    h = tt.Harness(f"sqlite:///{db}")
    h.add_agent("support", ADKAgent(LlmAgent(name="root", model=root, sub_agents=[sub]),
                                    tools={"refund": tt.ToolPolicy(side_effect=True)}))
    return h


async def test_r09_r16_a_transfer_to_a_sub_agent_survives_a_restart_and_the_approval_there(
        tmp_path: Path) -> None:
    """ADK carries out the transfer inside the plan; the sub-agent's answer is committed with
    it. A new harness (a restarted worker, its ADK session made again from the dialog)
    takes the person's approval: the conversation is still the sub-agent's, the refund is
    paid once, and no model is asked again for an answer already committed."""
    root = Scripted(script=[[transfer("billing")]])
    billing = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="r1", name="refund",
                                                     args={"order": "A1"}))],
        [types.Part(text="Refunded A1.")]])
    paid: list[str] = []
    async with support(tmp_path / "t.db", root, billing, paid) as h:
        task = await h.submit("support", "Refund A1, it arrived broken.")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
        assert info.record.status is tt.Status.WAITING, info.record.reason
        assert (len(root.asked), len(billing.asked), paid) == (1, 1, [])
    async with support(tmp_path / "t.db", root, billing, paid) as h:
        await h.emit(tt.Event("approval", task, True))
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded A1." and paid == ["A1"]
    assert (len(root.asked), len(billing.asked)) == (1, 2)
    assert info.snapshot.usage["completions"] == 3  # one per model turn, the transfer's too
    [answer] = [p.function_response for c in billing.asked[1].contents for p in c.parts or []
                if p.function_response is not None and p.function_response.name == "refund"]
    assert answer.id == "r1" and answer.response == {"result": "refunded A1"}


async def test_r22_a_call_missing_an_argument_is_told_and_nothing_runs(tmp_path: Path) -> None:
    """As ADK answers it: a call without a mandatory argument runs nothing, and the model is
    told which are missing; an argument the tool does not take is left out."""
    model = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="c1", name="lookup", args={}))],
        [types.Part(function_call=types.FunctionCall(
            id="c2", name="lookup", args={"order": "A1", "verbose": True}))],
        [types.Part(text="A1 was paid 40.")]])
    looked: list[str] = []

    def lookup(order: str) -> dict[str, Any]:
        """Look an order up."""
        looked.append(order)
        return {"order": order, "paid": 40}

    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(name="shop", model=model, tools=[lookup])))
    async with h:
        task = await h.submit("support", "What was paid on A1?")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert looked == ["A1"]
    [told] = [p.function_response for c in model.asked[1].contents for p in c.parts or []
              if p.function_response is not None]
    assert told.response == {"error": "Invoking `lookup()` failed as the following mandatory"
                                      " input parameters are not present: order"}


def parts_of(request: LlmRequest) -> list[tuple[str, Any]]:
    """What a request held, in order: each call's and answer's id, each text."""
    found: list[tuple[str, Any]] = []
    for content in request.contents:
        for part in content.parts or []:
            if part.function_call is not None:
                found.append(("call", part.function_call.id))
            elif part.function_response is not None:
                found.append(("answer", part.function_response.response))
            elif part.text:
                found.append(("text", part.text))
    return found


async def test_r17_a_sub_agent_calls_only_its_own_tools(tmp_path: Path) -> None:
    """As in ADK: after a transfer, the sub-agent's model calling a tool only the root agent
    has is told the tool is not found in *its* agent, and nothing runs."""
    wiped: list[str] = []

    def wipe(order: str) -> str:
        """The root's tool, which billing does not have."""
        wiped.append(order)
        return "wiped"

    root = Scripted(script=[[transfer("billing")]], asked=[])
    billing = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="w1", name="wipe",
                                                     args={"order": "A1"}))],
        [types.Part(text="I cannot do that.")]], asked=[])
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(
        name="root", model=root, tools=[wipe],
        sub_agents=[LlmAgent(name="billing", model=billing, description="Refunds.")])))
    async with h:
        task = await h.submit("support", "Wipe A1.")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert wiped == [] and info.snapshot.result == "I cannot do that."
    assert ("answer", {"error": "Tool wipe not found in agent billing."}) in \
        parts_of(billing.asked[1])


async def test_r10_after_a_restart_the_transfer_is_answered_once(tmp_path: Path) -> None:
    """The session rebuilt from the dialog holds ADK's own answer to the transfer (shown to
    billing as the root's words), and no second one saying the call was never made."""
    root = Scripted(script=[[transfer("billing")]], asked=[])
    billing = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="r1", name="refund",
                                                     args={"order": "A1"}))],
        [types.Part(text="Refunded A1.")]], asked=[])
    paid: list[str] = []
    async with support(tmp_path / "t.db", root, billing, paid) as h:
        task = await h.submit("support", "Refund A1, it arrived broken.")
        await h.run_until_idle(timeout=30)
    async with support(tmp_path / "t.db", root, billing, paid) as h:
        await h.emit(tt.Event("approval", task, True))
        await h.run_until_idle(timeout=30)
    shown = [str(p) for p in parts_of(billing.asked[1])]
    assert not any("not made" in p for p in shown), shown
    assert sum("`transfer_to_agent` tool returned result" in p for p in shown) == 1, shown


async def test_r08_an_unknown_tools_answer_is_in_the_conversation_once(tmp_path: Path) -> None:
    """The answer to a call of a tool the agent lacks is recorded as it was sent: the live
    session and one made again from the dialog hold it once, after its call."""
    model = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(id="c1", name="refund", args={}))],
        [types.Part(function_call=types.FunctionCall(id="c2", name="lookup",
                                                     args={"order": "A1"}))],
        [types.Part(text="A1 was paid 40.")]], asked=[])
    agent = ADKAgent(LlmAgent(name="shop", model=model, tools=[lookup]))
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", agent)
    async with h:
        await h.submit("support", "What was paid on A1?")
        await h.run_until_idle(timeout=30)
        [talk] = agent.dialogs.values()
        assert talk.live is not None
        live = [e.id for e in talk.live.events]
        assert len(live) == len(set(live))
        answers = [r.id for e in talk.live.events for r in e.get_function_responses()]
        assert answers == ["c1", "c2"], answers
    assert [p[0] for p in parts_of(model.asked[2])] == ["text", "call", "answer", "call",
                                                       "answer"]


class Streamer(BaseLlm):
    """Answers from a script; a step ``"hang"`` streams a word, says so, then hangs (a P0
    cuts it)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    model: str = "streamer"
    script: list[Any] = []
    asked: list[LlmRequest] = []
    streaming: asyncio.Event

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        self.asked.append(llm_request)
        step = self.script[len(self.asked) - 1]
        if step == "hang":
            yield LlmResponse(content=types.Content(role="model",
                                                    parts=[types.Part(text="Checking")]),
                              partial=True)
            self.streaming.set()
            await asyncio.sleep(60)
        yield LlmResponse(content=types.Content(role="model", parts=step), turn_complete=True)


async def test_e1_a_p0_cutting_a_sub_agents_answer_keeps_the_conversation_there(
        tmp_path: Path) -> None:
    """The cut text is the sub-agent's (its model is watched too), and after the resume the
    sub-agent, not the root, answers."""
    root = Streamer(script=[[transfer("billing")], [types.Part(text="root answered")]],
                    asked=[], streaming=asyncio.Event())
    billing = Streamer(script=[
        [types.Part(function_call=types.FunctionCall(id="l1", name="lookup",
                                                     args={"order": "A1"}))],
        "hang", [types.Part(text="billing answered")]], asked=[], streaming=asyncio.Event())
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(name="root", model=root, sub_agents=[
        LlmAgent(name="billing", model=billing, description="Billing.", tools=[lookup])])))
    async with h:
        task = await h.submit("support", "Refund A1")
        run = asyncio.create_task(h.run_until_idle(timeout=60))
        await asyncio.wait_for(billing.streaming.wait(), 30)
        await h.emit(tt.Event("user_interrupt", task, "wait"))
        await asyncio.wait_for(run, 30)
        cut = [r for r in await h.history(task) if r.get("cut_off")]
        await h.resume(task, "go on")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert [r["content"] for r in cut] == ["Checking"]
    assert info.snapshot.result == "billing answered" and len(root.asked) == 1


class Order(BaseModel):
    id: str
    cents: int


async def test_r17_arguments_reach_the_tool_as_adk_gives_them(tmp_path: Path) -> None:
    """A parameter typed with a pydantic model gets the model; a tool taking ``**extra``
    gets the arguments it did not name."""
    got: list[Any] = []

    def charge(order: Order) -> str:
        """Charge an order."""
        got.append(order)
        return "charged"

    def note(text: str, **extra: Any) -> str:
        """Note something."""
        got.append(extra)
        return "noted"

    model = Scripted(script=[
        [types.Part(function_call=types.FunctionCall(
            id="c1", name="charge", args={"order": {"id": "A1", "cents": 40}})),
         types.Part(function_call=types.FunctionCall(
             id="c2", name="note", args={"text": "hi", "tag": "vip"}))],
        [types.Part(text="Done.")]], asked=[])
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(name="shop", model=model, tools=[charge, note]),
                                    tools={"charge": tt.ToolPolicy(side_effect=True)}))
    async with h:
        task = await h.submit("support", "Charge A1.")
        await h.run_until_idle(timeout=30)
        info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert got == [Order(id="A1", cents=40), {"tag": "vip"}]


class Always(BaseLlm):
    """Answers every request with the same parts."""

    model: str = "always"
    parts: list[types.Part] = []
    asked: int = 0

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        self.asked += 1
        yield LlmResponse(content=types.Content(role="model", parts=self.parts),
                          turn_complete=True)


async def test_r12_agents_that_only_hand_the_conversation_back_and_forth_are_stopped(
        tmp_path: Path) -> None:
    """A plan carries out at most three transfers before a model answers; beyond, the plan
    fails (bounded recovery, then a person), each model turn counted as a completion."""
    root = Always(parts=[transfer("billing")])
    billing = Always(parts=[transfer("root")])
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")
    h.add_agent("support", ADKAgent(LlmAgent(name="root", model=root, sub_agents=[
        LlmAgent(name="billing", model=billing, description="Billing.")])))
    async with h:
        task = await h.submit("support", "Refund A1")
        await h.run_until_idle(timeout=60)
        info = await h.get(task)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert "transferred 3 times in one plan" in (info.snapshot.error or info.record.reason or "")
    assert root.asked + billing.asked < 40
