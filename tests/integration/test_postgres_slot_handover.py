"""R13 on PostgreSQL (issue 30): a slot let go by one worker reaches a task another worker
keeps waiting in memory for it, through the store's notice ('slot/' and the task's id),
without parking it: the task is claimed once, and its wait ends long before ``slot_wait``.
Each harness has a store of its own (its own pool and its own LISTEN connection), as two
processes would. (One worker: ``tests/acceptance/
test_r13_a_freed_slot_reaches_a_task_waiting_in_its_worker.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

import tether as tt
from tether.store.base import SLOT_NOTICE

pytestmark = pytest.mark.postgres

SLOT_WAIT = 120.0
"""Far longer than the test may take: a wait that is not handed the slot fails it."""


def app(url: str, release: asyncio.Event, started: list[str]) -> tt.Harness:
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.05, slot_wait=SLOT_WAIT))
    h.limit("provider", concurrency=1)

    @h.tool(limits=("provider",))
    async def hold(ctx: tt.ToolContext) -> str:
        started.append(ctx.task_id)
        await release.wait()
        return "done"

    @h.agent("holder")
    class Holder(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(t.last_tool_result) if t.last_tool_result else tt.ToolCall("hold", {})

    return h


async def test_a_slot_let_go_in_one_worker_reaches_a_task_waiting_in_another(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    release, started = asyncio.Event(), []
    first_worker, second_worker = app(pg_url, release, started), app(pg_url, release, started)
    claims: Counter[str] = Counter()
    claim_many = second_worker.store.claim_many

    async def counted(*args: Any, **kwargs: Any) -> Any:
        got = await claim_many(*args, **kwargs)
        claims.update(claim.task_id for claim in got)
        return got

    monkeypatch.setattr(second_worker.store, "claim_many", counted)
    notices: list[str] = []
    wait_for_change = second_worker.store.wait_for_change

    async def noted(*args: Any, **kwargs: Any) -> frozenset[str] | None:
        changed = await wait_for_change(*args, **kwargs)
        notices.extend(changed or ())
        return changed

    monkeypatch.setattr(second_worker.store, "wait_for_change", noted)
    first = await first_worker.submit("holder")
    stop = asyncio.Event()
    serving = asyncio.create_task(first_worker.serve(concurrency=1, stop=stop))
    deadline = time.monotonic() + 30
    while started != [first]:
        assert time.monotonic() < deadline, "the first task never took the slot"
        await asyncio.sleep(0.02)
    second = await second_worker.submit("holder")
    waiting = asyncio.create_task(second_worker.run_until_idle(concurrency=1, timeout=60))
    while [(u.in_use, u.waiting) for u in await second_worker.store.limit_usage(time.time())
           ] != [(1, 1)]:
        assert time.monotonic() < deadline, "the second task never queued for the slot"
        await asyncio.sleep(0.02)
    record = await second_worker.store.get_task(second)
    assert record.lease_owner is not None and record.wake_at is None  # in memory, not parked
    release.set()
    await asyncio.wait_for(waiting, 60)  # not SLOT_WAIT: the notice handed the slot over
    assert started == [first, second]
    assert claims == {second: 1}
    assert SLOT_NOTICE + second in notices
    assert (await second_worker.get(second)).snapshot.result == "done"
    stop.set()
    await serving
    await first_worker.close()
    await second_worker.close()
