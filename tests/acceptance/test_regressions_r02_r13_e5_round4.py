"""Regression tests for the fourth review round: operating many workers (R2, R13, E5)."""

from __future__ import annotations

import asyncio
import time

import tether as tt
from tether.model import Status

FAST = tt.Settings(poll_interval=0.01, lease_seconds=5.0, drain_timeout=5.0)


def _slow_planner(planning: asyncio.Event) -> tt.Harness:
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("slow")
    class Slow(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            planning.set()
            await asyncio.sleep(60)  # a long model call
            return tt.Finish("never")

    return h


async def test_e5_stop_during_a_model_call_hands_over_at_once_without_a_recovery() -> None:
    """E5: a graceful stop cancels an in-flight plan (nothing about it is in doubt), commits
    and releases the task, so the next worker claims it at once and no crash is counted."""
    planning = asyncio.Event()
    h = _slow_planner(planning)
    tid = await h.submit("slow")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.wait_for(planning.wait(), 5)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(server, 3)
    assert time.monotonic() - started < FAST.drain_timeout
    record = await h.store.get_task(tid)
    assert record.lease_owner is None and record.status is Status.RUNNING
    claim = await h.store.claim("next-worker", time.time(), 5)
    assert claim is not None and claim.task_id == tid and not claim.crashed
    await h.close()


async def test_r2_a_started_task_shows_running_while_its_first_plan_is_in_flight() -> None:
    """R2: which state is the task in? As soon as a worker starts it: running, not pending."""
    planning = asyncio.Event()
    h = _slow_planner(planning)
    tid = await h.submit("slow")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.wait_for(planning.wait(), 5)
    record = await h.store.get_task(tid)
    assert record.status is Status.RUNNING and record.lease_owner == h.worker_id
    stop.set()
    await server
    await h.close()


async def test_r13_a_worker_never_claims_a_task_it_is_still_running() -> None:
    """R13: a task whose lease lapsed while its own worker is slow is not claimed again by that
    same worker (it would race itself); other workers may take it over (fenced)."""
    h = tt.Harness("memory://")

    @h.agent("x")
    class X(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(None)

    tid = await h.submit("x")
    first = await h.store.claim("me", time.time(), 0.01)
    assert first is not None
    later = time.time() + 1
    assert await h.store.claim("me", later, 5, busy=[tid]) is None
    other = await h.store.claim("other", later, 5)
    assert other is not None and other.task_id == tid and other.fence > first.fence
    await h.close()
