"""R24 (with R4, E2): the interruption protocol is written down and configurable in one place."""

from __future__ import annotations

import asyncio

import pytest
from _support import fast_settings, run_alongside, strategies, wait_until

import tether as tt


def degrading_task(h: tt.Harness, calls: list[int], gate: asyncio.Event) -> None:
    @h.tool
    async def step(ctx: tt.ToolContext, n: int) -> int:
        calls.append(n)
        if n == 2:
            await gate.wait()
        return n

    @h.agent("stepper")
    class Stepper(tt.Agent):
        async def plan(self, task):
            n = task.scratch.get("n", 0)
            if n == 4:
                return tt.Finish(n)
            task.scratch["n"] = n + 1
            return tt.ToolCall("step", {"n": n + 1})


async def run_with_degrade(h: tt.Harness) -> tuple[str, list[int]]:
    calls: list[int] = []
    gate = asyncio.Event()
    degrading_task(h, calls, gate)
    tid = await h.submit("stepper")

    async def degrade() -> None:
        await wait_until(lambda: 2 in calls, what="step 2 in flight")
        await h.emit(tt.Event("degrade", tid, {"level": "read_only"}))
        gate.set()

    await run_alongside(h, degrade(), timeout=5)
    return tid, calls


async def test_r24_degrade_is_p2_by_default_and_does_not_pause():
    """R4, R24: by default a degrade signal is P2 (retry/compensation): a healthy task carries on."""
    h = tt.Harness("memory://", settings=fast_settings())
    assert h.protocol.rule_for("degrade").priority is tt.Priority.P2
    tid, calls = await run_with_degrade(h)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert calls == [1, 2, 3, 4]
    await h.close()


async def test_r24_overriding_protocol_in_one_place_changes_treatment():
    """R24: `Harness(protocol={"degrade": 0})` makes degrade a P0: the same task now pauses."""
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"degrade": 0})
    assert h.protocol.rule_for("degrade").priority is tt.Priority.P0
    tid, calls = await run_with_degrade(h)
    info = await h.get(tid)
    assert info.record.status is tt.Status.PAUSED
    assert calls == [1, 2]
    assert "pause" in await strategies(h, tid)
    (stored,) = await h.store.list_events(tid)
    assert stored.priority == 0 and stored.status == "applied"
    await h.close()


async def test_r24_new_event_type_and_rule_objects_configure_in_one_place():
    """R24, E2: a new event type with a Rule (priority and coalescing class) is accepted and
    coalesced with another type sharing its class; the table is readable for docs."""
    h = tt.Harness("memory://", settings=fast_settings(), protocol={
        "cpu_alert": tt.Rule(tt.Priority.P3, coalesce="infra"),
        "mem_alert": tt.Rule(tt.Priority.P3, coalesce="infra"),
    })
    table = h.protocol.table()
    assert table["cpu_alert"] == tt.Rule(tt.Priority.P3, "infra")
    assert table["user_message"].coalesce is None  # content-bearing events are never coalesced
    degrading_task(h, [], asyncio.Event())
    tid = await h.submit("stepper")
    await h.emit(tt.Event("cpu_alert", tid, {"cpu": 99}))
    r = await h.emit(tt.Event("mem_alert", tid, {"mem": 97}))
    assert r.coalesced == 1
    assert [e.status for e in await h.store.list_events(tid)] == ["coalesced", "pending"]
    with pytest.raises(tt.ConfigurationError):
        tt.Harness("memory://", protocol={"degrade": 9})
    await h.close()


async def test_e2_call_recovery_class_merges_timeout_retry_and_degrade(harness):
    """E2: a tool timeout, a retry and a degrade signal for one call share a coalescing class and
    become one recovery instruction."""
    degrading_task(harness, [], asyncio.Event())
    tid = await harness.submit("stepper")
    for kind in ("tool_timeout", "retry", "degrade"):
        await harness.emit(tt.Event(kind, tid, {"call": "k1"}))
    events = await harness.store.list_events(tid)
    assert [(e.event.type, e.status) for e in events] == [
        ("tool_timeout", "coalesced"), ("retry", "coalesced"), ("degrade", "pending")]
