"""Regression tests for the second review (R4-R9, R14, R16, R21, R24, R26, E2, E4, E6).

Each test is one of the reviewer's repros (``/tmp/review2/r*.py``) turned into an assertion
of the fixed behaviour; each fails on the code before the fix (commit fac660b) and passes
after it (commit 11bcc6b). The last test pins down what the guide says
``checkpoint_every_steps > 1`` costs.
"""

from __future__ import annotations

import asyncio
import collections
import gc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, run_alongside, strategies, wait_until

import tether as tt

pytestmark = pytest.mark.timeout(30)


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


async def event_status(h: tt.Harness, task_id: str, event_id: int) -> str:
    return next(s.status for s in await h.store.list_events(task_id) if s.event.id == event_id)


async def version_numbers(h: tt.Harness, task_id: str) -> list[int]:
    return [v for v, _, _ in await h.store.list_versions(task_id)]


def strip_at(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "at"} for row in rows]


# ---------------------------------------------------------------------- R16 / E6: waiting


async def test_e6_r16_approval_stored_before_deadline_but_picked_up_late_beats_the_timeout():
    """E6/R16 (r1 scenario A): an approval is stored while the task waits (no worker running)
    before the Wait's deadline; the worker comes back only after the deadline. The event was
    there in time, so the wait ends with the approval, not with a timeout."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_event is None:
                return tt.Wait("approval", timeout=0.3)
            return tt.Finish(dict(t.last_event))

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    receipt = await h.emit(tt.Event("approval", tid, {"ok": True}))
    assert receipt.accepted
    await asyncio.sleep(0.45)  # the worker is back only after the deadline
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    result = info.snapshot.result
    assert not result.get("timeout"), f"the wait timed out although the approval came in time: {result}"
    assert result["type"] == "approval" and result["payload"] == {"ok": True}
    assert result["id"] == receipt.event_id
    assert "wait_timeout" not in await strategies(h, tid)
    await h.close()


async def test_r16_approval_arriving_before_the_wait_is_not_lost():
    """R16 (r1 scenario B): the approval arrives while the task is still running (its tool
    asks for approval and the approver is fast), before the agent plans Wait("approval").
    It is in the dialog, check_wait is asked when the Wait begins, finds it there, and the
    Wait ends at once with it instead of waiting forever."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.tool()
    async def request_approval(ctx: tt.ToolContext) -> str:
        await h.emit(tt.Event("approval", ctx.task_id, {"ok": True}))
        return "requested"

    @h.agent("b")
    class B(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result is None:
                return tt.ToolCall("request_approval", {})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(dict(t.last_event))

        async def check_wait(self, t, wait):
            seen = [e for e in t.history if e.get("type") == wait["event_type"]]
            return seen[-1]["content"] if seen else None

    tid = await h.submit("b")
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, (
        f"task stayed {info.record.status.value} with wait {info.snapshot.frame.wait}")
    assert info.snapshot.result["type"] == "approval"
    assert info.snapshot.result["payload"] == {"ok": True}
    assert await event_states(h, tid) == [("approval", "applied")]
    await h.close()


async def test_r16_r9_interjection_while_waiting_does_not_end_the_wait():
    """R16/R9 (r9): while waiting for an approval, an unrelated user_message is answered by
    on_event with a Reply. The Reply runs, then the task goes back to waiting for the same
    deadline: the message must not end the wait, so the refund gated on the approval does not
    run. Only the approval ends the wait, and only then does the side-effecting refund run."""
    h = tt.Harness("memory://", settings=fast_settings())
    refunds: list[int] = []

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, cents: int) -> str:
        refunds.append(cents)
        return "refunded"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result:
                return tt.Finish(t.last_tool_result)
            if t.last_event is None:
                return tt.Wait("approval", timeout=3600)
            return tt.ToolCall("refund", {"cents": 500})  # whatever ended the wait approves it

        async def on_event(self, t, e):
            if e.type == "user_message":
                return tt.Reply("Thanks, still waiting for approval.")
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    before = await h.get(tid)
    assert before.record.status is tt.Status.WAITING
    due = before.snapshot.frame.wait["due_at"]

    await h.emit(tt.Event("user_message", tid, "any news?"))
    await h.run_until_idle(timeout=5)
    mid = await h.get(tid)
    assert refunds == [], "the refund ran without an approval"
    assert mid.record.status is tt.Status.WAITING
    assert mid.snapshot.frame.wait is not None and mid.snapshot.frame.wait["due_at"] == due
    assert mid.snapshot.frame.last_event is None
    assert "Thanks, still waiting for approval." in [
        r.get("content") for r in await h.history(tid) if r.get("role") == "assistant"]

    await h.emit(tt.Event("approval", tid, {"by": "manager"}))
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert refunds == [500]
    rows = await h.history(tid)
    approval_at = next(i for i, r in enumerate(rows) if r.get("type") == "approval")
    refund_at = next(i for i, r in enumerate(rows) if (r.get("tool_call") or {}).get("name") == "refund")
    assert approval_at < refund_at
    await h.close()


