"""Regression tests for the review findings (R4, R10, R11, R13, R19, R22, R26, E1, E4-E6, E8).

Each test is a reviewer's repro (``/tmp/review/r*.py``) turned into an assertion of the
fixed behaviour; each failed on the code before the fix (commit cd57a1f).
"""

from __future__ import annotations

import asyncio
import decimal
import time
from typing import Any

import orjson
import pytest
from _support import fast_settings, run_alongside, wait_until

import tether as tt
from tether.errors import StoreError
from tether.model import SNAPSHOT_FORMAT

pytestmark = pytest.mark.timeout(30)


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


async def status_of_is(h: tt.Harness, task_id: str, status: tt.Status) -> bool:
    return await status_of(h, task_id) is status


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


# ---------------------------------------------------------------------- R13: one run at a time


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


# ---------------------------------------------------------------------- R26: the notifier


async def test_r26_slow_notifier_is_not_cancelled():
    """R26 (r6): a notifier slower than a renewal period is let finish (the worker holds the
    lease while it runs); the person is actually told, and the lease is released after."""
    notified: list[str] = []

    async def notifier(bundle: dict) -> None:
        notified.append("start")
        await asyncio.sleep(0.5)
        notified.append("delivered")

    h = tt.Harness("memory://", settings=fast_settings(poll_interval=0.05, lease_seconds=1.2),
                   notifier=notifier)

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            raise RuntimeError("model down")

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert notified == ["start", "delivered"]
    record = await h.store.get_task(tid)
    assert record.status is tt.Status.NEEDS_HUMAN and record.lease_owner is None
    await h.close()


# ---------------------------------------------------------------------- R10: side effects in doubt


async def test_r10_side_effect_returning_non_json_runs_once_and_asks_a_person():
    """R10 (r1): a side-effecting tool whose result cannot be stored (a Decimal) has already
    changed the world; it is recorded as run and not retried, and the task goes to a person
    with a reason saying the value is not JSON."""
    h = tt.Harness("memory://", settings=fast_settings())
    calls: list[str] = []

    @h.tool(side_effect=True, retry=tt.RetryPolicy(backoff=0.0))
    async def refund(ctx: tt.ToolContext, amount: str) -> dict:
        calls.append(ctx.idempotency_key)  # the money moves here
        return {"refunded": decimal.Decimal(amount)}

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None and t.last_tool_error is None:
                return tt.ToolCall("refund", {"amount": "10.00"})
            return tt.Finish(t.last_tool_result)

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert len(calls) == 1, calls
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "not JSON-serialisable" in (info.record.reason or ""), info.record.reason
    records = await h.store.list_idempotency(tid)
    assert [r.status for r in records] == ["succeeded"]
    await h.close()


def timing_out_wire(h: tt.Harness, sent: list[str], max_attempts: int = 3) -> tt.Tool:
    @h.tool(side_effect=True, timeout=0.05,
            retry=tt.RetryPolicy(max_attempts=max_attempts, backoff=0.0))
    async def wire(ctx: tt.ToolContext, amount: int) -> str:
        sent.append(ctx.idempotency_key)  # the request reaches the bank
        await asyncio.sleep(0.1)  # ... the answer is slow; the timeout fires
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("wire", {"amount": 100})
            return tt.Finish(t.last_tool_result)

    return wire


async def test_r10_timed_out_side_effect_without_reconcile_is_not_retried():
    """R10 (r17): a side-effecting call that timed out may have happened. Without a reconcile
    hook it is not retried blindly: it ran once and the task needs a person ("outcome
    unknown")."""
    h = tt.Harness("memory://", settings=fast_settings())
    sent: list[str] = []
    timing_out_wire(h, sent)
    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    record = (await h.get(tid)).record
    assert len(sent) == 1, sent
    assert record.status is tt.Status.NEEDS_HUMAN
    assert "outcome unknown" in (record.reason or ""), record.reason
    await h.close()


