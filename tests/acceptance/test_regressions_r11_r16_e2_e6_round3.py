"""Regression tests for the third review round (R11, R16, E2, E6)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tether as tt
from tether.model import Status, check_transition

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


def _approval_gate(done: list[str]) -> tt.Harness:
    """Waits for an approval before each of two side-effecting steps."""
    h = tt.Harness("memory://", settings=FAST)

    @h.tool(side_effect=True)
    async def deploy(ctx: tt.ToolContext, what: str) -> str:
        done.append(what)
        return what

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            stage = t.scratch.get("stage", 0)
            t.scratch["stage"] = stage + 1
            return [tt.Wait("approval"), tt.ToolCall("deploy", {"what": "A"}),
                    tt.Wait("approval"), tt.ToolCall("deploy", {"what": "B"}),
                    tt.Finish(done)][stage]

    return h


async def test_r16_a_duplicate_approval_does_not_approve_the_next_wait() -> None:
    """R16: an approval that arrives after its wait ended (a retried webhook) is in the dialog,
    but it does not silently satisfy the next, unrelated Wait: only check_wait could say so."""
    done: list[str] = []
    h = _approval_gate(done)
    tid = await h.submit("gate")
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("approval", tid, {"for": "A"}))
    await h.emit(tt.Event("approval", tid, {"for": "A", "dup": True}))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert done == ["A"]
    assert info.record.status is Status.WAITING
    await h.emit(tt.Event("approval", tid, {"for": "B"}))
    await h.run_until_idle(timeout=5)
    assert done == ["A", "B"]
    await h.close()


async def test_r16_plain_resume_of_a_paused_interjection_keeps_the_armed_wait() -> None:
    """R16/R26: waiting for an approval, an interjected tool runs; a P0 pauses it; a plain
    resume continues the interjection and goes back to waiting, never past the approval."""
    deployed: list[str] = []
    h = tt.Harness("memory://", settings=FAST)
    in_note = asyncio.Event()
    go_on = asyncio.Event()

    @h.tool(side_effect=True)
    async def deploy(ctx: tt.ToolContext) -> str:
        deployed.append("deployed")
        return "deployed"

    @h.tool()
    async def note(ctx: tt.ToolContext, text: str) -> str:
        in_note.set()
        await go_on.wait()
        return text

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_event is None:
                return tt.Wait("approval")
            if not deployed:
                return tt.ToolCall("deploy", {})
            return tt.Finish("ok")

        async def on_event(self, t: tt.TaskView, e: tt.Event) -> tt.Action | None:
            if e.type == "user_message":
                return tt.ToolCall("note", {"text": str(e.payload)})
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)

    async def person() -> None:
        await h.emit(tt.Event("user_message", tid, "remember this"))
        await asyncio.wait_for(in_note.wait(), 5)
        await h.emit(tt.Event("user_interrupt", tid, {}))
        go_on.set()

    await asyncio.gather(h.run_until_idle(timeout=5), person())
    assert (await h.get(tid)).record.status is Status.PAUSED
    await h.resume(tid)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is Status.WAITING
    assert deployed == []
    await h.emit(tt.Event("approval", tid, {"ok": True}))
    await h.run_until_idle(timeout=5)
    assert deployed == ["deployed"]
    await h.close()


def test_r11_paused_and_waiting_tasks_may_fail() -> None:
    """R12: a recovery that times out while a task is paused or waiting fails it cleanly."""
    for status in (Status.PAUSED, Status.WAITING):
        check_transition("t", status, Status.FAILED)


async def test_r26_resume_with_a_message_before_the_task_started_is_kept() -> None:
    """R26: a person's message sent to a task no worker has started yet reaches the dialog."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("echo")
    class Echo(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish([e["content"] for e in t.history if e.get("role") == "user"])

    tid = await h.submit("echo")
    await h.resume(tid, message="use the EU region")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.snapshot.result == ["use the EU region"]
    await h.close()


async def test_e6_a_reopened_finished_task_whose_claimer_died_is_claimed_again() -> None:
    """E6: a rollback wakes a completed task; the worker that claims it dies before doing
    anything; after its lease expires another worker claims it and applies the rollback."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("one")
    class One(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish("done")

    tid = await h.submit("one")
    await h.run_until_idle(timeout=5)
    await h.inbox.emit(tt.Event("rollback", tid, {"version": 1}))  # stored, not yet applied
    doomed = await h.store.claim("dies", time.time(), 0.1)
    assert doomed is not None and doomed.task_id == tid
    await asyncio.sleep(0.15)
    again = await h.store.claim("healthy", time.time(), 5)
    assert again is not None and again.task_id == tid
    await h.store.release(again)
    await h.run_until_idle(timeout=5)
    states = [(e.event.type, e.status) for e in await h.store.list_events(tid)]
    assert ("rollback", "applied") in states
    await h.close()


async def test_e2_state_priority_does_not_collapse_content_events() -> None:
    """E2: only state types with a coalescing class keep only their newest; a user_message
    sent at P3 (content, no class) is never dropped."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("idle")
    class Idle(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    tid = await h.submit("idle")
    await h.run_until_idle(timeout=5)
    for n in range(3):
        await h.emit(tt.Event("user_message", tid, f"fyi {n}", priority=3))
        await h.emit(tt.Event("note", tid, f"note {n}", priority=4))
    states: list[Any] = [(e.event.type, e.status) for e in await h.store.list_events(tid)]
    assert states.count(("user_message", "pending")) == 3
    assert states.count(("note", "pending")) == 3
    await h.close()


async def test_r14_an_event_applied_in_the_same_tick_before_a_rollback_is_not_lost() -> None:
    """R14/R19: a user message and a rollback reach a parked task together; the message is
    applied first, then the rollback replaces the state. The message is applied again on the
    rolled-back state instead of vanishing with the discarded one."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    target = (await h.get(tid)).version
    await h.emit(tt.Event("user_interrupt", tid, {"note": "look at this"}))
    await h.inbox.emit(tt.Event("rollback", tid, {"version": target}))  # applied in one tick
    await h.run_until_idle(timeout=5)
    history = await h.history(tid)
    assert [e["content"] for e in history if e.get("type") == "user_interrupt"] == [
        {"note": "look at this"}]
    states = {(e.event.type, e.status) for e in await h.store.list_events(tid)}
    assert states == {("user_interrupt", "applied"), ("rollback", "applied")}
    await h.close()
