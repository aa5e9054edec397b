"""R10: a side-effecting call that may already have changed the world is never blindly run
again. A result that cannot be stored (not JSON) is recorded as run and sent to a person; a
call that timed out is not retried without a reconcile hook (outcome unknown, a person
decides); with one, a call the provider found is answered from it without a rerun, and one the
provider never saw is run again under the tool's retry policy, bounded, with the same key.
"""

from __future__ import annotations

import asyncio
import decimal
from typing import Any

import pytest
from _support import fast_settings

import tether as tt

pytestmark = pytest.mark.timeout(30)


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
