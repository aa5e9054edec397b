"""R16, E6 (with R4, R9, R14, R26): a Wait ends with the event it waits for, or its timeout, and
nothing else. An approval stored before the deadline wins even if picked up after it (E6); one
that arrived before the Wait began is found by check_wait (R16); an interjected user message,
a duplicate approval, or a plain resume of a paused interjection returns to the same wait
instead of ending it, so the side effect gated on the approval does not run early (R16, R9,
R26); heartbeats and progress (P3/P4) neither wake the task nor write versions that would push
rollback points out (R4, R14).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _support import fast_settings, strategies

import tether as tt
from tether.model import Status

pytestmark = pytest.mark.timeout(30)

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


async def event_status(h: tt.Harness, task_id: str, event_id: int) -> str:
    return next(s.status for s in await h.store.list_events(task_id) if s.event.id == event_id)


async def version_numbers(h: tt.Harness, task_id: str) -> list[int]:
    return [v for v, _, _ in await h.store.list_versions(task_id)]


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


async def test_e6_r16_approval_stored_before_deadline_but_picked_up_late_beats_the_timeout():
    """E6/R16 (r1 scenario A): an approval is stored while the task waits (no worker running)
    before the Wait's deadline; the worker comes back only after the deadline. The event was
    there in time, so the wait ends with the approval, not with a timeout."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_event is None:
                return tt.Wait("approval", timeout=0.3)
            return tt.Finish(dict(t.last_event))

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    receipt = await h.emit(tt.Event("approval", tid, {"ok": True}))
    assert receipt.accepted
    await asyncio.sleep(0.45)  # the worker is back only after the deadline
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    result = info.snapshot.result
    assert not result.get("timeout"), f"the wait timed out although the approval came in time: {result}"
    assert result["type"] == "approval" and result["payload"] == {"ok": True}
    assert result["id"] == receipt.event_id
    assert "wait_timeout" not in await strategies(h, tid)
    await h.close()


async def test_r16_approval_arriving_before_the_wait_is_not_lost():
    """R16 (r1 scenario B): the approval arrives while the task is still running (its tool
    asks for approval and the approver is fast), before the agent plans Wait("approval").
    It is in the dialog, check_wait is asked when the Wait begins, finds it there, and the
    Wait ends at once with it instead of waiting forever."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.tool()
    async def request_approval(ctx: tt.ToolContext) -> str:
        await h.emit(tt.Event("approval", ctx.task_id, {"ok": True}))
        return "requested"

    @h.agent("b")
    class B(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("request_approval", {})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(dict(t.last_event))

        async def check_wait(self, t, wait):
            seen = [e for e in t.history if e.get("type") == wait["event_type"]]
            return seen[-1]["content"] if seen else None

    tid = await h.submit("b")
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, (
        f"task stayed {info.record.status.value} with wait {info.snapshot.frame.wait}")
    assert info.snapshot.result["type"] == "approval"
    assert info.snapshot.result["payload"] == {"ok": True}
    assert await event_states(h, tid) == [("approval", "applied")]
    await h.close()


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


async def test_r16_r9_interjection_while_waiting_does_not_end_the_wait():
    """R16/R9 (r9): while waiting for an approval, an unrelated user_message is answered by
    on_event with a Reply. The Reply runs, then the task goes back to waiting for the same
    deadline: the message must not end the wait, so the refund gated on the approval does not
    run. Only the approval ends the wait, and only then does the side-effecting refund run."""
    h = tt.Harness("memory://", settings=fast_settings())
    refunds: list[int] = []

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, cents: int) -> str:
        refunds.append(cents)
        return "refunded"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result:
                return tt.Finish(t.last_tool_result)
            if t.last_event is None:
                return tt.Wait("approval", timeout=3600)
            return tt.ToolCall("refund", {"cents": 500})  # whatever ended the wait approves it

        async def on_event(self, t, e):
            if e.type == "user_message":
                return tt.Reply("Thanks, still waiting for approval.")
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    before = await h.get(tid)
    assert before.record.status is tt.Status.WAITING
    due = before.snapshot.frame.wait["due_at"]

    await h.emit(tt.Event("user_message", tid, "any news?"))
    await h.run_until_idle(timeout=5)
    mid = await h.get(tid)
    assert refunds == [], "the refund ran without an approval"
    assert mid.record.status is tt.Status.WAITING
    assert mid.snapshot.frame.wait is not None and mid.snapshot.frame.wait["due_at"] == due
    assert mid.snapshot.frame.last_event is None
    assert "Thanks, still waiting for approval." in [
        r.get("content") for r in await h.history(tid) if r.get("role") == "assistant"]

    await h.emit(tt.Event("approval", tid, {"by": "manager"}))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert refunds == [500]
    rows = await h.history(tid)
    approval_at = next(i for i, r in enumerate(rows) if r.get("type") == "approval")
    refund_at = next(i for i, r in enumerate(rows) if (r.get("tool_call") or {}).get("name") == "refund")
    assert approval_at < refund_at
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


async def test_r4_r14_heartbeats_and_progress_never_wake_a_waiting_task_or_prune_versions():
    """R4/R14 (r2): P3/P4 events (heartbeat, progress) sent to a waiting task must neither
    write new snapshot versions (which would push rollback points out of keep_versions) nor
    ask check_wait. The kept versions stay available: a rollback to the oldest one works."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=4))
    checks: list[Any] = []

    @h.tool()
    async def work(ctx: tt.ToolContext, i: int) -> int:
        return i

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n < 5:
                t.scratch["n"] = n + 1
                return tt.ToolCall("work", {"i": n})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

        async def check_wait(self, t, wait):
            checks.append(dict(wait))
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    assert len(checks) == 1  # asked once, when the wait began (R16)
    checks.clear()
    kept_before = await version_numbers(h, tid)
    head_before = (await h.get(tid)).version

    for i in range(6):
        await h.emit(tt.Event("heartbeat", tid, {"i": i}))
        await h.emit(tt.Event("progress", tid, {"pct": 10 * i}))
        await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.WAITING
    assert info.version == head_before, "P3/P4 events wrote new snapshot versions"
    assert await version_numbers(h, tid) == kept_before
    assert checks == [], "check_wait was asked because of a heartbeat/progress event"

    oldest = kept_before[0]
    receipt = await h.rollback(tid, oldest)  # must not raise VersionNotFound
    assert await event_status(h, tid, receipt.event_id) == "applied"
    assert "rollback_failed" not in await strategies(h, tid)
    await h.close()
