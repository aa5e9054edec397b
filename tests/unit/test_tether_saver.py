"""TetherSaver beyond LangGraph's suite (issue 28, R8, R13, R20): a conversation costs what
it adds per step, what it rebuilds is exactly what the graph stored (also after a message
changed in place, a fork, a copy, a prune by another process), retention keeps the newest
checkpoints, and misuse gets a clear error."""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import tether as tt
from tether.errors import ConfigurationError
from tether.integrations.tether_saver import TetherSaver
from tether.store import Store, open_store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 't.db'}")
    await opened.migrate()
    yield opened
    await opened.close()


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]
    turns: Annotated[list[int], operator.add]


def chat_graph(checkpointer: Any) -> Any:
    """One user message and one answer per turn; the answer quotes the turn number."""
    def answer(state: Chat) -> dict[str, Any]:
        turn = len(state["turns"])
        return {"messages": [AIMessage(f"answer {turn}: " + "x" * 300, id=f"a{turn}")],
                "turns": [turn]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=checkpointer)


async def talk(graph: Any, thread: str, turns: int) -> None:
    for turn in range(turns):
        await graph.ainvoke({"messages": [HumanMessage(f"question {turn}", id=f"q{turn}")]},
                            {"configurable": {"thread_id": thread}})


def blob_bytes(db: Path, channel: str) -> list[int]:
    """The stored size of each version of *channel*, in the order written."""
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute(
            "SELECT length(value) FROM graph_blobs WHERE channel = ? ORDER BY version",
            (channel,))]


async def test_r08_a_conversation_costs_what_it_adds_per_step(store: Store,
                                                              tmp_path: Path) -> None:
    """The messages channel grows by two messages a turn; each stored version is about the
    size of those two, at turn 5 as at turn 60 (LangGraph's savers store the whole list:
    ~60 times more by then)."""
    await talk(chat_graph(TetherSaver(store)), "t", 60)
    sizes = blob_bytes(tmp_path / "t.db", "messages")
    assert len(sizes) >= 120
    late, early = max(sizes[-10:]), max(sizes[5:15])
    assert late < 2 * early, (early, late)
    whole = len(InMemorySaver().serde.dumps_typed(
        (await chat_graph(TetherSaver(store)).aget_state(
            {"configurable": {"thread_id": "t"}})).values["messages"])[1])
    assert late * 20 < whole


async def test_r08_every_checkpoint_reads_back_as_langgraphs_own_saver_keeps_it(
        store: Store) -> None:
    mine, theirs = chat_graph(TetherSaver(store)), chat_graph(InMemorySaver())
    await talk(mine, "t", 12)
    await talk(theirs, "t", 12)
    config = {"configurable": {"thread_id": "t"}}
    ours = [s.values async for s in mine.aget_state_history(config)]
    reference = [s.values async for s in theirs.aget_state_history(config)]
    assert len(ours) == len(reference) > 24
    assert ours == reference
    again = chat_graph(TetherSaver(store))  # a new process: nothing remembered in memory
    assert [s.values async for s in again.aget_state_history(config)] == reference


async def test_r20_a_message_changed_in_place_is_never_taken_for_the_old_one(
        store: Store) -> None:
    saver = TetherSaver(store)
    first, second = HumanMessage("a", id="1"), AIMessage("b", id="2")
    config = await put(saver, None, {"messages": [first, second]})
    assert stored_as_added(store, config) is False  # the first list is whole
    config = await put(saver, config, {"messages": [first, second, AIMessage("c", id="3")]})
    assert stored_as_added(store, config) is True
    second.content = "b, edited"  # the same object, changed after it was stored
    config = await put(saver, config, {"messages": [first, second, AIMessage("d", id="4")]})
    loaded = await saver.aget_tuple(config)
    assert loaded is not None
    assert [m.content for m in loaded.checkpoint["channel_values"]["messages"]] == \
        ["a", "b, edited", "d"]


async def test_r13_a_base_pruned_by_another_process_is_stored_whole_instead(
        store: Store) -> None:
    writer, pruner = TetherSaver(store), TetherSaver(store)
    config = await put(writer, None, {"messages": ["a"]})
    config = await put(writer, config, {"messages": ["a", "b"]})
    await pruner.aprune(["t"], strategy="delete")  # every version gone, writer not told
    config = await put(writer, config, {"messages": ["a", "b", "c"]})
    loaded = await writer.aget_tuple({"configurable": {"thread_id": "t"}})
    assert loaded is not None and loaded.checkpoint["channel_values"]["messages"] == ["a", "b", "c"]


