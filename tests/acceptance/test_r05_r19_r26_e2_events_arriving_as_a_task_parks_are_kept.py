"""R5, R19, R26, E2: an event that arrives while a task is being parked is kept, not stranded
or dropped. A resume stored after the runner's last inbox read but before the commit that
parks the task makes it claimable again and is applied (R19, R5); a user message accepted
while the tool runs whose result sends the task to a person stays pending and reaches the
agent once the person resumes it, instead of being marked ignored (E2, R26).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _support import fast_settings, run_alongside

import tether as tt
from tether.model import Status

pytestmark = pytest.mark.timeout(30)

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3,
                   keep_versions=50)


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


async def test_r19_event_stored_before_the_parking_commit_is_not_stranded():
    """R19, R5 (r2): a resume stored after the runner's last inbox read but before the commit
    that parks the task (here: while on_event is still thinking about a user_interrupt) must
    make the task claimable again; the resume is applied and the task completes."""
    h = tt.Harness("memory://", settings=fast_settings())
    in_on_event = asyncio.Event()

    @h.tool(side_effect=True)
    async def slow(ctx: tt.ToolContext) -> str:
        await asyncio.sleep(0.2)
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("slow") if t.last_tool_result is None else tt.Finish("done")

        async def on_event(self, t, e):
            in_on_event.set()
            await asyncio.sleep(0.1)  # e.g. asks a model how to react
            return None  # default: P0 pauses

    tid = await h.submit("a")

    async def person() -> None:
        await asyncio.sleep(0.05)
        await h.emit(tt.Event("user_interrupt", tid, {"text": "hold on"}))
        await asyncio.wait_for(in_on_event.wait(), timeout=3)
        await asyncio.sleep(0.02)
        await h.resume(tid, message="carry on")  # the runner is inside on_event

    await run_alongside(h, person(), timeout=5)
    await h.run_until_idle(timeout=5)
    assert await event_states(h, tid) == [("user_interrupt", "applied"), ("resume", "applied")]
    assert await status_of(h, tid) is tt.Status.COMPLETED
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
