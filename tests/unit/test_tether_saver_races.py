"""Attacks on TetherSaver (issue 28, R13, R20), on SQLite: a put made twice, a chain of a
thousand additions, a read racing another process's prune, the sync methods from another
thread. Each was found by a review of the first version, failed then, and states what went
wrong and what is required.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from tether.integrations.tether_saver import TetherSaver
from tether.store import Store, graph_steps, open_store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 't.db'}")
    await opened.migrate()
    yield opened
    await opened.close()


def root_config(thread: str = "t") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


async def put_list(saver: TetherSaver, parent: dict[str, Any], value: list[Any],
                   version: str | None) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """Store a checkpoint after *parent* whose ``messages`` channel (at the next version after
    *version*) is *value*; returns its config and the arguments aput was given."""
    versions = {"messages": saver.get_next_version(version, None)}
    checkpoint = generate_checkpoint(channel_values={"messages": value},
                                     channel_versions=versions)
    args = (parent, checkpoint, {"source": "loop", "step": 0}, versions)
    return await saver.aput(*args), args


async def test_putting_the_same_checkpoint_twice_leaves_it_readable(store: Store) -> None:
    """An aput repeated with the same arguments (a caller retrying after a timeout whose
    commit in fact landed) turns the messages blob into a delta whose base is itself: the
    saver's cache names the version just stored as the base, and PUT_BLOB's ON CONFLICT DO
    UPDATE rewrites that very row with base = its own version. Every read of the checkpoint
    then recurses forever (RecursionError), so the thread is lost. Right: putting the same
    checkpoint again is harmless (as in InMemorySaver), and it reads back as stored."""
    saver = TetherSaver(store)
    first, _ = await put_list(saver, root_config(), ["a"], None)
    second, args = await put_list(saver, first, ["a", "b"], None)
    await saver.aput(*args)  # the same put once more
    loaded = await saver.aget_tuple(second)
    assert loaded is not None
    assert loaded.checkpoint["channel_values"]["messages"] == ["a", "b"]


async def test_a_long_conversation_stays_readable(store: Store) -> None:
    """Every list that extends the last one is stored as a delta on it, and the chain is never
    re-rooted; ``_values`` rebuilds it by recursing once per link. After about a thousand
    steps of one conversation (500 turns of a chat graph: two versions a turn) reading the
    newest checkpoint raises RecursionError, so the graph can no longer be resumed. Right:
    a chain of any length reads back (rebuild iteratively, and/or store the list whole again
    every N links so chains stay short)."""
    saver = TetherSaver(store)
    config, version, value = root_config(), None, []
    for step in range(1200):
        value = [*value, step]
        config, args = await put_list(saver, config, value, version)
        version = args[3]["messages"]
    loaded = await TetherSaver(store).aget_tuple(config)
    assert loaded is not None
    assert loaded.checkpoint["channel_values"]["messages"] == list(range(1200))


async def test_a_read_racing_another_process_prune_never_returns_a_checkpoint_without_values(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``graph_checkpoints`` reads the checkpoint rows, then each checkpoint's blobs, in
    separate autocommit statements (no read transaction). Another process (here a thread
    with its own store on the same file) storing the next checkpoint with keep=1 commits
    between them and drops the checkpoint just read and its blobs; ``_whole`` then skips the
    missing blob (``if not at: continue``), so aget_tuple returns the old checkpoint with
    ``channel_values == {}``: the conversation silently vanishes for the reader (a UI, or
    the graph resuming). Right: one read is one snapshot (a read transaction: BEGIN on
    SQLite, REPEATABLE READ on PostgreSQL), so it returns the checkpoint whole or not at all
    (never a checkpoint missing a value it reads)."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    await put_list(TetherSaver(store), root_config(), ["a"], None)

    def other_process_stores_the_next_one_with_keep_1() -> None:
        async def work() -> None:
            other = open_store(url)
            await other.migrate()
            try:
                writer = TetherSaver(other, keep=1)
                latest = await writer.aget_tuple(root_config())
                assert latest is not None
                await put_list(writer, latest.config, ["a", "b"],
                               latest.checkpoint["channel_versions"]["messages"])
            finally:
                await other.close()
        worker = threading.Thread(target=asyncio.run, args=(work(),))
        worker.start()
        worker.join()

    original = graph_steps.checkpoints
    interleaved: list[bool] = []

    def checkpoints(query: Any) -> Generator[Any, Any, Any]:
        inner = original(query)
        rows = yield next(inner)  # the checkpoint rows
        if not interleaved:
            interleaved.append(True)
            other_process_stores_the_next_one_with_keep_1()
        try:
            statement = inner.send(rows)
            while True:
                statement = inner.send((yield statement))
        except StopIteration as done:
            return done.value

    monkeypatch.setattr(graph_steps, "checkpoints", checkpoints)
    reader = TetherSaver(store)
    loaded = await reader.aget_tuple({"configurable": {"thread_id": "t"}})
    assert interleaved
    assert loaded is None or loaded.checkpoint["channel_values"].get("messages") in (
        ["a"], ["a", "b"]), loaded.checkpoint["channel_values"]


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def chat_graph(checkpointer: Any) -> Any:
    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("hi", id=f"a{len(state['messages'])}")]}

    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(checkpointer=checkpointer)


async def test_invoke_from_another_thread_works_on_a_fresh_saver(store: Store) -> None:
    """The module says the sync methods (``invoke``) work from another thread while the
    store's loop runs. They do only if an async method already ran on that loop: ``_loop``
    is set by ``_bind`` in the async methods alone, so a saver made inside the running loop
    and handed to ``graph.invoke`` in a worker thread (``asyncio.to_thread``) raises
    ConfigurationError ("run the graph with ainvoke ... or call invoke from another thread
    while that loop runs") though that is exactly what was done. Right: the saver finds the
    loop (e.g. remember the running loop in ``__init__``, or ask the store), and invoke works."""
    graph = chat_graph(TetherSaver(store))
    config = {"configurable": {"thread_id": "t"}}
    result = await asyncio.to_thread(graph.invoke, {"messages": [HumanMessage("q", id="q")]},
                                     config)
    assert [m.content for m in result["messages"]] == ["q", "hi"]


async def test_the_sync_retention_methods_work_from_another_thread(store: Store) -> None:
    """Only get_tuple, list, put, put_writes and delete_thread have sync forms; ``prune``,
    ``copy_thread`` and ``delete_for_runs`` fall through to BaseCheckpointSaver and raise
    NotImplementedError, though the saver implements them (async) and the module promises
    the sync methods work from another thread. Right: each has a sync form run through
    ``_sync`` like the others."""
    saver = TetherSaver(store)
    await put_list(saver, root_config(), ["a"], None)
    await asyncio.to_thread(saver.copy_thread, "t", "u")
    await asyncio.to_thread(saver.prune, ["u"])
    await asyncio.to_thread(saver.delete_for_runs, ["no such run"])
    copied = await saver.aget_tuple({"configurable": {"thread_id": "u"}})
    assert copied is not None and copied.checkpoint["channel_values"]["messages"] == ["a"]