# ---------------------------------------------------------------------- R4 / R14: P3/P4 while parked


async def test_r4_r14_heartbeats_and_progress_never_wake_a_waiting_task_or_prune_versions():
    """R4/R14 (r2): P3/P4 events (heartbeat, progress) sent to a waiting task must neither
    write new snapshot versions (which would push rollback points out of keep_versions) nor
    ask check_wait. The kept versions stay available: a rollback to the oldest one works."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=4))
    checks: list[Any] = []

    @h.tool()
    async def work(ctx: tt.ToolContext, i: int) -> int:
        return i

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n < 5:
                t.scratch["n"] = n + 1
                return tt.ToolCall("work", {"i": n})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

        async def check_wait(self, t, wait):
            checks.append(dict(wait))
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    assert len(checks) == 1  # asked once, when the wait began (R16)
    checks.clear()
    kept_before = await version_numbers(h, tid)
    head_before = (await h.get(tid)).version

    for i in range(6):
        await h.emit(tt.Event("heartbeat", tid, {"i": i}))
        await h.emit(tt.Event("progress", tid, {"pct": 10 * i}))
        await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.WAITING
    assert info.version == head_before, "P3/P4 events wrote new snapshot versions"
    assert await version_numbers(h, tid) == kept_before
    assert checks == [], "check_wait was asked because of a heartbeat/progress event"

    oldest = kept_before[0]
    receipt = await h.rollback(tid, oldest)  # must not raise VersionNotFound
    assert await event_status(h, tid, receipt.event_id) == "applied"
    assert "rollback_failed" not in await strategies(h, tid)
    await h.close()


# ---------------------------------------------------------------------- R14 / E4: rollback


async def test_r14_rollback_captures_the_head_so_pruning_cannot_make_it_fail():
    """R14 (r13): a rollback to the oldest kept version of a task that a worker is running is
    queued for that worker; before it is applied the worker commits again and the version is
    pruned. Because harness.rollback captures the target head when asked, the rollback still
    succeeds (no rollback_failed) and no side effect is repeated (E4)."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=3))
    runs: collections.Counter[int] = collections.Counter()
    in_flight = asyncio.Event()
    gate = asyncio.Event()

    @h.tool(side_effect=True)
    async def step(ctx: tt.ToolContext, i: int) -> int:
        runs[i] += 1
        if i == 3 and not gate.is_set():
            in_flight.set()
            await gate.wait()
        return i

    @h.agent("long")
    class Long(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n == 5:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("step", {"i": n})

    tid = await h.submit("long")

    async def person() -> tuple[int, tt.EmitReceipt]:
        await asyncio.wait_for(in_flight.wait(), 5)
        assert tid in h.runners  # a worker holds the task: the lever is queued for it
        oldest = (await version_numbers(h, tid))[0]
        receipt = await h.rollback(tid, oldest)
        assert await event_status(h, tid, receipt.event_id) == "pending"
        gate.set()  # the call returns, its result is committed, the oldest version is pruned
        return oldest, receipt

    [(oldest, receipt)] = await run_alongside(h, person())

    log = await h.store.list_recovery_log(tid)
    assert [r["resume_strategy"] for r in log if r["event_id"] == receipt.event_id] == ["rollback"], log
    assert "rollback_failed" not in [r["resume_strategy"] for r in log]
    assert await event_status(h, tid, receipt.event_id) == "applied"
    assert oldest not in await version_numbers(h, tid)  # the premise: it was pruned meanwhile
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED and info.snapshot.result == 5
    assert dict(runs) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1}  # nothing paid twice
    await h.close()


