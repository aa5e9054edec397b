"""A failing plan (model call) and an unreadable snapshot: bounded, explained recovery (R12, R22)."""

from __future__ import annotations

import tether as tt
from tether.store import SQLiteStore

FAST = tt.Settings(recovery_backoff=0.001, poll_interval=0.01)


def _harness(store: str | SQLiteStore) -> tt.Harness:
    harness = tt.Harness(store, settings=FAST)
    harness.plan_calls = 0  # type: ignore[attr-defined]

    @harness.tool(idempotent=True)
    async def echo(ctx: tt.ToolContext, n: int) -> int:
        return n

    @harness.agent("flaky_planner")
    class FlakyPlanner(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            harness.plan_calls += 1  # type: ignore[attr-defined]
            mode = task.input["mode"]
            if mode == "transient" and harness.plan_calls == 1:  # type: ignore[attr-defined]
                raise TimeoutError("model call timed out after 30.1s")
            if mode == "always":
                raise ConnectionError(f"model API 502 (request {harness.plan_calls})")  # type: ignore[attr-defined]
            if task.last_tool_result is None:
                return tt.ToolCall("echo", {"n": 7})
            return tt.Finish(task.last_tool_result)

    return harness


async def test_transient_plan_failure_is_retried_and_logged() -> None:
    """R12/R15: a model error is retried with backoff and the task completes."""
    harness = _harness("memory://")
    task_id = await harness.submit("flaky_planner", {"mode": "transient"})
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == 7
    strategies = [r["resume_strategy"] for r in await harness.store.list_recovery_log(task_id)]
    assert strategies == ["retry_plan"]


async def test_same_plan_failure_twice_goes_to_a_person() -> None:
    """R22: the same failure fingerprint again is not retried again: needs_human, with the reason."""
    harness = _harness("memory://")
    task_id = await harness.submit("flaky_planner", {"mode": "always"})
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "failed again the same way" in (info.record.reason or "")
    assert harness.plan_calls == 2  # type: ignore[attr-defined]


async def test_corrupt_newest_snapshot_falls_back_to_previous_version(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """R14: unreadable snapshot data is named (task, version) and recovery uses the previous good one."""
    path = str(tmp_path / "t.db")
    harness = _harness(SQLiteStore(path))
    task_id = await harness.submit("flaky_planner", {"mode": "ok"})
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.COMPLETED
    newest = info.version
    await harness.close()

    raw = SQLiteStore(path)
    raw._db.execute("UPDATE snapshots SET head = x'7b6e6f74206a736f6e' WHERE task_id = ? AND version = ?",
                    (task_id, newest))
    raw._db.execute("UPDATE tasks SET status = 'running' WHERE task_id = ?", (task_id,))
    await raw.close()

    harness = _harness(SQLiteStore(path))
    shown = await harness.get(task_id)  # a reader sees the last good version, damage named
    assert shown.version < newest
    assert task_id in shown.damaged[0] and f"version {newest}" in shown.damaged[0]
    await harness.run_until_idle(timeout=10)
    log = await harness.store.list_recovery_log(task_id)
    fallback = [r for r in log if r["resume_strategy"] == "fallback_version"]
    assert len(fallback) == 1 and f"version {newest}" in fallback[0]["detail"]
    final = await harness.get(task_id)
    assert final.record.status is tt.Status.COMPLETED
    assert final.version > newest