async def test_r08_a_fork_and_a_copy_read_their_own_values(store: Store) -> None:
    saver = TetherSaver(store)
    root = await put(saver, None, {"messages": ["a"]})
    left = await put(saver, root, {"messages": ["a", "left"]})
    right = await put(saver, root, {"messages": ["a", "right"]})  # a second branch
    left = await put(saver, left, {"messages": ["a", "left", "more"]})
    await saver.acopy_thread("t", "copy")
    await saver.adelete_thread("t")
    for config, expected in ((left, ["a", "left", "more"]), (right, ["a", "right"])):
        copied = {"configurable": {**config["configurable"], "thread_id": "copy"}}
        loaded = await saver.aget_tuple(copied)
        assert loaded is not None and loaded.checkpoint["channel_values"]["messages"] == expected
    assert await saver.aget_tuple(left) is None


async def test_r20_keep_holds_the_newest_checkpoints_and_what_they_read(
        store: Store, tmp_path: Path) -> None:
    saver = TetherSaver(store, keep=3)
    await talk(chat_graph(saver), "t", 20)
    config = {"configurable": {"thread_id": "t"}}
    assert len([c async for c in saver.alist(config)]) == 3
    with sqlite3.connect(tmp_path / "t.db") as conn:
        stored = conn.execute("SELECT sum(length(value)) FROM graph_blobs").fetchone()[0]
        writes = conn.execute("SELECT count(DISTINCT checkpoint_id) FROM graph_writes"
                              ).fetchone()[0]
    state = await chat_graph(TetherSaver(store)).aget_state(config)
    assert len(state.values["messages"]) == 40 and state.values["turns"] == list(range(20))
    whole = len(saver.serde.dumps_typed(state.values["messages"])[1])
    assert stored < 2 * whole  # the newest lists once, not a copy per checkpoint ever made
    assert writes <= 3


async def test_r13_a_harness_is_a_store_and_misuse_is_named(tmp_path: Path) -> None:
    async with tt.Harness(f"sqlite:///{tmp_path / 'h.db'}") as harness:
        saver = TetherSaver(harness)
        await talk(chat_graph(saver), "t", 2)
        with pytest.raises(ConfigurationError, match="thread id"):
            await saver.aget_tuple({"configurable": {}})
        with pytest.raises(ConfigurationError, match="ainvoke"):
            saver.get_tuple({"configurable": {"thread_id": "t"}})  # on the loop's own thread
        from_thread = await asyncio.to_thread(saver.get_tuple,
                                              {"configurable": {"thread_id": "t"}})
        assert from_thread is not None and len(from_thread.checkpoint["channel_values"]
                                               ["messages"]) == 4
    with pytest.raises(ConfigurationError, match="keep"):
        TetherSaver(harness, keep=0)
    with pytest.raises(ConfigurationError, match="tether store or harness"):
        _ = TetherSaver(object()).store


async def put(saver: TetherSaver, parent: Any, values: dict[str, Any]) -> Any:
    """Store a checkpoint of thread ``t`` after *parent* whose every channel changed."""
    found = await saver.aget_tuple(parent) if parent else None
    before = found.checkpoint["channel_versions"] if found else {}  # gone: versions start again
    versions = {k: saver.get_next_version(before.get(k), None) for k in values}
    checkpoint = generate_checkpoint(channel_values=values, channel_versions=versions)
    config = parent or {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return await saver.aput(config, checkpoint, {"source": "loop", "step": 0}, versions)


def stored_as_added(store: Store, config: Any) -> bool:
    """Whether the messages the checkpoint reads were stored as what they added."""
    path = store.path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT versions FROM graph_checkpoints WHERE checkpoint_id = ?",
                                (config["configurable"]["checkpoint_id"],)).fetchone()[0]
        version = json.loads(versions)["messages"]
        base = conn.execute("SELECT base FROM graph_blobs WHERE channel = 'messages' AND"
                            " version = ?", (version,)).fetchone()[0]
    return base is not None
