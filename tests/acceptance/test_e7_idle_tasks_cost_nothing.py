"""E7: a waiting task holds no memory in any worker; it lives in the store and is loaded
again when its event arrives. Shown with 10,000 tasks waiting for an approval at once.

Memory is measured with tracemalloc (bytes Python allocated and still holds), which does
not depend on machine load: parking 9,000 more waiting tasks must leave next to nothing
behind in the worker. ``bench/operations.py`` and ``bench/compare.py`` report the same as process RSS.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

from _support import fast_settings

import tether as tt
from tether.model import Status

TASKS = int(os.environ.get("TETHER_E7_TASKS", "10000"))
WARM = TASKS // 10


def approvals_app(path: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{path}", settings=fast_settings(sqlite_synchronous="NORMAL"))

    @h.agent("approve")
    class Approve(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

    return h


async def park(h: tt.Harness, first: int, count: int) -> None:
    for i in range(first, first + count):
        await h.submit("approve", {"n": i}, task_id=f"t{i:05d}")
    await h.run_until_idle(concurrency=32, timeout=600)


def held_bytes() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def test_e7_ten_thousand_waiting_tasks_hold_no_worker_memory_and_all_resume(
        tmp_path: Path) -> None:
    h = approvals_app(tmp_path / "idle.db")
    tracemalloc.start()
    try:
        await park(h, 0, WARM)  # warm up: caches, statement cache, code paths
        after_warm = held_bytes()
        await park(h, WARM, TASKS - WARM)
        after_all = held_bytes()
    finally:
        tracemalloc.stop()
    counts = await h.store.count_by_status()
    assert counts == {"waiting": TASKS}
    assert h.runners == {}  # no task is in memory
    per_task = (after_all - after_warm) / (TASKS - WARM)
    assert per_task < 100, f"{per_task:.0f} bytes still held per parked task"

    for i in range(TASKS):
        await h.emit(tt.Event("approval", f"t{i:05d}", {"ok": i}))
    await h.run_until_idle(concurrency=32, timeout=600)
    assert await h.store.count_by_status() == {"completed": TASKS}
    info = await h.get(f"t{TASKS - 1:05d}")
    assert info.record.status is Status.COMPLETED and info.snapshot.result == {"ok": TASKS - 1}
    await h.close()
