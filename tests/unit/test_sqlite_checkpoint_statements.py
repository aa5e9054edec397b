"""What one checkpoint asks of SQLite (R8, R13, issue 30: a step as close to one append as
the layout allows).

The statements a checkpoint runs are traced (``set_trace_callback`` on the store's own
connection): one read before it writes (the fence and the newest version together), no
rewrite of an old version's row while the task has fewer versions than it keeps, and once it
has as many, the new head takes the oldest row's place (the file does not grow with steps).
"""

from __future__ import annotations

import time
from pathlib import Path

import tether as tt
from tether.engine.worker import run_claimed
from tether.store.sqlite import SQLiteStore

KEEP = 4


def build(db: Path, steps: int) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(keep_versions=KEEP))

    @h.tool(idempotent=True)
    async def look(ctx: tt.ToolContext, n: int) -> int:
        return n

    @h.agent("counter")
    class Counter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.step < steps:
                return tt.ToolCall("look", {"n": task.step})
            return tt.Finish(task.step)

    return h


async def traced_run(tmp_path: Path, steps: int) -> tuple[list[str], list[int]]:
    """Every statement of the task's run (from its claim on), and its versions at the end."""
    said: list[str] = []
    async with build(tmp_path / "t.db", steps) as h:
        task_id = await h.submit("counter")
        store = h.store
        assert isinstance(store, SQLiteStore)
        store._db.set_trace_callback(said.append)
        claim = await store.claim_task(task_id, h.worker_id, time.time(), 30.0)
        assert claim is not None
        await run_claimed(h, claim)
        store._db.set_trace_callback(None)
        info = await h.get(task_id)
        assert info.record.status is tt.Status.COMPLETED, info.record.reason
        versions = [v for v, _, _ in await store.list_versions(task_id)]
    return said, versions


def count(said: list[str], start: str) -> int:
    return sum(s.lstrip().upper().startswith(start) for s in said)


def checkpoints(said: list[str]) -> int:
    """A checkpoint's one read: the fence with the newest version."""
    return sum("FROM snapshots WHERE task_id" in s and s.startswith("SELECT fence") for s in said)


async def test_r08_a_young_tasks_checkpoints_read_once_and_only_insert_heads(
        tmp_path: Path) -> None:
    said, versions = await traced_run(tmp_path, steps=1)
    commits = checkpoints(said)
    assert commits == len(versions) - 1 > 0  # version 1 was written at submit
    assert count(said, "SELECT MAX(VERSION)") == 0  # read with the fence, not on its own
    assert count(said, "UPDATE SNAPSHOTS") == 0  # fewer versions than kept: none to reuse
    assert count(said, "INSERT INTO SNAPSHOTS") == commits


async def test_r08_an_older_tasks_new_head_takes_the_oldest_kept_rows_place(
        tmp_path: Path) -> None:
    said, versions = await traced_run(tmp_path, steps=10)
    assert len(versions) == KEEP and versions == list(range(versions[0], versions[0] + KEEP))
    commits = checkpoints(said)
    inserted = count(said, "INSERT INTO SNAPSHOTS")
    assert inserted == KEEP - 1  # versions 2..KEEP: then each head reuses the oldest row
    assert count(said, "UPDATE SNAPSHOTS") == commits - inserted
    assert count(said, "DELETE FROM SNAPSHOTS") == 0  # one falls out, one is reused: none left
