"""R21, R22, R23, R26 (with R4, E8): no ghost recovery, loop breaking, structured recovery records,
and "needs a person" as a normal path."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from _support import fast_settings, run_alongside, strategies, wait_until

import tether as tt

R23_FIELDS = ("task_id", "checkpoint_version", "event_id", "resume_strategy", "recovery_attempt")


def broken_dependency(h: tt.Harness, state: dict) -> None:
    """A tool that fails the same way every time until a person fixes the dependency."""

    @h.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=0.001))
    async def query_db(ctx: tt.ToolContext, sql: str) -> list:
        state["calls"] = state.get("calls", 0) + 1
        if not state.get("fixed"):
            raise ConnectionRefusedError(f"connection refused by db-{state['calls']}:5432")
        return [{"rows": 1}]

    @h.agent("reporter")
    class Reporter(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("query_db", {"sql": "select 1"})
            return tt.Finish({"rows": task.last_tool_result,
                              "note": task.scratch.get("note"),
                              "dialog_roles": [r["role"] for r in task.history]})


async def parked(h: tt.Harness, state: dict) -> str:
    tid = await h.submit("reporter")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.NEEDS_HUMAN
    return tid


FAST = tt.Settings(poll_interval=0.01, recovery_backoff=0.001, lease_seconds=0.3)


async def status_of(h: tt.Harness, task_id: str) -> tt.Status:
    return (await h.store.get_task(task_id)).status  # the index row: needs no snapshot


async def event_states(h: tt.Harness, task_id: str) -> list[tuple[str, str]]:
    return [(s.event.type, s.status) for s in await h.store.list_events(task_id)]


def strip_at(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "at"} for row in rows]


async def test_r22_same_failure_fingerprint_stops_retrying_and_notifies_with_bundle():
    """R22, R26: the same failure again is not retried again: after one recovery round the task
    goes to needs_human, the reason names the fingerprint, and the notifier gets a full bundle."""
    bundles: list[dict] = []
    h = tt.Harness("memory://", settings=fast_settings(), notifier=bundles.append)
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)

    # one round of the tool's own retries (2), one recovery, one more round (2): then stop
    assert state["calls"] == 4
    info = await h.get(tid)
    assert "fingerprint" in info.record.reason and "query_db:" in info.record.reason
    assert info.snapshot.error == info.record.reason
    assert (await strategies(h, tid)).count("retry_backoff") == 1
    assert len(bundles) == 1
    bundle = bundles[0]
    for key in ("snapshot", "history", "events", "recovery_log", "failure_reasons"):
        assert key in bundle, key
    assert bundle["task"]["status"] == "needs_human"
    assert bundle["reason"] == info.record.reason
    assert any("fingerprint" in reason for reason in bundle["failure_reasons"])
    assert bundle["snapshot"]["call"]["tool"] == "query_db"
    assert [r["resume_strategy"] for r in bundle["recovery_log"]][-1] == "needs_human"
    assert any(r.get("error", "").startswith("ConnectionRefusedError") for r in bundle["history"])
    await h.close()


async def test_r21_duplicate_resume_signals_cause_one_recovery():
    """R21: 100 resume signals for one needs_human task (repeated and distinct source ids, some
    at once) cause exactly one `human_resume`."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)
    state["fixed"] = True

    same_id = [h.resume(tid, source_event_id="ops-click-1") for _ in range(40)]
    distinct = [h.resume(tid, source_event_id=f"ops-click-{i}") for i in range(2, 32)]
    await asyncio.gather(*same_id, *distinct)
    for i in range(30):  # and some arriving one after another, with and without ids
        await h.resume(tid, source_event_id=None if i % 2 else f"late-{i}")
    await h.run_until_idle(timeout=5)

    log = await h.store.list_recovery_log(tid)
    assert [r["resume_strategy"] for r in log].count("human_resume") == 1
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert state["calls"] == 5  # 4 failing attempts before the handoff, one after
    await h.close()