async def test_r10_timed_out_side_effect_found_by_reconcile_completes_without_rerun():
    """R10 (r17): after a timeout the reconcile hook is asked; it finds the transfer, so its
    result is used and the call is not run again."""
    h = tt.Harness("memory://", settings=fast_settings())
    sent: list[str] = []
    asked: list[str] = []
    wire = timing_out_wire(h, sent)

    @wire.reconcile
    async def _found(ctx: tt.ToolContext, amount: int) -> Any:
        asked.append(ctx.idempotency_key)
        return "reconciled" if ctx.idempotency_key in sent else None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert len(sent) == 1, sent
    assert asked == sent
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "reconciled"
    await h.close()


async def test_r10_timed_out_side_effect_reconciled_as_never_happened_runs_again_bounded():
    """R10 (r17): when the reconcile hook says the call never happened (None), it is run
    again, under the tool's retry policy: more than once, but not without end."""
    h = tt.Harness("memory://", settings=fast_settings())
    sent: list[str] = []
    asked: list[str] = []
    wire = timing_out_wire(h, sent, max_attempts=3)

    @wire.reconcile
    async def _not_found(ctx: tt.ToolContext, amount: int) -> Any:
        asked.append(ctx.idempotency_key)
        return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    record = (await h.get(tid)).record
    assert len(asked) >= 1  # every rerun was preceded by asking the provider
    assert 2 <= len(sent) <= 2 * 3, sent  # retried, within the policy (plus one recovery round)
    assert len(asked) >= len(sent) - 1
    assert len(set(sent)) == 1  # always with the same idempotency key
    assert record.status is tt.Status.NEEDS_HUMAN, record.status
    await h.close()


# ---------------------------------------------------------------------- E1/E5: graceful stop


async def test_e1_e5_stop_lets_the_side_effect_finish_and_releases_the_lease():
    """E1, E5 (r4): setting serve()'s stop while a side-effecting tool is in flight lets the
    call finish (never cut off), records its result, and releases the lease cleanly: another
    worker claims the task at once, not as a crash, and finishes it without re-running."""
    h = tt.Harness("memory://", settings=fast_settings())
    log: list[str] = []

    @h.tool(side_effect=True)
    async def transfer(ctx: tt.ToolContext) -> str:
        log.append("sent request")
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            log.append("CANCELLED mid side effect")
            raise
        log.append("got answer")
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("transfer")
            return tt.Finish(t.last_tool_result)

    tid = await h.submit("a")
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await wait_until(lambda: log == ["sent request"], timeout=3, what="the transfer to start")
    stop.set()  # what a SIGTERM handler does
    await asyncio.wait_for(server, timeout=5)
    assert log == ["sent request", "got answer"]
    record = await h.store.get_task(tid)
    assert record.lease_owner is None
    assert [r.status for r in await h.store.list_idempotency(tid)] == ["succeeded"]

    claim = await h.store.claim("worker-2", time.time(), 0.5)
    assert claim is not None and claim.task_id == tid
    assert not claim.crashed and claim.crashes == 0
    await h.store.release(claim)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == "ok"
    assert log == ["sent request", "got answer"]
    await h.close()


# ---------------------------------------------------------------------- R19/R5, E6: lost wakes


async def test_r19_event_stored_before_the_parking_commit_is_not_stranded():
    """R19, R5 (r2): a resume stored after the runner's last inbox read but before the commit
    that parks the task (here: while on_event is still thinking about a user_interrupt) must
    make the task claimable again; the resume is applied and the task completes."""
    h = tt.Harness("memory://", settings=fast_settings())
    in_on_event = asyncio.Event()

    @h.tool(side_effect=True)
    async def slow(ctx: tt.ToolContext) -> str:
        await asyncio.sleep(0.2)
        return "ok"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("slow") if t.last_tool_result is None else tt.Finish("done")

        async def on_event(self, t, e):
            in_on_event.set()
            await asyncio.sleep(0.1)  # e.g. asks a model how to react
            return None  # default: P0 pauses

    tid = await h.submit("a")

    async def person() -> None:
        await asyncio.sleep(0.05)
        await h.emit(tt.Event("user_interrupt", tid, {"text": "hold on"}))
        await asyncio.wait_for(in_on_event.wait(), timeout=3)
        await asyncio.sleep(0.02)
        await h.resume(tid, message="carry on")  # the runner is inside on_event

    await run_alongside(h, person(), timeout=5)
    await h.run_until_idle(timeout=5)
    assert await event_states(h, tid) == [("user_interrupt", "applied"), ("resume", "applied")]
    assert await status_of(h, tid) is tt.Status.COMPLETED
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


