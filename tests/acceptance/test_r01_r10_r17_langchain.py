"""A LangChain ``create_agent`` agent under tether (R1, R8, R10, R12, R17, R26; issue 28).

LangChain's own fake chat model (``FakeMessagesListChatModel`` from langchain-core, which
cannot stream and, as shipped, cannot bind tools: a subclass binds them) stands in for the
model, no server. The store is a real SQLite file. The model-agent conformance suite (P0 cut
of a streamed answer, P1 messages, approvals, reconcile shapes, loop bounds, usage, SIGKILLs
at every failpoint) runs over this adapter with ``langchain-openai`` against the fake OpenAI
server: tests/acceptance/test_r01_r03_r10_r17_agent_conformance.py and tests/chaos/.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

import pytest
from _support import fast_settings
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    HumanInTheLoopMiddleware,
    hook_config,
    wrap_tool_call,
)
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command
from pydantic import BaseModel

import tether as tt
from tether.errors import ConfigurationError
from tether.integrations.langchain import KEY, LangChainAgent, current_call, messages_of

SEEN: list[list[BaseMessage]] = []
"""Every request the scripted model got, in order (cleared by each test that reads it)."""


class Scripted(FakeMessagesListChatModel):
    """LangChain's fake chat model, answering from its list; every request goes to SEEN."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        SEEN.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def calls(*made: tuple[str, dict[str, Any]], text: str = "") -> AIMessage:
    return AIMessage(text, tool_calls=[{"name": n, "args": a, "id": f"c{i}_{n}"}
                                       for i, (n, a) in enumerate(made)],
                     usage_metadata={"input_tokens": 20, "output_tokens": 9, "total_tokens": 29})


class Shop:
    def __init__(self) -> None:
        self.refunds: list[tuple[str, str, int]] = []
        self.lookups = 0


def shop_tools(shop: Shop) -> list[Any]:
    @tool
    async def refund(order: str, amount: int, runtime: ToolRuntime) -> str:
        """Refund an order."""
        key = runtime.config["configurable"][KEY]
        assert key == current_call().idempotency_key
        shop.refunds.append((key, order, amount))
        return f"refunded {amount} on {order}"

    @tool
    def lookup(order: str) -> str:
        """Look an order up (a plain def: LangChain runs it in a thread)."""
        shop.lookups += 1
        return f"order {order}: paid 40"

    return [refund, lookup]


def harness(tmp_path: Path, agent: Any, **options: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{tmp_path / 'lc.db'}", settings=fast_settings())
    options.setdefault("tools", {"lookup": tt.ToolPolicy(idempotent=True)})
    h.add_agent("support", LangChainAgent(agent, **options))
    return h


async def finished(h: tt.Harness, task: str) -> tt.TaskInfo:
    await h.run_until_idle(timeout=20)
    return await h.get(task)


async def test_r17_a_create_agent_agent_runs_as_a_tether_task_in_one_line(tmp_path: Path) -> None:
    """Both calls of one answer run as tether calls (the refund a side effect by default, the
    lookup idempotent as named), the tool sees tether's key through ToolRuntime's config and
    current_call(), a plain ``def`` tool runs, and the usage is the model's."""
    shop = Shop()
    model = Scripted(responses=[calls(("lookup", {"order": "A1"}),
                                      ("refund", {"order": "A1", "amount": 5})),
                                AIMessage("Refunded.", usage_metadata={
                                    "input_tokens": 30, "output_tokens": 6, "total_tokens": 36})])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), system_prompt="Be brief."))
    assert h.tools["support.refund"].side_effect and not h.tools["support.lookup"].side_effect
    task = await h.submit("support", "Refund 5 on A1")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded."
    assert shop.lookups == 1 and len(shop.refunds) == 1
    assert shop.refunds[0][0] in {r.key for r in await h.store.list_idempotency(task)}
    assert info.snapshot.usage == {"completions": 2, "prompt_tokens": 50, "completion_tokens": 15}
    await h.close()