async def test_r8_e4_reused_results_after_rollback_keep_their_tool_call_rows():
    """R8/E4 (r7): after a rollback, calls answered from the idempotency record add their
    tool result to the new dialog branch; each such result must be preceded by the
    assistant's tool_call row with the same key, as a real call's is."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=50))
    paid: list[int] = []

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, i: int) -> str:
        paid.append(i)
        return f"paid {i}"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n == 3:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("pay", {"i": n})

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    assert paid == [0, 1, 2]

    await h.rollback(tid, 1)  # the start: every call is answered from its record
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert paid == [0, 1, 2], "a side effect was repeated after the rollback"
    assert (await strategies(h, tid)).count("reuse_result") == 3

    rows = strip_at(await h.history(tid))
    tool_rows = [i for i, r in enumerate(rows) if r.get("role") == "tool"]
    assert len(tool_rows) == 3
    for i in tool_rows:
        before = rows[i - 1] if i > 0 else {}
        assert before.get("role") == "assistant" and before.get("tool_call", {}).get("key") == \
            rows[i]["key"], f"tool result {rows[i]} is not preceded by its tool_call row: {rows}"
        assert before["tool_call"]["name"] == "pay"
    await h.close()


# ---------------------------------------------------------------------- R26 / R21: resume


async def test_r26_resume_with_content_amends_a_running_task_and_a_bare_resume_is_ignored():
    """R26 (and R21): a resume carrying a message and a frame_patch, sent to a task a worker
    is running, is applied (the message joins the dialog, the patch the scratch; log strategy
    "amend") rather than dropped as a duplicate. A resume without content sent at the same
    time is still ignored as a duplicate signal (R21)."""
    h = tt.Harness("memory://", settings=fast_settings())
    calls: list[tuple[int, str]] = []
    in_flight = asyncio.Event()
    gate = asyncio.Event()

    @h.tool(idempotent=True)
    async def fetch(ctx: tt.ToolContext, i: int, source: str) -> str:
        calls.append((i, source))
        if i == 0:
            in_flight.set()
            await gate.wait()
        return f"{source}:{i}"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            n = t.scratch.get("n", 0)
            if n == 3:
                return tt.Finish(n)
            t.scratch["n"] = n + 1
            return tt.ToolCall("fetch", {"i": n, "source": t.scratch.get("source", "primary")})

    tid = await h.submit("a")

    async def person() -> tuple[tt.EmitReceipt, tt.EmitReceipt]:
        await asyncio.wait_for(in_flight.wait(), 5)
        assert tid in h.runners
        amended = await h.resume(tid, message="use the mirror", frame_patch={"source": "mirror"})
        bare = await h.resume(tid)
        gate.set()
        return amended, bare

    [(amended, bare)] = await run_alongside(h, person())

    log = await h.store.list_recovery_log(tid)
    by_event = {r["event_id"]: r["resume_strategy"] for r in log if r["event_id"] is not None}
    assert by_event.get(amended.event_id) == "amend", log
    assert by_event.get(bare.event_id) == "resume_ignored", log
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.frame.scratch["source"] == "mirror"
    assert calls == [(0, "primary"), (1, "mirror"), (2, "mirror")]
    assert {"role": "user", "type": "resume", "content": "use the mirror"} in strip_at(
        await h.history(tid))
    await h.close()


# ---------------------------------------------------------------------- R4: P1 during plan


async def test_r4_p1_event_during_plan_is_applied_before_the_planned_tool_runs():
    """R4 (r4): an amend (P1) arriving while plan() runs (a model call) must be applied, and
    on_event must see it, before the planned side-effecting tool runs; the action on_event
    returns (a Reply) runs first, then the recorded call."""
    h = tt.Harness("memory://", settings=fast_settings())
    order: list[str] = []
    planning = asyncio.Event()
    go = asyncio.Event()

    @h.tool(side_effect=True)
    async def send_email(ctx: tt.ToolContext, to: str) -> str:
        order.append(f"tool {to}")
        return "sent"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if t.last_tool_result:
                return tt.Finish(t.last_tool_result)
            planning.set()
            await go.wait()  # the model is thinking
            return tt.ToolCall("send_email", {"to": t.scratch.get("to", "old@x")})

        async def on_event(self, t, e):
            order.append(f"on_event {e.type}")
            if e.type == "amend":
                t.scratch["to"] = e.payload
                return tt.Reply("ok, amended")
            return None

    tid = await h.submit("a")

    async def user() -> None:
        await asyncio.wait_for(planning.wait(), 5)
        await h.emit(tt.Event("amend", tid, "new@x"))
        go.set()

    await run_alongside(h, user())

    assert order[0] == "on_event amend", f"the planned tool ran before the amend was seen: {order}"
    assert order[1].startswith("tool "), order
    rows = strip_at(await h.history(tid))
    reply_at = next(i for i, r in enumerate(rows) if r.get("content") == "ok, amended")
    call_at = next(i for i, r in enumerate(rows) if "tool_call" in r)
    assert reply_at < call_at, f"the on_event action did not run first: {rows}"
    assert (await h.get(tid)).record.status is tt.Status.COMPLETED
    await h.close()


# ---------------------------------------------------------------------- R9: bubbling to parents


async def test_r9_interrupt_unhandled_by_child_is_handled_by_the_batch_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """R9 (r8): in the contract batch, a second "reparse" interrupt arrives while the first
    re-parse subtask is on top of the stack. The child agent does not handle it; it is offered
    to the parent batch agent, which does: both files are re-parsed and the task completes
    (before the fix it went unhandled at the top and the task paused)."""
    from tether.examples import build_harness, contract_files

    monkeypatch.setenv("TETHER_DEMO_PARSE_SECONDS", "0.05")
    h = build_harness("memory://", ledger_path=str(tmp_path / "ledger.db"))
    tid = await h.submit("contracts", {"files": contract_files(6)})

    def top_agent() -> str | None:
        runner = h.runners.get(tid)
        return runner.snap.stack[-1].agent if runner is not None else None

    def step() -> int:
        runner = h.runners.get(tid)
        return runner.snap.step if runner is not None else 0

    async def user() -> list[str]:
        await wait_until(lambda: step() >= 2, what="the batch to be under way")
        await h.emit(tt.Event("user_interrupt", tid, {"reparse": "contract-05.pdf"}))
        await wait_until(lambda: top_agent() == "reparse_contract", what="the re-parse child")
        stack = [f.agent for f in h.runners[tid].snap.stack]
        await h.emit(tt.Event("user_interrupt", tid, {"reparse": "contract-02.pdf"}))
        return stack

    [stack] = await run_alongside(h, user())
    assert stack == ["contracts", "reparse_contract"]

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, (
        f"{info.record.status.value}: {await strategies(h, tid)}")
    assert info.snapshot.stack[0].scratch["reparsed"] == ["contract-05.pdf", "contract-02.pdf"]
    assert info.snapshot.result["parsed"] == 6
    careful = [r["tool_call"]["args"]["file"] for r in await h.history(tid)
               if "tool_call" in r and r["tool_call"]["args"].get("careful")]
    assert sorted(careful) == ["contract-02.pdf", "contract-05.pdf"]
    assert "pause" not in await strategies(h, tid)
    await h.close()


# ---------------------------------------------------------------------- R5 / R8: agent-facing state


async def test_r5_on_event_scratch_changes_are_kept_when_it_returns_none():
    """R5 (r3): on_event may change task.scratch and still return None (take the default);
    those changes are saved, top-level and nested alike (it works on a deep copy that is
    stored afterwards, not a shallow copy that is thrown away)."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            t.scratch.setdefault("seen", [])
            t.scratch.setdefault("count", 0)
            return tt.Wait("approval")

        async def on_event(self, t, e):
            t.scratch["count"] += 1  # top-level change
            t.scratch["seen"].append(e.type)  # nested change
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("user_message", tid, "hi"))
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("follow_up", tid, "still there?"))
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.snapshot.frame.scratch == {"seen": ["user_message", "follow_up"], "count": 2}
    assert info.record.status is tt.Status.WAITING
    await h.close()


