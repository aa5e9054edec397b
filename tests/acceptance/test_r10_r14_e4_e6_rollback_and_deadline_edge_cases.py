"""Two edges found by the engine's unit tests, proven end to end on a real harness.

- E4, R10, R14: rolled back to a version whose side-effecting call was waiting out a retry,
  the call that succeeded since (same key, tool and arguments) is answered from the
  idempotency table, never run a third time.
- E6, R26: a task failed by its deadline while a wait's timer was also due, then resumed by
  a person, can still time out of that wait (its timer gets an id of its own) instead of
  waiting forever.
"""

from __future__ import annotations

import asyncio

import pytest
from _support import fast_settings, run_until_status, strategies

import tether as tt

pytestmark = pytest.mark.timeout(30)


async def test_e4_r10_a_rollback_to_a_retry_back_off_does_not_repeat_the_charge() -> None:
    """E4, R10: the charge failed once, then succeeded on its retry; rolling back to the
    version taken during the back-off finishes the call from its record: two runs in all."""
    h = tt.Harness("memory://", settings=fast_settings())
    runs: list[str] = []

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=3, backoff=0.01, jitter=0))
    async def charge(ctx: tt.ToolContext, amount: int) -> dict[str, int]:
        runs.append(ctx.idempotency_key)
        if len(runs) == 1:
            raise RuntimeError("card network busy")
        return {"charged": amount}

    @h.agent("checkout")
    class Checkout(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_tool_result is None:
                return tt.ToolCall("charge", {"amount": 5})
            return tt.Finish(task.last_tool_result)

    tid = await h.submit("checkout")
    await h.run_until_idle(timeout=10)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED and len(runs) == 2
    in_back_off = []
    for version, _, _ in await h.reads.versions(tid):
        _, head = await h.reads.head(tid, version)
        snap = tt.Snapshot.loads(head, tid, version)
        if snap.call is not None and snap.call.retry_at:
            in_back_off.append(version)
    assert in_back_off, "no kept version shows the call waiting out its retry"

    await h.rollback(tid, in_back_off[-1], by="ops")
    await run_until_status(h, tid, tt.Status.COMPLETED)

    assert len(runs) == 2, f"the charge ran again after the rollback: {runs}"
    assert (await h.get(tid)).snapshot.result == {"charged": 5}
    assert (await strategies(h, tid))[-2:] == ["rollback", "reuse_result"]
    await h.close()


async def test_e6_r26_a_resumed_task_can_still_time_out_of_its_wait() -> None:
    """E6, R26: the deadline and the wait's timeout both pass; the deadline fails the task;
    after a person resumes it, the wait still ends by its timeout and the task completes."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("approval")
    class Approval(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval", timeout=0.2)
            return tt.Finish(dict(task.last_event))

    tid = await h.submit("approval", deadline=0.2)
    await run_until_status(h, tid, tt.Status.WAITING, tt.Status.FAILED)
    await asyncio.sleep(0.5)  # both due times are now past, whichever fired already
    await run_until_status(h, tid, tt.Status.FAILED)

    await h.resume(tid, by="ann")
    await run_until_status(h, tid, tt.Status.COMPLETED)

    info = await h.get(tid)
    assert info.snapshot.result["timeout"] is True
    assert {"task_timeout", "human_resume", "wait_timeout"} <= set(await strategies(h, tid))
    await h.close()