async def test_r08_the_history_is_langchains_own_and_the_model_sees_it_whole(
        tmp_path: Path) -> None:
    """The second request holds the system prompt, the input, the answer with both calls and
    both tool messages, in order; the task's rows decode to the same conversation."""
    shop = Shop()
    SEEN.clear()
    model = Scripted(responses=[calls(("lookup", {"order": "A1"}),
                                      ("refund", {"order": "A1", "amount": 5})),
                                AIMessage("Refunded.")])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), system_prompt="Be brief."))
    task = await h.submit("support", "Refund 5 on A1")
    assert (await finished(h, task)).record.status is tt.Status.COMPLETED
    second = SEEN[1]
    assert [type(m).__name__ for m in second] == [
        "SystemMessage", "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage"]
    assert [m.tool_call_id for m in second if isinstance(m, ToolMessage)] == \
        ["c0_lookup", "c1_refund"]
    decoded = messages_of(await h.history(task), "Refund 5 on A1", "support.")
    assert [type(m).__name__ for m in decoded] == [
        "HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage"]
    assert decoded[-1].content == "Refunded."
    await h.close()


async def test_r17_wrap_tool_call_middleware_runs_around_each_tether_call(tmp_path: Path) -> None:
    """A ``wrap_tool_call`` middleware sees each call, inside the tether call (its key is
    current), and what it returns is the call's result."""
    shop = Shop()
    wrapped: list[str] = []

    @wrap_tool_call
    async def audit(request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        wrapped.append(f"{request.tool_call['name']}:{current_call().idempotency_key}")
        result = await handler(request)
        return ToolMessage(f"{result.content} (audited)", tool_call_id=result.tool_call_id)

    model = Scripted(responses=[calls(("lookup", {"order": "A1"})), AIMessage("ok")])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), middleware=[audit]))
    task = await h.submit("support", "look A1 up")
    assert (await finished(h, task)).record.status is tt.Status.COMPLETED
    key = (await h.store.list_idempotency(task))[0].key
    assert wrapped == [f"lookup:{key}"]
    results = [r for r in await h.history(task) if r.get("role") == "tool"]
    assert "(audited)" in str(results[0]["content"])
    await h.close()


class Verdict(BaseModel):
    refunded: bool
    order: str


async def test_r17_a_structured_response_is_the_tasks_result(tmp_path: Path) -> None:
    """With ``response_format`` (LangChain's tool strategy, handled inside its model node),
    the task's result is the structured response as plain data."""
    model = Scripted(responses=[calls(("Verdict", {"refunded": True, "order": "A1"}))])
    agent = create_agent(model, tools=shop_tools(Shop()), response_format=Verdict)
    h = harness(tmp_path, agent)
    task = await h.submit("support", "did A1 get its refund?")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == {"refunded": True, "order": "A1"}
    await h.close()


async def test_r12_r22_unparsable_arguments_are_told_to_the_model_and_replayed_valid(
        tmp_path: Path) -> None:
    """A call whose arguments are not JSON is never made: the model is told what it sent in
    the same plan, and every later request carries the call with ``{}`` (a strict server
    answers HTTP 500 to a replayed unparsable call), answered by that error."""
    SEEN.clear()
    broken = AIMessage("", invalid_tool_calls=[{"name": "refund", "args": "{'order': A1",
                                                 "id": "bad1", "error": "not JSON",
                                                 "type": "invalid_tool_call"}])
    model = Scripted(responses=[broken, AIMessage("Sorry, I could not.")])
    shop = Shop()
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop)))
    task = await h.submit("support", "Refund A1")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED and not shop.refunds
    replayed = next(m for m in SEEN[1] if isinstance(m, AIMessage))
    assert replayed.tool_calls == [{"name": "refund", "args": {}, "id": "bad1",
                                    "type": "tool_call"}] and not replayed.invalid_tool_calls
    told = next(m for m in SEEN[1] if isinstance(m, ToolMessage))
    assert told.tool_call_id == "bad1" and "{'order': A1" in str(told.content)
    await h.close()


async def test_r10_a_reconcile_hook_is_checked_when_the_agent_is_made(tmp_path: Path) -> None:
    """A hook that fits neither the tool's arguments nor the model's call is refused at once,
    naming the tool; one that takes the tool's arguments is accepted."""
    agent = create_agent(Scripted(responses=[]), tools=shop_tools(Shop()))

    async def wrong(ctx: tt.ToolContext, customer: str) -> None:
        return None

    async def right(ctx: tt.ToolContext, order: str, amount: int) -> None:
        return None

    with pytest.raises(ConfigurationError, match="refund"):
        LangChainAgent(agent, tools={"refund": tt.ToolPolicy(side_effect=True, reconcile=wrong)})
    LangChainAgent(agent, tools={"refund": tt.ToolPolicy(side_effect=True, reconcile=right)})
    with pytest.raises(ConfigurationError, match="nope"):
        LangChainAgent(agent, tools={"nope": tt.ToolPolicy()})


