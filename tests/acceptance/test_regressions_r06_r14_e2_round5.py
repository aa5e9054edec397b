"""Regression tests for what the random-sequence model found in the fifth round (R6, R14, E2).

Each test is the shrunk sequence that once broke tether, replayed by hand.
"""

from __future__ import annotations

import asyncio
from typing import Any

import tether as tt
from tether.model import Status

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3,
                   keep_versions=50)

async def _store_rollback(h: tt.Harness, task_id: str, version: int) -> tt.EmitReceipt:
    """A rollback lever stored in the inbox without being applied yet (the lever itself
    applies it at once when no worker holds the task)."""
    receipt, _ = await h.inbox.emit(tt.Event("rollback", task_id, {"version": version}))
    return receipt

async def test_r14_two_rollbacks_reaching_a_task_in_one_tick_are_each_applied_once() -> None:
    """R14: a completed task gets two rollback levers (to v1, then to v2) before any worker runs.
    Both are applied, in order, once each, and the worker goes idle. (Regression: the second
    rollback put the first back in the inbox as if never applied, and the two livelocked.)"""
    charged: list[int] = []
    h = tt.Harness("memory://", settings=FAST)

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, n: int) -> int:
        charged.append(n)
        return n

    @h.agent("job")
    class Job(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            i = t.scratch.get("i", 0)
            if i >= 3:
                return tt.Finish(i)
            t.scratch["i"] = i + 1
            return tt.ToolCall("charge", {"n": i})

    tid = await h.submit("job")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is Status.COMPLETED and charged == [0, 1, 2]
    first = await _store_rollback(h, tid, 1)
    second = await _store_rollback(h, tid, 2)
    assert first.accepted and second.accepted

    await h.run_until_idle(timeout=5)  # a livelock times out here
    events = {e.event.id: e.status for e in await h.store.list_events(tid)}
    assert events[first.event_id] == "applied" and events[second.event_id] == "applied"
    log = await h.store.list_recovery_log(tid)
    rollbacks = [r for r in log if r["resume_strategy"] == "rollback"]
    assert [r["event_id"] for r in rollbacks] == [first.event_id, second.event_id]
    info = await h.get(tid)
    # v2 was a running head: the task went on from there and finished again, with the calls
    # since answered from their records (E4), not paid again
    assert info.record.status is Status.COMPLETED and info.snapshot.result == 3
    assert charged == [0, 1, 2]
    await h.close()

async def test_e2_a_message_arriving_as_the_task_goes_to_a_person_waits_for_their_resume() -> None:
    """E2 + R26: a user message is accepted while a tool runs; the tool's result then sends the
    task to a person, in the same tick that drains the message. The message must stay pending
    and reach the agent after the person resumes. (Regression: it was marked "ignored", and
    the user's words were lost.)"""
    in_tool = asyncio.Event()
    release = asyncio.Event()
    seen: list[Any] = []
    h = tt.Harness("memory://", settings=FAST)

    @h.tool()
    async def fetch(ctx: tt.ToolContext) -> Any:
        in_tool.set()
        await release.wait()
        return object()  # not plain JSON: recorded, then a person is asked to fix the tool

    @h.agent("asker")
    class Asker(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if not t.scratch.get("fetched"):
                t.scratch["fetched"] = True
                return tt.ToolCall("fetch", {})
            messages = [row.get("content") for row in t.history
                        if row.get("type") == "user_message"]
            seen.append(messages)
            return tt.Finish(messages)

    tid = await h.submit("asker")
    runner = asyncio.create_task(h.run_until_idle(timeout=10))
    await asyncio.wait_for(in_tool.wait(), 5)
    receipt = await h.emit(tt.Event("user_message", tid, "also refund order 7"))
    assert receipt.accepted
    release.set()
    await runner

    parked = await h.get(tid)
    assert parked.record.status is Status.NEEDS_HUMAN, parked.record.reason
    pending = {e.event.id: e.status for e in await h.store.list_events(tid)}
    assert pending[receipt.event_id] == "pending"

    await h.resume(tid, message="tool fixed")
    await h.run_until_idle(timeout=5)
    done = await h.get(tid)
    assert done.record.status is Status.COMPLETED, done.record.reason
    statuses = {e.event.id: e.status for e in await h.store.list_events(tid)}
    assert statuses[receipt.event_id] == "applied"
    assert done.snapshot.result == ["also refund order 7"]
    await h.close()
