"""R13, R20 (issue 19): finished tasks are deleted after their retention by the workers
themselves, a task is deleted on demand (never under the worker holding it), and large
values no kept version refers to are collected."""

from __future__ import annotations

import asyncio

import pytest
from _support import fast_settings

import tether as tt
from tether.store import retention_steps


def app(h: tt.Harness, gate: asyncio.Event | None = None) -> None:
    @h.tool()
    async def read(ctx: tt.ToolContext, size: int) -> str:
        if gate is not None:
            await gate.wait()
        return "x" * size

    @h.agent("reader")
    class Reader(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("read", {"size": t.input})
            return tt.Finish(len(t.last_tool_result))


async def test_workers_delete_finished_tasks_past_retention_and_keep_the_rest() -> None:
    h = tt.Harness("memory://", settings=fast_settings(
        retain_completed=0.0, housekeeping_interval=0.05))
    app(h)
    done = [await h.submit("reader", 10) for _ in range(5)]
    await h.run_until_idle(timeout=20)
    waiting = await h.submit("reader", 10, not_before=3600)  # not finished: kept
    stop = asyncio.Event()
    worker = asyncio.create_task(h.serve(stop=stop))
    for _ in range(400):
        if not [t for t in await h.store.list_tasks() if t.task_id in done]:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await worker
    assert [t.task_id for t in await h.store.list_tasks()] == [waiting]
    await h.close()


async def test_a_task_is_deleted_on_demand_but_never_under_its_worker() -> None:
    h = tt.Harness("memory://", settings=fast_settings())
    gate = asyncio.Event()
    app(h, gate)
    task_id = await h.submit("reader", 10)
    running = asyncio.create_task(h.run_until_idle(timeout=20))
    for _ in range(400):
        if (await h.store.get_task(task_id)).lease_owner is not None:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(tt.TaskHeld, match="cancel it"):
        await h.delete(task_id, by="ops")
    gate.set()
    await running
    await h.delete(task_id, by="ops")
    with pytest.raises(tt.TaskNotFound):
        await h.get(task_id)
    with pytest.raises(tt.InvalidInput):
        await h.delete("../../etc/passwd")
    await h.close()


async def test_large_values_go_once_no_kept_version_refers_to_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R20: a task's large tool result is stored apart once; after the task is deleted,
    the next housekeeping round collects it, and a live task's stays."""
    h = tt.Harness("memory://", settings=fast_settings(blob_threshold=1024))
    app(h)
    gone = await h.submit("reader", 50_000)
    kept = await h.submit("reader", 60_000)
    await h.run_until_idle(timeout=20)
    assert (await h.get(kept)).snapshot.result == 60_000
    await h.delete(gone)
    monkeypatch.setattr(retention_steps, "GRACE", -1.0)  # count every value as old enough
    swept = await h.housekeep()
    assert swept.blobs >= 1 and swept.tasks == []
    info = await h.get(kept)  # its large values are still there, and load
    history = await h.history(kept)
    assert any(len(str(row.get("content"))) == 60_000 for row in history) and info.version >= 1
    again = await h.housekeep()
    assert again.blobs == 0
    await h.close()