async def test_r8_taskview_hands_out_copies_and_read_only_history():
    """R8 (r12): TaskView.input, last_tool_result and child_result are copies, and history
    entries are read-only mappings: an agent mutating them in plan() cannot change the
    stored frame input, tool result, child result or dialog."""
    h = tt.Harness("memory://", settings=fast_settings())
    seen: list[str] = []

    @h.tool()
    async def t1(ctx: tt.ToolContext) -> dict[str, Any]:
        return {"rows": [1, 2]}

    @h.agent("kid")
    class Kid(tt.Agent):
        async def plan(self, t):
            return tt.Finish({"k": [1]})

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if not t.scratch.get("spawned"):
                t.scratch["spawned"] = True
                return tt.Spawn("kid", {})
            if t.last_tool_result is None:
                return tt.ToolCall("t1", {})
            t.input["files"].append("injected.pdf")
            t.last_tool_result["rows"].append(99)
            t.child_result["k"].append(2)
            last = t.history[-1]
            seen.append("mapping" if isinstance(last, Mapping) else "other")
            try:
                last["content"] = "rewritten"  # type: ignore[index]
                seen.append("history writable")
            except TypeError:
                seen.append("history read-only")
            return tt.Finish("done")

    tid = await h.submit("a", {"files": ["a.pdf"]})
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.snapshot.error
    frame = info.snapshot.frame
    assert frame.input == {"files": ["a.pdf"]}
    assert info.snapshot.input == {"files": ["a.pdf"]}
    assert frame.last_tool_result == {"rows": [1, 2]}
    assert frame.child_result == {"k": [1]}
    assert seen == ["mapping", "history read-only"]
    assert [r["content"] for r in await h.history(tid) if r.get("role") == "tool"] == \
        [{"rows": [1, 2]}]
    await h.close()


