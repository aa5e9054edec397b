"""The app a ``tether worker`` child runs in the cross-process preemption tests.

Its polls are slowed down on purpose (a 30 s poll interval, a 120 s lease, so leases are
renewed and other processes' events looked for only every 30 s that way): a P0 that
reaches the runner within seconds can only have come through the store's change signal.
"""

from __future__ import annotations

import asyncio

import tether as tt

SLOW_POLLS = tt.Settings(poll_interval=30.0, lease_seconds=120.0)


def build(store: str) -> tt.Harness:
    h = tt.Harness(store, settings=SLOW_POLLS)

    @h.tool(interruptible=True)
    async def think(ctx: tt.ToolContext, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "thought it through"

    @h.agent("long")
    class Long(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_tool_result is not None:
                return tt.Finish(task.last_tool_result)
            return tt.ToolCall("think", {"seconds": 600.0})

    return h
