"""A claim on SQLite never steps over the tasks that workers hold (R2, E7, issue 30).

A worker taking back 1,000 tasks of a dead one claims them one after another; each claim
looked through the tasks already taken (still ``running``, now leased) before it reached a
free one, so the n-th claim cost n rows and recovery grew with the square of the tasks. The
work a claim does is counted here in SQLite's virtual-machine steps (a progress handler), which
do not depend on the machine's speed or load: it must not grow with the number of leased tasks.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import tether as tt
from tether.store.sqlite import SQLiteStore


def _store_with(db: Path, leased: int) -> SQLiteStore:
    """*leased* running tasks held by another worker's live lease, and one pending task."""
    h = tt.Harness(f"sqlite:///{db}")

    @h.agent("idle")
    class Idle(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Finish(None)

    async def fill() -> None:
        for n in range(leased + 1):
            await h.submit("idle", task_id=f"t{n:05d}")
        await h.close()

    asyncio.run(fill())
    raw = sqlite3.connect(db)
    with raw:
        raw.execute("UPDATE tasks SET status = 'running', lease_owner = 'other',"
                    " lease_until = ? WHERE task_id <> ?", (time.time() + 3600, f"t{leased:05d}"))
    raw.close()
    return SQLiteStore(str(db))


def _steps_to_claim(db: Path, leased: int) -> tuple[str, int]:
    store = _store_with(db, leased)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._db.set_progress_handler(count, 1)  # every VM step

    async def claim() -> str:
        try:
            claim = await store.claim("me", time.time(), 30.0)
            assert claim is not None
            return claim.task_id
        finally:
            await store.close()

    return asyncio.run(claim()), steps


def test_a_claim_costs_the_same_however_many_tasks_are_held(tmp_path: Path) -> None:
    few_task, few = _steps_to_claim(tmp_path / "few.db", 20)
    many_task, many = _steps_to_claim(tmp_path / "many.db", 2000)
    assert (few_task, many_task) == ("t00020", "t02000")  # the one free task, both times
    assert many < few * 2, (few, many)
