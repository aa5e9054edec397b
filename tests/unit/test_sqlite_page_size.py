"""R13, R25 (issue 30): a store file this tether creates has 2 KB pages (a step touches about
ten pages, each written whole to the log: fewer bytes a step than SQLite's 4 KB); a store
made with other pages keeps them, and works as before."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether as tt
from tether.store import sqlite_schema
from tether.store.sqlite import SQLiteStore


async def run_one_task(path: Path) -> str:
    h = tt.Harness(f"sqlite:///{path}")

    @h.tool()
    async def add(ctx: tt.ToolContext, a: int, b: int) -> int:
        return a + b

    @h.agent("adder")
    class Adder(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("add", {"a": 2, "b": 3})
            return tt.Finish(t.last_tool_result)

    task_id = await h.submit("adder")
    await h.run_until_idle(timeout=30)
    assert (await h.get(task_id)).snapshot.result == 5
    await h.close()
    return task_id


async def test_a_new_store_has_pages_of_the_chosen_size(tmp_path: Path) -> None:
    await run_one_task(tmp_path / "new.db")
    store = SQLiteStore(str(tmp_path / "new.db"))
    assert store.pragma("page_size") == sqlite_schema.PAGE_SIZE == 2048
    assert store.pragma("journal_mode") == "wal"
    await store.close()


async def test_a_store_made_with_other_pages_keeps_them_and_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "older.db"
    with monkeypatch.context() as older:  # as a tether before issue 30 made it
        older.setattr(sqlite_schema, "PAGE_SIZE", 4096)
        first = await run_one_task(path)
    second = await run_one_task(path)  # opened, written and read by this tether
    store = SQLiteStore(str(path))
    assert store.pragma("page_size") == 4096
    assert {(await store.get_task(t)).status for t in (first, second)} == {tt.Status.COMPLETED}
    await store.close()
