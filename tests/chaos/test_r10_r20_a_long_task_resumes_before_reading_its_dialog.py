"""R10, R20 (issue 30): a long task killed inside a call is back in that call before its dialog
is read, and its next plan sees the whole dialog, in order.

A child process runs a task of STEPS idempotent calls (two dialog rows each, far more than a
load reads at once) and SIGKILLs itself inside the last one. This process then opens the
same SQLite file: the runner counts the dialog's rows at load (so a version missing some
would fall back) and re-runs the call; the rows are read only when the agent plans again,
and that plan sees every row, the unread ones first, then the re-run call's result.

Child usage: ``python test_r10_r20_a_long_task_resumes_before_reading_its_dialog.py DB``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _child import killed_itself

import tether as tt
from tether.engine.loading import EAGER_ROWS

pytestmark = pytest.mark.timeout(60)
STEPS = 60
LEASE = 0.5


def app(db: str, seen: list[str], die: bool) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(lease_seconds=LEASE,
                                                          poll_interval=0.05))

    @h.tool(idempotent=True)
    async def work(ctx: tt.ToolContext, n: int) -> str:
        seen.append(f"call {n}")
        if die and n == STEPS - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"r{n}"

    @h.agent("counter")
    class Counter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            results = [row["content"] for row in task.history if row.get("role") == "tool"]
            if len(results) == STEPS:
                return tt.Finish({"results": results, "rows": len(task.history)})
            return tt.ToolCall("work", {"n": len(results)})

    return h


async def run_and_die(db: str) -> None:
    h = app(db, [], die=True)
    await h.submit("counter", "count", task_id="long")
    await h.run_until_idle()


def test_r10_r20_the_call_runs_again_first_and_the_plan_after_it_sees_every_row(
        tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    killed_itself(__file__, db)

    async def resume() -> dict[str, Any]:
        seen: list[str] = []
        h = app(db, seen, die=False)
        store = h.store
        read = store.read_history

        async def reading(task_id: str, segments: Sequence[Sequence[int]]) -> Any:
            seen.append("dialog read")
            return await read(task_id, segments)

        store.read_history = reading  # type: ignore[method-assign]
        await h.run_until_idle(timeout=30)
        info = await h.get("long")
        await h.close()
        assert info.record.status is tt.Status.COMPLETED, info.record.reason
        assert seen == [f"call {STEPS - 1}", "dialog read"]
        result: dict[str, Any] = info.snapshot.result
        return result

    result = asyncio.run(resume())
    assert result["results"] == [f"r{n}" for n in range(STEPS)]
    assert result["rows"] == 2 * STEPS > EAGER_ROWS


if __name__ == "__main__":
    asyncio.run(run_and_die(sys.argv[1]))
