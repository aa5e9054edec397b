"""Attacks on TetherSaver (issue 28, R13) on a real PostgreSQL: a prune and a read each
racing another process's put, a copy racing another process's delete. Each failed on the
first version and states what went wrong and what is required.

Races are made deterministic by running the other saver's whole operation at a chosen point
between two statements of the first one (``tether.store.postgres._execute`` wrapped), the
point where, with autocommit connections in READ COMMITTED, another process may commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

from tether.integrations.tether_saver import TetherSaver
from tether.store import Store, graph_steps, open_store
from tether.store import postgres as pg
from tether.store.steps import Statement


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores on one database: two processes."""
    first, second = open_store(pg_url), open_store(pg_url)
    await first.migrate()
    await second.migrate()
    yield first, second
    await first.close()
    await second.close()


def root_config(thread: str = "t") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


async def put_list(saver: TetherSaver, parent: dict[str, Any], value: list[Any],
                   version: str | None) -> dict[str, Any]:
    versions = {"messages": saver.get_next_version(version, None)}
    checkpoint = generate_checkpoint(channel_values={"messages": value},
                                     channel_versions=versions)
    return await saver.aput(parent, checkpoint, {"source": "loop", "step": 0}, versions)


def run_between(monkeypatch: pytest.MonkeyPatch, after: Any, other: Any) -> list[bool]:
    """Run the coroutine function *other* once, right after the first statement for which
    *after(statement)* holds has run."""
    original = pg._execute
    fired: list[bool] = []

    async def execute(conn: Any, statement: Any) -> Any:
        result = await original(conn, statement)
        if not fired and isinstance(statement, Statement) and after(statement):
            fired.append(True)
            await other()
        return result

    monkeypatch.setattr(pg, "_execute", execute)
    return fired


async def test_a_prune_never_drops_the_values_of_a_checkpoint_stored_meanwhile(
        stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """``_collect_blobs`` locks the namespace's blobs, then reads the checkpoints' versions
    (VERSIONS_OF), then reads the blobs again (BLOB_KEYS) and drops those no checkpoint read,
    each statement in its own READ COMMITTED snapshot. A put whose list is stored whole takes
    no lock (only a delta locks its base), so another process's put that commits between
    VERSIONS_OF and BLOB_KEYS has its new checkpoint unseen and its new blob seen: the blob
    is dropped, and the new (newest!) checkpoint reads back without its messages. Right: the
    blobs dropped are only those known before the checkpoints were read (use the rows of the
    locked BLOBS_OF read, not a later BLOB_KEYS read), or the whole collect runs in one
    snapshot / under a per-thread lock that puts take too."""
    first, second = stores
    pruner, writer = TetherSaver(first), TetherSaver(second)
    config = await put_list(writer, root_config(), ["a"], None)
    stored: list[dict[str, Any]] = []

    async def other_process_puts() -> None:
        fresh = TetherSaver(second)  # nothing cached: the list is stored whole
        stored.append(await put_list(fresh, config, ["a", "b"], None))

    fired = run_between(monkeypatch, lambda s: s.sql == graph_steps.VERSIONS_OF,
                        other_process_puts)
    await pruner.aprune(["t"], strategy="keep_latest")
    assert fired and stored
    loaded = await TetherSaver(first).aget_tuple(stored[0])
    assert loaded is not None
    assert loaded.checkpoint["channel_values"].get("messages") == ["a", "b"], \
        loaded.checkpoint["channel_values"]


async def test_a_read_racing_a_keep_1_put_never_returns_a_checkpoint_without_values(
        stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """``graph_checkpoints`` reads the checkpoint rows, then their blobs, in separate
    autocommit statements. A put with keep=1 from another process committing between them
    drops the checkpoint just read and its blobs; ``_whole`` skips the missing blob, and
    aget_tuple returns the checkpoint with ``channel_values == {}`` (messages silently lost
    for the reader). Right: a read is one snapshot (a REPEATABLE READ read-only
    transaction), returning the checkpoint whole or nothing."""
    first, second = stores
    await put_list(TetherSaver(second), root_config(), ["a"], None)

    async def other_process_puts_with_keep_1() -> None:
        writer = TetherSaver(second, keep=1)
        latest = await writer.aget_tuple(root_config())
        assert latest is not None
        await put_list(writer, latest.config, ["a", "b"],
                       latest.checkpoint["channel_versions"]["messages"])

    fired = run_between(
        monkeypatch, lambda s: s.sql.startswith("SELECT thread_id, checkpoint_ns, checkpoint_id,"
                                                " parent_id") and "ORDER BY" in s.sql,
        other_process_puts_with_keep_1)
    loaded = await TetherSaver(first).aget_tuple({"configurable": {"thread_id": "t"}})
    assert fired
    assert loaded is None or loaded.checkpoint["channel_values"].get("messages") in (
        ["a"], ["a", "b"]), loaded.checkpoint["channel_values"]


async def test_a_copy_racing_a_prune_never_copies_a_checkpoint_without_its_values(
        stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch) -> None:
    """``copy_thread`` copies checkpoints, then blobs, then writes, in three statements. A
    prune by another process committed between the first two (READ COMMITTED: each
    statement its own snapshot) left the copy with checkpoints whose values it never
    copied: the copied thread read back without its messages. Right: the three copies read
    one snapshot (REPEATABLE READ), so the copy is the thread as it stood when it began."""
    first, second = stores
    writer = TetherSaver(first)
    config = await put_list(writer, root_config(), ["a"], None)
    await put_list(writer, config, ["a", "b"], None)

    async def other_process_deletes_the_thread() -> None:
        await TetherSaver(second).adelete_thread("t")

    fired = run_between(monkeypatch, lambda s: s.sql == graph_steps.COPY_THREAD[0],
                        other_process_deletes_the_thread)
    await writer.acopy_thread("t", "copy")
    assert fired
    copied = await TetherSaver(first).aget_tuple(root_config("copy"))
    assert copied is not None
    assert copied.checkpoint["channel_values"].get("messages") == ["a", "b"], \
        copied.checkpoint["channel_values"]
