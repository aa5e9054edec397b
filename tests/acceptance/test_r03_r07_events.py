"""R3-R7 (with E2, R19, R24): one event queue, priorities, single-writer application, coalescing,
durable dedup, backpressure, and clear refusals."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _support import fast_settings, run_alongside, wait_until

import tether as tt


def gated_worker(h: tt.Harness, gate: asyncio.Event, log: list[str], calls: int = 3) -> None:
    """An agent doing *calls* tool calls; the second one waits on *gate*."""

    @h.tool
    async def work(ctx: tt.ToolContext, n: int) -> int:
        log.append(f"tool_start:{n}")
        if n == 2:
            await gate.wait()
        log.append(f"tool_end:{n}")
        return n

    @h.agent("worker")
    class Worker(tt.Agent):
        async def plan(self, task):
            n = task.scratch.get("n", 0)
            log.append(f"plan:{n}:signals={dict(task.signals)}")
            if n == calls:
                return tt.Finish({"n": n, "signals": dict(task.signals)})
            task.scratch["n"] = n + 1
            return tt.ToolCall("work", {"n": n + 1})

        async def on_event(self, task, event):
            log.append(f"on_event:{event.type}")
            return None


FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


async def event_status(h: tt.Harness, task_id: str, event_id: int) -> str:
    return next(s.status for s in await h.store.list_events(task_id) if s.event.id == event_id)


def strip_at(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "at"} for row in rows]


async def test_r04_r05_p1_user_message_applied_after_in_flight_tool_returns(harness):
    """R4 (P1 handled as soon as the current tool call ends), R5 (handlers only deliver)."""
    gate = asyncio.Event()
    log: list[str] = []
    gated_worker(harness, gate, log)
    tid = await harness.submit("worker")

    async def send() -> None:
        await wait_until(lambda: "tool_start:2" in log, what="tool 2 in flight")
        receipt = await harness.emit(tt.Event("user_message", tid, {"text": "also check X"}))
        assert receipt.accepted and receipt.outcome == "stored"
        # stored durably, but not applied while the tool is still running
        (stored,) = [e for e in await harness.store.list_events(tid) if e.event.type == "user_message"]
        assert stored.status == "pending" and stored.priority == tt.Priority.P1
        for _ in range(20):
            await asyncio.sleep(0)
        assert "on_event:user_message" not in log
        gate.set()

    await run_alongside(harness, send(), timeout=5)
    assert log.index("tool_end:2") < log.index("on_event:user_message") < log.index("plan:2:signals={}")
    history = await harness.history(tid)
    order = [(r["role"], r.get("type"), r.get("content")) for r in history]
    assert order.index(("tool", None, 2)) < order.index(("user", "user_message", {"text": "also check X"}))
    (stored,) = [e for e in await harness.store.list_events(tid) if e.event.type == "user_message"]
    assert stored.status == "applied"
    assert (await harness.get(tid)).record.status is tt.Status.COMPLETED


async def test_r04_p3_p4_update_signals_without_changing_flow(harness):
    """R4: P3/P4 events only update state (`task.signals`); the flow and agent are undisturbed."""
    gate = asyncio.Event()
    log: list[str] = []
    gated_worker(harness, gate, log)
    tid = await harness.submit("worker")

    async def send() -> None:
        await wait_until(lambda: "tool_start:2" in log, what="tool 2 in flight")
        await harness.emit(tt.Event("progress", tid, {"pct": 40}))
        await harness.emit(tt.Event("heartbeat", tid, {"alive": True}))
        gate.set()

    await run_alongside(harness, send(), timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.signals == {"progress": {"pct": 40}, "heartbeat": {"alive": True}}
    assert info.snapshot.result["signals"] == {"progress": {"pct": 40}, "heartbeat": {"alive": True}}
    assert not [line for line in log if line.startswith("on_event")]
    assert [line for line in log if line.startswith("tool_end")] == ["tool_end:1", "tool_end:2",
                                                                    "tool_end:3"]
    history = await harness.history(tid)
    assert not [r for r in history if r.get("type") in ("progress", "heartbeat")]
    events = await harness.store.list_events(tid)
    assert sorted(e.priority for e in events) == [3, 4]
    assert {e.status for e in events} == {"applied"}


async def test_r06_progress_events_inside_window_coalesce_to_newest(harness):
    """R6: several `progress` events inside the window become one (the newest); the others are
    marked "coalesced" in the store."""
    log: list[str] = []
    gated_worker(harness, asyncio.Event(), log, calls=0)
    tid = await harness.submit("worker")
    receipts = [await harness.emit(tt.Event("progress", tid, {"pct": p})) for p in (10, 20, 30, 40)]
    assert all(r.accepted for r in receipts)
    assert receipts[-1].coalesced == 1  # each new one swallowed the one pending before it
    events = await harness.store.list_events(tid)
    assert [e.status for e in events] == ["coalesced", "coalesced", "coalesced", "pending"]

    await harness.run_until_idle(timeout=5)
    events = await harness.store.list_events(tid)
    assert [e.status for e in events] == ["coalesced", "coalesced", "coalesced", "applied"]
    info = await harness.get(tid)
    assert info.snapshot.signals["progress"] == {"pct": 40}


async def test_e2_user_messages_are_never_coalesced(harness):
    """E2, R6: two `user_message`s inside the window are both kept and both reach the dialog."""
    log: list[str] = []
    gated_worker(harness, asyncio.Event(), log, calls=0)
    tid = await harness.submit("worker")
    r1 = await harness.emit(tt.Event("user_message", tid, {"text": "first"}))
    r2 = await harness.emit(tt.Event("user_message", tid, {"text": "second"}))
    assert r1.accepted and r2.accepted and r2.coalesced == 0
    assert [e.status for e in await harness.store.list_events(tid)] == ["pending", "pending"]

    await harness.run_until_idle(timeout=5)
    assert [e.status for e in await harness.store.list_events(tid)] == ["applied", "applied"]
    texts = [r["content"]["text"] for r in await harness.history(tid) if r.get("type") == "user_message"]
    assert texts == ["first", "second"]
    assert log.count("on_event:user_message") == 2


async def test_r06_r19_dedup_by_source_event_id_survives_reopen(db_url):
    """R6, R19: an event whose source_event_id was seen is dropped, durably across a restart."""

    def build() -> tt.Harness:
        h = tt.Harness(db_url, settings=fast_settings())
        gated_worker(h, asyncio.Event(), [], calls=0)
        return h

    h = build()
    tid = await h.submit("worker")
    first = await h.emit(tt.Event("webhook", tid, {"n": 1}, source_event_id="hook-1"))
    again = await h.emit(tt.Event("webhook", tid, {"n": 1}, source_event_id="hook-1"))
    assert first.accepted and first.outcome == "stored"
    assert not again.accepted and again.outcome == "duplicate" and again.event_id == first.event_id
    await h.run_until_idle(timeout=5)  # the first one is processed
    await h.close()

    h2 = build()
    task_open = await h2.submit("worker")  # a live task, so TaskClosed cannot mask the dedup
    after_restart = await h2.emit(tt.Event("webhook", task_open, {"n": 1}, source_event_id="hook-7"))
    assert after_restart.accepted
    dup_open = await h2.emit(tt.Event("webhook", task_open, {"n": 1}, source_event_id="hook-7"))
    await h2.close()

    h3 = build()
    dup_after_reopen = await h3.emit(tt.Event("webhook", task_open, {"n": 1},
                                              source_event_id="hook-7"))
    events = await h3.store.list_events(task_open)
    await h3.close()
    assert not dup_open.accepted and dup_open.outcome == "duplicate"
    assert not dup_after_reopen.accepted and dup_after_reopen.outcome == "duplicate"
    assert dup_after_reopen.event_id == after_restart.event_id
    assert len(events) == 1


async def test_r07_backpressure_refuses_low_priority_but_takes_p0_p1():
    """R7: with inbox_capacity=3, a 4th P3/P4 event is refused with InboxFull (a clear answer);
    P0 and P1 are still accepted."""
    h = tt.Harness("memory://", settings=fast_settings(inbox_capacity=3))
    gated_worker(h, asyncio.Event(), [], calls=0)
    tid = await h.submit("worker")
    for i in range(3):
        r = await h.emit(tt.Event(f"metric_{i}", tid, {"i": i}, priority=tt.Priority.P3))
        assert r.accepted
    with pytest.raises(tt.InboxFull, match="refused"):
        await h.emit(tt.Event("metric_x", tid, {}, priority=tt.Priority.P3))
    with pytest.raises(tt.InboxFull):
        await h.emit(tt.Event("heartbeat", tid, {}))
    p1 = await h.emit(tt.Event("user_message", tid, {"text": "still heard"}))
    p0 = await h.emit(tt.Event("user_interrupt", tid, {}))
    assert p1.accepted and p0.accepted
    assert len(await h.store.pending_events(tid)) == 5
    await h.close()


async def test_r03_r24_unknown_event_type_is_refused(harness):
    """R3, R24: an event type missing from the interruption protocol is refused, naming the fix."""
    gated_worker(harness, asyncio.Event(), [], calls=0)
    tid = await harness.submit("worker")
    with pytest.raises(tt.UnknownEventType, match="no_such_event"):
        await harness.emit(tt.Event("no_such_event", tid, {}))
    assert await harness.store.list_events(tid) == []


async def test_r03_emit_to_completed_or_missing_task_is_refused(harness):
    """R3/R11: a completed task takes no more events (TaskClosed); a missing one is TaskNotFound."""
    gated_worker(harness, asyncio.Event(), [], calls=0)
    tid = await harness.submit("worker")
    await harness.run_until_idle(timeout=5)
    assert (await harness.get(tid)).record.status is tt.Status.COMPLETED
    with pytest.raises(tt.TaskClosed):
        await harness.emit(tt.Event("user_message", tid, {"text": "too late"}))
    with pytest.raises(tt.TaskNotFound):
        await harness.emit(tt.Event("user_message", "no-such-task", {"text": "hello?"}))


async def test_r4_p1_event_during_plan_is_applied_before_the_planned_tool_runs():
    """R4 (r4), issue 27: an amend (P1) arriving while plan() runs (a model call) must be
    applied, and on_event must see it, before the planned side-effecting tool runs; the
    action on_event returns (a Reply) runs first. The call planned before the amend is not
    run (it is answered "not run"): the agent plans again and sends to the amended address."""
    h = tt.Harness("memory://", settings=fast_settings())
    order: list[str] = []
    planning = asyncio.Event()
    go = asyncio.Event()

    @h.tool(side_effect=True)
    async def send_email(ctx: tt.ToolContext, to: str) -> str:
        order.append(f"tool {to}")
        return "sent"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result:
                return tt.Finish(t.last_tool_result)
            planning.set()
            await go.wait()  # the model is thinking
            return tt.ToolCall("send_email", {"to": t.scratch.get("to", "old@x")})

        async def on_event(self, t, e):
            order.append(f"on_event {e.type}")
            if e.type == "amend":
                t.scratch["to"] = e.payload
                return tt.Reply("ok, amended")
            return None

    tid = await h.submit("a")

    async def user() -> None:
        await asyncio.wait_for(planning.wait(), 5)
        await h.emit(tt.Event("amend", tid, "new@x"))
        go.set()

    await run_alongside(h, user())

    assert order[0] == "on_event amend", f"the planned tool ran before the amend was seen: {order}"
    assert order[1:] == ["tool new@x"], order
    rows = strip_at(await h.history(tid))
    reply_at = next(i for i, r in enumerate(rows) if r.get("content") == "ok, amended")
    not_run = [r for r in rows if r.get("not_run") and "tool_call" in r]
    assert [r["tool_call"]["args"] for r in not_run] == [{"to": "old@x"}]
    call_at = next(i for i, r in enumerate(rows) if "tool_call" in r and not r.get("not_run"))
    assert reply_at < call_at, f"the on_event action did not run first: {rows}"
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    await h.close()


async def test_r6_r4_coalescing_never_swallows_a_more_urgent_event():
    """R6/R4 (r14): a degrade sent at priority 0 and then a retry (P2) share the coalescing
    class call_recovery, but the later, less urgent retry must not replace the P0 degrade:
    both stay pending and both are applied, most urgent first."""
    h = tt.Harness("memory://", settings=fast_settings())
    seen: list[tuple[str, Any]] = []

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

        async def on_event(self, t, e):
            seen.append((e.type, e.payload))
            return None

    tid = await h.submit("a")  # not running: the events stay pending
    degrade = await h.emit(tt.Event("degrade", tid, {"mode": "stop-now"}, priority=0))
    retry = await h.emit(tt.Event("retry", tid, {"n": 1}))
    assert retry.coalesced == 0
    assert await event_states(h, tid) == [("degrade", "pending"), ("retry", "pending")]

    await h.run_until_idle(timeout=5)
    assert seen[:2] == [("degrade", {"mode": "stop-now"}), ("retry", {"n": 1})]
    assert await event_status(h, tid, degrade.event_id) == "applied"
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


async def test_e2_r24_overriding_only_a_priority_keeps_the_coalescing_class():
    """E2/R24 (r3 proto): protocol={"degrade": 0} changes degrade's priority only; it keeps
    its default coalescing class (call_recovery), so a degrade still replaces a pending retry
    or tool_error of the same task inside the window."""
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"degrade": 0})
    table = h.protocol.table()
    assert table["degrade"] == tt.Rule(tt.Priority.P0, coalesce="call_recovery")
    assert table["tool_error"].coalesce == "call_recovery"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

    tid = await h.submit("a")
    await h.emit(tt.Event("retry", tid, {"n": 1}))
    degrade = await h.emit(tt.Event("degrade", tid, {"mode": "cheap"}))
    assert degrade.coalesced == 1
    assert await event_states(h, tid) == [("retry", "coalesced"), ("degrade", "pending")]
    stored = next(s for s in await h.store.list_events(tid) if s.event.id == degrade.event_id)
    assert stored.priority == 0 and stored.coalesce == "call_recovery"
    await h.close()


async def test_r7_full_inbox_accepts_an_event_that_replaces_a_pending_one_of_its_class():
    """R7 (r10): with the inbox at capacity, a progress event that coalesces with a pending
    progress event inside the window adds nothing net, so it is accepted (replacing the older
    one) rather than refused with InboxFull. An event that would add a row is still refused."""
    h = tt.Harness("memory://", settings=fast_settings(inbox_capacity=3))

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

    tid = await h.submit("a")  # not running: events stay pending
    await h.emit(tt.Event("webhook", tid, 1))
    await h.emit(tt.Event("webhook", tid, 2))
    await h.emit(tt.Event("progress", tid, {"pct": 10}))
    newer = await h.emit(tt.Event("progress", tid, {"pct": 20}))  # inbox full: must not raise
    assert newer.accepted and newer.coalesced == 1
    events = [(s.event.type, s.event.payload, s.status) for s in await h.store.list_events(tid)]
    assert events == [("webhook", 1, "pending"), ("webhook", 2, "pending"),
                      ("progress", {"pct": 10}, "coalesced"), ("progress", {"pct": 20}, "pending")]
    with pytest.raises(tt.InboxFull):
        await h.emit(tt.Event("state_change", tid, {"s": "x"}))  # another class: a new row
    await h.close()