class Remembering(AgentMiddleware[AgentState[Any], Any]):
    """Middleware with a hook that runs once per agent run."""

    async def abefore_agent(self, state: AgentState[Any], runtime: Any) -> None:
        return None


class Audit(AgentMiddleware[AgentState[Any], Any]):
    """Middleware with an after_model hook."""

    async def aafter_model(self, state: AgentState[Any], runtime: Any) -> None:
        return None


class Noted(AgentState[Any]):
    notes: list[str]


class Counter(TypedDict):
    count: int


@pytest.mark.parametrize(("build", "named"), [
    (lambda: create_agent(Scripted(responses=[]), tools=[], checkpointer=InMemorySaver()),
     "checkpointer"),
    (lambda: create_agent(Scripted(responses=[]), tools=[], middleware=[Remembering()]),
     "Remembering.before_agent"),
    (lambda: create_agent(Scripted(responses=[]), tools=[], state_schema=Noted), "notes"),
    (lambda: StateGraph(Counter).add_node("x", lambda s: s).add_edge(START, "x").compile(),
     "no messages"),
    (lambda: create_agent, "not a compiled LangGraph graph"),
    (lambda: create_agent(Scripted(responses=[]), tools=[], middleware=[
        Audit(), HumanInTheLoopMiddleware(interrupt_on={"refund": True})]),
     "Audit has an after_model hook that runs after HumanInTheLoopMiddleware"),
    (lambda: create_agent(Scripted(responses=[]), tools=[], middleware=[
        HumanInTheLoopMiddleware(interrupt_on={"refund": True}, interrupt_mode="per_call")]),
     "per_call"),
], ids=["checkpointer", "before_agent", "extra_state", "no_messages", "not_a_graph",
        "hitl_before_another_after_model", "hitl_per_call"])
def test_r26_what_tether_cannot_keep_is_refused_by_name(build: Callable[[], Any],
                                                         named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        LangChainAgent(build())


async def test_r17_a_list_of_langchain_messages_is_a_valid_input(tmp_path: Path) -> None:
    """A task's input may be the conversation so far (LangChain message dicts)."""
    from langchain_core.messages import messages_to_dict

    SEEN.clear()
    model = Scripted(responses=[AIMessage("Hello again.")])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(Shop())))
    opening = messages_to_dict([HumanMessage("hi"), AIMessage("hello"), HumanMessage("again")])
    task = await h.submit("support", opening)
    info = await finished(h, task)
    assert info.snapshot.result == "Hello again."
    assert [m.content for m in SEEN[0]] == ["hi", "hello", "again"]
    await h.close()


@pytest.mark.parametrize(("allowed", "answer", "paid", "told"), [
    (["approve", "edit", "reject"], True, [50], "refunded 50 on A1"),
    (["approve", "edit", "reject"], {"approved": True, "args": {"order": "A1", "amount": 5}},
     [5], "refunded 5 on A1"),
    (["approve", "edit", "reject"], {"approved": False, "reason": "too much"}, [], "too much"),
    (["approve", "reject"], {"approved": True, "args": {"order": "A1", "amount": 5}}, [],
     "editing refund calls is not allowed"),
    (["approve", "edit", "reject"], {"approved": True, "args": "amount=5"}, [],
     "not a JSON object"),
    (["approve", "edit", "reject"], {"approved": "false"}, [], "rejected by a person"),
    (["approve", "respond"], {"respond": "Refunded by hand already."}, [],
     "Refunded by hand already."),
    (["approve", "reject"], {"respond": "Refunded by hand already."}, [],
     "in the tool's place is not allowed"),
], ids=["approved", "edited", "rejected", "edit_not_allowed", "edit_not_an_object",
        "a_string_is_no_approval", "responded", "respond_not_allowed"])
async def test_r26_a_person_approves_edits_or_rejects_what_the_middleware_names(
        tmp_path: Path, allowed: list[str], answer: Any, paid: list[int], told: str) -> None:
    """``HumanInTheLoopMiddleware`` becomes a tether wait before the call it names; the
    person's answer (an ``approval`` event) runs the call, runs it with edited arguments
    (where the middleware allows edits), or answers the model with the reason; the model
    sees what happened. The call never runs before the answer."""
    SEEN.clear()
    shop = Shop()
    model = Scripted(responses=[calls(("refund", {"order": "A1", "amount": 50})),
                                AIMessage("done")])
    hitl = HumanInTheLoopMiddleware(interrupt_on={"refund": {"allowed_decisions": allowed}})
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), middleware=[hitl]))
    task = await h.submit("support", "Refund A1")
    waiting = await finished(h, task)
    assert waiting.record.status is tt.Status.WAITING and not shop.refunds
    await h.emit(tt.Event("approval", task, answer))
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert [amount for _, _, amount in shop.refunds] == paid
    result = next(m for m in SEEN[-1] if isinstance(m, ToolMessage))
    assert told in str(result.content), result
    await h.close()


