"""R3, R10, R14, R17 (issue 28): a LangChain agent's graph run is kept open across a task's
plans, and is never continued where the task's conversation is not the run's.

A kept run waits at its tool nodes while tether runs the calls, and the next plan hands it the
results, so a task pays one graph start, not one per model turn. These tests count the graph
runs started (``astream`` calls on the agent's answering copy of its graph) and read every
request the model got: the conversation the model sees must be exactly the task's rows, with
one run when nothing came between the turns and a new one from the rows when something did (a
message between calls, a rollback, a failed request, a graph that ends at its tools).
LangChain's own fake chat model, no server; a real SQLite store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import tether as tt
from tether.agents.model_calls import RetryPolicy
from tether.integrations.langchain import LangChainAgent, current_call

SEEN: list[list[BaseMessage]] = []
"""Every request the scripted model answered, in order (cleared by :func:`model`)."""
FAIL_AT: set[int] = set()
"""Requests (numbered from 1) that fail once with a 503 before they are answered."""


class Scripted(FakeMessagesListChatModel):
    """LangChain's fake chat model answering from its list; each request is kept in SEEN."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        asked = len(SEEN) + 1
        if asked in FAIL_AT:
            FAIL_AT.discard(asked)
            raise Unavailable("the provider is busy")
        SEEN.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


class Unavailable(Exception):
    status_code = 503


def answer(*orders: str, ids: str = "c") -> AIMessage:
    """One answer looking each order up; ids ``c0``, ``c1``... (the same in every answer, as
    some models and fakes give them)."""
    return AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": order},
                                      "id": f"{ids}{i}"} for i, order in enumerate(orders)])


class Counted:
    """The graph runs an agent started: ``astream`` calls on its answering graph."""

    def __init__(self, agent: LangChainAgent, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = 0
        started = agent.answering.astream

        def astream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            self.runs += 1
            return started(*args, **kwargs)

        monkeypatch.setattr(agent.answering, "astream", astream)


def lookups(looked: list[str]) -> Any:
    @tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        looked.append(order)
        return f"order {order}: paid 40"

    return lookup


def harness(tmp_path: Path, graph: Any, **options: Any) -> tuple[tt.Harness, LangChainAgent]:
    h = tt.Harness(f"sqlite:///{tmp_path / 'kept.db'}", settings=fast_settings())
    agent = LangChainAgent(graph, tools={"lookup": tt.ToolPolicy(idempotent=True)}, **options)
    h.add_agent("support", agent)
    return h, agent


async def completed(h: tt.Harness, prompt: str) -> tt.TaskInfo:
    """A task of the support agent, run until idle: completed, as it should."""
    task = await h.submit("support", prompt)
    await h.run_until_idle(timeout=20)
    info = await h.get(task)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    return info


def model(*responses: BaseMessage) -> Scripted:
    SEEN.clear()
    FAIL_AT.clear()
    return Scripted(responses=list(responses))


def results(request: list[BaseMessage]) -> dict[str, Any]:
    """The tool results a request holds, by call id, in order (ids repeat across answers,
    so later ones win: the newest answer's)."""
    return {m.tool_call_id: m.content for m in request if isinstance(m, ToolMessage)}


def hand_built(chat: Scripted, looked: list[str]) -> Any:
    """A hand-built ReAct graph: one ``ToolNode`` task runs every call of an answer."""
    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await chat.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookups(looked)]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


@pytest.mark.parametrize("shape", ["create_agent", "hand-built"])
async def test_r17_one_graph_run_serves_every_turn_and_each_result_reaches_its_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    """Three answers (three calls, then two with the same ids again, then text): one graph
    run for the task, each call run once by tether, and each request holds each result
    under its own call, in the order the model asked."""
    looked: list[str] = []
    chat = model(answer("A1", "B2", "C3"), answer("D4", "E5"), AIMessage("All paid."))
    graph = create_agent(chat, tools=[lookups(looked)]) if shape == "create_agent" \
        else hand_built(chat, looked)
    h, agent = harness(tmp_path, graph)
    counted = Counted(agent, monkeypatch)
    info = await completed(h, "check my orders")
    assert info.snapshot.result == "All paid."
    assert looked == ["A1", "B2", "C3", "D4", "E5"]
    assert counted.runs == 1
    second, third = SEEN[1], SEEN[2]
    assert [type(m) for m in second] == [HumanMessage, AIMessage, *[ToolMessage] * 3]
    assert results(second) == {f"c{i}": f"order {o}: paid 40" for i, o in enumerate(
        ["A1", "B2", "C3"])}
    assert [type(m) for m in third] == [HumanMessage, AIMessage, *[ToolMessage] * 3,
                                        AIMessage, ToolMessage, ToolMessage]
    assert [m.content for m in third[-2:]] == ["order D4: paid 40", "order E5: paid 40"]
    await h.close()


async def test_r03_a_message_between_the_calls_reaches_the_model_through_a_new_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A P1 message sent while a call runs is not in the kept run's conversation: the run is
    left and the next request, from the task's rows, holds the message after the result."""
    looked: list[str] = []
    h_box: list[tt.Harness] = []

    @tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        looked.append(order)
        if len(looked) == 1:
            await h_box[0].emit(tt.Event("user_message", current_call().task_id,
                                         "and B2 too, please"))
        return f"order {order}: paid 40"

    chat = model(answer("A1"), answer("B2"), AIMessage("Both paid."))
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookup]))
    h_box.append(h)
    counted = Counted(agent, monkeypatch)
    await completed(h, "check A1")
    assert looked == ["A1", "B2"]
    second = SEEN[1]
    assert [type(m) for m in second] == [HumanMessage, AIMessage, ToolMessage, HumanMessage]
    assert "and B2 too, please" in str(second[-1].content)
    assert counted.runs == 2  # the first left at the message; the second to the end
    await h.close()


