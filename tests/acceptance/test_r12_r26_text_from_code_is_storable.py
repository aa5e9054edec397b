"""R12, R26 (issue 26): what a tool or an agent says is stored, whatever characters it holds.

A tool's error message and an agent's failure reason reach text columns (the task's reason,
an idempotency record's error). PostgreSQL refuses a NUL in text, so a tool raising
``ValueError("bad\\x00byte")`` used to make every checkpoint of its task fail: the task could
never be parked for a person. The text is stored with the NUL written as ``\\0``, on SQLite
and PostgreSQL alike; the dialog and recovery log keep the exact text (they are JSON).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tether as tt


@pytest.fixture(params=["sqlite", "postgres"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    url = request.getfixturevalue("pg_url") if request.param == "postgres" \
        else f"sqlite:///{tmp_path / 'text.db'}"
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.01, max_recovery_attempts=1,
                                             recovery_backoff=0.01))
    yield h
    await h.close()


async def test_r26_a_tool_error_with_a_nul_parks_the_task_for_a_person(harness: tt.Harness) -> None:
    """R26: the failure is recorded and the task reaches needs_human with a readable reason."""
    @harness.tool(retry=tt.RetryPolicy(max_attempts=1))
    async def parse(ctx: tt.ToolContext) -> str:
        raise ValueError("bad\x00byte")

    @harness.agent("parser")
    class Parser(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.ToolCall("parse", {})

    task_id = await harness.submit("parser")
    await harness.run_until_idle(timeout=20)
    record = await harness.store.get_task(task_id)
    assert record.status is tt.Status.NEEDS_HUMAN
    assert record.reason is not None and "bad\\0byte" in record.reason
    calls = await harness.reads.calls(task_id)
    assert calls and all(c.error is None or "\x00" not in c.error for c in calls)
    assert any(c.error and "bad\\0byte" in c.error for c in calls)


async def test_r12_an_agent_failing_with_a_nul_in_its_reason_ends_failed(harness: tt.Harness) -> None:
    """R12: an agent's Fail reason with a NUL ends the task as failed, the reason kept."""
    @harness.agent("quitter")
    class Quitter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Fail("gave up at \x00")

    task_id = await harness.submit("quitter")
    await harness.run_until_idle(timeout=20)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.FAILED
    assert info.record.reason == "gave up at \\0"
    assert info.snapshot.error == "gave up at \x00"
