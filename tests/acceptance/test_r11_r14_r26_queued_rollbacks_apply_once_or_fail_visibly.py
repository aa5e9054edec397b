"""R14 (with R11, R26, E4): a rollback lever that waits in the inbox while the task moves on is
applied once, in order, or marked failed, never lost or looping. ``harness.rollback`` captures
the target head, so commits that prune that version meanwhile cannot make it fail (R14); a lever
stored without a captured head whose version is gone is marked failed with a rollback_failed
record and the task goes on (R26); two rollbacks reaching a task in one tick are both applied,
with no side effect paid twice (E4); a cancel sent before a rollback stays final (R11).
"""

from __future__ import annotations

import asyncio
import collections

import pytest
from _support import fast_settings, run_alongside, wait_until

import tether as tt
from tether.model import Status

pytestmark = pytest.mark.timeout(30)

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3,
                   keep_versions=50)


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


async def event_status(h: tt.Harness, task_id: str, event_id: int) -> str:
    return next(s.status for s in await h.store.list_events(task_id) if s.event.id == event_id)


async def version_numbers(h: tt.Harness, task_id: str) -> list[int]:
    return [v for v, _, _ in await h.store.list_versions(task_id)]


async def _store_rollback(h: tt.Harness, task_id: str, version: int) -> tt.EmitReceipt:
    """A rollback lever stored in the inbox without being applied yet (the lever itself
    applies it at once when no worker holds the task)."""
    receipt, _ = await h.inbox.emit(tt.Event("rollback", task_id, {"version": version}))
    return receipt


async def test_r14_rollback_captures_the_head_so_pruning_cannot_make_it_fail():
    """R14 (r13): a rollback to the oldest kept version of a task that a worker is running is
    queued for that worker; before it is applied the worker commits again and the version is
    pruned. Because harness.rollback captures the target head when asked, the rollback still
    succeeds (no rollback_failed) and no side effect is repeated (E4)."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=3))
    runs: collections.Counter[int] = collections.Counter()
    in_flight = asyncio.Event()
    gate = asyncio.Event()

    @h.tool(side_effect=True)
    async def step(ctx: tt.ToolContext, i: int) -> int:
        runs[i] += 1
        if i == 3 and not gate.is_set():
            in_flight.set()
            await gate.wait()
        return i

    @h.agent("long")
    class Long(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n == 5:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("step", {"i": n})

    tid = await h.submit("long")

    async def person() -> tuple[int, tt.EmitReceipt]:
        await asyncio.wait_for(in_flight.wait(), 5)
        assert tid in h.runners  # a worker holds the task: the lever is queued for it
        oldest = (await version_numbers(h, tid))[0]
        receipt = await h.rollback(tid, oldest)
        assert await event_status(h, tid, receipt.event_id) == "pending"
        gate.set()  # the call returns, its result is committed, the oldest version is pruned
        return oldest, receipt

    [(oldest, receipt)] = await run_alongside(h, person())

    log = await h.store.list_recovery_log(tid)
    assert [r["resume_strategy"] for r in log if r["event_id"] == receipt.event_id] == ["rollback"], log
    assert "rollback_failed" not in [r["resume_strategy"] for r in log]
    assert await event_status(h, tid, receipt.event_id) == "applied"
    assert oldest not in await version_numbers(h, tid)  # the premise: it was pruned meanwhile
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == 5
    assert dict(runs) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}  # nothing paid twice
    await h.close()


def _pruning_race_harness() -> tuple[tt.Harness, asyncio.Event, asyncio.Event]:
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=3, defer_results_under=0))
    in_tool = asyncio.Event()
    release = asyncio.Event()

    @h.tool()
    async def work(ctx: tt.ToolContext, n: int) -> int:
        if n == 4:
            in_tool.set()
            await release.wait()
        return n

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            t.scratch["n"] = n + 1
            return tt.ToolCall("work", {"n": n}) if n < 8 else tt.Finish("ok")

    return h, in_tool, release


async def test_r14_rollback_survives_its_version_being_pruned_before_it_is_applied():
    """R14 (r14): harness.rollback captures the target head when asked, so later commits
    pruning that version before the runner applies it cannot make the rollback fail."""
    h, in_tool, release = _pruning_race_harness()
    tid = await h.submit("a")
    target: dict[str, int] = {}

    async def person() -> None:
        await asyncio.wait_for(in_tool.wait(), timeout=3)
        target["version"] = (await h.store.list_versions(tid))[0][0]
        receipt = await h.rollback(tid, target["version"])
        assert receipt.accepted
        release.set()  # the result commit now prunes that version

    await run_alongside(h, person(), timeout=5)
    kept = [v for v, _, _ in await h.store.list_versions(tid)]
    assert target["version"] not in kept
    assert ("rollback", "applied") in await event_states(h, tid)
    log = await h.store.list_recovery_log(tid)
    assert any(r["resume_strategy"] == "rollback"
               and f"version {target['version']}" in r["detail"] for r in log)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    await h.close()


async def test_r26_a_rollback_lever_that_cannot_be_applied_is_marked_failed():
    """R26 (r14): a rollback event naming a version that is gone by the time it is applied
    (sent without a captured head) is marked failed in the event list with a rollback_failed
    record; the task is not parked forever on it and completes."""
    h, in_tool, release = _pruning_race_harness()
    tid = await h.submit("a")
    target: dict[str, int] = {}

    async def sender() -> None:
        await asyncio.wait_for(in_tool.wait(), timeout=3)
        target["version"] = (await h.store.list_versions(tid))[0][0]
        receipt, _ = await h.inbox.emit(tt.Event("rollback", tid, {"version": target["version"]}))
        assert receipt.accepted
        release.set()

    await run_alongside(h, sender(), timeout=5)
    states = await event_states(h, tid)
    assert ("rollback", "failed") in states, states
    record = (await h.get(tid)).record
    assert record.status is tt.Status.COMPLETED, (record.status, record.reason)
    assert all(s != "pending" for _, s in await event_states(h, tid))
    log = [r["resume_strategy"] for r in await h.store.list_recovery_log(tid)]
    assert "rollback_failed" in log, log
    await h.close()


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


async def test_r11_rollback_queued_behind_cancel_does_not_revive_the_task():
    """R11 (r7): cancel, then rollback, both sent while a tool call is in flight. The cancel
    wins: the task stays cancelled and no further tool call runs."""
    h = tt.Harness("memory://", settings=fast_settings())
    runs: list[int] = []

    @h.tool(side_effect=True)
    async def step(ctx: tt.ToolContext, n: int) -> int:
        runs.append(n)
        await asyncio.sleep(0.1)
        return n

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n < 3:
                t.scratch["n"] = n + 1
                return tt.ToolCall("step", {"n": n})
            return tt.Finish("done")

    tid = await h.submit("a")

    async def person() -> None:
        await wait_until(lambda: runs == [0, 1], timeout=3, what="the second call")
        await h.cancel(tid)
        await h.rollback(tid, 2)  # accepted: the task is still running in the store

    await run_alongside(h, person(), timeout=5)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.CANCELLED
    assert runs == [0, 1]
    states = dict(await event_states(h, tid))
    assert states["cancel"] == "applied"
    await h.close()
