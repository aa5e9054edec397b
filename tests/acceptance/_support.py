"""Helpers shared by the acceptance tests (imported as ``_support``).

They only make waiting for a condition explicit and bounded; they never
stand in for an assertion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import tether as tt

FAST = dict(recovery_backoff=0.01, poll_interval=0.01)


def fast_settings(**overrides: Any) -> tt.Settings:
    """Settings that keep tests quick: short recovery backoff and worker poll interval."""
    return tt.Settings(**{**FAST, **overrides})


async def wait_until(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0,
                     what: str = "condition") -> None:
    """Poll *predicate* until it holds; fail the test (not hang) if it never does."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.002)


async def run_alongside(h: tt.Harness, *side: Awaitable[Any], timeout: float = 10.0) -> list[Any]:
    """Run the harness until idle while *side* coroutines inject events."""
    results = await asyncio.gather(h.run_until_idle(timeout=timeout), *side)
    return list(results[1:])


async def run_until_status(h: tt.Harness, task_id: str, *statuses: tt.Status,
                           timeout: float = 5.0) -> tt.Status:
    """Re-run the harness until the task reaches one of *statuses* (for timers due later)."""
    deadline = time.monotonic() + timeout
    while True:
        await h.run_until_idle(timeout=timeout)
        status = (await h.get(task_id)).record.status
        if status in statuses:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} stayed {status.value}, wanted {statuses}")
        await asyncio.sleep(0.01)


async def strategies(h: tt.Harness, task_id: str) -> list[str]:
    return [r["resume_strategy"] for r in await h.store.list_recovery_log(task_id)]


SLOW_PLAN = tt.Settings(poll_interval=0.01, lease_seconds=5.0, drain_timeout=5.0)


def slow_planner(planning: asyncio.Event) -> tt.Harness:
    """A harness whose one agent sets *planning* and then plans for a minute (a long model
    call), with a lease and drain timeout long enough to outlast the test."""
    h = tt.Harness("memory://", settings=SLOW_PLAN)

    @h.agent("slow")
    class Slow(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            planning.set()
            await asyncio.sleep(60)  # a long model call
            return tt.Finish("never")

    return h