# ---------------------------------------------------------------------- R11: cancel is final


async def test_r11_rollback_queued_behind_cancel_does_not_revive_the_task():
    """R11 (r7): cancel, then rollback, both sent while a tool call is in flight. The cancel
    wins: the task stays cancelled and no further tool call runs."""
    h = tt.Harness("memory://", settings=fast_settings())
    runs: list[int] = []

    @h.tool(side_effect=True)
    async def step(ctx: tt.ToolContext, n: int) -> int:
        runs.append(n)
        await asyncio.sleep(0.1)
        return n

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n < 3:
                t.scratch["n"] = n + 1
                return tt.ToolCall("step", {"n": n})
            return tt.Finish("done")

    tid = await h.submit("a")

    async def person() -> None:
        await wait_until(lambda: runs == [0, 1], timeout=3, what="the second call")
        await h.cancel(tid)
        await h.rollback(tid, 2)  # accepted: the task is still running in the store

    await run_alongside(h, person(), timeout=5)
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.CANCELLED
    assert runs == [0, 1]
    states = dict(await event_states(h, tid))
    assert states["cancel"] == "applied"
    await h.close()


# ---------------------------------------------------------------------- R4: no livelock


async def test_r4_duplicate_resume_to_a_running_task_does_not_livelock_a_long_plan():
    """R4, R21 (r10): a stray resume for a task that is running interrupts at most one plan()
    (it is a P0 event); it must not cancel every later plan() again and again."""
    h = tt.Harness("memory://", settings=fast_settings(poll_interval=0.05))
    plans = {"started": 0, "cancelled": 0, "done": 0}

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            plans["started"] += 1
            try:
                await asyncio.sleep(0.25)  # a model call
            except asyncio.CancelledError:
                plans["cancelled"] += 1
                raise
            plans["done"] += 1
            n = len([e for e in t.history if e.get("role") == "assistant"])
            return tt.Reply(f"r{n}") if n < 2 else tt.Finish("ok")

    tid = await h.submit("a")

    async def duplicate_click() -> None:
        await wait_until(lambda: plans["done"] == 1 and plans["started"] == 2, timeout=3,
                         what="the second plan")
        await h.resume(tid)

    try:
        await run_alongside(h, duplicate_click(), timeout=4)
    except TimeoutError:
        pytest.fail(f"run_until_idle livelocked: {plans}")
    assert await status_of(h, tid) is tt.Status.COMPLETED
    assert plans["cancelled"] <= 1, plans
    assert plans["done"] == 3, plans
    assert all(s != "pending" for _, s in await event_states(h, tid))
    await h.close()


# ---------------------------------------------------------------------- E4: keys in subtasks