async def test_r26_person_resumes_with_message_and_frame_patch_and_task_completes():
    """R26: a person fixes the cause, amends the task (frame_patch) and resumes it with a message;
    the task completes and the message is in the dialog."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)

    state["fixed"] = True
    receipt = await h.resume(tid, message="restarted the database", frame_patch={"note": "db fixed"})
    assert receipt.accepted
    assert (await h.get(tid)).record.status is tt.Status.RUNNING
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["rows"] == [{"rows": 1}]
    assert info.snapshot.result["note"] == "db fixed"
    assert info.record.reason is None and info.snapshot.error is None
    history = await h.history(tid)
    assert {"role": "user", "type": "resume", "content": "restarted the database"}.items() <= \
        next(r for r in history if r.get("type") == "resume").items()
    await h.close()


async def test_r26_export_bundle_of_parked_task(harness):
    """R26: `harness.export` returns one bundle with state, failure reasons and context."""
    state: dict = {}
    broken_dependency(harness, state)
    tid = await parked(harness, state)
    bundle = await harness.export(tid)
    assert bundle["task"]["task_id"] == tid and bundle["task"]["status"] == "needs_human"
    assert bundle["snapshot"]["task_id"] == tid
    assert bundle["snapshot_version"] == (await harness.get(tid)).version
    assert bundle["history"] == await harness.history(tid)
    assert bundle["failure_reasons"] and bundle["recovery_log"]
    assert {r["status"] for r in bundle["idempotency"]} == {"failed"}
    assert bundle["versions"] and all("created_at" in v for v in bundle["versions"])


async def test_e8_planned_tool_removed_by_deploy_goes_to_needs_human_naming_it(db_url):
    """E8: code changed between interruption and resume: the recorded step names a tool that no
    longer exists, so the task goes to needs_human with that name, and the worker keeps working."""
    started = asyncio.Event()

    old = tt.Harness(db_url, settings=fast_settings())

    @old.tool(interruptible=True)
    async def legacy_export(ctx: tt.ToolContext, fmt: str) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    def register_agent(h: tt.Harness) -> None:
        @h.agent("exporter")
        class Exporter(tt.Agent):
            async def plan(self, task):
                if task.last_tool_result is None:
                    return tt.ToolCall("legacy_export", {"fmt": "csv"})
                return tt.Finish(task.last_tool_result)

    register_agent(old)
    tid = await old.submit("exporter")

    async def interrupt() -> None:
        await started.wait()
        await old.emit(tt.Event("user_interrupt", tid, {}))

    await asyncio.gather(old.run_until_idle(timeout=5), interrupt())
    paused = await old.get(tid)
    assert paused.record.status is tt.Status.PAUSED
    assert paused.snapshot.frame.agenda[0].action["name"] == "legacy_export"
    await old.close()

    new = tt.Harness(db_url, settings=fast_settings())  # the deploy: the tool is gone
    register_agent(new)

    @new.tool
    async def other(ctx: tt.ToolContext) -> str:
        return "fine"

    @new.agent("healthy")
    class Healthy(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("other", {})
            return tt.Finish(task.last_tool_result)

    ok = await new.submit("healthy")
    await new.resume(tid)
    await new.run_until_idle(timeout=5)
    info = await new.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "legacy_export" in info.record.reason
    assert (await new.get(ok)).record.status is tt.Status.COMPLETED
    await new.close()


async def test_r23_every_recovery_record_is_structured_and_logged(caplog):
    """R23: every recovery action writes one record with task_id, checkpoint_version, event_id,
    resume_strategy and recovery_attempt, and the `tether.recovery` logger emits it with
    `extra={"tether": ...}`."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    with caplog.at_level(logging.INFO, logger="tether.recovery"):
        tid = await parked(h, state)
        state["fixed"] = True
        await h.resume(tid, message="fixed")
        await h.run_until_idle(timeout=5)

    log = await h.store.list_recovery_log(tid)
    assert {r["resume_strategy"] for r in log} >= {"retry_backoff", "needs_human", "human_resume"}
    for record in log:
        for field in R23_FIELDS:
            assert field in record, (field, record)
        assert record["task_id"] == tid
        assert isinstance(record["checkpoint_version"], int)
    resume = next(r for r in log if r["resume_strategy"] == "human_resume")
    assert isinstance(resume["event_id"], int)
    assert next(r for r in log if r["resume_strategy"] == "retry_backoff")["recovery_attempt"] == 1

    emitted = [r for r in caplog.records if r.name == "tether.recovery"]
    assert len(emitted) == len(log)
    for rec in emitted:
        data = rec.tether
        for field in R23_FIELDS:
            assert field in data, (field, data)
    assert [r.tether["resume_strategy"] for r in emitted] == [r["resume_strategy"] for r in log]


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


async def test_r26_resume_with_a_message_before_the_task_started_is_kept() -> None:
    """R26: a person's message sent to a task no worker has started yet reaches the dialog."""
    h = tt.Harness("memory://", settings=FAST)

    @h.agent("echo")
    class Echo(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Finish([e["content"] for e in t.history if e.get("role") == "user"])

    tid = await h.submit("echo")
    await h.resume(tid, message="use the EU region")
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.snapshot.result == ["use the EU region"]
    await h.close()


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
    assert "fingerprint" in (record.reason or "") and "search" in (record.reason or ""), record.reason
    await h.close()


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
