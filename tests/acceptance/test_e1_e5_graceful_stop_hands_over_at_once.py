"""E1, E5: a graceful stop hands a task over at once and cleanly. When ``serve()``'s stop is
set (what a SIGTERM handler does), an in-flight model call is cancelled (nothing about it is in
doubt) while an in-flight side-effecting call is let finish and its result recorded first (E1);
the worker then commits and releases its lease, so the next worker claims the task at once, not
as a crash, and no recovery attempt is counted (E5).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from _support import SLOW_PLAN, fast_settings, slow_planner, wait_until

import tether as tt
from tether.model import Status

pytestmark = pytest.mark.timeout(30)


async def test_e5_stop_during_a_model_call_hands_over_at_once_without_a_recovery() -> None:
    """E5: a graceful stop cancels an in-flight plan (nothing about it is in doubt), commits
    and releases the task, so the next worker claims it at once and no crash is counted."""
    planning = asyncio.Event()
    h = slow_planner(planning)
    tid = await h.submit("slow")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.wait_for(planning.wait(), 5)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(server, 3)
    assert time.monotonic() - started < SLOW_PLAN.drain_timeout
    record = await h.store.get_task(tid)
    assert record.lease_owner is None and record.status is Status.RUNNING
    claim = await h.store.claim("next-worker", time.time(), 5)
    assert claim is not None and claim.task_id == tid and not claim.crashed
    await h.close()


async def test_e1_e5_stop_lets_the_side_effect_finish_and_releases_the_lease():
    """E1, E5 (r4): setting serve()'s stop while a side-effecting tool is in flight lets the
    call finish (never cut off), records its result, and releases the lease cleanly: another
    worker claims the task at once, not as a crash, and finishes it without re-running."""
    h = tt.Harness("memory://", settings=fast_settings())
    log: list[str] = []

    @h.tool(side_effect=True)
    async def transfer(ctx: tt.ToolContext) -> str:
        log.append("sent request")
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            log.append("CANCELLED mid side effect")
            raise
        log.append("got answer")
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("transfer")
            return tt.Finish(t.last_tool_result)

    tid = await h.submit("a")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await wait_until(lambda: log == ["sent request"], timeout=3, what="the transfer to start")
    stop.set()  # what a SIGTERM handler does
    await asyncio.wait_for(server, timeout=5)
    assert log == ["sent request", "got answer"]
    record = await h.store.get_task(tid)
    assert record.lease_owner is None
    assert [r.status for r in await h.store.list_idempotency(tid)] == ["succeeded"]

    claim = await h.store.claim("worker-2", time.time(), 0.5)
    assert claim is not None and claim.task_id == tid
    assert not claim.crashed and claim.crashes == 0
    await h.store.release(claim)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "ok"
    assert log == ["sent request", "got answer"]
    await h.close()
