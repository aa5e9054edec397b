"""R14 (with E4, R8, R19): versioned snapshots, kept with timestamps, and rollback to any kept
one; a rollback never repeats a side effect (not even inside a spawned subtask), keeps each
reused result after its tool_call row, and loses no event applied in the same tick."""

from __future__ import annotations

import time
from typing import Any

import pytest
from _support import fast_settings, strategies

import tether as tt
from tether.model import Snapshot


def charger(h: tt.Harness, runs: list[int], count: int = 6) -> None:
    """Charges *count* items (a side effect), then waits for an approval before finishing."""

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, item: int) -> dict:
        runs.append(item)
        return {"item": item, "key": ctx.idempotency_key}

    @h.agent("charger")
    class Charger(tt.Agent):
        async def plan(self, task):
            i = task.scratch.get("i", 0)
            if i < count:
                task.scratch["i"] = i + 1
                return tt.ToolCall("charge", {"item": i + 1})
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish({"charged": i})


async def version_at_step(h: tt.Harness, tid: str, step: int) -> int:
    """The kept version whose head is at *step* with no call in flight."""
    for version, _, _ in await h.store.list_versions(tid):
        _, data = await h.store.load_head(tid, version)
        snap = Snapshot.loads(data, tid, version)
        if snap.step == step and snap.call is None:
            return version
    raise AssertionError(f"no kept version at step {step}")


FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


def strip_at(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "at"} for row in rows]


async def test_r14_last_n_versions_kept_with_timestamps():
    """R14: versions are never overwritten; the newest keep_versions are kept, each timestamped."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=5))
    runs: list[int] = []
    charger(h, runs, count=10)
    t0 = time.time()
    tid = await h.submit("charger")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    versions = await h.store.list_versions(tid)
    assert len(versions) == 5
    numbers = [v for v, _, _ in versions]
    assert numbers == list(range(info.version - 4, info.version + 1))
    stamps = [at for _, at, _ in versions]
    assert stamps == sorted(stamps) and all(t0 - 1 <= at <= time.time() for at in stamps)
    steps = [Snapshot.loads((await h.store.load_head(tid, v))[1], tid, v).step for v in numbers]
    assert steps == sorted(steps) and steps[0] < steps[-1]  # older versions hold older state
    await h.close()


async def test_r14_e4_rollback_continues_from_older_version_without_repeating_side_effects():
    """R14, E4: rolling back to an older version continues from there; the calls made since are
    identical, so they return their recorded results and the side effect does not run again."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=100))
    runs: list[int] = []
    charger(h, runs)
    tid = await h.submit("charger")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    assert runs == [1, 2, 3, 4, 5, 6]

    target = await version_at_step(h, tid, 2)
    await h.rollback(tid, target)
    rolled = await h.get(tid)
    assert rolled.snapshot.step == 2 and rolled.snapshot.frame.scratch["i"] == 2
    assert rolled.record.status is not tt.Status.WAITING
    assert "rollback" in await strategies(h, tid)

    await h.run_until_idle(timeout=5)
    assert runs == [1, 2, 3, 4, 5, 6]  # nothing charged twice
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    assert (await strategies(h, tid)).count("reuse_result") == 4
    await h.emit(tt.Event("approval", tid, {"ok": True}))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == {"charged": 6}
    await h.close()


async def test_e4_rollback_with_redo_side_effects_runs_again_with_new_keys():
    """E4: redoing side effects after a rollback takes an explicit request, and uses new keys."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=100))
    runs: list[int] = []
    charger(h, runs)
    tid = await h.submit("charger")
    await h.run_until_idle(timeout=5)
    first_keys = {r.key for r in await h.store.list_idempotency(tid)}

    await h.rollback(tid, await version_at_step(h, tid, 2), redo_side_effects=True)
    await h.run_until_idle(timeout=5)
    assert runs == [1, 2, 3, 4, 5, 6, 3, 4, 5, 6]
    records = await h.store.list_idempotency(tid)
    new_keys = {r.key for r in records} - first_keys
    assert len(new_keys) == 4
    assert all(r.status == "succeeded" for r in records if r.key in new_keys)
    await h.close()


async def test_r14_rollback_to_pruned_version_raises_version_not_found():
    """R14: only kept versions can be rolled back to; a pruned one is VersionNotFound."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=3))
    runs: list[int] = []
    charger(h, runs)
    tid = await h.submit("charger")
    await h.run_until_idle(timeout=5)
    kept = [v for v, _, _ in await h.store.list_versions(tid)]
    assert len(kept) == 3 and min(kept) > 1
    before = await h.get(tid)
    with pytest.raises(tt.VersionNotFound, match="not kept"):
        await h.rollback(tid, 1)
    after = await h.get(tid)
    assert after.version == before.version and after.record.status is tt.Status.WAITING
    await h.close()


