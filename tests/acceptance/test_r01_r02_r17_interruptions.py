"""R1, R2, R17 (with R4/E1, R15): interruptions have tested paths; the harness can say where a task is."""

from __future__ import annotations

import asyncio
from collections import Counter

from _support import run_alongside, strategies, wait_until

import tether as tt


def batch_harness(h: tt.Harness, calls: list[int], gate_at: int | None = None,
                  gate: asyncio.Event | None = None, handle_interrupt: bool = True) -> None:
    """The source's case: a batch agent parsing contracts, and a subtask that re-parses one."""

    @h.tool
    async def parse(ctx: tt.ToolContext, n: int) -> dict:
        calls.append(n)
        if gate is not None and n == gate_at:
            await gate.wait()
        await asyncio.sleep(0)
        return {"n": n, "ok": True}

    @h.agent("batch")
    class Batch(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is not None:
                done = task.scratch.setdefault("done", [])
                if task.last_tool_result["n"] not in done:
                    done.append(task.last_tool_result["n"])
            todo = task.scratch.setdefault("todo", list(range(1, task.input["count"] + 1)))
            if task.child_result is not None:
                task.scratch["reparsed"] = task.child_result
            if not todo:
                return tt.Finish({"parsed": task.scratch["done"],
                                  "reparsed": task.scratch.get("reparsed")})
            return tt.ToolCall("parse", {"n": todo.pop(0)})

        async def on_event(self, task, event):
            if handle_interrupt and event.type == "user_interrupt":
                return tt.Spawn("reparse", {"n": event.payload["n"]})
            return None

    @h.agent("reparse")
    class Reparse(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("parse", {"n": task.input["n"]})
            return tt.Finish(task.last_tool_result)


def slow_model_harness(h: tt.Harness, started: list[int], cancelled: list[int],
                       reparsed: list[int]) -> None:
    """An agent whose model call would take a minute (each call's step in *started*, each
    one cut off in *cancelled*), answering a ``user_interrupt`` with a subtask that re-parses
    the contract it names (into *reparsed*); with the subtask's result it finishes."""

    @h.tool
    async def parse(ctx: tt.ToolContext, n: int) -> int:
        reparsed.append(n)
        return n

    @h.agent("slow_model")
    class SlowModel(tt.Agent):
        async def plan(self, task):
            if task.child_result is not None:
                return tt.Finish({"child": task.child_result})
            started.append(task.step)
            try:
                await asyncio.sleep(60)  # a model call that would take a minute
            except asyncio.CancelledError:
                cancelled.append(task.step)
                raise
            return tt.Finish("too slow")

        async def on_event(self, task, event):
            if event.type == "user_interrupt":
                return tt.Spawn("reparse_one", {"n": event.payload["n"]})
            return None

    @h.agent("reparse_one")
    class ReparseOne(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("parse", {"n": task.input["n"]})
            return tt.Finish(task.last_tool_result)


async def test_r01_r17_preemption_spawns_reparse_and_batch_finishes_without_redoing(harness):
    """R1 (external preemption), R4, R15, R17: a P0 "stop, re-parse #5" during a batch of 20.

    The agent's on_event answers the user_interrupt with a Spawn; contract #5 is
    parsed twice in all (once in the batch, once by the subtask), every other
    contract exactly once, and the batch result is complete.
    """
    calls: list[int] = []
    gate = asyncio.Event()
    batch_harness(harness, calls, gate_at=7, gate=gate)
    tid = await harness.submit("batch", {"count": 20})

    async def interrupt() -> None:
        await wait_until(lambda: 7 in calls, what="contract 7 in flight")
        receipt = await harness.emit(tt.Event("user_interrupt", tid, {"n": 5}))
        assert receipt.accepted
        gate.set()

    await run_alongside(harness, interrupt())

    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    counts = Counter(calls)
    assert counts[5] == 2, calls
    assert all(counts[n] == 1 for n in range(1, 21) if n != 5), calls
    assert sorted(info.snapshot.result["parsed"]) == list(range(1, 21))
    assert info.snapshot.result["reparsed"] == {"n": 5, "ok": True}
    # the subtask ran after contract 7 (the call in flight) finished: E1, nothing cut off
    assert calls.index(7) < len(calls) - 1 - calls[::-1].index(5)
    history = await harness.history(tid)
    spawns = [r for r in history if r.get("event") == "spawn"]
    assert len(spawns) == 1 and spawns[0]["agent"] == "reparse"
    assert any(r.get("type") == "user_interrupt" and r["role"] == "user" for r in history)


async def test_r01_r15_unhandled_p0_pauses_and_resume_keeps_todo_list(harness):
    """R1, R4, R15: a P0 with no handler pauses the task; `harness.resume` continues it.

    The to-do list (the frame's scratch) survives the pause: on resume the
    remaining contracts are parsed, none twice.
    """
    calls: list[int] = []
    gate = asyncio.Event()
    batch_harness(harness, calls, gate_at=4, gate=gate, handle_interrupt=False)
    tid = await harness.submit("batch", {"count": 10})

    async def interrupt() -> None:
        await wait_until(lambda: 4 in calls, what="contract 4 in flight")
        await harness.emit(tt.Event("user_interrupt", tid, {"why": "hold on"}))
        gate.set()

    await run_alongside(harness, interrupt())

    paused = await harness.get(tid)
    assert paused.record.status is tt.Status.PAUSED
    todo = paused.snapshot.frame.scratch["todo"]
    assert todo and todo == list(range(5, 11)), todo
    assert sorted(calls) == [1, 2, 3, 4]
    assert "pause" in await strategies(harness, tid)

    await harness.resume(tid, message="go on")
    await harness.run_until_idle(timeout=10)

    done = await harness.get(tid)
    assert done.record.status is tt.Status.COMPLETED
    assert sorted(calls) == list(range(1, 11))
    assert sorted(done.snapshot.result["parsed"]) == list(range(1, 11))


async def test_r04_e1_p0_cancels_interruptible_tool_at_once(harness):
    """R4, E1: P0 cancels an in-flight tool declared interruptible, without waiting for it."""
    cancelled = asyncio.Event()
    started = asyncio.Event()

    @harness.tool(interruptible=True)
    async def crawl(ctx: tt.ToolContext) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    @harness.agent("crawler")
    class Crawler(tt.Agent):
        async def plan(self, task):
            return tt.ToolCall("crawl", {})

    tid = await harness.submit("crawler")

    async def interrupt() -> None:
        await started.wait()
        await harness.emit(tt.Event("user_interrupt", tid, {}))

    await run_alongside(harness, interrupt(), timeout=5)
    assert cancelled.is_set()
    info = await harness.get(tid)
    assert info.record.status is tt.Status.PAUSED
    records = await harness.store.list_idempotency(tid)
    assert [r.status for r in records] == ["failed"]
    assert "interrupted" in (records[0].error or "")


async def test_e1_p0_lets_side_effecting_tool_finish_and_records_it_first(harness):
    """E1: a side-effecting tool in flight is never cancelled by P0; its result is recorded first."""
    gate = asyncio.Event()
    started = asyncio.Event()
    sent: list[str] = []

    @harness.tool(side_effect=True)
    async def send_email(ctx: tt.ToolContext, to: str) -> dict:
        started.set()
        await gate.wait()
        sent.append(to)
        return {"sent": to}

    @harness.agent("mailer")
    class Mailer(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("send_email", {"to": "a@example.com"})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("mailer")

    async def interrupt() -> None:
        await started.wait()
        await harness.emit(tt.Event("user_interrupt", tid, {}))
        gate.set()

    await run_alongside(harness, interrupt(), timeout=5)
    info = await harness.get(tid)
    assert sent == ["a@example.com"]
    assert info.record.status is tt.Status.PAUSED
    assert info.snapshot.frame.last_tool_result == {"sent": "a@example.com"}
    records = await harness.store.list_idempotency(tid)
    assert [r.status for r in records] == ["succeeded"]
    history = await harness.history(tid)
    kinds = [(r["role"], r.get("type")) for r in history]
    assert kinds.index(("tool", None)) < kinds.index(("user", "user_interrupt"))


async def test_r01_system_fault_tool_failure_is_retried_then_succeeds(harness):
    """R1 (system fault path), R15: a tool that times out, then errors, then works is retried."""
    attempts: list[int] = []

    @harness.tool(timeout=0.05, retry=tt.RetryPolicy(max_attempts=3, backoff=0.001))
    async def fetch(ctx: tt.ToolContext, url: str) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(1)  # exceeds the tool timeout
        if ctx.attempt == 2:
            raise ConnectionError("dependency down")
        return f"body of {url}"

    @harness.agent("fetcher")
    class Fetcher(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("fetch", {"url": "u"})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("fetcher")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == "body of u"
    assert attempts == [1, 2, 3]
    (record,) = await harness.store.list_idempotency(tid)
    assert record.status == "succeeded" and record.attempts == 3


async def test_r02_get_answers_step_current_call_and_status(harness):
    """R2: for a task at any moment, `harness.get` says which step, the call in flight, the status,
    whether its intermediate products exist and whether recovery would re-run or resume."""
    gate = asyncio.Event()
    in_flight = asyncio.Event()

    @harness.tool
    async def step_tool(ctx: tt.ToolContext, n: int) -> int:
        if n == 3:
            in_flight.set()
            await gate.wait()
        return n

    @harness.agent("stepper")
    class Stepper(tt.Agent):
        async def plan(self, task):
            n = task.scratch.get("n", 0)
            if n == 5:
                return tt.Finish(n)
            task.scratch["n"] = n + 1
            return tt.ToolCall("step_tool", {"n": n + 1})

    tid = await harness.submit("stepper")
    before = await harness.get(tid)
    assert before.record.status is tt.Status.PENDING and before.snapshot.step == 0

    seen: dict = {}

    async def look() -> None:
        await in_flight.wait()
        info = await harness.get(tid)
        seen["status"] = info.record.status
        seen["step"] = info.snapshot.step
        seen["call"] = info.snapshot.call
        seen["resources"] = info.snapshot.resources
        seen["record"] = await harness.store.get_idempotency(info.snapshot.call.key)
        gate.set()

    await run_alongside(harness, look(), timeout=5)
    assert seen["status"] is tt.Status.RUNNING
    assert seen["step"] == 2  # two calls done, the third in flight
    call = seen["call"]
    assert call.tool == "step_tool" and call.args == {"n": 3}
    assert call.status == "started"  # in doubt after a crash: resume point is before this call
    assert seen["record"].status == "started"
    assert seen["resources"] == []
    assert harness.tools[call.tool].idempotent  # so a recovery would re-run it with the same key
    after = await harness.get(tid)
    assert after.record.status is tt.Status.COMPLETED
    assert after.snapshot.step == 6 and after.snapshot.call is None


async def test_r04_p0_cancels_in_flight_model_call_and_handler_runs(harness):
    """R4, R17: a P0 cancels an in-flight plan (the model call) at once; the agent's handler then
    spawns the subtask and the frame plans again afterwards."""
    started: list[int] = []
    cancelled_plans: list[int] = []
    reparsed: list[int] = []
    slow_model_harness(harness, started, cancelled_plans, reparsed)
    tid = await harness.submit("slow_model")

    async def interrupt() -> None:
        await wait_until(lambda: bool(started))
        await harness.emit(tt.Event("user_interrupt", tid, {"n": 5}))

    await run_alongside(harness, interrupt(), timeout=5)
    info = await harness.get(tid)
    assert cancelled_plans == [0]
    assert reparsed == [5]
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == {"child": 5}


async def test_r04_r15_p0_handled_by_spawn_while_interruptible_tool_in_flight(harness):
    """R4, R15, E1: a P0 cancels an interruptible tool; the agent answers with a Spawn. The Spawn
    runs first and the cancelled call is kept on the to-do list and re-run afterwards.

    (agent.on_event docstring: "An action returned here runs before the frame's own planned work,
    which is kept".)
    """
    started = asyncio.Event()
    runs: list[str] = []

    @harness.tool(interruptible=True)
    async def crawl(ctx: tt.ToolContext, site: str) -> str:
        runs.append(f"crawl:{site}")
        if len(runs) == 1:
            started.set()
            await asyncio.sleep(60)
        return f"crawled {site}"

    @harness.tool
    async def parse(ctx: tt.ToolContext, n: int) -> int:
        runs.append(f"parse:{n}")
        return n

    @harness.agent("crawler")
    class Crawler(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("crawl", {"site": "a"})
            return tt.Finish({"crawl": task.last_tool_result, "child": task.child_result})

        async def on_event(self, task, event):
            if event.type == "user_interrupt":
                return tt.Spawn("reparse_one", {"n": 5})
            return None

    @harness.agent("reparse_one")
    class ReparseOne(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("parse", {"n": task.input["n"]})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("crawler")

    async def interrupt() -> None:
        await started.wait()
        await harness.emit(tt.Event("user_interrupt", tid, {}))

    await run_alongside(harness, interrupt(), timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert runs == ["crawl:a", "parse:5", "crawl:a"]
    assert info.snapshot.result == {"crawl": "crawled a", "child": 5}


async def test_r15_p0_handled_by_spawn_during_retry_backoff_keeps_the_failed_call(harness):
    """R15, R17: a user interrupt arriving while a failed call waits for its retry is answered by
    the agent's Spawn; the pending call is kept (to-do list survives) and retried afterwards."""
    failed_once = asyncio.Event()
    runs: list[str] = []

    @harness.tool(retry=tt.RetryPolicy(max_attempts=3, backoff=0.3, jitter=0))
    async def fetch(ctx: tt.ToolContext) -> str:
        runs.append("fetch")
        if len(runs) == 1:
            failed_once.set()
            raise ConnectionError("upstream down")
        return "fetched"

    @harness.tool
    async def parse(ctx: tt.ToolContext, n: int) -> int:
        runs.append(f"parse:{n}")
        return n

    @harness.agent("fetcher")
    class Fetcher(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("fetch", {})
            return tt.Finish({"fetch": task.last_tool_result, "child": task.child_result})

        async def on_event(self, task, event):
            if event.type == "user_interrupt":
                return tt.Spawn("reparse_one", {"n": 5})
            return None

    @harness.agent("reparse_one")
    class ReparseOne(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("parse", {"n": task.input["n"]})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("fetcher")

    async def interrupt() -> None:
        await failed_once.wait()
        await wait_until(lambda: "fetch" in runs)
        await harness.emit(tt.Event("user_interrupt", tid, {}))

    await run_alongside(harness, interrupt(), timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert runs == ["fetch", "parse:5", "fetch"]
    assert info.snapshot.result == {"fetch": "fetched", "child": 5}


async def test_r15_p1_handled_by_tool_call_during_retry_backoff_runs_that_call_with_its_own_args(
        harness):
    """R15, R10, E3: a user message arriving while a failed call waits for its retry is answered
    by the agent with a different ToolCall. That call runs with its own arguments and key; the
    pending call keeps its own and is retried afterwards."""
    failed_once = asyncio.Event()
    runs: list[tuple[str, dict]] = []

    @harness.tool(retry=tt.RetryPolicy(max_attempts=3, backoff=0.3, jitter=0))
    async def fetch(ctx: tt.ToolContext, url: str) -> str:
        runs.append(("fetch", {"url": url}))
        if len(runs) == 1:
            failed_once.set()
            raise ConnectionError("upstream down")
        return f"fetched {url}"

    @harness.tool
    async def acknowledge(ctx: tt.ToolContext, text: str) -> str:
        runs.append(("acknowledge", {"text": text}))
        return f"ack {text}"

    @harness.agent("fetcher")
    class Fetcher(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None or task.last_tool_result.startswith("ack"):
                if task.scratch.get("fetched"):
                    return tt.Finish(task.scratch["fetched"])
                return tt.ToolCall("fetch", {"url": "https://example.com"})
            task.scratch["fetched"] = task.last_tool_result
            return tt.Finish(task.last_tool_result)

        async def on_event(self, task, event):
            if event.type == "user_message":
                return tt.ToolCall("acknowledge", {"text": event.payload["text"]})
            return None

    tid = await harness.submit("fetcher")

    async def message() -> None:
        await failed_once.wait()
        await harness.emit(tt.Event("user_message", tid, {"text": "hurry"}))

    await run_alongside(harness, message(), timeout=5)
    info = await harness.get(tid)
    assert ("acknowledge", {"text": "hurry"}) in runs, runs
    assert [r for r in runs if r[0] == "fetch"] == [("fetch", {"url": "https://example.com"})] * 2
    records = {r.key: r for r in await harness.store.list_idempotency(tid)}
    assert sorted(r.tool for r in records.values()) == ["acknowledge", "fetch"]
    fetch_record = next(r for r in records.values() if r.tool == "fetch")
    assert fetch_record.result == "fetched https://example.com"
    assert info.record.status is tt.Status.COMPLETED, info.record.reason


async def test_r04_e1_a_p0_stored_after_the_inbox_read_stops_the_model_call_before_it_starts(
        harness, monkeypatch):
    """R4, E1: a P0 that arrives after the loop read its inbox but before the model call
    starts finds no work to cancel; it must still stop that call before it starts, not wait
    for the whole call to come back (the P0 here is stored at exactly that point)."""
    from tether.engine.runner import Runner

    long_calls: list[int] = []
    original_step = Runner.step

    async def step_after_a_p0(runner: Runner) -> None:
        if runner.snap.task_id == tid and not interrupted:
            interrupted.append(True)
            await harness.emit(tt.Event("user_interrupt", tid, {"n": 7}))
        await original_step(runner)

    interrupted: list[bool] = []
    monkeypatch.setattr(Runner, "step", step_after_a_p0)

    reparsed: list[int] = []
    slow_model_harness(harness, long_calls, [], reparsed)

    tid = await harness.submit("slow_model")
    await harness.run_until_idle(timeout=10)
    info = await harness.get(tid)
    assert interrupted and long_calls == []
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == {"child": 7}
