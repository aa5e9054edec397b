"""R3, R10, R14, R26 (issue 13, part 1): levers belong to people and never repeat a side effect.

- Only the operator levers store control events; ``Harness.emit`` (behind webhooks, streams
  and the API's generic route) refuses them and stores nothing.
- A rollback names a version; the state it restores comes from the store, never from the
  event's payload.
- A side-effecting call whose outcome is unknown is never re-run by a resume: a person says
  what happened (happened, not_happened, skip), and that decision is recorded with who made it.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from _support import strategies

import tether as tt
from tether.errors import IllegalTransition, InDoubtCall, ReservedEventType
from tether.protocol import RESERVED_EVENTS


def payer(h: tt.Harness, paid: list[int]) -> None:
    """Waits for an approval, then pays each order in its scratch (a side effect)."""

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, order: int) -> str:
        paid.append(order)
        return f"paid {order}"

    @h.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval")
            todo = task.scratch.setdefault("orders", [1])
            done = task.scratch.setdefault("done", 0)
            if done < len(todo):
                task.scratch["done"] = done + 1
                return tt.ToolCall("pay", {"order": todo[done]})
            return tt.Finish(task.scratch["done"])


@pytest.mark.parametrize("event_type", sorted(RESERVED_EVENTS))
async def test_r03_emit_refuses_every_lever_and_stores_nothing(harness: tt.Harness,
                                                             event_type: str) -> None:
    """R3/R26: a caller that may send events cannot cancel, resume, roll back, decide or time
    out a task: Harness.emit refuses the type by name and the inbox stays as it was."""
    paid: list[int] = []
    payer(harness, paid)
    tid = await harness.submit("payer")
    await harness.run_until_idle(timeout=5)
    before = await harness.store.list_events(tid)
    with pytest.raises(ReservedEventType, match=f"{event_type!r} is a lever"):
        await harness.emit(tt.Event(event_type, tid, {"version": 1}))
    assert await harness.store.list_events(tid) == before
    assert (await harness.get(tid)).record.status is tt.Status.WAITING


async def test_r14_a_rollback_takes_the_stored_version_never_a_head_in_its_payload(
        harness: tt.Harness) -> None:
    """R14: a rollback event whose payload carries an edited head (approval given, three orders
    to pay) restores the version as the store has it: waiting for an approval, nothing paid."""
    paid: list[int] = []
    payer(harness, paid)
    tid = await harness.submit("payer")
    await harness.run_until_idle(timeout=5)
    waiting = await harness.get(tid)
    assert waiting.record.status is tt.Status.WAITING
    forged: dict[str, Any] = orjson.loads(waiting.snapshot.dumps())
    forged["status"] = "running"
    forged["stack"][0]["wait"] = None
    forged["stack"][0]["last_event"] = {"type": "approval", "payload": {"ok": True}}
    forged["stack"][0]["scratch"] = {"orders": [7, 8, 9]}
    await harness.inbox.emit(tt.Event("rollback", tid, {"version": waiting.version,
                                                        "head": forged}))
    await harness.run_until_idle(timeout=5)
    after = await harness.get(tid)
    assert paid == []
    assert after.record.status is tt.Status.WAITING
    assert after.snapshot.frame.scratch == waiting.snapshot.frame.scratch
    assert "rollback" in await strategies(harness, tid)


def doubtful(h: tt.Harness, ledger: list[str]) -> None:
    """Refunds once; the provider takes the money and the answer is lost (outcome unknown)."""

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, amount: int) -> dict[str, Any]:
        ledger.append(ctx.idempotency_key)
        if len(ledger) == 1:
            raise tt.OutcomeUnknown("the provider took the request; no answer came")
        return {"refunded": amount}

    @h.agent("refunder")
    class Refunder(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if not task.scratch.get("asked"):
                task.scratch["asked"] = True
                return tt.ToolCall("refund", {"amount": 30})
            return tt.Finish({"result": task.last_tool_result, "error": task.last_tool_error})


async def _parked_in_doubt(h: tt.Harness, ledger: list[str]) -> str:
    doubtful(h, ledger)
    tid = await h.submit("refunder")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN and len(ledger) == 1
    assert info.snapshot.call is not None and info.snapshot.call.status == "started"
    return tid


async def test_r10_a_plain_resume_of_a_call_in_doubt_is_refused_listing_the_three_answers(
        harness: tt.Harness) -> None:
    """R10/R26: resume (plain or with a message) never re-runs a call whose outcome is unknown;
    the refusal names the three things a person can say, and the ledger is untouched."""
    ledger: list[str] = []
    tid = await _parked_in_doubt(harness, ledger)
    for message in (None, "try again please"):
        with pytest.raises(InDoubtCall) as refused:
            await harness.resume(tid, message)
        for answer in ("happened", "not_happened", "skip"):
            assert answer in str(refused.value)
    await harness.run_until_idle(timeout=5)
    assert len(ledger) == 1
    assert (await harness.get(tid)).record.status is tt.Status.NEEDS_HUMAN


async def test_r10_a_resume_event_reaching_the_worker_does_not_rerun_a_call_in_doubt(
        harness: tt.Harness) -> None:
    """R10: the worker applying a resume checks again (a resume stored before the call went in
    doubt, or by older code): the lever fails by name and the provider is not called again."""
    ledger: list[str] = []
    tid = await _parked_in_doubt(harness, ledger)
    await harness.inbox.emit(tt.Event("resume", tid, {"message": None}))
    await harness.run_until_idle(timeout=5)
    assert len(ledger) == 1
    assert (await harness.get(tid)).record.status is tt.Status.NEEDS_HUMAN
    assert "resume_failed" in await strategies(harness, tid)


@pytest.mark.parametrize(("outcome", "result", "calls", "finish"), [
    ("happened", {"refunded": 30, "by": "bank statement"}, 1,
     {"result": {"refunded": 30, "by": "bank statement"}, "error": None}),
    ("not_happened", None, 2, {"result": {"refunded": 30}, "error": None}),
    ("skip", None, 1, {"result": None, "error": {"tool": "refund", "skipped": True}}),
])
async def test_r10_r26_a_person_decides_what_happened_and_it_is_recorded(
        harness: tt.Harness, outcome: str, result: Any, calls: int,
        finish: dict[str, Any]) -> None:
    """R10/R26: happened records the person's result without calling the provider; not_happened
    runs it now with the same key; skip drops it. The dialog and the recovery log say who."""
    ledger: list[str] = []
    tid = await _parked_in_doubt(harness, ledger)
    await harness.decide(tid, outcome, result, by="alice")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert len(ledger) == calls and len(set(ledger)) == 1  # a re-run keeps its key
    got = info.snapshot.result
    if outcome == "skip":
        assert got["result"] is None and got["error"]["skipped"] is True
        assert got["error"]["tool"] == "refund" and got["error"]["by"] == "alice"
    else:
        assert got == finish
    decided = [row for row in await harness.history(tid) if row.get("type") == "decide"]
    assert [(row["content"]["outcome"], row["content"]["by"]) for row in decided] == [
        (outcome, "alice")]
    log = [r for r in await harness.store.list_recovery_log(tid)
           if r["resume_strategy"] == "human_decision"]
    assert len(log) == 1 and "alice" in log[0]["detail"]


async def test_r10_decide_needs_a_call_in_doubt_and_a_known_answer(harness: tt.Harness) -> None:
    """R26: deciding about a task with nothing in doubt, or with an unknown answer, is refused
    by name and stores no event."""
    paid: list[int] = []
    payer(harness, paid)
    tid = await harness.submit("payer")
    await harness.run_until_idle(timeout=5)
    before = await harness.store.list_events(tid)
    with pytest.raises(IllegalTransition, match="nothing to decide"):
        await harness.decide(tid, "happened", {"x": 1})
    with pytest.raises(tt.InvalidInput, match="happened, not_happened, skip"):
        await harness.decide(tid, "maybe")
    with pytest.raises(tt.InvalidInput, match="only"):
        await harness.decide(tid, "skip", {"x": 1})
    assert await harness.store.list_events(tid) == before
