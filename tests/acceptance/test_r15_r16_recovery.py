"""R15, R16 (with R12, E6, E7): recovery strategies per interruption, and validating external
state before resuming a wait."""

from __future__ import annotations

from _support import fast_settings, strategies

import tether as tt


async def test_r15_tool_retried_with_backoff_then_succeeds(harness):
    """R15: a system fault gets bounded retries with backoff (same key each time), then success."""
    attempts: list[tuple[int, str]] = []

    @harness.tool(retry=tt.RetryPolicy(max_attempts=4, backoff=0.001))
    async def lookup(ctx: tt.ToolContext, q: str) -> str:
        attempts.append((ctx.attempt, ctx.idempotency_key))
        if len(attempts) < 3:
            raise ConnectionError(f"upstream 503 (try {len(attempts)})")
        return f"answer to {q}"

    @harness.agent("asker")
    class Asker(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("lookup", {"q": "why"})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("asker")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == "answer to why"
    assert [a for a, _ in attempts] == [1, 2, 3]
    assert len({k for _, k in attempts}) == 1  # one key across retries
    (record,) = await harness.store.list_idempotency(tid)
    assert (record.status, record.attempts) == ("succeeded", 3)


async def test_r12_r15_gave_up_call_recovered_after_backoff():
    """R12, R15: when a tool's own retries give up, the harness recovers it after a backoff
    (a bounded recovery attempt, logged) and the task still completes."""
    h = tt.Harness("memory://", settings=tt.Settings(recovery_backoff=0.01, poll_interval=0.01))
    calls: list[int] = []

    @h.tool(retry=tt.RetryPolicy(max_attempts=1, backoff=0.001))
    async def flaky(ctx: tt.ToolContext) -> str:
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise TimeoutError("dependency timed out")
        return "ok"

    @h.agent("once")
    class Once(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("flaky", {})
            return tt.Finish(task.last_tool_result)

    tid = await h.submit("once")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(calls) == 2
    log = await h.store.list_recovery_log(tid)
    retry = [r for r in log if r["resume_strategy"] == "retry_backoff"]
    assert len(retry) == 1 and retry[0]["recovery_attempt"] == 1
    assert info.snapshot.recovery.attempts == 0  # progress resets the budget
    await h.close()


async def test_r15_failed_item_in_batch_is_skipped_recorded_and_batch_continues(harness):
    """R15: a failed subtask in a batch is skipped (recorded) and the batch continues: the
    agent's on_event for `tool_error` returns an action."""
    processed: list[int] = []

    @harness.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=0.001))
    async def process(ctx: tt.ToolContext, item: int) -> int:
        if item == 3:
            raise ValueError(f"item {item} is malformed")
        processed.append(item)
        return item

    @harness.agent("batch")
    class Batch(tt.Agent):
        async def plan(self, task):
            error = task.last_tool_error
            if error is not None and error["key"] not in task.scratch.get("seen", []):
                task.scratch.setdefault("seen", []).append(error["key"])
                task.scratch.setdefault("errors", []).append(error["error"])
            todo = task.scratch.setdefault("todo", [1, 2, 3, 4, 5])
            if not todo:
                return tt.Finish({"skipped": task.scratch.get("skipped", []),
                                  "errors": task.scratch.get("errors", [])})
            return tt.ToolCall("process", {"item": todo.pop(0)})

        async def on_event(self, task, event):
            if event.type == "tool_error":
                task.scratch.setdefault("skipped", []).append(event.payload["tool"])
                return tt.Reply(f"skipping: {event.payload['error']}")
            return None

    tid = await harness.submit("batch")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert processed == [1, 2, 4, 5]
    assert info.snapshot.result["skipped"] == ["process"]
    assert info.snapshot.result["errors"] == ["ValueError: item 3 is malformed"]
    assert "skip" in await strategies(harness, tid)
    history = await harness.history(tid)
    assert any(r["role"] == "tool" and "malformed" in (r.get("error") or "") for r in history)
    assert any(r["role"] == "assistant" and "skipping" in r.get("content", "") for r in history)
    failed = [r for r in await harness.store.list_idempotency(tid) if r.status == "failed"]
    assert len(failed) == 1 and failed[0].attempts == 2


def approval_waiter(h: tt.Harness, approvals: dict[str, bool]) -> None:
    @h.agent("approver")
    class Approver(tt.Agent):
        async def plan(self, task):
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(dict(task.last_event))

        async def check_wait(self, task, wait):
            if approvals.get(task.task_id):
                return {"approved": True, "via": "approval-system"}
            return None


async def test_r16_waiting_task_sees_approval_that_happened_outside(harness):
    """R16: before resuming, external state is validated: the approval happened meanwhile (the
    event was never delivered), so after `wake_waiting` the task goes on instead of waiting forever."""
    approvals: dict[str, bool] = {}
    approval_waiter(harness, approvals)
    tid = await harness.submit("approver")
    await harness.run_until_idle(timeout=5)
    assert (await harness.get(tid)).record.status is tt.Status.WAITING

    # nothing happened outside yet: a re-check leaves it waiting
    assert await harness.wake_waiting() == 1
    await harness.run_until_idle(timeout=5)
    assert (await harness.get(tid)).record.status is tt.Status.WAITING

    approvals[tid] = True
    await harness.wake_waiting()
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["payload"] == {"approved": True, "via": "approval-system"}
    assert info.snapshot.result["source"] == "check_wait"
    assert "wait_validated" in await strategies(harness, tid)


async def test_r16_r19_approval_emitted_while_no_worker_ran_is_found_on_next_run(db_url):
    """R16, R19, E7: an approval stored while no worker was running is found by the next one
    (a fresh process on the same store), and the wait ends with it."""

    def build() -> tt.Harness:
        h = tt.Harness(db_url, settings=fast_settings())
        approval_waiter(h, {})
        return h

    h1 = build()
    tid = await h1.submit("approver")
    await h1.run_until_idle(timeout=5)
    assert (await h1.get(tid)).record.status is tt.Status.WAITING
    await h1.close()

    sender = build()  # a webhook handler process: stores the event, runs nothing
    receipt = await sender.emit(tt.Event("approval", tid, {"by": "alice"}, source_event_id="appr-1"))
    assert receipt.accepted
    await sender.close()

    h2 = build()
    await h2.run_until_idle(timeout=5)
    info = await h2.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["payload"] == {"by": "alice"}
    assert info.snapshot.result["source_event_id"] == "appr-1"
    await h2.close()
