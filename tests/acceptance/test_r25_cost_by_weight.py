"""Recovery is paid by weight (R25): how many commits a step costs, by what the step risks,
and what batching checkpoints (checkpoint_every_steps) saves and costs after a crash."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings

import tether as tt

STEPS = 20


async def _commits_for(side_effect: bool, settings: tt.Settings) -> int:
    harness = tt.Harness("memory://", settings=settings)

    @harness.tool(side_effect=side_effect, idempotent=not side_effect)
    async def work(ctx: tt.ToolContext, n: int) -> int:
        return n

    @harness.agent("steps")
    class Steps(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            n = task.scratch.get("n", 0)
            if n == STEPS:
                return tt.Finish(n)
            task.scratch["n"] = n + 1
            return tt.ToolCall("work", {"n": n})

    task_id = await harness.submit("steps")
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.snapshot.result == STEPS
    return info.version - 1  # version 1 is the submitted task


@pytest.mark.parametrize(
    ("side_effect", "settings", "per_step"),
    [
        (False, tt.Settings(), 1),                         # quick idempotent: result rides along
        (False, tt.Settings(defer_results_under=0), 2),    # strict: result committed at once
        (True, tt.Settings(), 2),                          # side effect: always two commits
    ],
    ids=["idempotent-deferred", "idempotent-strict", "side-effect"],
)
async def test_commits_per_tool_step(side_effect: bool, settings: tt.Settings, per_step: int) -> None:
    """R10/R25: every tool call has a resume point; a side-effecting call also commits its
    result at once, while a quick idempotent call's result joins the next resume point."""
    commits = await _commits_for(side_effect, settings)
    assert commits == per_step * STEPS + 1  # + the final Finish


async def test_a_slow_idempotent_call_commits_its_result_at_once() -> None:
    """R25: only calls quicker than defer_results_under are deferred, bounding what a crash
    could make the worker redo."""
    commits = await _commits_for(False, tt.Settings(defer_results_under=1e-9))
    assert commits == 2 * STEPS + 1


async def version_numbers(h: tt.Harness, task_id: str) -> list[int]:
    return [v for v, _, _ in await h.store.list_versions(task_id)]


class SimulatedCrash(BaseException):
    """Escapes every handler, like SIGKILL: nothing is committed or released."""


async def test_r25_checkpoint_every_steps_batches_commits_and_costs_replanning_after_a_crash(
        tmp_path: Path):
    """R25 / guide §6: with checkpoint_every_steps=3, steps other than tool calls are made
    durable every 3 steps (fewer snapshot versions), and the price is the one the guide
    states: after a crash up to that many such steps are planned again (a paid model is asked
    again), against one with the default of 1. The dialog is never duplicated."""

    async def run(every: int, crash_at: int | None) -> tuple[int, list[int], list[int], list[str]]:
        url = f"sqlite:///{tmp_path / f'ck-{every}-{crash_at}.db'}"
        h = tt.Harness(url, settings=fast_settings(checkpoint_every_steps=every,
                                                   lease_seconds=0.3))
        plans: list[int] = []
        crashed = {"done": False}

        @h.agent("a")
        class A(tt.Agent):
            async def plan(self, t):
                i = t.scratch.get("i", 0)
                plans.append(i)
                if i == crash_at and not crashed["done"]:
                    crashed["done"] = True
                    raise SimulatedCrash
                if i == 6:
                    return tt.Finish(i)
                t.scratch["i"] = i + 1
                return tt.Reply(f"paid-model answer #{i}")

        tid = await h.submit("a")
        await h.run_until_idle(timeout=5)
        if crash_at is not None:
            assert crashed["done"]
            gc.collect()  # the dead worker task's SimulatedCrash is dropped, not reported
            await asyncio.sleep(0.45)  # the dead worker's lease expires
            await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is tt.Status.COMPLETED, info.snapshot.error
        steps = []
        for v in await version_numbers(h, tid):
            _, data = await h.store.load_head(tid, v)
            steps.append(tt.Snapshot.loads(data, tid, v).step)
        dialog = [r["content"] for r in await h.history(tid) if r.get("role") == "assistant"]
        await h.close()
        return info.version, steps, plans, dialog

    loop = asyncio.get_running_loop()
    default_handler = loop.get_exception_handler()

    def ignore_simulated_crash(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not isinstance(context.get("exception"), SimulatedCrash):
            loop.default_exception_handler(context)

    loop.set_exception_handler(ignore_simulated_crash)
    answers = [f"paid-model answer #{i}" for i in range(6)]

    # What it saves: 6 replies + finish are 7 commits with 1, 3 commits with 3.
    version, steps, plans, dialog = await run(1, None)
    assert (version, steps, plans, dialog) == (8, [0, 1, 2, 3, 4, 5, 6, 7], list(range(7)), answers)
    version, steps, plans, dialog = await run(3, None)
    assert (version, steps, plans, dialog) == (4, [0, 3, 6, 7], list(range(7)), answers)

    # What it costs: a crash while planning the 6th step (two replies not yet durable).
    _, _, plans, dialog = await run(1, 5)
    assert plans == [0, 1, 2, 3, 4, 5, 5, 6]  # only the plan in flight is asked again
    assert dialog == answers
    _, _, plans, dialog = await run(3, 5)
    assert plans == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]  # 3 plans asked again: up to N
    assert dialog == answers
    gc.collect()
    loop.set_exception_handler(default_handler)
