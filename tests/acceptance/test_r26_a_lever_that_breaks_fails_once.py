"""R26, R21 (issue 26): a lever whose application breaks fails once, visibly, and is not
retried in a loop; a task row says why it is what it is from its first version.

A lever that raised anything but tether's own errors (a state tether did not foresee) went
back to the inbox with the runner's crash and was retried at once, for ever: 1,298 versions
in a minute were seen. It is marked failed now, with the error and its traceback in the
recovery log. And the reason a task is created with (a fork being written) reaches its row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.engine import levers
from tether.model import EventStatus, TaskRecord


async def test_r26_a_lever_that_raises_is_marked_failed_once_and_the_task_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = tt.Harness(f"sqlite:///{tmp_path / 'broken.db'}")

    @h.agent("waiter")
    class Waiter(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Wait("approval")

    async def broken_resume(task: Any, event: Any) -> None:
        raise KeyError("a field no tether writes")

    task_id = await h.submit("waiter")
    await h.run_until_idle(timeout=10)
    before = (await h.get(task_id)).version
    monkeypatch.setattr(levers, "human_resume", broken_resume)
    receipt = await h.resume(task_id, message="go on")
    await h.run_until_idle(timeout=10)

    event = next(e for e in await h.reads.events(task_id) if e.event.id == receipt.event_id)
    assert event.status == EventStatus.FAILED
    failed = [r for r in await h.reads.recovery_log(task_id)
              if r["resume_strategy"] == "resume_failed"]
    assert len(failed) == 1 and "KeyError" in failed[0]["detail"] and failed[0]["traceback"]
    info = await h.get(task_id)
    assert info.record.status is tt.Status.WAITING and info.version <= before + 1
    await h.close()


async def test_r26_a_task_created_with_a_reason_shows_it_on_its_row(tmp_path: Path) -> None:
    """R26: a fork's first, empty version says it is being forked; a crash before its second
    step leaves a paused task whose row names why (it had no reason before)."""
    h = tt.Harness(f"sqlite:///{tmp_path / 'reason.db'}")
    snap = tt.Snapshot(task_id="half", agent="waiter", input=None, status=tt.Status.PAUSED)
    await h.store.create_task(TaskRecord("half", "waiter", tt.Status.PAUSED, 1.0, 1.0, 1,
                                         reason="being forked from src v3"), snap.dumps())
    assert (await h.store.get_task("half")).reason == "being forked from src v3"
    await h.close()