async def test_r22_a_graph_that_asks_no_model_goes_to_a_person_naming_why(tmp_path: Path) -> None:
    """A graph whose run adds no model answer is not run again and again: the plan fails
    saying so, and bounded recovery hands the task to a person with that reason."""
    from langgraph.graph import MessagesState

    graph = StateGraph(MessagesState)
    graph.add_node("echo", lambda state: {"messages": [HumanMessage("echo")]})
    graph.add_edge(START, "echo")
    h = harness(tmp_path, graph.compile(), tools={})
    task = await h.submit("support", "hello")
    info = await finished(h, task)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "added no model answer" in (info.record.reason or "")
    assert info.snapshot.usage.get("completions", 0) == 0  # no model was asked: none paid
    await h.close()


async def test_r17_langgraphs_prebuilt_react_agent_runs_too(tmp_path: Path) -> None:
    """``langgraph.prebuilt.create_react_agent`` (LangGraph's own ReAct agent, deprecated in
    favour of ``create_agent`` but widely used) runs under the same adapter: its
    ``remaining_steps`` is a value LangGraph computes per run, not state tether must keep."""
    import warnings

    from langgraph.prebuilt import create_react_agent

    shop = Shop()
    model = Scripted(responses=[calls(("refund", {"order": "A1", "amount": 5})),
                                AIMessage("Refunded.")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice
        agent = create_react_agent(model, tools=shop_tools(shop), prompt="Be brief.")
    h = harness(tmp_path, agent)
    task = await h.submit("support", "Refund 5 on A1")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "Refunded." and len(shop.refunds) == 1
    await h.close()


class Guard(AgentMiddleware[AgentState[Any], Any]):
    """Ends the run instead of letting a refund over 100 run (LangChain's ``jump_to``)."""

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        last = state["messages"][-1]
        if any(c["args"].get("amount", 0) > 100 for c in getattr(last, "tool_calls", [])):
            return {"jump_to": "end"}
        return None


async def test_r10_a_call_a_guard_ended_the_run_on_is_never_made(tmp_path: Path) -> None:
    """A run that *ended* with calls in its answer (a guard jumped to the end) is not a run
    that stopped before its tools: the calls are not made, as in plain LangChain, and the
    task ends with the answer's words."""
    shop = Shop()
    model = Scripted(responses=[calls(("refund", {"order": "A1", "amount": 5000}),
                                      text="Refunding.")])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), middleware=[Guard()]))
    task = await h.submit("support", "refund A1")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert shop.refunds == [] and info.snapshot.result == "Refunding."
    await h.close()


async def test_r17_a_structured_response_beside_a_call_runs_the_call_then_finishes(
        tmp_path: Path) -> None:
    """An answer holding a real call and the structured response: the call runs (as in
    plain LangChain) and the task's result is the structured response."""
    shop = Shop()
    model = Scripted(responses=[calls(("refund", {"order": "A1", "amount": 5}),
                                      ("Verdict", {"refunded": True, "order": "A1"}))])
    h = harness(tmp_path, create_agent(model, tools=shop_tools(shop), response_format=Verdict))
    task = await h.submit("support", "refund A1 and say so")
    info = await finished(h, task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert [amount for _, _, amount in shop.refunds] == [5]
    assert info.snapshot.result == {"refunded": True, "order": "A1"}
    await h.close()


class Summarising(AgentMiddleware[AgentState[Any], Any]):
    """Replaces all but the last two messages by a summary once there are more than four (as
    LangChain's SummarizationMiddleware does), counting how often it summarises."""

    def __init__(self) -> None:
        super().__init__()
        self.summaries = 0

    async def abefore_model(self, state: AgentState[Any], runtime: Any) -> dict[str, Any] | None:
        messages = state["messages"]
        if len(messages) <= 4:
            return None
        self.summaries += 1
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES),
                             HumanMessage(f"SUMMARY {self.summaries}"), *messages[-2:]]}