async def test_r14_a_rollback_while_the_run_waits_asks_from_the_versions_conversation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback applied while the kept run waits at a later answer's tools: the model is
    asked from the version's conversation (the rolled-back answer nowhere in it), never by
    the run that held the newer one."""
    looked: list[str] = []
    h_box: list[tt.Harness] = []
    versions: list[int] = []

    @tool
    async def lookup(order: str) -> str:
        """Look an order up; the first look at B2 rolls the task back to A1's resume point."""
        looked.append(order)
        task_id = current_call().task_id
        if order == "A1" and not versions:
            versions.append((await h_box[0].get(task_id)).record.head_version)
        if order == "B2" and looked.count("B2") == 1:
            await h_box[0].rollback(task_id, versions[0])
        return f"order {order}: paid 40"

    chat = model(answer("A1"), answer("B2"), AIMessage("Back to A1 only."))
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookup]))
    h_box.append(h)
    counted = Counted(agent, monkeypatch)
    info = await completed(h, "check A1")
    assert info.snapshot.result == "Back to A1 only."
    third = SEEN[2]
    assert [type(m) for m in third] == [HumanMessage, AIMessage, ToolMessage]
    assert third[1].tool_calls[0]["args"] == {"order": "A1"}
    assert not any("B2" in str(m.content) for m in third)
    assert counted.runs == 2
    await h.close()


async def test_r12_a_request_that_fails_in_a_kept_run_is_asked_again_in_a_new_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second request fails once with a 503 inside the kept run: the run is gone, the
    retry starts one from the rows (the result of the first call in it), no call runs twice."""
    looked: list[str] = []
    chat = model(answer("A1"), answer("B2"), AIMessage("Done."))
    FAIL_AT.add(2)
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookups(looked)]),
                       retry=RetryPolicy(attempts=3, base=0.0, cap=0.0))
    counted = Counted(agent, monkeypatch)
    await completed(h, "check A1")
    assert looked == ["A1", "B2"]
    assert [type(m) for m in SEEN[1]] == [HumanMessage, AIMessage, ToolMessage]
    assert counted.runs == 2
    await h.close()


async def test_r17_a_graph_that_ends_at_its_tools_is_asked_again_from_its_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``return_direct`` tool ends LangGraph's run after the tool node; tether's task goes
    on to the model, as it does for every other tool: the kept run ends, a new one asks."""
    looked: list[str] = []

    @tool(return_direct=True)
    async def lookup(order: str) -> str:
        """Look an order up."""
        looked.append(order)
        return f"order {order}: paid 40"

    chat = model(answer("A1"), AIMessage("A1 is paid."))
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookup]))
    counted = Counted(agent, monkeypatch)
    info = await completed(h, "check A1")
    assert info.snapshot.result == "A1 is paid."
    assert looked == ["A1"] and len(SEEN) == 2
    assert counted.runs == 2
    await h.close()


async def test_r10_two_calls_with_one_id_each_reach_the_model_with_their_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer whose two calls share one id (a sloppy model): the kept run's tool node could
    hand it only one result for both, so it is not continued; the next request, from the
    task's rows, holds both results."""
    looked: list[str] = []
    twice = AIMessage("", tool_calls=[{"name": "lookup", "args": {"order": o}, "id": "same"}
                                      for o in ("A1", "B2")])
    chat = model(twice, AIMessage("Both paid."))
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookups(looked)]))
    counted = Counted(agent, monkeypatch)
    await completed(h, "check A1 and B2")
    assert looked == ["A1", "B2"]
    assert [m.content for m in SEEN[1] if isinstance(m, ToolMessage)] == [
        "order A1: paid 40", "order B2: paid 40"]
    assert counted.runs == 2
    await h.close()


class Evicting(Scripted):
    """Answers asynchronously; while answering its second request, the task's conversation
    is dropped from the agent (as other tasks' plans evict the oldest of those it keeps)."""

    def __init__(self, agent_box: list[LangChainAgent], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._agent_box = agent_box

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        if len(SEEN) == 1:
            agent = self._agent_box[0]
            for decoded in list(agent.dialogs.values()):
                agent.forget(decoded)
        return self._generate(messages, *args, **kwargs)


async def test_r17_a_conversation_dropped_while_its_model_answers_is_not_asked_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request in flight is paid for: the run it waits for is left only once its answer
    is in, so the model is asked once per turn, and the task ends as asked."""
    looked: list[str] = []
    box: list[LangChainAgent] = []
    SEEN.clear()
    FAIL_AT.clear()
    chat = Evicting(box, responses=[answer("A1"), answer("B2"), AIMessage("Done.")])
    h, agent = harness(tmp_path, create_agent(chat, tools=[lookups(looked)]))
    box.append(agent)
    counted = Counted(agent, monkeypatch)
    info = await completed(h, "check A1, then B2")
    assert info.snapshot.result == "Done."
    assert len(SEEN) == 3 and looked == ["A1", "B2"]
    assert counted.runs == 2  # the dropped run is left after its answer; the next starts anew
    await h.close()
