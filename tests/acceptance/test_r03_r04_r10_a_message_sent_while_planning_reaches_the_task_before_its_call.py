"""R3, R4, R10 (issue 30): a step reads the inbox once, and a message sent while the agent
planned still reaches the task before the call it planned starts.

After a plan whose next action is a tool call, the runner does not read the inbox again: the
call's resume point is written only if no event arrived unread since the last read
(``Checkpoint.inbox_seen``), so a quick step costs one read of the inbox, not two. When one
did arrive (here: a "STOP" stored by another store connection, as another process would,
while the agent planned a refund), nothing of the resume point is written, the runner reads
the message, the refund is set aside unpaid, and the agent plans again with the message.
The task runs without a worker (``run_claimed``), so no poller can see the message first:
the resume point's condition is what catches it, every time.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.engine.answers import NOT_RUN
from tether.engine.worker import run_claimed
from tether.errors import InboxMoved

STOP = "STOP: do NOT refund A1"


def build(db: Path, refunds: list[str], calls: int = 1) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}")
    other = tt.Harness(f"sqlite:///{db}")  # another process's connection: wakes no runner here

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    @h.agent("support")
    class Support(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            said = [e for e in task.history if e.get("type") == "user_message"]
            if said:
                return tt.Finish(f"stopped after {len(refunds)} refund(s)")
            if task.input == "interrupted" and task.step == 0:
                await other.emit(tt.Event("user_message", task.task_id, {"text": STOP}))
            if task.step < calls:
                return tt.ToolCall("refund", {"order": f"A{task.step + 1}"})
            return tt.Finish("done")

    return h


async def run_alone(h: tt.Harness, task_id: str) -> None:
    claim = await h.store.claim_task(task_id, h.worker_id, time.time(), 30.0)
    assert claim is not None
    await run_claimed(h, claim)


async def test_r04_r10_a_stop_sent_while_the_agent_planned_is_read_before_the_refund(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refunds: list[str] = []
    async with build(tmp_path / "t.db", refunds) as h:
        task_id = await h.submit("support", "interrupted")
        refused: list[InboxMoved] = []
        real = h.store.commit_reading

        async def commit_reading(*args: Any) -> Any:  # what the runner commits with
            try:
                return await real(*args)
            except InboxMoved as moved:
                refused.append(moved)
                raise

        monkeypatch.setattr(h.store, "commit_reading", commit_reading)
        await run_alone(h, task_id)
        assert len(refused) == 1  # the resume point's condition caught the message
        info = await h.get(task_id)
        assert refunds == []  # the refund planned before the message was never paid
        assert info.record.status is tt.Status.COMPLETED
        assert info.snapshot.result == "stopped after 0 refund(s)"
        dialog = await h.history(task_id)
        said = next(n for n, e in enumerate(dialog) if STOP in str(e))
        not_run = next(n for n, e in enumerate(dialog) if NOT_RUN in str(e))
        assert not_run < said  # the refund is answered "not run", then the message
        assert await h.store.list_idempotency(task_id) == []  # no resume point was written
        log = [r["resume_strategy"] for r in await h.store.list_recovery_log(task_id)]
        assert "answer_set_aside" in log


async def test_r10_a_quick_step_reads_the_inbox_once(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    refunds: list[str] = []
    async with build(tmp_path / "t.db", refunds, calls=20) as h:
        task_id = await h.submit("support", "plain")
        reads: Counter[str] = Counter()
        real = h.store.pending_events

        async def counted(task: str) -> Any:
            reads[task] += 1
            return await real(task)

        monkeypatch.setattr(h.store, "pending_events", counted)
        await run_alone(h, task_id)
        assert len(refunds) == 20
        assert reads[task_id] <= 20 + 3  # one a step (before planning), and a few to start