async def test_e4_rollback_reuses_keys_inside_spawned_subtasks():
    """E4 (r11): after a rollback to before a Spawn, the subtask's calls get the same
    idempotency keys as before, so its side effect returns the recorded result instead of
    running again."""
    h = tt.Harness("memory://", settings=fast_settings())
    refunds: list[str] = []

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str) -> str:
        refunds.append(ctx.idempotency_key)
        return f"refunded {order}"

    @h.agent("child")
    class C(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("refund", {"order": t.input})
            return tt.Finish(t.last_tool_result)

    @h.agent("root")
    class R(tt.Agent):
        async def plan(self, t):
            if t.child_result is None:
                return tt.Spawn("child", "A-17")
            return tt.Finish(t.child_result)

    tid = await h.submit("root")
    await h.run_until_idle(timeout=5)
    assert await status_of(h, tid) is tt.Status.COMPLETED
    assert len(refunds) == 1
    first = (await h.store.list_versions(tid))[0][0]
    assert first == 1  # the task as submitted: before the Spawn
    await h.rollback(tid, first)  # back to before the spawn; side effects are not redone
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == "refunded A-17"
    assert len(refunds) == 1, refunds
    await h.close()


# ---------------------------------------------------------------------- R22: re-planning loops


async def test_r22_replanning_the_same_failing_call_stops_after_the_second_failure():
    """R22 (r12): an agent that answers tool_error by re-planning the very same failing call
    must not loop: the second identical failure (same tool, arguments, masked error) sends
    the task to a person."""
    h = tt.Harness("memory://", settings=fast_settings())
    calls = {"n": 0}

    @h.tool(retry=tt.RetryPolicy(max_attempts=1))
    async def search(ctx: tt.ToolContext, q: str) -> Any:
        calls["n"] += 1
        raise ConnectionError(f"search backend down (req {calls['n']:08x})")

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):  # a naive LLM keeps asking for the same call
            return tt.ToolCall("search", {"q": "refund policy"})

        async def on_event(self, t, e):
            if e.type == "tool_error":
                return tt.Reply("search failed, let me try again")
            return None

    tid = await h.submit("a")
    try:
        await h.run_until_idle(timeout=3)
    except TimeoutError:
        pytest.fail(f"still looping after 3 s ({calls['n']} calls)")
    record = (await h.get(tid)).record
    assert record.status is tt.Status.NEEDS_HUMAN
    assert calls["n"] == 2, calls
    assert "R22" in (record.reason or "") and "search" in (record.reason or ""), record.reason
    await h.close()


# ---------------------------------------------------------------------- R26: failed levers


def _pruning_race_harness() -> tuple[tt.Harness, asyncio.Event, asyncio.Event]:
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=3, defer_results_under=0))
    in_tool = asyncio.Event()
    release = asyncio.Event()

    @h.tool()
    async def work(ctx: tt.ToolContext, n: int) -> int:
        if n == 4:
            in_tool.set()
            await release.wait()
        return n

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            t.scratch["n"] = n + 1
            return tt.ToolCall("work", {"n": n}) if n < 8 else tt.Finish("ok")

    return h, in_tool, release


async def test_r14_rollback_survives_its_version_being_pruned_before_it_is_applied():
    """R14 (r14): harness.rollback captures the target head when asked, so later commits
    pruning that version before the runner applies it cannot make the rollback fail."""
    h, in_tool, release = _pruning_race_harness()
    tid = await h.submit("a")
    target: dict[str, int] = {}

    async def person() -> None:
        await asyncio.wait_for(in_tool.wait(), timeout=3)
        target["version"] = (await h.store.list_versions(tid))[0][0]
        receipt = await h.rollback(tid, target["version"])
        assert receipt.accepted
        release.set()  # the result commit now prunes that version

    await run_alongside(h, person(), timeout=5)
    kept = [v for v, _, _ in await h.store.list_versions(tid)]
    assert target["version"] not in kept
    assert ("rollback", "applied") in await event_states(h, tid)
    log = await h.store.list_recovery_log(tid)
    assert any(r["resume_strategy"] == "rollback"
               and f"version {target['version']}" in r["detail"] for r in log)
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    await h.close()


