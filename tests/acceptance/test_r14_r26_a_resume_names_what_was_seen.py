"""R14, R26: a person's resume is about the stop they were shown, and applied only to it.

A task stops for a person once (here: a lookup that is down); a person looks at it. Before
they click resume, someone else resumes it, and it stops again for another reason: the model
asked for the same refund a second time, which tether holds. A plain resume of that second
stop would pay the refund again. The first person's resume carries the etag of what they saw
(``harness.resume(..., etag=)``, the console's form, the API's body, ``tether resume
--etag``): it is refused (``StaleDecision``) and nothing is stored; a resume event that
reaches the loop after the task moved on is dropped (``resume_ignored``), never applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tether as tt
from tether.model import Event


class Shop:
    def __init__(self) -> None:
        self.paid: list[str] = []
        self.lookup_down = True


def refunds_twice(h: tt.Harness, shop: Shop) -> None:
    @h.tool(idempotent=True, retry=tt.RetryPolicy(max_attempts=1))
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, str]:
        if shop.lookup_down:
            raise RuntimeError("the order service is down")
        return {"order": order}

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> dict[str, int]:
        shop.paid.append(ctx.idempotency_key)
        return {"refunded": amount}

    @h.agent("support")
    class Support(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            asked = int(t.scratch.get("asked", 0))
            t.scratch["asked"] = asked + 1
            if asked == 0:
                return tt.ToolCall("lookup", {"order": "A1"})
            if asked in (1, 2):  # the model asks for the same refund twice
                return tt.ToolCall("refund", {"order": "A1", "amount": 5})
            return tt.Finish(t.last_tool_result)


@pytest.fixture
async def stopped_twice(tmp_path: Path) -> AsyncIterator[tuple[tt.Harness, str, Shop, str]]:
    """The task, its second stop (the held refund), and the etag of its first stop."""
    shop = Shop()
    h = tt.Harness(f"sqlite:///{tmp_path / 'resume.db'}")
    refunds_twice(h, shop)
    task_id = await h.submit("support")
    await h.run_until_idle(timeout=10)
    first_stop = await h.get(task_id)
    assert first_stop.record.status is tt.Status.NEEDS_HUMAN
    assert "order service is down" in (first_stop.record.reason or "")
    shop.lookup_down = False
    await h.resume(task_id, by="bob", etag=first_stop.etag)
    await h.run_until_idle(timeout=10)
    second = await h.get(task_id)
    assert second.record.status is tt.Status.NEEDS_HUMAN and len(shop.paid) == 1
    assert "a 2nd time" in (second.record.reason or "")
    yield h, task_id, shop, first_stop.etag
    await h.close()


async def test_r26_a_resume_about_an_earlier_stop_is_refused_and_nothing_is_paid_again(
        stopped_twice: tuple[tt.Harness, str, Shop, str]) -> None:
    """R26, R10: the first person's resume carries the etag of the first stop: refused,
    nothing stored, the refund not paid a second time. Resumed as shown now (the held
    refund answered with the earlier result), the task completes, paid once."""
    h, task_id, shop, seen_first = stopped_twice
    events_before = len(await h.store.list_events(task_id))
    with pytest.raises(tt.StaleDecision, match="no longer as it was shown"):
        await h.resume(task_id, by="ann", etag=seen_first)
    assert len(await h.store.list_events(task_id)) == events_before
    await h.run_until_idle(timeout=10)
    assert (await h.get(task_id)).record.status is tt.Status.NEEDS_HUMAN
    assert len(shop.paid) == 1

    now = await h.get(task_id)
    await h.resume(task_id, by="ann", earlier_result=True, etag=now.etag)
    await h.run_until_idle(timeout=10)
    done = await h.get(task_id)
    assert done.record.status is tt.Status.COMPLETED, done.record.reason
    assert done.snapshot.result == {"refunded": 5} and len(shop.paid) == 1


async def test_r14_a_resume_that_reaches_the_loop_after_the_task_moved_on_is_dropped(
        stopped_twice: tuple[tt.Harness, str, Shop, str]) -> None:
    """R14, R26: a resume event naming the version its sender saw, older than the task's
    now (it was stored before the task moved on), is recorded as ``resume_ignored`` and
    changes nothing: the held refund stays held, paid once."""
    h, task_id, shop, _ = stopped_twice
    now = await h.get(task_id)
    receipt = await h._control(Event("resume", task_id, {"by": "ann", "version": now.version - 1}))
    assert receipt.accepted
    await h.run_until_idle(timeout=10)
    after = await h.get(task_id)
    assert after.record.status is tt.Status.NEEDS_HUMAN and len(shop.paid) == 1
    record = (await h.store.list_recovery_log(task_id))[-1]
    assert record["resume_strategy"] == "resume_ignored"
    assert "moved on since" in record["detail"]


async def test_r26_a_view_of_a_deleted_task_does_not_steer_the_one_made_again_with_its_id(
        tmp_path: Path) -> None:
    """R26: a task waiting for a person (no call open) is deleted and submitted again under
    the same id, and waits where the first one did (same version and status). The etag shown
    for the first one is refused for the second: it is another task, never seen."""
    async with tt.Harness(f"sqlite:///{tmp_path / 'again.db'}") as h:
        @h.agent("asks")
        class Asks(tt.Agent):
            async def plan(self, t: tt.TaskView) -> tt.Action:
                return tt.Finish(t.last_event) if t.last_event else tt.Wait("approval")

        await h.submit("asks", task_id="t1")
        await h.run_until_idle(timeout=10)
        first = await h.get("t1")
        await h.delete("t1")
        await h.submit("asks", task_id="t1")
        await h.run_until_idle(timeout=10)
        again = await h.get("t1")
        assert (again.version, again.record.status, again.snapshot.call) \
            == (first.version, tt.Status.WAITING, None)
        with pytest.raises(tt.StaleDecision, match="no longer as it was shown"):
            await h.resume("t1", by="ann", etag=first.etag)
        assert [e for e in await h.store.list_events("t1") if e.event.type == "resume"] == []
