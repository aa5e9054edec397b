"""R2, R13, E6: a task is run by one worker at a time, under a lease. A started task shows
running with its lease owner (R2); a worker never claims a task it is still running, a slow
notifier or a failed renewal never lets a second copy run, and the lease is kept through a
long tool call (R13); a worker that claims a due or reopened task and dies before committing
anything leaves it claimable again once its lease expires, counted as a crash (E6).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _support import fast_settings, slow_planner, wait_until

import tether as tt
from tether.errors import StoreError
from tether.model import Status

pytestmark = pytest.mark.timeout(30)

FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


async def status_of_is(h: tt.Harness, task_id: str, status: tt.Status) -> bool:
    return await status_of(h, task_id) is status


async def test_r2_a_started_task_shows_running_while_its_first_plan_is_in_flight() -> None:
    """R2: which state is the task in? As soon as a worker starts it: running, not pending."""
    planning = asyncio.Event()
    h = slow_planner(planning)
    tid = await h.submit("slow")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.wait_for(planning.wait(), 5)
    record = await h.store.get_task(tid)
    assert record.status is Status.RUNNING and record.lease_owner == h.worker_id
    stop.set()
    await server
    await h.close()


async def test_r13_a_worker_never_claims_a_task_it_is_still_running() -> None:
    """R13: a task whose lease lapsed while its own worker is slow is not claimed again by that
    same worker (it would race itself); other workers may take it over (fenced)."""
    h = tt.Harness("memory://")

    @h.agent("x")
    class X(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish(None)

    tid = await h.submit("x")
    first = await h.store.claim("me", time.time(), 0.01)
    assert first is not None
    later = time.time() + 1
    assert await h.store.claim("me", later, 5, busy=[tid]) is None
    other = await h.store.claim("other", later, 5)
    assert other is not None and other.task_id == tid and other.fence > first.fence
    await h.close()


async def test_r13_resume_during_slow_notifier_never_runs_the_task_twice_at_once():
    """R13 (r5c): a person resumes a needs_human task while the worker is still inside a slow
    notifier for it. The worker must not end up running two copies of the task: the payment
    runs exactly once, never concurrently, and the task completes."""
    notified: list[str] = []

    async def notifier(bundle: dict) -> None:
        notified.append("start")
        await asyncio.sleep(0.25)  # a pager / webhook call
        notified.append("done")

    h = tt.Harness("memory://", settings=fast_settings(lease_seconds=0.45), notifier=notifier)
    pays: list[str] = []
    in_flight = {"now": 0, "max": 0}

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext) -> str:
        pays.append(ctx.idempotency_key)
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        try:
            await asyncio.sleep(0.8)  # a slow payment API, longer than the lease
        finally:
            in_flight["now"] -= 1
        return "paid"

    @pay.reconcile
    async def _reconcile(ctx: tt.ToolContext) -> Any:
        return None  # the provider has no record: not paid yet

    tries = {"n": 0}

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            tries["n"] += 1
            if tries["n"] <= 2:
                raise RuntimeError("model down")  # twice the same way -> needs_human
            if t.last_tool_result is None:
                return tt.ToolCall("pay")
            return tt.Finish(t.last_tool_result)

    tid = await h.submit("a")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(concurrency=4, stop=stop))
    try:
        await wait_until(lambda: notified == ["start"], timeout=3, what="the notifier to start")
        assert await status_of(h, tid) is tt.Status.NEEDS_HUMAN
        await h.resume(tid, message="model is back")  # while the notifier is still running
        await wait_until(lambda: status_of_is(h, tid, tt.Status.COMPLETED), timeout=6,
                         what="the task to complete")
        await asyncio.sleep(0.3)  # a second copy, if any, would still be paying now
    finally:
        stop.set()
        await server
    assert notified == ["start", "done"]
    assert in_flight["max"] == 1, "two runs of the same task paid at the same time"
    assert len(pays) == 1, pays
    assert (await h.get(tid)).snapshot.result == "paid"
    await h.close()


async def test_r13_one_failed_lease_renewal_does_not_stop_later_renewals(monkeypatch):
    """R13 (r13): a transient StoreError (database busy) during one renewal is logged, and
    the keeper goes on renewing. The task keeps its lease through a tool call longer than
    the lease, no other worker can claim it meanwhile, and it completes without a
    recovery, the side effect run once."""
    h = tt.Harness("memory://", settings=fast_settings(lease_seconds=0.3))
    runs: list[str] = []

    @h.tool(side_effect=True)
    async def long_job(ctx: tt.ToolContext) -> str:
        runs.append(ctx.idempotency_key)
        await asyncio.sleep(0.9)  # three leases long
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("long_job") if t.last_tool_result is None else tt.Finish(1)

    original = h.store.renew
    renewals = {"calls": 0, "failed": 0}

    async def flaky_renew(claim: Any, until: float) -> None:
        renewals["calls"] += 1
        if renewals["calls"] == 1:
            renewals["failed"] += 1
            raise StoreError("SQLite store is busy or unwritable: database is locked")
        await original(claim, until)

    monkeypatch.setattr(h.store, "renew", flaky_renew)
    tid = await h.submit("a")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    try:
        await wait_until(lambda: len(runs) == 1, timeout=3, what="the tool to start")
        await asyncio.sleep(0.6)  # two leases into the tool call
        assert renewals["failed"] == 1 and renewals["calls"] >= 3, renewals
        record = await h.store.get_task(tid)
        assert record.lease_owner == h.worker_id
        assert record.lease_until is not None and record.lease_until > time.time()
        assert await h.store.claim("worker-2", time.time(), 15) is None
        await wait_until(lambda: status_of_is(h, tid, tt.Status.COMPLETED), timeout=3,
                         what="the task to complete")
    finally:
        stop.set()
        await server
    assert len(runs) == 1
    strategies = [r["resume_strategy"] for r in await h.store.list_recovery_log(tid)]
    assert "resume" not in strategies and "needs_human" not in strategies, strategies
    await h.close()


async def test_r13_each_lease_is_renewed_a_third_of_a_lease_after_it_was_taken_not_sooner(
        monkeypatch):
    """R13: a worker renews each lease once a third of it has passed since it was taken or
    last renewed, so a lease taken a moment ago is not written again (every renewal is a
    write); a task that outlives a third of its lease is still renewed, and keeps it."""
    lease = 0.6
    h = tt.Harness("memory://", settings=fast_settings(lease_seconds=lease, poll_interval=0.05))

    @h.tool()
    async def work(ctx: tt.ToolContext) -> str:
        await asyncio.sleep(lease / 2)
        return "done"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("work") if t.last_tool_result is None else tt.Finish(1)

    starts: dict[str, list[float]] = {}  # each lease's start, as the worker gave it to the store
    renewed_after: list[float] = []
    claim_many, renew = h.store.claim_many, h.store.renew

    async def claiming(worker: str, now: float, lease_seconds: float, most: int,
                       busy: Any = ()) -> Any:
        taken = await claim_many(worker, now, lease_seconds, most, busy=busy)
        for claim in taken:
            starts[claim.task_id] = [now]
        return taken

    async def renewing(held: Any, until: float) -> None:
        renewed_after.append(until - lease - starts[held.task_id][-1])
        starts[held.task_id].append(until - lease)
        await renew(held, until)

    monkeypatch.setattr(h.store, "claim_many", claiming)
    monkeypatch.setattr(h.store, "renew", renewing)
    tids = [await h.submit("a") for _ in range(5)]
    await h.run_until_idle(concurrency=1, timeout=20)  # one after another: claims spread out
    assert [await status_of(h, tid) for tid in tids] == [Status.COMPLETED] * 5
    assert renewed_after, "tasks held longer than a third of their lease were never renewed"
    assert min(renewed_after) >= lease / 3 - 0.005, renewed_after
    await h.close()


@pytest.mark.parametrize("wake", ["timer", "approval_event"])
async def test_e6_parked_task_whose_claimer_died_is_claimable_again_as_a_crash(wake: str):
    """E6 (r3): a waiting task that became due (timer or approval event) is claimed by a
    worker that dies before committing anything. Once that lease expires the task is
    claimable again (crashed=True), and a healthy worker finishes it."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_event is None:
                return tt.Wait("approval", timeout=0.1 if wake == "timer" else None)
            return tt.Finish({"ended_by": t.last_event.get("type")})

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert await status_of(h, tid) is tt.Status.WAITING
    if wake == "timer":
        await asyncio.sleep(0.15)  # the timer is due
    else:
        await h.emit(tt.Event("approval", tid, {"by": "alice"}))

    dead = await h.store.claim("worker-X", time.time(), 0.05)  # ...and is SIGKILLed
    assert dead is not None and dead.task_id == tid
    await asyncio.sleep(0.1)  # its lease expires
    again = await h.store.claim("worker-Y", time.time(), 0.05)  # dies as well
    assert again is not None and again.task_id == tid
    assert again.crashed and again.crashes == 1
    await asyncio.sleep(0.1)

    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, (info.record.status, info.record.reason)
    if wake == "approval_event":
        assert info.snapshot.result == {"ended_by": "approval"}
    await h.close()


async def test_e6_a_reopened_finished_task_whose_claimer_died_is_claimed_again() -> None:
    """E6: a rollback wakes a completed task; the worker that claims it dies before doing
    anything; after its lease expires another worker claims it and applies the rollback."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("one")
    class One(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish("done")

    tid = await h.submit("one")
    await h.run_until_idle(timeout=5)
    await h.inbox.emit(tt.Event("rollback", tid, {"version": 1}))  # stored, not yet applied
    doomed = await h.store.claim("dies", time.time(), 0.1)
    assert doomed is not None and doomed.task_id == tid
    await asyncio.sleep(0.15)
    again = await h.store.claim("healthy", time.time(), 5)
    assert again is not None and again.task_id == tid
    await h.store.release(again)
    await h.run_until_idle(timeout=5)
    states = [(e.event.type, e.status) for e in await h.store.list_events(tid)]
    assert ("rollback", "applied") in states
    await h.close()