async def test_r26_a_rollback_lever_that_cannot_be_applied_is_marked_failed():
    """R26 (r14): a rollback event naming a version that is gone by the time it is applied
    (sent without a captured head) is marked failed in the event list with a rollback_failed
    record; the task is not parked forever on it and completes."""
    h, in_tool, release = _pruning_race_harness()
    tid = await h.submit("a")
    target: dict[str, int] = {}

    async def sender() -> None:
        await asyncio.wait_for(in_tool.wait(), timeout=3)
        target["version"] = (await h.store.list_versions(tid))[0][0]
        receipt, _ = await h.inbox.emit(tt.Event("rollback", tid, {"version": target["version"]}))
        assert receipt.accepted
        release.set()

    await run_alongside(h, sender(), timeout=5)
    states = await event_states(h, tid)
    assert ("rollback", "failed") in states, states
    record = (await h.get(tid)).record
    assert record.status is tt.Status.COMPLETED, (record.status, record.reason)
    assert all(s != "pending" for _, s in await event_states(h, tid))
    log = [r["resume_strategy"] for r in await h.store.list_recovery_log(tid)]
    assert "rollback_failed" in log, log
    await h.close()


# ---------------------------------------------------------------------- E8: deploys


async def test_e8_amended_resume_gets_past_a_step_naming_a_removed_tool():
    """E8 (r15): a recorded step names a tool a deploy removed; the task needs a person. A
    resume with a message and a frame patch makes the agent plan again instead of replaying
    the dead step, and the task completes."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.scratch.get("use_new"):
                return tt.Finish("used the new tool")
            return tt.ToolCall("old_tool")

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    record = (await h.get(tid)).record
    assert record.status is tt.Status.NEEDS_HUMAN and "old_tool" in (record.reason or "")
    await h.resume(tid, message="old_tool is gone, use new_tool", frame_patch={"use_new": True})
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert info.snapshot.result == "used the new tool"
    await h.close()


async def test_e8_snapshot_from_newer_code_makes_an_old_worker_back_off():
    """E8 (r16): a worker that cannot read a snapshot written by newer code leaves the task
    alone for a while (a few claims a second at most, not thousands) and does not change
    the task: a newer worker can still run it."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish(1)

    tid = await h.submit("a")
    head = orjson.loads((await h.store.load_head(tid))[1])
    head["format"] = SNAPSHOT_FORMAT + 1  # written by a newer worker
    h.store._db.execute("UPDATE snapshots SET head = ? WHERE task_id = ?",
                        (orjson.dumps(head), tid))
    original = h.store.claim
    claims: list[str] = []

    async def counting_claim(*args: Any, **kwargs: Any) -> Any:
        claim = await original(*args, **kwargs)
        if claim is not None:
            claims.append(claim.task_id)
        return claim

    h.store.claim = counting_claim  # type: ignore[method-assign]
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    await asyncio.sleep(0.8)
    stop.set()
    await server
    assert len(claims) in range(1, 6), f"{len(claims)} claims in 0.8 s"
    record = await h.store.get_task(tid)
    assert record.status is tt.Status.PENDING and record.lease_owner is None
    assert (await h.store.load_head(tid))[1] == orjson.dumps(head)
    await h.close()


# ---------------------------------------------------------------------- R26: unreadable task


async def test_r26_task_without_a_readable_snapshot_goes_to_a_person_lease_released():
    """R26 (r9b): a task whose only snapshot is unreadable cannot be run; instead of being
    claimed and crashed over and over, it ends in needs_human with a reason naming the task,
    and its lease is released."""
    notified: list[dict] = []
    h = tt.Harness("memory://", settings=fast_settings(lease_seconds=0.3),
                   notifier=notified.append)

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish(1)

    tid = await h.submit("a")
    h.store._db.execute("UPDATE snapshots SET head = x'7b7b' WHERE task_id = ?", (tid,))
    stop = asyncio.Event()
    server = asyncio.create_task(h.serve(stop=stop))
    try:
        await wait_until(lambda: status_of_is(h, tid, tt.Status.NEEDS_HUMAN), timeout=3,
                         what="needs_human")
        await asyncio.sleep(0.4)  # longer than a lease: nobody grabs it again
    finally:
        stop.set()
        await server
    record = await h.store.get_task(tid)
    assert record.status is tt.Status.NEEDS_HUMAN
    assert tid in (record.reason or "") and "snapshot" in (record.reason or ""), record.reason
    assert record.lease_owner is None
    assert len(notified) == 1
    await h.close()
