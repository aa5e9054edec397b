"""R10, R26 (issue 26): a decision is about one observation, and applied only to it.

A person decides about the call they were shown: its key and its attempt. The harness
refuses a decision whose key or attempt is not the store's now (``StaleDecision``, nothing
stored); a decision event that reaches the task's loop after the call moved on (attempted
again, settled, rolled back) is dropped and recorded as ``decide_failed``, never applied.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tether as tt
from tether.model import Event, EventStatus


def refunding(h: tt.Harness, ledger: list[str]) -> None:
    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, amount: int) -> dict[str, int]:
        ledger.append(ctx.idempotency_key)
        raise tt.OutcomeUnknown("the provider took the request; no answer came")

    @h.agent("refunder")
    class Refunder(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_tool_result is None and task.last_tool_error is None:
                return tt.ToolCall("refund", {"amount": 30})
            return tt.Finish(task.last_tool_result)


@pytest.fixture
async def parked(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A task parked needs_human with its refund in doubt at attempt 1 (paid once)."""
    ledger: list[str] = []
    h = tt.Harness(f"sqlite:///{tmp_path / 'seen.db'}")
    refunding(h, ledger)
    task_id = await h.submit("refunder")
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN and info.snapshot.call is not None
    yield h, task_id, info.snapshot.call, ledger
    await h.close()


async def test_r26_a_decision_about_another_key_or_attempt_is_refused_and_nothing_stored(
        parked) -> None:  # type: ignore[no-untyped-def]
    """R26: what the console or a client showed travels with the decision; a mismatch is
    refused before anything is stored, and the call stays in doubt."""
    h, task_id, call, ledger = parked
    for key, attempt in ((call.key, call.attempt + 1), ("someone-else", call.attempt)):
        with pytest.raises(tt.StaleDecision, match="not the one shown"):
            await h.decide(task_id, "not_happened", key=key, attempt=attempt)
    assert [e.event.type for e in await h.reads.events(task_id)] == []
    receipt = await h.decide(task_id, "happened", {"refunded": 30}, key=call.key,
                             attempt=call.attempt)
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == {"refunded": 30}
    assert receipt.accepted and len(ledger) == 1


async def test_r10_a_queued_decision_about_an_older_attempt_is_dropped_never_applied(
        parked) -> None:  # type: ignore[no-untyped-def]
    """R10: a decide event whose observation no longer holds (here: an older attempt, as
    after the call ran again and was parked again) is refused by the loop: recorded as
    decide_failed with the reason, the call still in doubt, nothing paid again."""
    h, task_id, call, ledger = parked
    stale = {"outcome": "not_happened", "by": "ann", "key": call.key,
             "attempt": call.attempt - 1, "branch": 0, "status": "needs_human"}
    receipt = await h._control(Event("decide", task_id, stale))
    event = next(e for e in await h.reads.events(task_id) if e.event.id == receipt.event_id)
    assert event.status == EventStatus.FAILED
    record = (await h.reads.recovery_log(task_id))[-1]
    assert record["resume_strategy"] == "decide_failed"
    assert "attempted again since" in record["detail"]
    await h.run_until_idle(timeout=10)
    info = await h.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert info.snapshot.call is not None and info.snapshot.call.status == "started"
    assert len(ledger) == 1