async def test_r8_resources_from_failed_attempts_are_recorded_and_cleaned_up(tmp_path: Path):
    """R8 (r3): a tool attempt that registers a temp file and then fails still leaves that
    resource in the snapshot, so it is cleaned up with the others when the task ends."""
    h = tt.Harness("memory://", settings=fast_settings())
    made: list[Path] = []

    @h.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=0.001))
    async def convert(ctx: tt.ToolContext) -> str:
        path = tmp_path / f"part-{len(made)}.tmp"
        path.write_text("x")
        made.append(path)
        ctx.add_resource("temp_file", str(path))
        if len(made) < 2:
            raise ConnectionError("upstream 503")
        return "ok"

    @h.agent("b")
    class B(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("convert", {}) if t.last_tool_result is None else tt.Finish(1)

    tid = await h.submit("b")
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(made) == 2
    assert [r.ref for r in info.snapshot.resources] == [str(p) for p in made]
    assert [p for p in made if p.exists()] == [], "a temp file of a failed attempt was left behind"
    await h.close()


# ---------------------------------------------------------------------- R6 / R7 / E2: the inbox


async def test_r6_r4_coalescing_never_swallows_a_more_urgent_event():
    """R6/R4 (r14): a degrade sent at priority 0 and then a retry (P2) share the coalescing
    class call_recovery, but the later, less urgent retry must not replace the P0 degrade:
    both stay pending and both are applied, most urgent first."""
    h = tt.Harness("memory://", settings=fast_settings())
    seen: list[tuple[str, Any]] = []

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

        async def on_event(self, t, e):
            seen.append((e.type, e.payload))
            return None

    tid = await h.submit("a")  # not running: the events stay pending
    degrade = await h.emit(tt.Event("degrade", tid, {"mode": "stop-now"}, priority=0))
    retry = await h.emit(tt.Event("retry", tid, {"n": 1}))
    assert retry.coalesced == 0
    assert await event_states(h, tid) == [("degrade", "pending"), ("retry", "pending")]

    await h.run_until_idle(timeout=5)
    assert seen[:2] == [("degrade", {"mode": "stop-now"}), ("retry", {"n": 1})]
    assert await event_status(h, tid, degrade.event_id) == "applied"
    await h.close()


async def test_r7_full_inbox_accepts_an_event_that_replaces_a_pending_one_of_its_class():
    """R7 (r10): with the inbox at capacity, a progress event that coalesces with a pending
    progress event inside the window adds nothing net, so it is accepted (replacing the older
    one) rather than refused with InboxFull. An event that would add a row is still refused."""
    h = tt.Harness("memory://", settings=fast_settings(inbox_capacity=3))

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

    tid = await h.submit("a")  # not running: events stay pending
    await h.emit(tt.Event("webhook", tid, 1))
    await h.emit(tt.Event("webhook", tid, 2))
    await h.emit(tt.Event("progress", tid, {"pct": 10}))
    newer = await h.emit(tt.Event("progress", tid, {"pct": 20}))  # inbox full: must not raise
    assert newer.accepted and newer.coalesced == 1
    events = [(s.event.type, s.event.payload, s.status) for s in await h.store.list_events(tid)]
    assert events == [("webhook", 1, "pending"), ("webhook", 2, "pending"),
                      ("progress", {"pct": 10}, "coalesced"), ("progress", {"pct": 20}, "pending")]
    with pytest.raises(tt.InboxFull):
        await h.emit(tt.Event("state_change", tid, {"s": "x"}))  # another class: a new row
    await h.close()


async def test_e2_r24_overriding_only_a_priority_keeps_the_coalescing_class():
    """E2/R24 (r3 proto): protocol={"degrade": 0} changes degrade's priority only; it keeps
    its default coalescing class (call_recovery), so a degrade still replaces a pending retry
    or tool_error of the same task inside the window."""
    h = tt.Harness("memory://", settings=fast_settings(), protocol={"degrade": 0})
    table = h.protocol.table()
    assert table["degrade"] == tt.Rule(tt.Priority.P0, coalesce="call_recovery")
    assert table["tool_error"].coalesce == "call_recovery"

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            return tt.Finish()

    tid = await h.submit("a")
    await h.emit(tt.Event("retry", tid, {"n": 1}))
    degrade = await h.emit(tt.Event("degrade", tid, {"mode": "cheap"}))
    assert degrade.coalesced == 1
    assert await event_states(h, tid) == [("retry", "coalesced"), ("degrade", "pending")]
    stored = next(s for s in await h.store.list_events(tid) if s.event.id == degrade.event_id)
    assert stored.priority == 0 and stored.coalesce == "call_recovery"
    await h.close()


# ---------------------------------------------------------------------- R25: checkpoint_every_steps


class SimulatedCrash(BaseException):
    """Escapes every handler, like SIGKILL: nothing is committed or released."""


async def test_r25_checkpoint_every_steps_batches_commits_and_costs_replanning_after_a_crash(
        tmp_path: Path):
    """R25 / guide §6: with checkpoint_every_steps=3, steps other than tool calls are made
    durable every 3 steps (fewer snapshot versions), and the price is the one the guide
    states: after a crash up to that many such steps are planned again (a paid model is asked
    again), against one with the default of 1. The dialog is never duplicated."""

    async def run(every: int, crash_at: int | None) -> tuple[int, list[int], list[int], list[str]]:
        url = f"sqlite:///{tmp_path / f'ck-{every}-{crash_at}.db'}"
        h = tt.Harness(url, settings=fast_settings(checkpoint_every_steps=every,
                                                   lease_seconds=0.3))
        plans: list[int] = []
        crashed = {"done": False}

        @h.agent("a")
        class A(tt.Agent):
            async def plan(self, t):
                i = t.scratch.get("i", 0)
                plans.append(i)
                if i == crash_at and not crashed["done"]:
                    crashed["done"] = True
                    raise SimulatedCrash
                if i == 6:
                    return tt.Finish(i)
                t.scratch["i"] = i + 1
                return tt.Reply(f"paid-model answer #{i}")

        tid = await h.submit("a")
        await h.run_until_idle(timeout=5)
        if crash_at is not None:
            assert crashed["done"]
            gc.collect()  # the dead worker task's SimulatedCrash is dropped, not reported
            await asyncio.sleep(0.45)  # the dead worker's lease expires
            await h.run_until_idle(timeout=5)
        info = await h.get(tid)
        assert info.record.status is tt.Status.COMPLETED, info.snapshot.error
        steps = []
        for v in await version_numbers(h, tid):
            _, data = await h.store.load_head(tid, v)
            steps.append(tt.Snapshot.loads(data, tid, v).step)
        dialog = [r["content"] for r in await h.history(tid) if r.get("role") == "assistant"]
        await h.close()
        return info.version, steps, plans, dialog

    loop = asyncio.get_running_loop()
    default_handler = loop.get_exception_handler()

    def ignore_simulated_crash(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not isinstance(context.get("exception"), SimulatedCrash):
            loop.default_exception_handler(context)

    loop.set_exception_handler(ignore_simulated_crash)
    answers = [f"paid-model answer #{i}" for i in range(6)]

    # What it saves: 6 replies + finish are 7 commits with 1, 3 commits with 3.
    version, steps, plans, dialog = await run(1, None)
    assert (version, steps, plans, dialog) == (8, [0, 1, 2, 3, 4, 5, 6, 7], list(range(7)), answers)
    version, steps, plans, dialog = await run(3, None)
    assert (version, steps, plans, dialog) == (4, [0, 3, 6, 7], list(range(7)), answers)

    # What it costs: a crash while planning the 6th step (two replies not yet durable).
    _, _, plans, dialog = await run(1, 5)
    assert plans == [0, 1, 2, 3, 4, 5, 5, 6]  # only the plan in flight is asked again
    assert dialog == answers
    _, _, plans, dialog = await run(3, 5)
    assert plans == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6]  # 3 plans asked again: up to N
    assert dialog == answers
    gc.collect()
    loop.set_exception_handler(default_handler)
