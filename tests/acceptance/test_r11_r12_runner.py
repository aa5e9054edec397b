"""R11, R12 (with E6): the runner's states and transitions, settings defaults, waits."""

from __future__ import annotations

import time

import pytest
from _support import fast_settings, run_until_status

import tether as tt
from tether.model import Status, check_transition


def waiter(h: tt.Harness, timeout: float | None) -> None:
    @h.agent("waiter")
    class Waiter(tt.Agent):
        async def plan(self, task):
            if task.last_event is None:
                return tt.Wait("approval", timeout=timeout)
            return tt.Finish(dict(task.last_event))


async def test_r11_states_are_the_eight_named():
    """R11: idle (pending), running, paused, waiting, needs_human, completed, failed, cancelled."""
    assert {s.value for s in tt.Status} == {"pending", "running", "paused", "waiting", "needs_human",
                                           "completed", "failed", "cancelled"}
    assert {s for s in tt.Status if s.is_terminal} == {tt.Status.COMPLETED, tt.Status.FAILED,
                                                      tt.Status.CANCELLED}


async def test_r11_illegal_transitions_are_refused():
    """R11: the life cycle is enforced; a cancelled or completed task never runs again."""
    for current, target in [(tt.Status.COMPLETED, tt.Status.RUNNING),
                            (tt.Status.CANCELLED, tt.Status.RUNNING),
                            (tt.Status.PENDING, tt.Status.COMPLETED),
                            (tt.Status.PAUSED, tt.Status.COMPLETED)]:
        with pytest.raises(tt.IllegalTransition, match=f"{current.value} to {target.value}"):
            check_transition("t1", current, target)
    check_transition("t1", tt.Status.RUNNING, tt.Status.PAUSED)  # a legal move does not raise
    check_transition("t1", tt.Status.PAUSED, tt.Status.RUNNING)


async def test_r11_cancel_of_completed_task_raises_task_closed(harness):
    """R11: cancelling a completed task is refused with TaskClosed; its status does not change."""
    waiter(harness, timeout=0)
    tid = await harness.submit("waiter")
    await run_until_status(harness, tid, tt.Status.COMPLETED)
    with pytest.raises(tt.TaskClosed):
        await harness.cancel(tid)
    with pytest.raises(tt.TaskClosed):
        await harness.resume(tid)
    assert (await harness.get(tid)).record.status is tt.Status.COMPLETED


async def test_r11_cancel_of_waiting_task_cancels_it(harness):
    """R11: a waiting task can be cancelled; afterwards it takes no events."""
    waiter(harness, timeout=None)
    tid = await harness.submit("waiter")
    await harness.run_until_idle(timeout=5)
    assert (await harness.get(tid)).record.status is tt.Status.WAITING
    await harness.cancel(tid)
    assert (await harness.get(tid)).record.status is tt.Status.CANCELLED
    with pytest.raises(tt.TaskClosed):
        await harness.emit(tt.Event("approval", tid, {"ok": True}))


async def test_r12_settings_defaults():
    """R12: sensible defaults: 3 recovery attempts, 10 kept versions, a 1.5 s coalescing window,
    a checkpoint every step, a bounded inbox and a recovery timeout."""
    s = tt.Settings()
    assert s.max_recovery_attempts == 3
    assert s.keep_versions == 10
    assert s.coalesce_window == 1.5
    assert s.checkpoint_every_steps == 1
    assert s.inbox_capacity > 0
    assert s.recovery_timeout > 0
    with pytest.raises(tt.ConfigurationError):
        tt.Settings(max_recovery_attempts=0)


async def test_r11_e6_wait_with_timeout_ends_with_timeout_marker(harness):
    """R11, E6: a Wait with a timeout and no event ends with last_event {"timeout": True}."""
    waiter(harness, timeout=0.05)
    tid = await harness.submit("waiter")
    started = time.monotonic()
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    if time.monotonic() - started < 0.05:
        assert info.record.status is tt.Status.WAITING
        assert info.snapshot.frame.wait["due_at"] is not None  # stored as a due time (E6)
    await run_until_status(harness, tid, tt.Status.COMPLETED)
    result = (await harness.get(tid)).snapshot.result
    assert result["timeout"] is True
    assert result.get("type") == "approval"


async def test_r11_wait_ended_by_approval_event(harness):
    """R11, R3: a Wait("approval") ends when an `approval` event arrives; the agent sees it."""
    waiter(harness, timeout=None)
    tid = await harness.submit("waiter")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.WAITING
    wait = dict(info.snapshot.frame.wait)
    assert isinstance(wait.pop("id"), str)  # what an answer names (R26)
    assert wait == {"event_type": "approval", "due_at": None, "timeout": None}

    receipt = await harness.emit(tt.Event("approval", tid, {"approved_by": "ops"}))
    assert receipt.accepted
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["type"] == "approval"
    assert info.snapshot.result["payload"] == {"approved_by": "ops"}
    assert info.snapshot.result.get("timeout") is not True


async def test_r11_other_event_does_not_end_a_wait(harness):
    """R11: a Wait ends only on its event type; a user message meanwhile leaves it waiting."""
    waiter(harness, timeout=None)
    tid = await harness.submit("waiter")
    await harness.run_until_idle(timeout=5)
    await harness.emit(tt.Event("user_message", tid, {"text": "any news?"}))
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.WAITING
    assert info.snapshot.frame.last_event is None


async def test_r12_checkpoint_every_n_steps_batches_light_steps():
    """R12, R25: non-tool steps are made durable every N steps; tool calls always get a resume point."""

    async def versions_for(every: int) -> int:
        h = tt.Harness("memory://", settings=fast_settings(checkpoint_every_steps=every))

        @h.agent("chatty")
        class Chatty(tt.Agent):
            async def plan(self, task):
                if task.step == 12:
                    return tt.Finish("done")
                return tt.Reply(f"line {task.step}")

        tid = await h.submit("chatty")
        await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is tt.Status.COMPLETED
        assert len(await h.history(tid)) == 13
        await h.close()
        return info.version

    assert await versions_for(6) < await versions_for(1)


def test_r11_paused_and_waiting_tasks_may_fail() -> None:
    """R12: a recovery that times out while a task is paused or waiting fails it cleanly."""
    for status in (Status.PAUSED, Status.WAITING):
        check_transition("t", status, Status.FAILED)