async def test_r08_middleware_that_rewrites_the_conversation_is_kept_as_written(
        tmp_path: Path) -> None:
    """A middleware that replaces old messages by a summary: the model is asked with exactly
    what plain LangChain sends, the summary is made as often (not every turn again), and the
    task's rows decode to the rewritten conversation."""
    def script() -> list[BaseMessage]:
        return [*(calls(("lookup", {"order": f"A{i}"})) for i in range(4)), AIMessage("done")]

    SEEN.clear()
    plain = Summarising()
    await create_agent(Scripted(responses=script()), tools=shop_tools(Shop()),
                       middleware=[plain]).ainvoke({"messages": [HumanMessage("go")]})
    asked_plain = [[m.text for m in request] for request in SEEN]
    SEEN.clear()
    ours = Summarising()
    h = harness(tmp_path, create_agent(Scripted(responses=script()), tools=shop_tools(Shop()),
                                       middleware=[ours]))
    task = await h.submit("support", "go")
    assert (await finished(h, task)).record.status is tt.Status.COMPLETED
    assert [[m.text for m in request] for request in SEEN] == asked_plain
    assert ours.summaries == plain.summaries > 0
    decoded = messages_of(await h.history(task), "go", "support.")
    assert decoded[0].text.startswith("SUMMARY") and decoded[-1].text == "done"
    await h.close()


def test_r08_an_input_with_repeated_ids_or_an_open_call_is_made_whole() -> None:
    """Messages given as the input keep their order under ids of their own (LangGraph would
    merge two with one id), and a call left open in them is answered as not made, so the
    provider accepts the conversation."""
    from langchain_core.messages import messages_to_dict

    given = messages_to_dict([HumanMessage("order A1 please", id="x"),
                              AIMessage("which amount?", id="x"), HumanMessage("5 EUR", id="x"),
                              AIMessage("", tool_calls=[{"name": "lookup", "args": {},
                                                         "id": "open1"}])])
    decoded = messages_of([], given, "support.")
    assert [m.text for m in decoded[:3]] == ["order A1 please", "which amount?", "5 EUR"]
    assert len({m.id for m in decoded}) == len(decoded)
    assert isinstance(decoded[-1], ToolMessage) and decoded[-1].tool_call_id == "open1"


async def test_r10_a_tool_that_returns_a_command_ran_once_and_is_not_run_again(
        tmp_path: Path) -> None:
    """A tool returning LangGraph's ``Command`` (graph state tether does not keep) has done
    its work by then: the call is not retried (which would repeat it); the task goes to a
    person saying why. A tool declared to return one is refused when the agent is made."""
    ran: list[str] = []

    @tool
    def transfer(order: str, runtime: ToolRuntime) -> Any:
        """Move an order to another queue."""
        ran.append(order)
        return Command(update={"messages": [ToolMessage("moved", tool_call_id=runtime.tool_call_id)],
                               "queue": "other"})

    model = Scripted(responses=[calls(("transfer", {"order": "A1"})), AIMessage("done")])
    h = harness(tmp_path, create_agent(model, tools=[transfer]), tools={})
    task = await h.submit("support", "transfer A1")
    info = await finished(h, task)
    assert ran == ["A1"], "the call ran again"
    assert info.record.status is tt.Status.NEEDS_HUMAN
    reason = info.record.reason or ""
    assert "returned a Command" in reason and "not repeated" in reason, reason
    await h.close()

    @tool
    def declared(order: str) -> Command:  # type: ignore[type-arg]
        """Move an order, as its signature says."""
        return Command(update={})

    with pytest.raises(ConfigurationError, match="declared returns a Command"):
        LangChainAgent(create_agent(Scripted(responses=[]), tools=[declared]))


@pytest.mark.parametrize("streams", [False, True])
async def test_r17_a_model_that_streams_nothing_is_asked_plainly_after_its_first_answer(
        tmp_path: Path, streams: bool) -> None:
    """R17 (issue 27: streaming detected, not configured): LangChain asks a chat model that
    cannot stream plainly, without a word; the adapter sees its first answer arrive with not
    one piece streamed and asks plainly from then on (LangGraph's message stream and the
    callbacks cost about 0.5 ms a call), while a model that streams keeps being streamed."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    class Streaming(GenericFakeChatModel):
        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self

    answers = [calls(("lookup", {"order": "A1"})), AIMessage("A1 was paid 40.")]
    model = Streaming(messages=iter(answers)) if streams else Scripted(responses=answers)
    h = harness(tmp_path, create_agent(model, tools=shop_tools(Shop())))
    agent = h.agents["support"]
    assert isinstance(agent, LangChainAgent) and agent.streams()
    info = await finished(h, await h.submit("support", "How much was A1?"))
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "A1 was paid 40."
    assert agent.streams() is streams
    await h.close()