async def test_r14_history_after_rollback_shows_the_branch():
    """R14: after a rollback, the rows written after the rollback point are not in
    `harness.history`, but they remain in the store on their own branch."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=100))
    runs: list[int] = []
    charger(h, runs)
    tid = await h.submit("charger")
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("user_message", tid, {"text": "before rollback"}))
    await h.run_until_idle(timeout=5)
    full = await h.history(tid)
    assert any(r.get("content") == {"text": "before rollback"} for r in full)

    target = await version_at_step(h, tid, 2)
    _, data = await h.store.load_head(tid, target)
    point = Snapshot.loads(data, tid, target).history_len
    await h.rollback(tid, target)

    branch = await h.history(tid)
    assert branch == full[:point]
    assert not any(r.get("content") == {"text": "before rollback"} for r in branch)
    original = await h.store.read_history(tid, [[0, -1]])
    assert original[: len(full)] == full  # nothing was deleted or rewritten

    await h.run_until_idle(timeout=5)
    continued = await h.history(tid)
    assert continued[:point] == full[:point]
    assert len(continued) > point
    assert not any(r.get("content") == {"text": "before rollback"} for r in continued)
    info = await h.get(tid)
    assert len(info.snapshot.history_segments) == 2
    await h.close()


async def test_r14_completed_task_can_be_rolled_back_and_rerun_without_repeating_calls() -> None:
    """R14, E4: a completed task rolled back to a kept version runs on from there; identical
    calls return their recorded results instead of running again."""
    harness = tt.Harness("memory://", settings=tt.Settings(poll_interval=0.01))
    runs: list[int] = []

    @harness.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, n: int) -> int:
        runs.append(n)
        return n * 10

    @harness.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            if n == 3:
                return tt.Finish(sum(e["content"] for e in task.history if e.get("role") == "tool"))
            task.scratch["n"] = n + 1
            return tt.ToolCall("pay", {"n": n})

    task_id = await harness.submit("payer")
    await harness.run_until_idle(timeout=10)
    assert (await harness.get(task_id)).snapshot.result == 30
    oldest = (await harness.store.list_versions(task_id))[0][0]
    await harness.rollback(task_id, oldest)
    assert (await harness.get(task_id)).record.status is not tt.Status.COMPLETED
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == 30
    assert runs == [0, 1, 2]


async def test_r14_cancelled_task_cannot_be_rolled_back() -> None:
    """R11: cancelled is final; a rollback is refused with TaskClosed and nothing changes."""
    harness = tt.Harness("memory://")

    @harness.agent("idle")
    class Idle(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    task_id = await harness.submit("idle")
    await harness.run_until_idle(timeout=10)
    await harness.cancel(task_id)
    with pytest.raises(tt.TaskClosed):
        await harness.rollback(task_id, 1)
    assert (await harness.get(task_id)).record.status is tt.Status.CANCELLED


async def test_e4_rollback_reuses_keys_inside_spawned_subtasks():
    """E4 (r11): after a rollback to before a Spawn, the subtask's calls get the same
    idempotency keys as before, so its side effect returns the recorded result instead of
    running again."""
    h = tt.Harness("memory://", settings=fast_settings())
    refunds: list[str] = []

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str) -> str:
        refunds.append(ctx.idempotency_key)
        return f"refunded {order}"

    @h.agent("child")
    class C(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("refund", {"order": t.input})
            return tt.Finish(t.last_tool_result)

    @h.agent("root")
    class R(tt.Agent):
        async def plan(self, t):
            if t.child_result is None:
                return tt.Spawn("child", "A-17")
            return tt.Finish(t.child_result)

    tid = await h.submit("root")
    await h.run_until_idle(timeout=5)
    assert await status_of(h, tid) is tt.Status.COMPLETED
    assert len(refunds) == 1
    first = (await h.store.list_versions(tid))[0][0]
    assert first == 1  # the task as submitted: before the Spawn
    await h.rollback(tid, first)  # back to before the spawn; side effects are not redone
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == "refunded A-17"
    assert len(refunds) == 1, refunds
    await h.close()


async def test_r8_e4_reused_results_after_rollback_keep_their_tool_call_rows():
    """R8/E4 (r7): after a rollback, calls answered from the idempotency record add their
    tool result to the new dialog branch; each such result must be preceded by the
    assistant's tool_call row with the same key, as a real call's is."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=50))
    paid: list[int] = []

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, i: int) -> str:
        paid.append(i)
        return f"paid {i}"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n == 3:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("pay", {"i": n})

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert paid == [0, 1, 2]

    await h.rollback(tid, 1)  # the start: every call is answered from its record
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert paid == [0, 1, 2], "a side effect was repeated after the rollback"
    assert (await strategies(h, tid)).count("reuse_result") == 3

    rows = strip_at(await h.history(tid))
    tool_rows = [i for i, r in enumerate(rows) if r.get("role") == "tool"]
    assert len(tool_rows) == 3
    for i in tool_rows:
        before = rows[i - 1] if i > 0 else {}
        assert before.get("role") == "assistant" and before.get("tool_call", {}).get("key") == \
            rows[i]["key"], f"tool result {rows[i]} is not preceded by its tool_call row: {rows}"
        assert before["tool_call"]["name"] == "pay"
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
