"""Recovery is paid by weight (R25): how many commits a step costs, by what the step risks."""

from __future__ import annotations

import pytest

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
