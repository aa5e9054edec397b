"""An amended instruction replaces the plan it makes wrong (R3 "amend", R15 preemption)."""

from __future__ import annotations

import asyncio

import pytest

import tether as tt


def _mailer(sent: list[str], plan_started: asyncio.Event, proceed: asyncio.Event) -> tt.Harness:
    harness = tt.Harness("memory://", settings=tt.Settings(poll_interval=0.01))

    @harness.tool(side_effect=True)
    async def send_email(ctx: tt.ToolContext, to: str) -> str:
        sent.append(to)
        return f"sent to {to}"

    @harness.agent("mailer")
    class Mailer(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_tool_result is not None:
                return tt.Finish(task.last_tool_result)
            plan_started.set()
            await proceed.wait()  # a slow model call
            return tt.ToolCall("send_email", {"to": task.scratch.get("to", "old@example.com")})

        async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
            if event.type == "amend":
                task.scratch["to"] = event.payload["to"]
                return tt.Replan()
            return None

    return harness


async def test_amend_during_planning_drops_the_stale_call_and_plans_again() -> None:
    """R3/R4: an amend that arrives while the model plans is applied before the planned call
    runs; Replan drops that call, so the email goes only to the amended address."""
    sent: list[str] = []
    plan_started, proceed = asyncio.Event(), asyncio.Event()
    harness = _mailer(sent, plan_started, proceed)
    task_id = await harness.submit("mailer")

    async def amend() -> None:
        await plan_started.wait()
        await harness.emit(tt.Event("amend", task_id, {"to": "new@example.com"}))
        proceed.set()

    await asyncio.gather(harness.run_until_idle(timeout=10), amend())
    info = await harness.get(task_id)
    assert sent == ["new@example.com"]
    assert info.snapshot.result == "sent to new@example.com"
    strategies = [r["resume_strategy"] for r in await harness.store.list_recovery_log(task_id)]
    assert "replan" in strategies


async def test_plan_may_not_return_replan() -> None:
    """Replan is an answer to an event, not a plan: returning it from plan() is an error that
    ends, after the bounded retry, with a person and a reason naming it."""
    harness = tt.Harness("memory://", settings=tt.Settings(recovery_backoff=0.001))

    @harness.agent("confused")
    class Confused(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            return tt.Replan()

    task_id = await harness.submit("confused")
    await harness.run_until_idle(timeout=10)
    info = await harness.get(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "only on_event may return" in (info.record.reason or "")


@pytest.mark.parametrize("kind", ["replan"])
def test_replan_round_trips_as_an_action(kind: str) -> None:
    from tether.model import action_from_dict, action_to_dict

    assert action_to_dict(tt.Replan()) == {"kind": kind}
    assert action_from_dict({"kind": kind}) == tt.Replan()
