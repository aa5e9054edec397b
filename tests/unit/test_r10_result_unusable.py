"""R10, R22: a tool that ran but whose result cannot be kept says so (``tt.ResultUnusable``):
the call is recorded as done and never run again, and a person is asked, with the message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tether as tt
from tether.model import OutcomeStatus


class Once(tt.Agent):
    """Calls the tool once, then finishes with what it returned."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        if task.last_tool_result is None:
            return tt.ToolCall("charge", {"order": "A1"})
        return tt.Finish(task.last_tool_result)


async def test_r10_a_result_a_tool_cannot_give_is_recorded_as_done_and_never_repeated(
        tmp_path: Path) -> None:
    ran: list[str] = []
    h = tt.Harness(f"sqlite:///{tmp_path / 't.db'}")

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, order: str) -> Any:
        """Charge an order."""
        ran.append(order)
        raise tt.ResultUnusable("the payment API answered in a form this tool cannot read",
                                {"raw": "<xml/>"})

    h.add_agent("a", Once())
    async with h:
        task = await h.submit("a", "go")
        await h.run_until_idle(timeout=10)
        info = await h.get(task)
        record = (await h.store.list_idempotency(task))[0]
    assert ran == ["A1"]
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "cannot read" in (info.record.reason or "") and "not" in (info.record.reason or "")
    assert record.status is OutcomeStatus.SUCCEEDED and "<xml/>" in str(record.result)
