"""R9 (with R1, R3): a parent ends its running subtask. Temporal's child cancellation, DBOS's
cancel_children: the subtask's wait ends, a call of its that has not started is dropped, an
interruptible call is cut by a P0, and the parent sees the cancellation as ``child_error``."""

from __future__ import annotations

import asyncio

from _support import fast_settings

import tether as tt


def nested(h: tt.Harness, child_work: tt.Action) -> list[str]:
    """boss spawns helper, which does *child_work* and would then finish; boss cancels its
    subtasks on an ``abort`` event and finishes with what it saw."""
    seen: list[str] = []

    @h.agent("boss")
    class Boss(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if not t.scratch.get("spawned"):
                t.scratch["spawned"] = True
                return tt.Spawn("helper", {"n": 1})
            seen.append(f"child_error={t.child_error}")
            return tt.Finish({"child_error": t.child_error, "child_result": t.child_result})

        async def on_event(self, t: tt.TaskView, event: tt.Event) -> tt.Action | None:
            return tt.CancelSubtask(f"the user said {event.payload}") \
                if event.type == "abort" else None

    @h.agent("helper")
    class Helper(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if not t.scratch.get("started"):
                t.scratch["started"] = True
                return child_work
            return tt.Finish("helper finished")

    return seen


async def test_r09_a_waiting_subtask_is_cancelled_and_the_parent_sees_child_error() -> None:
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"abort": 1})
    seen = nested(h, tt.Wait("approval", timeout=3600))
    task_id = await h.submit("boss")
    await h.run_until_idle(timeout=10)
    assert (await h.get(task_id)).record.status is tt.Status.WAITING  # the child waits
    await h.emit(tt.Event("abort", task_id, "stop"))
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == {"child_error": "cancelled by boss: the user said stop",
                                    "child_result": None}
    assert seen == ["child_error=cancelled by boss: the user said stop"]
    log = await h.store.list_recovery_log(task_id)
    assert "cancel_subtask" in [r["resume_strategy"] for r in log]
    history = await h.history(task_id)
    assert [r["agent"] for r in history if r.get("event") == "fail"] == ["helper"]
    await h.close()


async def test_r09_r03_a_p0_cuts_the_subtask_s_interruptible_call_then_cancels_it() -> None:
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"abort": 0})
    started, finished = asyncio.Event(), []

    @h.tool(interruptible=True)
    async def crawl(ctx: tt.ToolContext, pages: int) -> int:
        started.set()
        await asyncio.sleep(3600)
        finished.append(pages)
        return pages

    nested(h, tt.ToolCall("crawl", {"pages": 10_000}))
    task_id = await h.submit("boss")

    async def abort_once_crawling() -> None:
        await started.wait()
        await h.emit(tt.Event("abort", task_id, "enough"))

    await asyncio.gather(h.run_until_idle(timeout=20), abort_once_crawling())
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED and finished == []
    assert info.snapshot.result["child_error"] == "cancelled by boss: the user said enough"
    await h.close()


async def test_r09_cancelling_ends_every_level_above_the_parent() -> None:
    """boss → helper → deep helper waiting: boss's cancel ends both; it sees helper's."""
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"abort": 1})
    nested(h, tt.Spawn("deep"))

    @h.agent("deep")
    class Deep(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    task_id = await h.submit("boss")
    await h.run_until_idle(timeout=10)
    assert [f.agent for f in (await h.get(task_id)).snapshot.stack] == ["boss", "helper", "deep"]
    await h.emit(tt.Event("abort", task_id, "stop"))
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["child_error"] == "cancelled by boss: the user said stop"
    fails = [r["agent"] for r in await h.history(task_id) if r.get("event") == "fail"]
    assert fails == ["deep", "helper"]  # top first
    await h.close()


async def test_r09_plan_may_not_answer_cancel_subtask() -> None:
    h = tt.Harness("memory://", settings=fast_settings(max_recovery_attempts=1))

    @h.agent("confused")
    class Confused(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.CancelSubtask()  # type: ignore[return-value]

    task_id = await h.submit("confused")
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "only on_event may return" in (info.record.reason or "")
    await h.close()
